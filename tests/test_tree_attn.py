"""verify.tree_attn against the float64 reference, on every device present."""

import itertools
import math

import pytest
import torch

import verify_ops
from verify_ops.cases import make_case
from verify_ops.reference import relative_error, tree_attn_ref

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
LENS = [0, 1, 37, 300, 5]


def check(case, tol):
    out = torch.full_like(case.q, float("nan"), memory_format=torch.contiguous_format)
    verify_ops.tree_attn_out(*case.args(), out)
    ref = tree_attn_ref(*case.args())
    err = relative_error(out, ref)
    assert err < tol, f"relative error {err:.3g} >= {tol}"
    functional = verify_ops.tree_attn(*case.args())
    assert torch.equal(functional, out)


@pytest.mark.parametrize("num_q_heads,num_kv_heads", [(4, 4), (8, 4), (8, 2), (16, 2), (16, 1)])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gqa_and_head_dims(device, num_q_heads, num_kv_heads, head_dim):
    case = make_case(LENS, 6, num_q_heads, num_kv_heads, head_dim, device=device,
                     seed=num_q_heads * 1000 + num_kv_heads * 10 + head_dim)
    check(case, TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("layout", ["fragmented", "contiguous"])
@pytest.mark.parametrize("strided_q", [False, True])
def test_dtypes_layouts_strides(device, dtype, index_dtype, layout, strided_q):
    if device == "cuda" and dtype == torch.float32:
        pytest.skip("float32 is a CPU-only dtype")
    case = make_case(LENS, 5, 8, 2, 64, dtype=dtype, device=device, index_dtype=index_dtype,
                     layout=layout, strided_q=strided_q, seed=7)
    check(case, TOL[dtype])


# 16, 32, 64, 96 and 160 rows per KV head: the CUDA kernel's key-split-4,
# key-split-2 and 64-row tiles (one warpgroup of wgmma on sm_90a), one 128-row
# tile (two warpgroups), and two 128-row tiles, the last with a warpgroup of
# padding rows; in both 16-bit dtypes, with a prefix long enough to split.
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("num_drafts", [2, 4, 8, 12, 20])
def test_row_tilings(device, dtype, head_dim, num_drafts):
    case = make_case([0, 1, 2500], num_drafts, 16, 2, head_dim, dtype=dtype, device=device,
                     tree="random", seed=num_drafts * 100 + head_dim)
    check(case, TOL[dtype])


# 72, 96 and 128 rows of a single (request, KV head) pair: on CUDA two 64-row
# tiles at head_dim 64 and 128, where more pairs take one 128-row tile; a
# prefix of 0, 1, or enough to split, ending inside a tile.
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("num_drafts", [9, 12, 16])
@pytest.mark.parametrize("prefix", [0, 1, 5003])
def test_one_kv_head_pair(device, head_dim, num_drafts, prefix):
    case = make_case([prefix], num_drafts, 8, 1, head_dim, device=device, tree="random",
                     seed=prefix + num_drafts * 10 + head_dim)
    check(case, TOL[torch.bfloat16])


@pytest.mark.parametrize("num_drafts,tree", [(1, "random"), (3, "chain"), (16, "eagle"),
                                             (33, "random"), (64, "eagle")])
def test_tree_shapes(device, num_drafts, tree):
    case = make_case([0, 1, 130], num_drafts, 8, 1, 128, device=device, tree=tree,
                     seed=num_drafts)
    check(case, TOL[torch.bfloat16])


# (D, group, head_dim, dtype): 16, 64, 128 and 256 rows per KV head, each head dim,
# and fp16, whose range (65504) bounds the probabilities the kernels accept.
@pytest.mark.parametrize("num_drafts,group,head_dim,dtype", [
    (8, 2, 128, torch.bfloat16), (8, 8, 128, torch.bfloat16), (16, 8, 128, torch.bfloat16),
    (16, 8, 128, torch.float16), (16, 8, 64, torch.bfloat16), (16, 8, 256, torch.bfloat16),
    (32, 8, 256, torch.float16)])
def test_scores_that_jump_along_the_context(device, num_drafts, group, head_dim, dtype):
    """Every 97 keys each score steps up by 2^24 (in softmax weight), seven
    times, then falls back: the running max keeps moving past the CUDA
    kernels' bounds (2^8 to move it, 2^15 for a probability), so their short
    path falls back to the full one and O is rescaled, tile after tile."""
    case = make_case([9000, 1, 2500], num_drafts, 2 * group, 2, head_dim, dtype=dtype,
                     device=device, seed=head_dim + num_drafts + group)
    # q . k gains q0 * k0 = level * top / 7: 24 * level in log2 units once scaled.
    top = 7 * 24 / (case.sm_scale * math.log2(math.e))
    q0 = math.sqrt(top)
    case.q[:, :, 0] += q0
    for b, prefix in enumerate(case.seq_lens.tolist()):
        total = prefix + num_drafts
        slots = case.req_to_token[case.req_pool_indices[b], :total].long()
        level = torch.arange(total, device=device) // 97 % 8
        case.k_cache[slots, :, 0] += (level * (top / q0 / 7)).to(dtype)[:, None]
    check(case, TOL[dtype])


def test_mixed_index_dtypes(device):
    case = make_case([3, 90], 4, 4, 2, 64, device=device, seed=3)
    case.req_pool_indices = case.req_pool_indices.long()
    case.seq_lens = case.seq_lens.long()
    check(case, TOL[torch.bfloat16])


def test_masked_out_rows_are_zero(device):
    case = make_case([0, 4], 4, 4, 4, 64, device=device, seed=11)
    case.tree_mask[0, 2] = False  # request 0 has no prefix: draft 2 sees nothing
    out = verify_ops.tree_attn(*case.args())
    assert torch.equal(out[2].float(), torch.zeros_like(out[2].float()))
    assert relative_error(out, tree_attn_ref(*case.args())) < TOL[torch.bfloat16]


def test_output_ignores_unowned_slots(device):
    """Scribbling over slots no request owns must not change the result."""
    case = make_case(LENS, 4, 8, 2, 64, device=device, seed=5)
    before = verify_ops.tree_attn(*case.args())
    nan_rows = torch.isnan(case.k_cache.float()).any(-1).any(-1)
    case.k_cache[nan_rows] = 1e4
    case.v_cache[nan_rows] = -1e4
    after = verify_ops.tree_attn(*case.args())
    assert torch.equal(before, after)


def test_strided_out(device):
    case = make_case([20, 3], 4, 4, 2, 64, device=device, seed=9)
    wide = torch.full((case.q.shape[0], 8, 64), float("nan"), dtype=case.q.dtype, device=device)
    out = wide[:, 2:6]
    verify_ops.tree_attn_out(*case.args(), out)
    assert relative_error(out, tree_attn_ref(*case.args())) < TOL[torch.bfloat16]
    assert torch.isnan(wide[:, :2].float()).all() and torch.isnan(wide[:, 6:].float()).all()


def test_out_variant_bumps_the_version_of_out(device):
    """As ATen's in-place ops do, so that autograd refuses a tensor it saved
    for backward and that was overwritten since."""
    case = make_case([20, 3], 4, 4, 2, 64, device=device, seed=10)
    out = torch.empty_like(case.q)
    version = out._version
    verify_ops.tree_attn_out(*case.args(), out)
    assert out._version > version
    weights = torch.ones_like(case.q, requires_grad=True)
    loss = (weights * out).sum()  # saves out for the gradient of weights
    verify_ops.tree_attn_out(*case.args(), out)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_out_made_under_inference_mode_is_written_outside_it(device):
    """Such a tensor has no version counter: the op writes it, as it did
    before it bumped versions (SGLang may allocate buffers either way)."""
    case = make_case([20, 3], 4, 4, 2, 64, device=device, seed=11)
    with torch.inference_mode():
        out = torch.full_like(case.q, float("nan"))
    verify_ops.tree_attn_out(*case.args(), out)
    assert relative_error(out, tree_attn_ref(*case.args())) < TOL[torch.bfloat16]


@pytest.mark.parametrize("sm_scale", [0.7, -0.05, 0.0])
def test_any_softmax_scale(device, sm_scale):
    """The CUDA kernels scale each tile's max rather than each score, so a
    negative or zero scale takes another route there."""
    case = make_case([0, 1, 700], 6, 8, 2, 128, device=device, tree="random", seed=21)
    case.sm_scale = sm_scale
    check(case, TOL[torch.bfloat16])


def test_empty_batch(device):
    case = make_case([], 4, 4, 2, 64, device=device)
    assert verify_ops.tree_attn(*case.args()).shape == (0, 4, 64)


def test_no_query_heads(device):
    case = make_case([3, 5], 4, 4, 2, 64, device=device)
    q = case.q[:, :0]
    out = torch.empty_like(q)
    verify_ops.tree_attn_out(q, *case.args()[1:], out)
    assert verify_ops.tree_attn(q, *case.args()[1:]).shape == (8, 0, 64)


@pytest.mark.parametrize("seed", range(4))
def test_random_configurations(device, seed):
    gen = torch.Generator().manual_seed(100 + seed)
    pick = lambda xs: xs[int(torch.randint(len(xs), (1,), generator=gen))]  # noqa: E731
    num_kv_heads = pick([1, 2, 4])
    group = pick([1, 3, 8, 16])
    lens = torch.randint(0, 200, (pick([1, 2, 5]),), generator=gen).tolist()
    case = make_case(lens, pick([2, 7, 24]), num_kv_heads * group, num_kv_heads,
                     pick([64, 128, 256]), device=device, layout=pick(["fragmented", "contiguous"]),
                     strided_q=bool(seed % 2), index_dtype=pick([torch.int32, torch.int64]),
                     tree=pick(["random", "eagle"]), seed=seed)
    check(case, TOL[torch.bfloat16])
