"""The SGLang plugin: ``--attention-backend verify_ops`` is valid in SGLang's own parser."""

import argparse
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

# sglang itself may import while its deeper modules lack dependencies (seen on
# the H200 box: no `dill`); skip on what the tests really import.
for _module in ("sglang.srt.server_args", "sglang.srt.layers.attention.attention_registry"):
    pytest.importorskip(_module)

BACKEND_FLAGS = ("--attention-backend", "--prefill-attention-backend",
                 "--decode-attention-backend")
# The README's EAGLE launch line, minus the model paths.
README_FLAGS = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8",
                "--attention-backend", "verify_ops",
                "--speculative-draft-attention-backend", "triton"]


def sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def test_register_is_idempotent_and_sglang_parser_accepts_the_backend():
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES

    from verify_ops.sglang import plugin

    plugin.register()
    plugin.register()
    assert ATTENTION_BACKEND_CHOICES.count("verify_ops") == 1
    assert ATTENTION_BACKENDS["verify_ops"] is plugin.create_backend
    parser = sglang_parser()
    for flag in BACKEND_FLAGS:
        args = parser.parse_args(["--model-path", "m", flag, "verify_ops"])
        assert getattr(args, flag[2:].replace("-", "_")) == "verify_ops"
    args = parser.parse_args(["--model-path", "m", "--speculative-draft-model-path", "d",
                              *README_FLAGS])
    assert (args.attention_backend, args.speculative_draft_attention_backend) == (
        "verify_ops", "triton")
    with pytest.raises(SystemExit):  # the parser still rejects unknown names
        parser.parse_args(["--model-path", "m", "--attention-backend", "not_a_backend"])


def test_entry_point_is_declared():
    from verify_ops.sglang import plugin

    (ep,) = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "verify_ops"]
    assert ep.value == "verify_ops.sglang.plugin:register"
    assert ep.load() is plugin.register


def test_sglang_load_plugins_enables_the_flag_in_a_fresh_process():
    # A fresh interpreter proves the entry point alone does it, as in each
    # SGLang process (launch_server, scheduler, detokenizer).
    script = textwrap.dedent(f"""
        import argparse, os
        os.environ.pop("SGLANG_PLUGINS", None)
        from sglang.srt.server_args import ServerArgs, ATTENTION_BACKEND_CHOICES
        assert "verify_ops" not in ATTENTION_BACKEND_CHOICES
        from sglang.srt.plugins import load_plugins
        load_plugins()
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
        assert "verify_ops" in ATTENTION_BACKENDS
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        for flag in {BACKEND_FLAGS!r}:
            parser.parse_args(["--model-path", "m", flag, "verify_ops"])
        print("OK")
    """)
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0 and child.stdout.strip().endswith("OK"), child.stderr[-5000:]


def test_register_lets_tree_drafts_run_on_paged_pools():
    """SGLang refuses topk > 1 with page_size > 1 unless the backend is in a tuple
    local to its EAGLE handler; register() widens that tuple, once."""
    speculative_hook = pytest.importorskip("sglang.srt.arg_groups.speculative_hook")
    from verify_ops.sglang import plugin

    def allowed_lists():
        return [c for c in speculative_hook._handle_eagle_family.__code__.co_consts
                if isinstance(c, tuple) and "fa3" in c and "triton" in c]

    assert len(allowed_lists()) == 1, "SGLang's check changed: revisit allow_paged_tree_drafts"
    plugin.register()
    plugin.register()
    (allowed,) = allowed_lists()
    assert set(allowed) == {"flashinfer", "fa3", "triton", "verify_ops"}
    assert len(allowed) == 4


@pytest.mark.parametrize("model", ["GptOssForCausalLM", "Exaone4ForCausalLM"])
def test_register_lets_windowed_models_run_on_the_backend(model):
    """SGLang asserts some models' attention backends against a tuple local to its
    model-specific handler; register() adds the backend there, once."""
    from sglang.srt.server_args import ServerArgs

    from verify_ops.sglang import plugin

    try:
        from sglang.srt.arg_groups.model_hook import handle_model_specific_adjustments as handler
    except ImportError:  # SGLang 0.5.17: a ServerArgs method
        handler = ServerArgs._handle_model_specific_adjustments
    backends = plugin.MODEL_BACKEND_LISTS[model]

    def model_lists():
        return [c for c in handler.__code__.co_consts if isinstance(c, tuple)
                and frozenset(c) - {"verify_ops"} == backends]

    assert len(model_lists()) == 1, f"SGLang's {model} check changed: revisit its list"
    plugin.register()
    plugin.register()
    (allowed,) = model_lists()
    assert allowed.count("verify_ops") == 1 and len(allowed) == len(backends) + 1
    assert plugin.allow_windowed_models()[model]
