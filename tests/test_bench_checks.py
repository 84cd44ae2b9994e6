"""bench/: the oracle checks that gate every timed method (issue 4: "Tests verify the
table's oracle outputs before timing")."""

import dataclasses

import pytest
import torch

import verify_ops
from bench.bench_tree_attn import format_table
from bench.oracle import CHECK_TOL, check_method, short_check_shape
from bench.workload import Shape, make_workload
from verify_ops.cases import make_case
from verify_ops.reference import relative_error, tree_attn_ref

needs_cuda = pytest.mark.skipif(not verify_ops.has_cuda_kernel(),
                                reason="needs a GPU and a CUDA build of verify_ops")


def _tree_blind_errors(seq_len):
    """Relative errors of a correct bf16 output and of one that drops the drafts."""
    case = make_case([seq_len], 8, 8, 1, 128, tree="eagle", seed=1)
    args = list(case.args())
    ref = tree_attn_ref(*args)
    args[6] = torch.zeros_like(args[6])  # no draft visible: the tree ignored
    blind = tree_attn_ref(*args).to(torch.bfloat16).float()
    return relative_error(ref.to(torch.bfloat16).float(), ref), relative_error(blind, ref)


def test_the_long_check_alone_misses_a_tree_blind_method_and_the_short_one_catches_it():
    good, blind = _tree_blind_errors(16384)
    assert good < CHECK_TOL and blind < CHECK_TOL  # why the short check exists
    short = short_check_shape(Shape(1, 16384, 8, 8, 1, 128, "fragmented"))
    good, blind = _tree_blind_errors(short.seq_len)
    assert good < CHECK_TOL <= blind


def test_short_check_keeps_everything_but_the_context():
    s = Shape(8, 65536, 4, 32, 4, 64, "contiguous", "chain")
    c = short_check_shape(s)
    assert (c.batch, c.num_drafts, c.num_q_heads, c.num_kv_heads, c.head_dim, c.layout,
            c.tree) == (8, 4, 32, 4, 64, "contiguous", "chain")
    assert c.seq_len < s.seq_len


def test_the_table_says_wrong_for_a_method_that_failed_its_check():
    s = Shape(1, 4096, 8, 32, 8, 128, "fragmented")
    row = {"shape": s.__dict__, "label": s.label(), "num_layers": s.num_layers,
           "roofline_us": 4.0, "methods": {"verify_ops": {"error": "WRONG: relative error 0.5"},
                                          "triton": {"us": 250.0}}}
    assert "WRONG" in format_table([row], ["verify_ops", "triton"]).splitlines()[2]


def _row(methods):
    s = Shape(1, 4096, 8, 32, 8, 128, "fragmented")
    return {"shape": s.__dict__, "label": s.label(), "num_layers": s.num_layers,
            "roofline_us": 4.0, "methods": methods}


def test_a_skipped_method_says_skip_in_its_row_and_why_under_the_table():
    rows = [_row({"verify_ops": {"us": 10.0}, "flashinfer": {"skipped": "not importable"},
                  "triton": {"us": 250.0}}),
            _row({"verify_ops": {"us": 10.0}, "flashinfer": {"us": 20.0}})]
    lines = format_table(rows, ["verify_ops", "flashinfer", "triton"]).splitlines()
    assert lines[2].split()[-3:] == ["skip", "250.0", "25.00"]
    assert lines[3].split()[-3:] == ["20.0", "2.00", "-"]
    assert lines[-1] == "flashinfer skipped: not importable"


def test_a_method_skipped_on_every_row_gets_no_column():
    rows = [_row({"verify_ops": {"us": 10.0}, "fa3": {"skipped": "FA3 not here"},
                  "triton": {"us": 250.0}})]
    lines = format_table(rows, ["verify_ops", "fa3", "triton"]).splitlines()
    assert "fa3" not in lines[0] and "triton" in lines[0]
    assert lines[2].split()[-2:] == ["250.0", "25.00"]
    assert lines[-1] == "fa3 skipped: FA3 not here"


def test_run_method_reports_an_absent_package_as_skipped_and_times_nothing(monkeypatch):
    import bench.bench_tree_attn as bta
    from bench.methods import METHODS, MethodUnavailable

    def absent(w):
        raise MethodUnavailable("flashinfer not importable: ModuleNotFoundError")

    monkeypatch.setitem(METHODS, "absent", absent)  # the dict both modules share
    w = make_workload(Shape(1, 40, 4, 4, 1, 64, "fragmented"), num_layers=1, device="cpu")
    result = bta.run_method("absent", w, w, None, 1.0)
    assert result == {"skipped": "flashinfer not importable: ModuleNotFoundError"}


# Flex reads the KV that SDPA's gather builds, so one layout covers it (each
# case costs Flex a compile).
METHOD_LAYOUTS = [("verify_ops", "fragmented"), ("verify_ops", "contiguous"),
                  ("flashinfer", "fragmented"), ("flashinfer", "contiguous"),
                  ("fa3", "fragmented"), ("fa3", "contiguous"),
                  ("triton", "fragmented"), ("triton", "contiguous"),
                  ("sdpa", "fragmented"), ("sdpa", "contiguous"), ("flex", "fragmented")]
GPU_ONLY = ("triton", "flashinfer", "fa3")


# On CPU: the methods that run there (Triton's interpreter gets bf16 wrong;
# FlashInfer and FA3 have no CPU kernels), at two small shapes.
@pytest.mark.parametrize("batch,seq_len,drafts,heads", [(2, 100, 8, (8, 2, 64)),
                                                      (1, 40, 16, (4, 1, 128))])
@pytest.mark.parametrize("method,layout", [(m, lay) for m, lay in METHOD_LAYOUTS
                                           if m not in GPU_ONLY])
def test_every_method_matches_the_reference_on_cpu(method, layout, batch, seq_len, drafts,
                                                   heads):
    w = make_workload(Shape(batch, seq_len, drafts, *heads, layout), num_layers=2, device="cpu")
    assert check_method(method, w) < CHECK_TOL


def test_flex_falls_back_to_its_main_kernel_where_the_default_does_not_compile(monkeypatch):
    from bench import methods
    real_compile = torch.compile

    def default_fails(fn, **kwargs):  # as NoValidChoicesError did at D32-D64 with GQA
        compiled = real_compile(fn, **kwargs)

        def call(*args, kernel_options=None, **kw):
            if kernel_options is None:
                raise RuntimeError("injected: no valid kernel")
            return compiled(*args, kernel_options=kernel_options, **kw)
        return call

    monkeypatch.setattr(torch, "compile", default_fails)
    w = make_workload(Shape(1, 100, 8, 8, 2, 64, "fragmented"), num_layers=1, device="cpu")
    calls = methods.prepare_flex(w)
    assert "FORCE_USE_FLEX_ATTENTION" in calls[0].note
    assert check_method("flex", w) < CHECK_TOL


@needs_cuda
@pytest.mark.parametrize("batch,seq_len,drafts,heads,tree", [(1, 300, 8, (32, 8, 128), "eagle"),
                                                           (2, 1000, 16, (8, 1, 128), "eagle"),
                                                           (1, 500, 8, (16, 2, 256), "eagle"),
                                                           (2, 200, 16, (32, 4, 64), "eagle"),
                                                           (2, 700, 4, (8, 1, 128), "chain")])
@pytest.mark.parametrize("method,layout", METHOD_LAYOUTS)
def test_every_method_matches_the_reference_on_every_layer(method, layout, batch, seq_len,
                                                          drafts, heads, tree):
    if method == "triton":
        pytest.importorskip("sglang.kernels.ops.attention.extend_attention")
    if method == "flashinfer":
        pytest.importorskip("flashinfer")
    if method == "fa3":
        from bench.methods import MethodUnavailable, load_fa3
        try:
            load_fa3()
        except MethodUnavailable as exc:
            pytest.skip(str(exc))
    w = make_workload(Shape(batch, seq_len, drafts, *heads, layout, tree), num_layers=2)
    assert check_method(method, w) < CHECK_TOL


@needs_cuda
def test_run_case_reports_a_wrong_method_and_does_not_time_it(monkeypatch):
    import bench.bench_tree_attn as bta
    from bench import methods

    def tree_blind(w):  # SDPA with every draft visible (w itself is left as it was)
        return methods.prepare_sdpa(dataclasses.replace(w, tree_mask=torch.ones_like(w.tree_mask)))

    monkeypatch.setitem(bta.METHODS, "blind", tree_blind)
    timed = []
    monkeypatch.setattr(bta, "time_per_layer_us", lambda calls: timed.append(1) or 1.0)
    row = bta.run_case(Shape(1, 65536, 8, 8, 1, 128, "fragmented"), ["blind"],
                       {"copy_bytes_per_s": 4e12, "matmul_flops_per_s": 7e14})
    assert "WRONG" in row["methods"]["blind"]["error"] and not timed
