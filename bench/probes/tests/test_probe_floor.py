"""bench/probes/floor_probe.py: issue 4's target times, the reachability verdict, the chain
kernel's output check, and the probe end to end on a GPU."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from bench.probes.floor_probe import (PEAK_FLOP_PER_SM_CLOCK, check_chain, expected_chain,
                                      floor_us, format_table, least_us, math_at_peak_us,
                                      peak_flops_per_s, reachable, targets_us)
from bench.workload import Shape, make_workload

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")


def test_a_memory_bound_case_of_64_mb_or_more_targets_85_percent():
    t = targets_us(kv_bytes=2.1e9, roofline_us=500.0, bound="memory", batch=8, seq_len=65536,
                   num_drafts=8)
    assert t["target_pct_us"] == pytest.approx(500.0 / 0.85)
    assert t["target_short_us"] is None


def test_a_memory_bound_case_under_64_mb_has_no_percentage_target():
    t = targets_us(kv_bytes=63.9e6, roofline_us=15.0, bound="memory", batch=1, seq_len=65536,
                   num_drafts=8)
    assert t == {"target_pct_us": None, "target_short_us": None}


def test_a_math_bound_case_targets_50_percent_at_any_size():
    t = targets_us(kv_bytes=1e6, roofline_us=3.0, bound="math", batch=8, seq_len=16384,
                   num_drafts=64)
    assert t["target_pct_us"] == pytest.approx(6.0)
    assert t["target_short_us"] is None


def test_batch_1_at_4k_with_up_to_16_drafts_targets_8_us_beside_its_percentage():
    s = Shape(1, 4096, 8, 64, 8, 128, "fragmented")
    t = targets_us(s.kv_bytes, roofline_us=1.2, bound="math", batch=s.batch, seq_len=s.seq_len,
                   num_drafts=s.num_drafts)
    assert t == {"target_pct_us": pytest.approx(2.4), "target_short_us": 8.0}
    for batch, seq_len, drafts in [(8, 4096, 8), (1, 16384, 8), (1, 4096, 32)]:
        assert targets_us(1e6, 1.0, "memory", batch, seq_len, drafts)["target_short_us"] is None
    assert targets_us(1e6, 1.0, "memory", 1, 4096, 16)["target_short_us"] == 8.0


def test_an_unknown_bound_is_an_error():
    with pytest.raises(ValueError):
        targets_us(1e6, 1.0, "latency", 1, 4096, 8)


def test_reachable_only_while_the_least_time_fits_every_target_that_applies():
    assert reachable(5.0, None, None)
    assert reachable(5.0, 5.0, 8.0)
    assert not reachable(9.0, None, 8.0)       # the 8 µs target alone
    assert not reachable(9.0, 8.5, None)       # the percentage target alone
    assert not reachable(7.0, 6.0, 8.0)        # under 8 µs, over the percentage target
    assert not reachable(7.0, 20.0, 6.5)


def test_the_floor_is_the_shorter_chain_plain_or_with_dependent_launch():
    assert floor_us({"chain_us": 1.6, "chain_pdl_us": 1.2}) == 1.2
    assert floor_us({"chain_us": 1.6, "chain_pdl_us": 1.9}) == 1.6
    assert floor_us({"chain_us": 1.6, "chain_pdl_us": None}) == 1.6  # a device without PDL


def test_the_peak_rate_of_an_h200_counts_tensor_and_cuda_cores_at_the_max_clock():
    peak = peak_flops_per_s(9, 132, 1.98e9)
    assert peak == pytest.approx((4096 + 512) * 132 * 1.98e9)
    assert peak > 989.4e12 * 1.98 / 1.83  # above the tensor cores' rate alone at that clock
    assert peak_flops_per_s(9, 132, None) is None  # clock unknown
    assert 12 not in PEAK_FLOP_PER_SM_CLOCK and peak_flops_per_s(12, 84, 2.6e9) is None


def test_the_least_time_is_the_floor_plus_the_math_at_the_peak_rate():
    assert math_at_peak_us(2e9, 1e15) == pytest.approx(2.0)
    assert math_at_peak_us(2e9, None) is None
    assert least_us({"floor_us": 1.3, "math_at_peak_us": 0.45}) == pytest.approx(1.75)
    assert least_us({"floor_us": 1.3, "math_at_peak_us": None}) == 1.3  # peak unknown


def test_a_target_between_the_floor_and_the_least_time_is_out_of_reach():
    # Arithmetic only (a made-up floor and matmul rate): a math-bound case whose
    # 50 % target passes the floor alone but not the floor plus its math at peak.
    s = Shape(1, 4096, 32, 8, 1, 128, "contiguous")
    floor, matmul_rate, peak = 1.3, 760e12, peak_flops_per_s(9, 132, 1.98e9)
    target = targets_us(s.kv_bytes, s.flops / matmul_rate * 1e6, "math", s.batch, s.seq_len,
                        s.num_drafts)["target_pct_us"]
    assert target == pytest.approx(2 * s.flops / matmul_rate * 1e6)
    row = {"floor_us": floor, "math_at_peak_us": math_at_peak_us(s.flops, peak)}
    assert least_us(row) == pytest.approx(floor + s.flops / peak * 1e6)
    assert floor < target < least_us(row)
    assert reachable(floor, target, None) and not reachable(least_us(row), target, None)


def test_the_table_marks_missing_targets_and_unreachable_cases():
    row = {"label": "bs1 L4k D8 8/1/128 frag", "roofline_us": 0.5, "bound": "memory",
           "target_pct_us": None, "target_short_us": 8.0, "empty_us": 2.1, "chain_us": 9.0,
           "empty_pdl_us": 1.25, "chain_pdl_us": 8.75, "math_at_peak_us": 0.31,
           "least_us": 9.06, "reachable": False}
    line = format_table([row]).splitlines()[2]
    assert " - " in line and "8.0" in line and "1.25" in line and "8.75" in line
    assert line.split()[-3:] == ["0.31", "9.06", "NO"]
    no_pdl = format_table([{**row, "empty_pdl_us": None, "chain_pdl_us": None,
                            "math_at_peak_us": None, "least_us": 9.0}]).splitlines()[2]
    assert no_pdl.split()[-6:] == ["9.00", "-", "-", "-", "9.00", "NO"]


def _naive_chain(w, layer):
    """The chain's output by loops, independently of expected_chain's indexing."""
    s, lay = w.shape, w.layers[layer]
    out = torch.empty_like(lay.q)
    group = s.num_q_heads // s.num_kv_heads
    for b in range(s.batch):
        slot = int(w.req_to_token[w.req_pool_indices[b], w.seq_lens[b] + s.num_drafts - 1])
        for t in range(s.num_drafts):
            for qh in range(s.num_q_heads):
                out[b * s.num_drafts + t, qh] = (lay.k_cache[slot, qh // group].float()
                                                 + lay.v_cache[slot, qh // group].float())
    return out


@pytest.mark.parametrize("shape", [Shape(2, 100, 8, 8, 2, 64, "fragmented"),
                                   Shape(3, 40, 4, 32, 8, 128, "contiguous")])
def test_expected_chain_is_the_last_drafts_k_plus_v_row_on_every_row(shape):
    w = make_workload(shape, num_layers=2, device="cpu")
    assert torch.equal(expected_chain(w, 1), _naive_chain(w, 1))


def test_check_chain_raises_on_one_wrong_element_and_on_unwritten_rows():
    w = make_workload(Shape(2, 100, 8, 8, 2, 64, "fragmented"), num_layers=1, device="cpu")
    out = expected_chain(w, 0).clone()
    check_chain(w, 0, out)
    out[5, 3, 7] += 1
    with pytest.raises(RuntimeError, match="1 of"):
        check_chain(w, 0, out)
    out = expected_chain(w, 0).clone()
    out[-1] = float("nan")  # as verify's poisoning leaves a row the kernel skipped
    with pytest.raises(RuntimeError):
        check_chain(w, 0, out)


# Triton's interpreter runs the kernels on the CPU; it rounds float32 to bf16
# differently from the GPU, so this runs them on float32 copies of the caches.
INTERPRETED = textwrap.dedent("""
    import dataclasses, torch
    from bench.probes import floor_probe as fp
    from bench.workload import parse_case
    from bench.workload import Layer, make_workload
    for case in {cases!r}:
        w = make_workload(parse_case(case), num_layers=2, device="cpu")
        w = dataclasses.replace(w, layers=[Layer(*(t.float() for t in (l.q, l.k_cache, l.v_cache)))
                                           for l in w.layers])
        outs = [torch.empty_like(l.q) for l in w.layers]
        ones = [torch.empty(1) for _ in w.layers]
        fp.verify(w, outs, [fp.chain_call(w, i, o) for i, o in enumerate(outs)],
                  ones, [fp.empty_call(o) for o in ones])
    print("interpreted ok")
""")


@needs_triton
def test_the_kernels_write_what_the_check_expects_under_tritons_interpreter():
    # D64 with 8 q heads per KV head: 512 rows per program pair, 16 row blocks.
    cases = ["2/100/8/8/2/64/fragmented", "1/30/16/8/1/128/contiguous",
             "2/40/64/16/2/256/fragmented", "2/20/64/64/8/128/fragmented"]
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", INTERPRETED.format(cases=cases)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "interpreted ok" in done.stdout


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_probe_times_two_tiny_cases_and_writes_their_rows(tmp_path):
    from bench.probes import floor_probe

    out = tmp_path / "floor.json"
    cases = "1/64/8/8/1/128/fragmented,1/64/4/32/8/128/contiguous"
    rows = floor_probe.main(["--cases", cases, "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["rows"] == json.loads(json.dumps(rows))
    assert saved["meta"]["copy_bytes_per_s"] > 0 and saved["meta"]["matmul_flops_per_s"] > 0
    assert [r["label"] for r in saved["rows"]] == ["bs1 L64 D8 8/1/128 frag",
                                                   "bs1 L64 D4 32/8/128 cont"]
    pdl = floor_probe.supports_dependent_launch()
    for r in saved["rows"]:
        assert 0 < r["empty_us"] < 1e3 and 0 < r["chain_us"] < 1e3
        for key in ("empty_pdl_us", "chain_pdl_us"):
            assert (0 < r[key] < 1e3) if pdl else r[key] is None
        assert r["floor_us"] == floor_us(r)
        peak = saved["meta"]["peak_flops_per_s"]
        assert peak is None or peak > saved["meta"]["matmul_flops_per_s"]
        assert r["math_at_peak_us"] == math_at_peak_us(r["flops"], peak)
        assert r["least_us"] == least_us(r) >= r["floor_us"]
        assert r["bound"] in ("memory", "math") and r["roofline_us"] > 0
        want = targets_us(r["kv_bytes"], r["roofline_us"], r["bound"], r["shape"]["batch"],
                          r["shape"]["seq_len"], r["shape"]["num_drafts"])
        assert {k: r[k] for k in want} == want
        assert r["reachable"] is reachable(r["least_us"], r["target_pct_us"],
                                           r["target_short_us"])
