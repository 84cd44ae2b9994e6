"""SGLang plugin: makes ``--attention-backend verify_ops`` (and the prefill/decode
variants) valid, with no edit to SGLang.

SGLang's ``load_plugins()`` calls every ``sglang.srt.plugins`` entry point
with no arguments in each of its processes (launch_server, Engine, scheduler,
detokenizer); ``pyproject.toml`` points it at :func:`register`.
"""

from __future__ import annotations

from .config import BACKEND_NAME


def register() -> None:
    """Add the backend choice and its factory, and the defrag hooks (``defrag.py``);
    safe to call any number of times."""
    from sglang.srt.layers.attention import attention_registry
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    from . import defrag

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:  # the adder is a bare list.extend
        add_attention_backend_choices([BACKEND_NAME])
    attention_registry.register_attention_backend(BACKEND_NAME)(create_backend)
    allow_paged_tree_drafts()
    defrag.install()


# SGLang's EAGLE argument handler allows --speculative-eagle-topk > 1 with
# --page-size > 1 only for the backends in a tuple local to it.
_PAGED_TREE_BACKENDS = {"flashinfer", "fa3", "triton"}


def allow_paged_tree_drafts() -> bool:
    """Add the backend to the tuple of backends SGLang lets run tree drafts
    (topk > 1) on paged pools. It needs that list for the draft decode's
    per-branch pages, which stays Triton's (``--speculative-draft-attention-backend
    triton``); the verify op reads per-token slots, whatever the page size.
    The tuple is a constant of the handler's code, so the handler gets a copy
    of its code with the wider tuple. Returns whether the tuple is there now;
    an SGLang without that check (or that changed it) is left as it is."""
    try:
        from sglang.srt.arg_groups import speculative_hook
    except ImportError:
        return False
    handler = getattr(speculative_hook, "_handle_eagle_family", None)
    if handler is None:
        return False
    code = handler.__code__
    consts = tuple(
        const + (BACKEND_NAME,) if (isinstance(const, tuple) and set(const) == _PAGED_TREE_BACKENDS)
        else const for const in code.co_consts)
    if consts != code.co_consts:
        handler.__code__ = code.replace(co_consts=consts)
    return any(isinstance(const, tuple) and BACKEND_NAME in const
               for const in handler.__code__.co_consts)


def create_backend(runner):
    """Factory SGLang calls with its ModelRunner, as for ``triton``."""
    assert not runner.model_config.is_encoder_decoder, (
        "Cross attention is not supported by the verify_ops backend (nor by triton, "
        "whose paths it reuses). Please use `--attention-backend flashinfer`.")
    from .backend import VerifyOpsAttnBackend  # imports Triton; only when a runner needs it

    return VerifyOpsAttnBackend(runner)
