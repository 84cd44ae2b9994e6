"""Context parallel tree verify: each request's prefix KV split over ranks, each rank's
(out, lse) over its share, merged with the drafts' state, against the reference,
with sliding windows (depth-dependent edge included) and sinks (counted once)."""

import pytest
import torch

import verify_ops
from parallel_harness import GROUPS, run_processes
from verify_ops.cases import make_case
from verify_ops.merge import merge_attn_states
from verify_ops.parallel import (context_parallel_tree_attn, draft_state, local_positions,
                                 local_row_width, merge_all, owned_count, owner_of,
                                 plan_context_parallel, shard_state, torch_all_gather)
from verify_ops.parallel.split_case import split_context


@pytest.mark.parametrize("cp_size, interleave", [(1, 1), (2, 1), (3, 1), (2, 4), (4, 3)])
def test_layout_counts_and_positions(cp_size, interleave):
    ends = torch.arange(0, 60)
    positions = torch.arange(60)
    for rank in range(cp_size):
        mine = owner_of(positions, cp_size, interleave) == rank
        brute = torch.tensor([int(mine[:end].sum()) for end in ends.tolist()])
        assert torch.equal(owned_count(ends, cp_size, rank, interleave), brute)
        assert torch.equal(local_positions(int(mine.sum()), cp_size, rank, interleave),
                           positions[mine])
    # Every position has one owner, and a local row is wide enough on every rank.
    width = local_row_width(60, cp_size, interleave)
    assert max(int(owned_count(torch.tensor([60]), cp_size, r, interleave))
               for r in range(cp_size)) <= width


def test_layout_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"cp_rank must be in \[0, cp_size = 2\), got 2"):
        owned_count(torch.tensor([5]), 2, 2)
    with pytest.raises(ValueError, match=r"interleave_size must be >= 1, got 0"):
        owned_count(torch.tensor([5]), 2, 0, interleave_size=0)
    with pytest.raises(ValueError, match=r"sliding_window must be -1 \(off\) or >= 0, got -2"):
        plan_context_parallel(torch.zeros(1, 4, dtype=torch.int32), torch.tensor([3]),
                              torch.ones(1, 2, 2, dtype=torch.bool), 2, 0, sliding_window=-2)


def split_options(case):
    """The case's options as the shard calls and the draft call take them."""
    options = dict(case.options)
    window = options.pop("sliding_window", -1)
    sinks = options.pop("sinks", None)
    return options, window, sinks


def merged_over_ranks(case, cp_size, interleave):
    """Every rank's shard state computed here in turn, merged, then the drafts' state."""
    options, window, sinks = split_options(case)
    outs, lses = [], []
    for rank in range(cp_size):
        shard = split_context(case, cp_size, rank, interleave)
        plan = plan_context_parallel(shard.local_rows, case.seq_lens, case.tree_mask, cp_size,
                                     rank, interleave_size=interleave, sliding_window=window)
        out, lse = shard_state(case.q, shard.k_cache, shard.v_cache, plan, case.sm_scale,
                               **options)
        outs.append(out)
        lses.append(lse)
    out, lse = merge_all(outs, lses)
    drafts = draft_state(case.q, shard.draft_k, shard.draft_v, plan, case.sm_scale, sinks=sinks,
                         **options)
    out, lse = merge_attn_states(out, lse, *drafts)
    return out.to(case.q.dtype), lse


def assert_matches_reference(case, out, lse, name):
    ref, ref_lse = verify_ops.tree_attn_ref(*case.args(), **case.options, return_lse=True)
    tol = 1e-5 if case.q.dtype == torch.float32 else 1e-2
    assert out.dtype == case.q.dtype, name
    assert verify_ops.relative_error(out, ref) < tol, name
    finite = ref_lse.isfinite()
    assert torch.equal(finite.cpu(), lse.isfinite().cpu()), name
    assert torch.allclose(lse.double()[finite], ref_lse[finite], rtol=1e-4, atol=2e-3), name


# Ragged prefixes (0 and 1 included) around the window's edge; D = 6.
LENS = [0, 1, 2, 5, 90, 33, 300]
OPTIONS = {
    "plain": dict(),
    "sinks": dict(sinks=True),
    "soft-cap": dict(logit_cap=3.0),
    "fp8 KV with scales": dict(kv_scales=True, kv_dtype=torch.float8_e5m2),
    # W = 0: a draft sees its own depth only; W < D - 1: the whole window is
    # edge; W = 40: safe zone and edge; W > L: nothing cut.
    "window 0": dict(sliding_window=0),
    "window 3": dict(sliding_window=3),
    "window 40": dict(sliding_window=40),
    "window 500": dict(sliding_window=500),
    "window 17 + sinks + soft-cap": dict(sliding_window=17, sinks=True, logit_cap=5.0),
}


@pytest.mark.parametrize("cp_size, interleave", [(2, 1), (3, 1), (4, 3)])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_shards_merge_to_reference(name, cp_size, interleave):
    case = make_case(LENS, 6, 8, 2, 64, dtype=torch.float32, strided_q=True,
                     seed=cp_size * 10 + interleave, **OPTIONS[name])
    out, lse = merged_over_ranks(case, cp_size, interleave)
    assert_matches_reference(case, out, lse, name)


@pytest.mark.parametrize("tree", ["random", "eagle", "chain"])
@pytest.mark.parametrize("num_drafts", [1, 2, 8])
def test_trees_and_bf16(tree, num_drafts):
    case = make_case(LENS, num_drafts, 8, 1, 64, dtype=torch.bfloat16, tree=tree, seed=3,
                     sliding_window=7, sinks=True)
    out, lse = merged_over_ranks(case, 2, 1)
    assert_matches_reference(case, out, lse, f"{tree} D={num_drafts}")


def test_the_window_edge_is_needed():
    """Without the edge call (the window's depth-dependent first positions) the
    answer is wrong, so the window tests above can fail."""
    case = make_case(LENS, 6, 8, 2, 64, dtype=torch.float32, seed=5, tree="chain",
                     sliding_window=40)
    options, window, _ = split_options(case)
    shard = split_context(case, 1, 0)
    plan = plan_context_parallel(shard.local_rows, case.seq_lens, case.tree_mask, 1, 0,
                                 sliding_window=window)

    def verify():
        prefix = shard_state(case.q, shard.k_cache, shard.v_cache, plan, case.sm_scale,
                             **options)
        drafts = draft_state(case.q, shard.draft_k, shard.draft_v, plan, case.sm_scale,
                             **options)
        return merge_attn_states(*prefix, *drafts)[0]

    ref = verify_ops.tree_attn_ref(*case.args(), **case.options)
    assert plan.edge_mask.any()
    assert verify_ops.relative_error(verify(), ref) < 1e-5
    plan.edge_rows = plan.edge_mask = None
    assert verify_ops.relative_error(verify(), ref) > 0.05


# --- across processes: the composite with real collectives ----------------------------

PROCESS_CASES = [
    dict(),
    dict(sliding_window=40, sinks=True),
    dict(logit_cap=3.0, sliding_window=3),
]


def check_rank(rank, world_size, device):
    """context_parallel_tree_attn on this rank's share, for every case and layout."""
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    all_gather = torch_all_gather()
    for interleave in (1, 4):
        for options in PROCESS_CASES:
            case = make_case(LENS, 6, 8, 2, 64, dtype=dtype, device=device, strided_q=True,
                             seed=len(options) + interleave, **options)
            scales, window, sinks = split_options(case)
            shard = split_context(case, world_size, rank, interleave)
            plan = plan_context_parallel(shard.local_rows, case.seq_lens, case.tree_mask,
                                         world_size, rank, interleave_size=interleave,
                                         sliding_window=window)
            out, lse = context_parallel_tree_attn(
                case.q, shard.k_cache, shard.v_cache, shard.draft_k, shard.draft_v, plan,
                case.sm_scale, all_gather, sinks=sinks, return_lse=True, **scales)
            assert_matches_reference(case, out, lse,
                                     f"{options} interleave {interleave} rank {rank}")


@pytest.mark.parametrize("backend, world_size", GROUPS)
def test_processes_match_reference(backend, world_size):
    run_processes(check_rank, world_size, backend)
