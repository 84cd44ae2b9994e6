"""bench/model_step.py on the CPU: its cases, its byte and FLOP arithmetic, how it sizes
the K/V pools, its table, its refusal without a GPU, and its fused kernels (under
Triton's interpreter) against plain torch through a whole small step."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from bench import model_step as ms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA, QWEN = ms.MODELS["llama3.1-8b"], ms.MODELS["qwen3-235b-a22b-tp8"]


def test_the_default_cases_are_two_models_two_batches_four_contexts_three_drafts():
    cases = ms.cases_from_args(ms.parse_args([]))
    assert len(cases) == 2 * 2 * 4 * 3
    assert {(c.num_drafts, c.tree) for c in cases} == {(4, "chain"), (8, "eagle"), (16, "eagle")}
    assert {c.seq_len for c in cases} == {4096, 16384, 65536, 131072}
    # One model's cases together, then a (batch, context)'s: weights and pools are reused.
    assert [c.model for c in cases] == sorted((c.model for c in cases),
                                              key=list(ms.MODELS).index)


def test_explicit_cases_and_their_errors():
    args = ms.parse_args(["--cases", "qwen3-235b-a22b-tp8/1/65536/8/eagle"])
    assert ms.cases_from_args(args) == [ms.Case("qwen3-235b-a22b-tp8", 1, 65536, 8, "eagle")]
    with pytest.raises(ValueError, match="model/batch/context/drafts/tree"):
        ms.parse_case("llama3.1-8b/1/65536/8")
    with pytest.raises(ValueError, match="unknown model"):
        ms.cases_of(["gpt-5"], [1], [4096], [8], [4])


def test_the_models_have_the_parameter_counts_of_their_namesakes():
    assert LLAMA.weight_bytes() / 2 == pytest.approx(8.03e9, rel=0.01)  # Llama 3.1 8B
    # One TP8 rank of Qwen3-235B-A22B: an eighth of 235B, plus the replicated KV heads.
    assert QWEN.weight_bytes() / 2 == pytest.approx(235e9 / 8, rel=0.01)
    assert QWEN.weight_bytes() < 64e9  # with the pools, inside an H200 (and an H100)


def test_a_token_reads_top_k_experts_and_many_tokens_read_nearly_all():
    assert ms.expected_experts(QWEN, 1) == pytest.approx(8)
    assert ms.expected_experts(QWEN, 128) > 127
    assert ms.expected_experts(LLAMA, 8) == 0


def test_step_bytes_count_the_weights_read_and_every_layers_kv():
    case = ms.Case("llama3.1-8b", 1, 65536, 8, "eagle")
    b = ms.step_bytes(LLAMA, case)
    assert b["kv"] == 32 * 2 * (65536 + 8) * 8 * 128 * 2
    # The dense model reads every weight but the embedding rows it does not look up.
    assert b["weights"] == pytest.approx(LLAMA.weight_bytes() - 2 * LLAMA.vocab * LLAMA.hidden,
                                         rel=1e-3)
    moe = ms.step_bytes(QWEN, ms.Case("qwen3-235b-a22b-tp8", 1, 4096, 8, "eagle"))
    assert moe["weights"] < QWEN.weight_bytes() / 2  # 8 tokens route to ~51 of 128 experts
    assert moe["total"] == moe["weights"] + moe["kv"]


def test_step_flops_are_the_token_matmuls_and_the_attention():
    case = ms.Case("llama3.1-8b", 1, 4096, 8, "eagle")
    f = ms.step_flops(LLAMA, case)
    params = 32 * (LLAMA.attention_params() + LLAMA.mlp_params()) + LLAMA.vocab * LLAMA.hidden
    assert f["matmul"] == 2 * 8 * params
    assert f["attention"] == 32 * 4 * 128 * 32 * 8 * (4096 + 8)


def test_every_layer_gets_its_pool_where_they_fit_and_they_take_turns_where_not():
    small = ms.Case("llama3.1-8b", 1, 4096, 16, "eagle")
    assert ms.kv_pools(LLAMA, small, 100e9) == 32
    big = ms.Case("llama3.1-8b", 8, 131072, 16, "eagle")
    per_layer = ms.kv_bytes_per_layer(LLAMA, big)  # 4.3 GB
    assert ms.kv_pools(LLAMA, big, 110e9) == int(110e9 // per_layer) < 32
    with pytest.raises(ValueError, match="L2"):
        ms.kv_pools(QWEN, ms.Case("qwen3-235b-a22b-tp8", 1, 4096, 16, "eagle"), 1e6)


def test_replays_take_about_two_seconds_within_3_to_15():
    assert ms.replays_for(1.0) == 15
    assert ms.replays_for(200.0) == 10
    assert ms.replays_for(900.0) == 3


def _row(label, **ms_by_method):
    methods = {m: ({"ms": v} if isinstance(v, float) else v) for m, v in ms_by_method.items()}
    return {"label": label, "methods": methods}


def test_the_table_gives_speedups_and_attentions_share_and_lists_what_did_not_run():
    rows = [_row("llama3.1-8b bs1 L64k D8 eagle", verify_ops=10.0, triton=150.0,
                 flashinfer=12.5, fa3={"skipped": "FA3 not here"}, none=5.0),
            _row("qwen3-235b-a22b-tp8 bs1 L4k D4 chain", verify_ops=8.0,
                 triton={"error": "WRONG: relative error 0.5"},
                 flashinfer={"skipped": "flashinfer not importable"},
                 fa3={"skipped": "FA3 not here"}, none=6.0)]
    lines = ms.format_table(rows).splitlines()
    assert lines[0].split()[:6] == ["model", "case", "ours", "ms", "triton", "x"]
    assert "fa3" not in lines[0]  # skipped on every row: no column
    assert lines[0].endswith("attention share verif/trito/flash")
    assert lines[2].split()[-7:] == ["10.000", "150.000", "15.00", "12.500", "1.25", "5.000",
                                     "50%/97%/60%"]
    assert lines[3].split()[-7:] == ["8.000", "-", "-", "-", "-", "6.000", "25%/-/-"]
    assert lines[4].endswith("llama3.1-8b bs1 L64k D8 eagle fa3: FA3 not here")
    assert lines[5].endswith("triton: WRONG: relative error 0.5")
    assert lines[6].endswith("flashinfer: flashinfer not importable")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_fails_at_once_and_says_why():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        ms.main(["--cases", "llama3.1-8b/1/4096/8/eagle", "--out", ""])


# Under Triton's interpreter the kernels run on the CPU, in float32 (it rounds
# bf16 unlike the GPU). BROKEN replaces one kernel by a wrong one: the check fails.
STEP_CHECK = textwrap.dedent("""
    import torch
    from bench import model_kernels as mk, model_step as ms
    if {broken!r} == "no-residual":
        add = mk.add_rmsnorm
        mk.add_rmsnorm = lambda x, r, w, o, eps, has_residual: add(x, r, w, o, eps, False)
    if {broken!r} == "first-expert":
        gemm = mk.moe_gemm
        mk.moe_gemm = lambda a, w, *rest, **kw: gemm(a, w[:1].expand_as(w).contiguous(), *rest, **kw)
    for cfg in ms.TINY_MODELS:
        torch.manual_seed(0)
        print(cfg.name, ms.check_step(cfg, device="cpu", dtype=torch.float32))
""")


def _interpreted_step_errors(broken=None):
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", STEP_CHECK.format(broken=broken)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: float(err) for name, err in (line.split() for line in done.stdout.splitlines())}


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")


@needs_triton
def test_the_fused_kernels_match_plain_torch_through_a_whole_step():
    errors = _interpreted_step_errors()
    assert set(errors) == {"tiny-dense", "tiny-moe"}
    assert max(errors.values()) < ms.STEP_CHECK_TOL


@needs_triton
def test_the_step_check_catches_a_dropped_residual_and_a_wrong_expert():
    assert min(_interpreted_step_errors("no-residual").values()) > ms.STEP_CHECK_TOL
    assert _interpreted_step_errors("first-expert")["tiny-moe"] > ms.STEP_CHECK_TOL
