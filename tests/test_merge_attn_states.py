"""merge_attn_states: its arithmetic against merge_attn_states_ref, and against the op:
one request's keys split into two disjoint parts, each computed with its LSE,
merge to the op on the whole."""

from dataclasses import replace

import pytest
import torch

import verify_ops
from verify_ops.cases import make_case

INF = float("inf")


def random_states(rows, heads, head_dim, dtype, seed, device="cpu", lse_scale=5.0):
    gen = torch.Generator().manual_seed(seed)
    outs = [torch.randn(rows, heads, head_dim, generator=gen).to(device, dtype)
            for _ in range(2)]
    lses = [lse_scale * torch.randn(rows, heads, generator=gen).to(device) for _ in range(2)]
    return outs[0], lses[0], outs[1], lses[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_reference(device, dtype):
    out_a, lse_a, out_b, lse_b = random_states(37, 4, 64, dtype, seed=1, device=device)
    # Empty parts: a alone, b alone, both (rows 0-2); far-apart LSEs (rows 3-4).
    lse_a[0], lse_b[1] = -INF, -INF
    lse_a[2], lse_b[2] = -INF, -INF
    lse_a[3], lse_b[3] = 900.0, -900.0
    lse_a[4], lse_b[4] = -1e4, -1e4 + 1.0
    out, lse = verify_ops.merge_attn_states(out_a, lse_a, out_b, lse_b)
    ref, ref_lse = verify_ops.merge_attn_states_ref(out_a, lse_a, out_b, lse_b)
    assert out.dtype == dtype and lse.dtype == torch.float32
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert verify_ops.relative_error(out, ref) < tol
    assert torch.equal(lse.isinf(), ref_lse.isinf())
    assert torch.allclose(lse.double()[ref_lse.isfinite()], ref_lse[ref_lse.isfinite()],
                          rtol=1e-6, atol=1e-4)
    # Exact where one side weighs nothing; zero with -inf where both are empty.
    assert torch.equal(out[0], out_b[0]) and torch.equal(out[1], out_a[1])
    assert torch.equal(lse[0], lse_b[0]) and torch.equal(lse[1], lse_a[1])
    assert (out[2] == 0).all() and (lse[2] == -INF).all()


def test_result_takes_out_a_dtype():
    out_a, lse_a, out_b, lse_b = random_states(5, 2, 8, torch.float32, seed=2)
    out, _ = verify_ops.merge_attn_states(out_a, lse_a, out_b.to(torch.bfloat16), lse_b)
    assert out.dtype == torch.float32
    out, _ = verify_ops.merge_attn_states(out_a.to(torch.float16), lse_a, out_b, lse_b)
    assert out.dtype == torch.float16


def test_is_symmetric_and_associative():
    gen = torch.Generator().manual_seed(3)
    states = [(torch.randn(9, 3, 16, generator=gen, dtype=torch.float64),
               4 * torch.randn(9, 3, generator=gen, dtype=torch.float64)) for _ in range(3)]
    (a, la), (b, lb), (c, lc) = states
    ab = verify_ops.merge_attn_states(a, la, b, lb)
    ba = verify_ops.merge_attn_states(b, lb, a, la)
    assert torch.allclose(ab[0], ba[0]) and torch.allclose(ab[1], ba[1])
    left = verify_ops.merge_attn_states(*ab, c, lc)
    right = verify_ops.merge_attn_states(a, la, *verify_ops.merge_attn_states(b, lb, c, lc))
    assert torch.allclose(left[0], right[0]) and torch.allclose(left[1], right[1])


def test_bad_shapes_name_the_arguments():
    out_a, lse_a, out_b, lse_b = random_states(4, 2, 8, torch.float32, seed=4)
    with pytest.raises(ValueError, match=r"out_a and out_b must have one shape"):
        verify_ops.merge_attn_states(out_a, lse_a, out_b[:3], lse_b)
    with pytest.raises(ValueError, match=r"lse_a and lse_b must have shape \[N, H\] = \[4, 2\]"):
        verify_ops.merge_attn_states(out_a, lse_a, out_b, lse_b[:, :1])


# --- against the op: the keys of each request split in two ---------------------------

def split_at(case, cut):
    """Two cases over disjoint keys of ``case``: the first ``cut[b]`` prefix
    positions (drafts masked out), and the rest of the prefix plus the drafts
    (the row shifted, so that positions stay relative to the prefix's end)."""
    cut = torch.as_tensor(cut, dtype=torch.int64, device=case.q.device)
    lens = case.seq_lens.long()
    rows = case.req_to_token[case.req_pool_indices.long()].long()
    head = with_rows(case, rows, cut, torch.zeros_like(case.tree_mask))
    tail = with_rows(case, shifted(rows, cut), lens - cut, case.tree_mask)
    return head, tail


def shifted(rows, by):
    index = by[:, None] + torch.arange(rows.shape[1], device=rows.device)
    return torch.gather(rows, 1, index.clamp(max=rows.shape[1] - 1))


def with_rows(case, rows, lens, tree_mask):
    return replace(case, req_to_token=rows.to(case.req_to_token.dtype),
                   req_pool_indices=torch.arange(rows.shape[0], device=rows.device),
                   seq_lens=lens.to(case.seq_lens.dtype), tree_mask=tree_mask)


LENS = [0, 1, 57, 300]
SPLITS = {
    # (options, cut): empty heads, empty tail prefixes, cuts mid-prefix.
    "plain": (dict(), [0, 0, 20, 299]),
    "all in the head": (dict(), [0, 1, 57, 300]),
    "sinks": (dict(sinks=True), [0, 1, 30, 150]),
    "soft-cap": (dict(logit_cap=2.5), [0, 1, 11, 3]),
    "fp8 KV with scales": (dict(kv_scales=True, kv_dtype=torch.float8_e4m3fn), [0, 0, 40, 77]),
}
# (A window makes the first positions it shows visible to the shallow drafts
# only, so no cut of the prefix leaves both parts plain calls of the op:
# tests/test_parallel_context.py covers the window under a split.)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(SPLITS))
def test_two_parts_merge_to_the_whole(device, name, dtype):
    if device == "cuda" and dtype == torch.float32:
        pytest.skip("float32 q is CPU-only")
    options, cut = SPLITS[name]
    case = make_case(LENS, 7, 8, 2, 64, dtype=dtype, strided_q=True, seed=11, device=device,
                     **options)
    head, tail = split_at(case, cut)
    opts = dict(case.options)
    sinks = opts.pop("sinks", None)
    # Sinks count once: in the tail only.
    head_state = verify_ops.tree_attn(*head.args(), **opts, return_lse=True)
    tail_state = verify_ops.tree_attn(*tail.args(), **opts, sinks=sinks, return_lse=True)
    out, lse = verify_ops.merge_attn_states(*head_state, *tail_state)
    ref, ref_lse = verify_ops.tree_attn_ref(*case.args(), **case.options, return_lse=True)
    assert verify_ops.relative_error(out, ref) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert torch.equal(lse.isinf().cpu(), ref_lse.isinf().cpu())
    finite = ref_lse.isfinite()
    assert torch.allclose(lse.double()[finite], ref_lse[finite], rtol=1e-4, atol=2e-3)


def test_both_parts_empty(device):
    """A request with no prefix whose drafts see nothing: both parts -inf, out 0."""
    case = make_case([0, 0], 3, 4, 2, 64, seed=5, device=device)
    empty = replace(case, tree_mask=torch.zeros_like(case.tree_mask))
    out_a, lse_a = verify_ops.tree_attn(*empty.args(), return_lse=True)
    out, lse = verify_ops.merge_attn_states(out_a, lse_a, out_a, lse_a)
    assert (lse == -INF).all() and (out == 0).all()
