"""The CPU kernel's own structure: KV tiles of up to 256 tokens, the KV range split
across threads when (request, KV head) pairs are fewer than them, the
vectorized softmax, and the bf16 tile products (bf16 cases on a CPU with
AMX) beside the fp32 ones, against the float64 reference.

Thread counts above the machine's cores are fine here: at::get_num_threads()
decides the splits, whatever the cores."""

import pytest
import torch

import verify_ops
from verify_ops.cases import make_case

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
TILE = 256  # kTileTokens in csrc/cpu/tree_attn_cpu.cpp
MAX_TILE = TILE + 64  # kMaxTileTokens: a range's last tile takes up to this many keys


@pytest.fixture
def threads():
    """Sets torch's thread count for one test and restores it afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def verify_ops_uses_amx() -> bool:
    """Whether oneDNN's brgemm has bf16 kernels here (what could_pack(BFloat16) asks)."""
    try:
        with open("/proc/cpuinfo") as f:
            return torch.backends.mkldnn.is_available() and "amx_bf16" in f.read()
    except OSError:
        return False


def run(case, **extra):
    """out and lse from NaN-poisoned buffers, which must be fully written."""
    out = torch.full_like(case.q, float("nan"))
    lse = torch.full(case.q.shape[:2], float("nan"))
    verify_ops.tree_attn_out(*case.args(), out, **case.options, **extra, lse=lse)
    assert not out.isnan().any() and not lse.isnan().any()
    return out, lse


def check(case, **extra):
    out, lse = run(case, **extra)
    ref, ref_lse = verify_ops.tree_attn_ref(*case.args(), **case.options, **extra,
                                            return_lse=True)
    err = verify_ops.relative_error(out, ref)
    assert err < TOL[case.q.dtype], f"relative error {err:.3g}"
    assert torch.equal(lse.isinf(), ref_lse.isinf())
    finite = ref_lse.isfinite()
    assert torch.allclose(lse.double()[finite], ref_lse[finite], atol=2e-3, rtol=1e-4)
    return out, lse


# One pair and a few threads: up to 7 splits in steps of 16 tokens, at least
# 128 tokens each (none below 128 tokens), tiles ending on and off 256, a
# range of exactly MAX_TILE keys (one tile) and of one more (two).
@pytest.mark.parametrize("num_threads", [2, 3, 7])
@pytest.mark.parametrize("prefix", [0, 1, TILE - 4, TILE, MAX_TILE - 8, MAX_TILE - 7,
                                    3 * TILE + 17])
def test_split_kv_range(threads, num_threads, prefix):
    threads(num_threads)
    case = make_case([prefix], 8, 8, 1, 64, dtype=torch.float32, tree="random",
                     seed=prefix + num_threads)
    check(case)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn, torch.float8_e5m2],
                         ids=["kv=q", "e4m3", "e5m2"])
def test_split_dtypes(threads, dtype, kv_dtype):
    threads(4)
    case = make_case([2 * TILE + 9, 40], 6, 4, 1, 64, dtype=dtype, kv_dtype=kv_dtype,
                     kv_scales=kv_dtype is not None, seed=3)
    check(case)


# Every option, with and without splits, over several tiles: the window's
# edge falls inside a tile, before it whole tiles are skipped.
@pytest.mark.parametrize("num_threads", [1, 4])
@pytest.mark.parametrize("window", [-1, 0, 7, TILE + 30])
def test_options_across_tiles_and_splits(threads, num_threads, window):
    threads(num_threads)
    case = make_case([0, 1, 3 * TILE + 100], 9, 6, 2, 32, dtype=torch.float32, tree="eagle",
                     sinks=True, logit_cap=5.0, kv_scales=True, sliding_window=window,
                     seed=window + 10)
    check(case)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [8, 9, 36, 256])
@pytest.mark.parametrize("group", [1, 16])
def test_head_dims_and_wide_groups(dtype, head_dim, group):
    """Head dims that are no multiple of the vector width (an odd one takes the
    fp32 products in bf16 too); 24 drafts x 16 q heads = 384 rows per KV head."""
    case = make_case([TILE + 3, 5], 24, 2 * group, 2, head_dim, dtype=dtype,
                     seed=head_dim + group)
    check(case)


def test_soft_cap_saturates_and_keeps_small_scores():
    """Scores far beyond the cap (tanh -> +-1) and near zero (tanh(y) ~ y) alike."""
    case = make_case([600], 4, 4, 1, 64, dtype=torch.float32, seed=21)
    case.q.mul_(40.0)
    for cap in (0.5, 1e3):
        check(case, logit_cap=cap)


def test_scores_spanning_the_exp_range():
    """Scores from -200 to +200 around each row's max: the vectorized exp
    flushes below e^-87 and stays exact near 0."""
    case = make_case([700], 4, 4, 1, 64, dtype=torch.float32, seed=5)
    scale = torch.linspace(0.01, 30.0, 700 + 4)
    slots = case.req_to_token[int(case.req_pool_indices[0]), :704].long()
    case.k_cache[slots] *= scale[:, None, None]
    check(case)


@pytest.mark.parametrize("num_threads", [1, 4])
def test_splits_keep_the_defrag_invariant(threads, num_threads):
    """With splits too, the output depends on where slots lie only through their values."""
    threads(num_threads)
    case = make_case([2 * TILE + 50, 3], 5, 4, 1, 64, layout="fragmented", seed=8)
    before, before_lse = run(case)
    rows = case.req_pool_indices.long().tolist()
    total = (case.seq_lens + 5).tolist()
    src = torch.cat([case.req_to_token[r, :n] for r, n in zip(rows, total)]).long()
    pool = case.k_cache.shape[0]
    dst = torch.arange(pool, pool + src.numel())
    grow = lambda c: torch.cat([c, torch.full_like(c[: src.numel()], float("nan"))])  # noqa: E731
    case.k_cache, case.v_cache = grow(case.k_cache), grow(case.v_cache)
    verify_ops.relocate_kv([case.k_cache], [case.v_cache], src, dst)
    offset = 0
    for r, n in zip(rows, total):
        case.req_to_token[r, :n] = dst[offset: offset + n].to(case.req_to_token.dtype)
        offset += n
    after, after_lse = run(case)
    assert torch.equal(after, before) and torch.equal(after_lse, before_lse)


def test_thread_counts_agree_to_rounding(threads):
    """The split count follows the thread count, so results may differ in the
    last bits between thread counts, never by more."""
    case = make_case([5 * TILE], 8, 8, 1, 64, dtype=torch.float32, seed=13)
    outs = []
    for count in (1, 2, 5):
        threads(count)
        outs.append(run(case)[0])
    for other in outs[1:]:
        assert torch.allclose(other, outs[0], rtol=1e-5, atol=1e-6)


def test_window_never_reads_before_its_start_with_splits(threads):
    threads(6)
    case = make_case([4 * TILE + 11], 4, 4, 1, 64, dtype=torch.float32, tree="chain", seed=2)
    expected = verify_ops.tree_attn(*case.args(), sliding_window=TILE + 5)
    row = case.req_to_token[int(case.req_pool_indices[0])]
    stale = row[: 4 * TILE + 11 - (TILE + 5)].long()
    case.k_cache[stale] = float("nan")
    case.v_cache[stale] = float("nan")
    assert torch.equal(verify_ops.tree_attn(*case.args(), sliding_window=TILE + 5), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_without_onednn(monkeypatch, dtype):
    """With oneDNN off, brgemm has no JIT kernels: bf16 takes the fp32 products,
    and both go through the BLAS gemm."""
    case = make_case([2 * TILE + 7, 0], 6, 8, 2, 64, dtype=dtype, sinks=True, seed=17)
    with_onednn, _ = check(case)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    assert not torch.backends.mkldnn.enabled
    without, _ = check(case)
    if dtype == torch.bfloat16 and verify_ops_uses_amx():
        assert not torch.equal(without, with_onednn)  # two different paths ran
    assert torch.allclose(without.float(), with_onednn.float(), atol=2 * TOL[dtype], rtol=0.05)


# SchemaCheckMode compares tensors with ops fp8 lacks on CPU ("mul_cpu_reduced_float"
# not implemented for Float8_e4m3fn): fp8 pools skip test_schema.
@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn], ids=["kv=q", "e4m3"])
def test_opcheck_with_every_option(threads, kv_dtype):
    """torch.library.opcheck of both ops on the CPU kernel, with splits (four
    threads, three pairs), every option and lse: schema (what is written),
    fake kernel against the real one, autograd registration, AOT dispatch."""
    threads(4)
    case = make_case([300, 0, 1], 5, 4, 1, 64, dtype=torch.bfloat16, kv_dtype=kv_dtype,
                     tree="random", kv_scales=True, sinks=True, logit_cap=5.0,
                     sliding_window=200, seed=4)
    utils = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    if kv_dtype is None:
        utils = ("test_schema",) + utils
    out = torch.empty_like(case.q)
    lse = torch.empty(case.q.shape[:2])
    torch.library.opcheck(torch.ops.verify.tree_attn_out.default, (*case.args(), out),
                          dict(case.options, lse=lse), test_utils=utils)
    torch.library.opcheck(torch.ops.verify.tree_attn.default, case.args(), dict(case.options),
                          test_utils=utils)
