"""CUDA-only limits of the contract: huge pools, very uneven batches, every D up to 128."""

import pytest
import torch

import verify_ops
from verify_ops.cases import make_case
from verify_ops.reference import relative_error, tree_attn_ref

pytestmark = pytest.mark.skipif(not verify_ops.has_cuda_kernel(),
                                reason="needs a GPU and a CUDA build of verify_ops")
TOL = 1e-2


def check_into_poisoned_out(case):
    """The out-variant writes into NaN: a row it misses fails the comparison."""
    out = torch.full_like(case.q, float("nan"))
    verify_ops.tree_attn_out(*case.args(), out)
    assert relative_error(out, tree_attn_ref(*case.args())) < TOL


def test_uneven_lengths_in_one_batch():
    case = make_case([1, 100_000, 0, 777], 8, 32, 8, 128, device="cuda", tree="eagle", seed=1)
    out = verify_ops.tree_attn(*case.args())
    assert relative_error(out, tree_attn_ref(*case.args())) < TOL


# Tens of KV tiles per split, so that every pipeline stage is refilled many
# times over (the stage barriers of the producer-warpgroup kernel, every head
# dim on sm_90a, change phase each time round); 96 rows per KV head, and 160
# at head_dim 256, where the producer kernel takes more than 128.
@pytest.mark.parametrize("head_dim,num_drafts", [(64, 12), (128, 12), (256, 12), (256, 20)])
def test_many_tiles_per_split(head_dim, num_drafts):
    case = make_case([60_000, 3], num_drafts, 16, 2, head_dim, device="cuda", tree="random",
                     seed=head_dim + num_drafts)
    check_into_poisoned_out(case)


@pytest.mark.parametrize("num_drafts", [1, 2, 15, 63, 64, 65, 100, 128])
@pytest.mark.parametrize("group", [1, 5, 16])
def test_every_tree_size(num_drafts, group):
    case = make_case([0, 1, 3000], num_drafts, 2 * group, 2, 128, device="cuda", seed=num_drafts)
    out = verify_ops.tree_attn(*case.args())
    assert relative_error(out, tree_attn_ref(*case.args())) < TOL


def test_context_beyond_int32_positions_is_refused():
    """The kernels count a request's tokens in 32 bits; a longer req_to_token row is refused."""
    case = make_case([10, 3], 4, 8, 2, 128, device="cuda", seed=3)
    args = list(case.args())
    args[3] = case.req_to_token[:, :1].expand(-1, 2**31)  # no memory behind it
    with pytest.raises(RuntimeError, match=r"at most 2\^31 - 1 positions per request "
                                           r"\(req_to_token.size\(1\)\), got 2147483648"):
        verify_ops.tree_attn(*args)


def test_more_request_kv_head_pairs_than_a_grid_row_takes_is_refused():
    """One grid row of CTAs per (request, KV head): CUDA allows 65535 rows."""
    bs = 65536
    q = torch.randn(bs, 1, 64, device="cuda").to(torch.bfloat16)
    k = torch.randn(4, 1, 64, device="cuda").to(torch.bfloat16)
    req_to_token = torch.zeros(bs, 2, dtype=torch.int32, device="cuda")
    rows = torch.arange(bs, dtype=torch.int32, device="cuda")
    seq_lens = torch.ones(bs, dtype=torch.int32, device="cuda")
    mask = torch.ones(bs, 1, 1, dtype=torch.bool, device="cuda")
    with pytest.raises(RuntimeError, match=r"at most 65535 \(request, KV head\) pairs "
                                           r"\(bs \* Hkv\), got 65536 \* 1"):
        verify_ops.tree_attn(q, k, k, req_to_token, rows, seq_lens, mask, 0.125)


def test_contiguous_q_at_an_unaligned_address():
    """A contiguous q 2 bytes off a 16-byte boundary (a view into a larger
    buffer) goes through an aligned copy: the kernels load Q 16 bytes at a time."""
    case = make_case([3000, 5], 8, 8, 2, 128, device="cuda", seed=4)
    flat = torch.empty(case.q.numel() + 1, dtype=case.q.dtype, device="cuda")
    q = flat[1:].view(case.q.shape)
    q.copy_(case.q)
    assert q.is_contiguous() and q.data_ptr() % 16 == 2
    args = list(case.args())
    args[0] = q
    out = verify_ops.tree_attn(*args)
    torch.cuda.synchronize()
    assert relative_error(out, tree_attn_ref(*case.args())) < TOL


def test_pool_beyond_int32_elements():
    """Slots whose element offset exceeds 2**31 need 64-bit addressing."""
    num_kv_heads, head_dim = 1, 128
    pool = (2**31) // (num_kv_heads * head_dim) + 4096
    small = make_case([3000, 5], 8, 8, num_kv_heads, head_dim, device="cuda", seed=2)
    k = torch.empty(pool, num_kv_heads, head_dim, dtype=torch.bfloat16, device="cuda")
    v = torch.empty_like(k)
    # Move every slot the case uses to the top of the pool.
    shift = pool - small.k_cache.shape[0]
    k[shift:] = small.k_cache
    v[shift:] = small.v_cache
    small.k_cache, small.v_cache = k, v
    small.req_to_token += shift
    assert int(small.req_to_token.min()) * num_kv_heads * head_dim > 2**31
    out = verify_ops.tree_attn(*small.args())
    ref_case = make_case([3000, 5], 8, 8, num_kv_heads, head_dim, device="cuda", seed=2)
    assert relative_error(out, tree_attn_ref(*ref_case.args())) < TOL


def test_hundreds_of_splits():
    """One request on one KV head at 64k: a split per half SM, merged across hundreds."""
    case = make_case([65536], 8, 4, 1, 128, device="cuda", tree="eagle", seed=3)
    check_into_poisoned_out(case)


@pytest.mark.parametrize("lens,num_kv_heads", [([20_000, 5, 7, 9], 2), ([40_000], 1)])
def test_both_merges(lens, num_kv_heads):
    """32 rows per KV head: on a 132-SM H200, 33 splits for four requests on
    two KV heads (the few-split merge, four split lanes per row, the first
    with a ninth split) and 264 for one on one (past the few-split merge's
    128 at head_dim 128: the split-parallel merge)."""
    case = make_case(lens, 8, 4 * num_kv_heads, num_kv_heads, 128, device="cuda",
                     tree="random", seed=len(lens))
    check_into_poisoned_out(case)


@pytest.mark.parametrize("head_dim,lens", [(64, [40_000]), (64, [20_000, 3]),
                                           (128, [15_000, 3]), (128, [20_000, 3])])
def test_few_split_merge_at_its_widest(head_dim, lens):
    """16 rows per KV head, one KV head: on a 132-SM H200, at head_dim 64 264
    splits cut to the few-split merge's 256 (16 split lanes of 16 splits, a
    whole merge CTA per row) and 132 beside a 3-token request; at 128, 118
    (8 lanes) and 132 cut to its 128."""
    case = make_case(lens, 4, 4, 1, head_dim, device="cuda", tree="random",
                     seed=head_dim + lens[0])
    check_into_poisoned_out(case)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 3, 5, 8, 22, 44])
def test_merge_at_every_split_count(head_dim, num_kv_heads):
    """One long request beside two that the attention kernel writes directly:
    on a 132-SM H200 the KV heads give 2-88 splits, so the merges see every
    number of split lanes per row, rows that share a CTA, and a last CTA that
    is only partly filled."""
    case = make_case([6000, 1, 0], 5, 3 * num_kv_heads, num_kv_heads, head_dim, device="cuda",
                     tree="random", seed=num_kv_heads * 1000 + head_dim)
    check_into_poisoned_out(case)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_merge_with_empty_split_lanes_and_unseen_splits(head_dim):
    """The 6000-token request sets tens of splits; the others fill two to five,
    so some split lanes of their merged rows hold no split. Draft 3 of request 1
    sees its prefix only, while that request's last split holds only drafts: a
    split LSE of -inf beside finite ones, alone in its lane or sharing it."""
    case = make_case([6000, 256, 300, 140], 8, 8, 1, head_dim, device="cuda", tree="random",
                     seed=head_dim + 7)
    case.tree_mask[1, 3] = False
    check_into_poisoned_out(case)


# (batch, KV heads, q heads per KV head, D, head_dim): on a 132-SM H200 these
# give 2-8 splits per (request, KV head, row tile), which merge inside their
# cluster, on every attention kernel: key split 2 and 4, the four-warp wgmma
# tile, the producer kernel at each head dim (two 128-row tiles in the last),
# and the eight-warp kernel at head_dim 256.
CLUSTER_CASES = [
    (16, 8, 4, 8, 128), (11, 8, 4, 8, 128), (8, 8, 4, 8, 128), (6, 8, 4, 8, 128),
    (5, 8, 4, 8, 128), (4, 8, 4, 8, 128), (8, 8, 4, 4, 64), (8, 8, 8, 8, 128),
    (8, 8, 8, 16, 128), (4, 8, 8, 16, 128), (2, 8, 8, 16, 128), (8, 4, 8, 16, 64),
    (8, 2, 8, 8, 256), (8, 2, 8, 16, 256), (8, 2, 8, 24, 256), (2, 4, 4, 64, 128),
]
RAGGED_PREFIXES = [5000, 0, 1, 256, 700, 3000, 128, 9000, 64, 2, 4100, 333, 17, 1500, 6000, 90]


@pytest.mark.parametrize("batch,num_kv_heads,group,num_drafts,head_dim", CLUSTER_CASES)
def test_splits_merged_in_a_cluster(batch, num_kv_heads, group, num_drafts, head_dim):
    """Ragged prefixes leave some requests fewer active splits than their
    cluster holds, and some none to merge (0-64 tokens). Prefixes of 128 and
    256 end on a split boundary, so a last split holds only drafts: the draft
    that sees none of them has a split LSE of -inf beside finite ones."""
    lens = RAGGED_PREFIXES[:batch]
    case = make_case(lens, num_drafts, group * num_kv_heads, num_kv_heads, head_dim,
                     device="cuda", tree="random", seed=batch * 100 + head_dim + num_drafts)
    for b, prefix in enumerate(lens):
        if prefix in (128, 256):
            case.tree_mask[b, num_drafts - 1] = False
    check_into_poisoned_out(case)
