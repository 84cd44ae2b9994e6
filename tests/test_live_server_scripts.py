"""The live-server run's CPU-checkable parts (bench/device/live_*.py): its launch
lines parse in the installed SGLang, the offline model folders and tokenizer,
the random-weight fill, the parcel packing and unpacking, and the comparisons
and counts its report rests on. The run itself needs the GPU
(``bench/device/live_server.sh``)."""

import argparse
import json
import types
import zipfile
from pathlib import Path

import pytest

from bench.device import live_pack, live_server, live_unpack


def launch_args(shape: str, backend: str) -> list[str]:
    args = types.SimpleNamespace(models=Path("/m"), mem_fraction=0.6, server_args=[])
    command = live_server.server_command(args, shape, backend, 30123)
    assert command[1:3] == ["-m", "sglang.launch_server"]
    return command[3:]


@pytest.mark.parametrize("shape", sorted(live_server.SHAPES))
@pytest.mark.parametrize("backend", ["triton", "verify_ops", "flashinfer"])
def test_launch_lines_parse_in_sglang(shape, backend):
    pytest.importorskip("sglang.srt.server_args")
    from sglang.srt.server_args import ServerArgs

    from verify_ops.sglang import plugin

    plugin.register()
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    parsed = parser.parse_args(launch_args(shape, backend))
    steps, topk, drafts = live_server.SHAPES[shape]
    assert (parsed.speculative_num_steps, parsed.speculative_eagle_topk,
            parsed.speculative_num_draft_tokens) == (steps, topk, drafts)
    assert parsed.attention_backend == backend
    assert parsed.load_format == "dummy" and parsed.context_length == 70000
    assert parsed.cuda_graph_max_bs_decode == 4 and not parsed.disable_cuda_graph
    expected_draft = "triton" if backend == "verify_ops" else None
    assert parsed.speculative_draft_attention_backend == expected_draft


def test_model_folders_and_tokenizer(tmp_path):
    pytest.importorskip("tokenizers")
    from bench.device import live_model

    tokenizer = live_model.byte_level_bpe()
    assert tokenizer.get_vocab_size() == live_model.VOCAB_SIZE
    text = "Speculative decoding, verified: ñ 中文 🙂"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    assert tokenizer.token_to_id("<|begin_of_text|>") == 128000
    assert tokenizer.token_to_id("<|end_of_text|>") == 128001
    assert tokenizer.id_to_token(live_model.VOCAB_SIZE - 1).startswith("<|reserved")
    # Every id the model can emit maps to a token.
    assert all(tokenizer.id_to_token(i) for i in range(0, live_model.VOCAB_SIZE, 997))
    live_model.write_model(tmp_path / "draft", 2, tokenizer)
    config = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2
    assert (config["hidden_size"], config["intermediate_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"]) == (4096, 14336, 32, 8, 128)
    transformers = pytest.importorskip("transformers")
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path / "draft")
    assert len(loaded) == live_model.VOCAB_SIZE and loaded.eos_token_id == 128001


def test_live_weights_make_the_draft_the_targets_first_layers(monkeypatch):
    torch = pytest.importorskip("torch")
    from bench.device import live_dummy_init

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = torch.nn.ModuleDict({
                "qkv_proj": torch.nn.Linear(8, 24, bias=False),
                "o_proj": torch.nn.Linear(8, 8, bias=False)})
            self.mlp = torch.nn.ModuleDict({"down_proj": torch.nn.Linear(16, 8, bias=True)})
            self.input_layernorm = torch.nn.LayerNorm(8)

    class Model(torch.nn.Module):
        def __init__(self, layers):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList(Layer() for _ in range(layers))
            self.lm_head = torch.nn.Linear(8, 32, bias=False)

    monkeypatch.setenv("LIVE_IDENTITY_FROM", "2")
    target, draft = Model(4), Model(2)
    counts = live_dummy_init.fill_weights(target)
    live_dummy_init.fill_weights(draft)
    assert counts["silenced"] == 4  # o_proj and down_proj of layers 2 and 3
    t, d = dict(target.named_parameters()), dict(draft.named_parameters())
    assert all(torch.equal(d[name], t[name]) for name in d)
    assert not torch.equal(t["model.layers.0.self_attn.qkv_proj.weight"],
                           t["model.layers.1.self_attn.qkv_proj.weight"])
    assert torch.all(t["model.layers.3.self_attn.o_proj.weight"] == 0)
    assert torch.all(t["model.layers.0.input_layernorm.weight"] == 1)
    assert torch.all(t["model.layers.0.input_layernorm.bias"] == 0)
    assert 0.015 < t["lm_head.weight"].std().item() < 0.025


def make_wheel(path: Path, files: dict) -> Path:
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    return path


def test_pack_prunes_and_unpack_restores(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels / "pkg-1-py3-none-any.whl", {
        "pkg/__init__.py": "x = 1\n",
        "pkg-1.data/purelib/pkg_extra.py": "y = 2\n",
        "pkg-1.data/scripts/tool": "#!python\n",
        "xgrammar/lib/libxgrammar.a": "static",
        "sglang/srt/server/_core.cpython-312-x86_64-linux-gnu.so": "rust",
    })
    kernel = make_wheel(tmp_path / "sglang_kernel-0.4.5-cp310-abi3-any.whl", {
        "sgl_kernel/__init__.py": "", "sgl_kernel/sm90/common_ops.abi3.so": "sm90",
        "sgl_kernel/flash_ops.abi3.so": "fa3", "sgl_kernel/sm100/common_ops.abi3.so": "sm100",
        "sglang_kernel-0.4.5.dist-info/METADATA": "Name: sglang-kernel\nVersion: 0.4.5\n",
    })
    out = tmp_path / "live"
    site = out / "stage" / "site"
    site.mkdir(parents=True)
    for wheel in wheels.glob("*.whl"):
        live_pack.install_wheel(wheel, site)
    left_out = live_pack.prune(site)
    kernel_left_out = live_pack.add_kernel(kernel, site)
    assert set(left_out) == {"xgrammar/lib/*", "sglang/srt/server/_core.*.so"}
    assert set(kernel_left_out) == {"sgl_kernel/flash_ops.abi3.so",
                                    "sgl_kernel/sm100/common_ops.abi3.so"}
    parcels = live_pack.pack(site, out, chunk_bytes=200)
    assert len(parcels) >= 2  # small chunks: the join is exercised
    assert live_unpack.unpack(out) == 0
    unpacked = {p.relative_to(out / "site").as_posix()
                for p in (out / "site").rglob("*") if p.is_file()}
    assert unpacked == {"pkg/__init__.py", "pkg_extra.py", "sgl_kernel/__init__.py",
                        "sgl_kernel/sm90/common_ops.abi3.so", ".sha256",
                        "sglang_kernel-0.4.5.dist-info/METADATA"}
    # A part missing: it waits; a corrupt part: it refuses.
    (out / "box" / "part-2").write_bytes(b"corrupt")
    (out / "site" / ".sha256").unlink()
    for parcel in out.glob("parcel-*"):
        (parcel / "chunk").unlink()
        (parcel / "manifest.json").unlink()
    assert live_unpack.unpack(out) == 1
    (out / "box" / "part-2.json").unlink()
    assert live_unpack.unpack(out) == 3


def run_with(outputs, logprobs=None, top2=None):
    alone = [{"output_ids": ids, "logprobs": lp, "top2": t}
             for ids, lp, t in zip(outputs, logprobs or [None] * len(outputs),
                                   top2 or [None] * len(outputs))]
    return {"check": {"alone": alone, "batch": alone}}


def test_compare_outputs_tells_ties_from_differences():
    same = run_with([[1, 2, 3]], [[-0.1, -0.2, -0.3]])
    assert live_server.compare_outputs(same, same)["ok"]
    # Diverging at position 1 where the reference's top two are 0.02 nats apart: a tie.
    reference = run_with([[1, 2, 3]], [[-0.1, -0.70, -0.3]],
                         [[[[-0.1, 1], [-2, 9]], [[-0.70, 2], [-0.72, 5]], [[-0.3, 3], [-1, 4]]]])
    tied = run_with([[1, 5, 3]], [[-0.1, -0.71, -0.3]])
    assert live_server.compare_outputs(reference, tied)["ok"]
    # The same divergence where the choice was clear: a difference.
    clear = run_with([[1, 2, 3]], [[-0.1, -0.1, -0.3]],
                     [[[[-0.1, 1], [-2, 9]], [[-0.1, 2], [-3.0, 5]], [[-0.3, 3], [-1, 4]]]])
    assert not live_server.compare_outputs(clear, tied)["ok"]
    # Same tokens, log-probabilities far apart: a difference too.
    far = run_with([[1, 2, 3]], [[-0.1, -1.5, -0.3]])
    assert not live_server.compare_outputs(same, far)["ok"]


def test_verify_counts_read_the_backend_log_lines():
    log = "\n".join([
        "[x] verify_ops: TARGET_VERIFY served by tree_attn (bs=1, D=4)",
        "[x] verify_ops: TARGET_VERIFY served by tree_attn (bs=2, D=4)",
        "[x] verify_ops: TARGET_VERIFY served by Triton fallback (score_mod)",
        "[x] Decode batch, #running-req: 1",
    ])
    counts = live_server.verify_counts(log)
    assert counts["served"] == 2 and counts["fallbacks"] == {"score_mod": 1}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_driver_runs_checks_times_and_reports_against_a_fake_server(tmp_path, monkeypatch,
                                                                     capsys):
    pytest.importorskip("requests")
    import sys

    fake = Path(__file__).parent / "support" / "fake_sglang_server.py"
    real = live_server.server_command
    monkeypatch.setattr(live_server, "server_command", lambda args, shape, backend, port:
                        [sys.executable, str(fake), *real(args, shape, backend, port)[3:]])
    monkeypatch.setattr(live_server, "gpu_name", lambda: "fake GPU")
    results, out = tmp_path / "results", tmp_path / "out"
    common = ["--models", str(tmp_path), "--results", str(results), "--out", str(out),
              "--lengths", "64,128", "--new-tokens", "16", "--port", str(free_port()),
              "--start-timeout", "60"]
    assert live_server.main(["run", "--shapes", "chain", "--backends", "triton,verify_ops",
                             *common]) == 0
    monkeypatch.setenv("FAKE_SHIFT", "1")  # this "backend" changes the third token
    assert live_server.main(["run", "--shapes", "chain", "--backends", "flashinfer",
                             *common]) == 0
    capsys.readouterr()
    assert live_server.main(["report", "--results", str(results), "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "chain  verify_ops" in printed and "OK 8/8 same" in printed
    assert "DIFFER 0/8 same" in printed and "chain/flashinfer differs from triton" in printed
    table = {row["backend"]: row for row in json.loads((out / "live_table.json").read_text())}
    assert set(table) == {"triton", "verify_ops", "flashinfer"}
    assert table["verify_ops"]["verify"]["served"] > 0
    assert set(table["triton"]["tokens_per_s"]) == {"64", "128"}  # JSON keys
    run = json.loads((results / "chain-verify_ops.json").read_text())
    assert run["ok"] and run["check"]["logprobs"] and len(run["speed"]) == 4
    assert all(s["decode_tokens"] == 15 and s["steps"] == 4 for s in run["speed"])
    assert (out / "server-chain-verify_ops.log").exists()
