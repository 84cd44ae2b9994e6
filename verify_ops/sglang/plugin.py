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
    defrag.install()


def create_backend(runner):
    """Factory SGLang calls with its ModelRunner, as for ``triton``."""
    assert not runner.model_config.is_encoder_decoder, (
        "Cross attention is not supported by the verify_ops backend (nor by triton, "
        "whose paths it reuses). Please use `--attention-backend flashinfer`.")
    from .backend import VerifyOpsAttnBackend  # imports Triton; only when a runner needs it

    return VerifyOpsAttnBackend(runner)
