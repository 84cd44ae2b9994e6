"""SGLang plugin: makes ``--attention-backend verify_ops`` (and the prefill/decode
variants) valid, with no edit to SGLang.

SGLang's ``load_plugins()`` calls every ``sglang.srt.plugins`` entry point
with no arguments in each of its processes (launch_server, Engine, scheduler,
detokenizer); ``pyproject.toml`` points it at :func:`register`.
"""

from __future__ import annotations

from .config import BACKEND_NAME


def register() -> None:
    """Add the backend choice and its factory, the backend to SGLang's lists of
    backends allowed for paged trees and for the windowed models (gpt-oss,
    Exaone 4), and the defrag hooks (``defrag.py``); safe to call any number of
    times."""
    from sglang.srt.layers.attention import attention_registry
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    from . import defrag

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:  # the adder is a bare list.extend
        add_attention_backend_choices([BACKEND_NAME])
    attention_registry.register_attention_backend(BACKEND_NAME)(create_backend)
    allow_paged_tree_drafts()
    allow_windowed_models()
    defrag.install()


def _admit_backend(function, backends: frozenset) -> bool:
    """Add the backend to the tuple constant of ``function`` that lists exactly
    ``backends``: SGLang's argument checks compare against such tuples, local to
    their functions, so the function gets a copy of its code with the wider
    tuple. Returns whether the backend is in that tuple now; a function
    without it (an SGLang that changed the check) is left as it is."""
    code = function.__code__
    consts = tuple(
        const + (BACKEND_NAME,) if isinstance(const, tuple) and frozenset(const) == backends
        else const for const in code.co_consts)
    if consts != code.co_consts:
        function.__code__ = code.replace(co_consts=consts)
    return any(isinstance(const, tuple) and BACKEND_NAME in const
               and frozenset(const) - {BACKEND_NAME} == backends
               for const in function.__code__.co_consts)


# SGLang's EAGLE argument handler allows --speculative-eagle-topk > 1 with
# --page-size > 1 only for these backends.
PAGED_TREE_BACKENDS = frozenset({"flashinfer", "fa3", "triton"})
# SGLang serves these models only on the backends it lists for each; their
# attention is the op's: sliding windows, sinks (gpt-oss), full layers.
MODEL_BACKEND_LISTS = {
    "GptOssForCausalLM": frozenset({"triton", "trtllm_mha", "fa3", "fa4", "ascend",
                                    "intel_amx", "intel_xpu", "aiter"}),
    # Exaone 4 with sliding-window layers (config.sliding_window_pattern).
    "Exaone4ForCausalLM": frozenset({"fa3", "triton", "trtllm_mha"}),
}


def allow_paged_tree_drafts() -> bool:
    """Let SGLang run tree drafts (topk > 1) on paged pools with this backend.
    SGLang needs the list for the draft decode's per-branch pages, which stays
    Triton's (``--speculative-draft-attention-backend triton``); the verify op
    reads per-token slots, whatever the page size."""
    try:
        from sglang.srt.arg_groups import speculative_hook
    except ImportError:
        return False
    handler = getattr(speculative_hook, "_handle_eagle_family", None)
    return handler is not None and _admit_backend(handler, PAGED_TREE_BACKENDS)


def allow_windowed_models() -> dict[str, bool]:
    """Let SGLang serve the models of ``MODEL_BACKEND_LISTS`` on this backend:
    their prefill and decode are Triton's, which is on each list, and the verify
    op applies their windows and sinks. The checks are in ``model_hook``
    (SGLang 0.5.23) or a ServerArgs method (0.5.17). Returns, per model, whether
    the backend is on its list now."""
    handlers = []
    try:
        from sglang.srt.arg_groups import model_hook
        handlers.append(getattr(model_hook, "handle_model_specific_adjustments", None))
    except ImportError:
        pass
    from sglang.srt.server_args import ServerArgs
    handlers.append(getattr(ServerArgs, "_handle_model_specific_adjustments", None))
    handlers = [h for h in handlers if h is not None]
    # A list, not a generator: every handler is widened, not just the first.
    return {model: any([_admit_backend(h, backends) for h in handlers])
            for model, backends in MODEL_BACKEND_LISTS.items()}


def create_backend(runner):
    """Factory SGLang calls with its ModelRunner, as for ``triton``."""
    assert not runner.model_config.is_encoder_decoder, (
        "Cross attention is not supported by the verify_ops backend (nor by triton, "
        "whose paths it reuses). Please use `--attention-backend flashinfer`.")
    from .backend import VerifyOpsAttnBackend  # imports Triton; only when a runner needs it

    return VerifyOpsAttnBackend(runner)
