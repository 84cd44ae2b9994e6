"""SGLang's decode context parallelism on the tree op (verify_ops.sglang.context_parallel):
widened slots (slot % N == position % N, stored at row slot // N of rank slot % N),
query heads sharded and all-gathered, KV heads replicated in the group, drafts from
the fresh K/V, against the reference; and the layout against SGLang's own helpers."""

from types import SimpleNamespace

import pytest
import torch

import verify_ops
from parallel_harness import GROUPS, run_processes
from verify_ops.cases import make_case
from verify_ops.parallel import gather_heads, owned_count, torch_all_gather
from verify_ops.sglang.context_parallel import DcpTreeVerify, dcp_local_rows, dcp_write_loc


def widened_case(dcp_size, **kwargs):
    """A case in DCP's widened slot space: pages of dcp_size slots, so a request's
    position p sits in a slot s with s % dcp_size == p % dcp_size."""
    case = make_case(layout="paged", page_size=dcp_size, **kwargs)
    rows = case.req_to_token[case.req_pool_indices.long()].long()
    for b, length in enumerate(case.seq_lens.tolist()):
        used = rows[b, : length + case.tree_mask.shape[-1]]
        assert torch.equal(used % dcp_size, torch.arange(used.numel()) % dcp_size)
    return case


def rank_pool(cache, dcp_size, dcp_rank):
    """Rank dcp_rank's local buffer: widened slot s (s % N == rank) at row s // N;
    row 0 is SGLang's padding (zeros), rows of nobody's tokens NaN."""
    local = cache[dcp_rank::dcp_size].clone()
    local[0] = 0
    return local


def draft_kv(case):
    num_drafts = case.tree_mask.shape[-1]
    rows = case.req_to_token[case.req_pool_indices.long()].long()
    positions = case.seq_lens.long()[:, None] + torch.arange(num_drafts, device=rows.device)
    slots = torch.gather(rows, 1, positions).reshape(-1)
    return case.k_cache[slots], case.v_cache[slots]


def test_local_rows_match_sglang():
    from sglang.srt.layers.dcp.layout import get_dcp_lens, maybe_dcp_kernel_indices

    case = widened_case(3, seq_lens=[0, 1, 7, 40], num_drafts=4, num_q_heads=4,
                        num_kv_heads=1, head_dim=16)
    lens = case.seq_lens.long()
    for rank in range(3):
        ours = dcp_local_rows(case.req_to_token, case.req_pool_indices, 3, rank)
        owned = owned_count(lens, 3, rank)
        assert torch.equal(owned, get_dcp_lens(lens, 3, rank))
        for b in range(len(lens)):
            row = case.req_to_token[int(case.req_pool_indices[b]), : int(lens[b])].long()
            sglang = maybe_dcp_kernel_indices(row, 3, rank)
            assert torch.equal(ours[b, : int(owned[b])].long(), sglang)
    for interleave in (2, 5):
        for rank in range(3):
            assert torch.equal(owned_count(lens, 3, rank, interleave),
                               get_dcp_lens(lens, 3, rank, interleave_size=interleave))


def test_write_loc_by_slot_residue():
    loc = torch.tensor([6, 7, 8, 9, 13])
    local, mine = dcp_write_loc(loc, 2, 1)
    assert torch.equal(local, torch.tensor([3, 3, 4, 4, 6]))
    assert torch.equal(mine, torch.tensor([False, True, False, True, True]))


# (Hq, Hkv, options) of the whole group: at DCP 2 each rank keeps Hq / 2 query
# heads; Hkv < group size means one KV head used by several ranks' drafts.
CASES = [
    (16, 2, dict()),
    (16, 1, dict(sinks=True, sliding_window=30)),
    (8, 8, dict(logit_cap=4.0, sliding_window=2)),
]


class FakePool:
    """The two reads the adapter makes of SGLang's token pool."""

    def __init__(self, k, v):
        self.k, self.v = k, v

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


def check_rank(rank, world_size, device):
    """Each rank through DcpTreeVerify's batch and forward; gathered heads vs the reference."""
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    all_gather = torch_all_gather()
    verify = DcpTreeVerify(world_size, rank, all_gather)
    for hq, hkv, options in CASES:
        if hq % world_size:
            continue
        case = widened_case(world_size, seq_lens=[0, 1, 5, 90, 257], num_drafts=6,
                            num_q_heads=hq, num_kv_heads=hkv, head_dim=64, dtype=dtype,
                            device=device, seed=hq + hkv, **options)
        local_heads = hq // world_size
        mine = slice(rank * local_heads, (rank + 1) * local_heads)
        pool = FakePool(rank_pool(case.k_cache, world_size, rank),
                        rank_pool(case.v_cache, world_size, rank))
        layer = SimpleNamespace(layer_id=0, tp_q_head_num=local_heads, tp_k_head_num=hkv,
                                qk_head_dim=64, scaling=case.sm_scale,
                                logit_cap=options.get("logit_cap", 0.0),
                                sliding_window_size=options.get("sliding_window", -1))
        sinks = case.options.get("sinks")
        verify.begin_batch(case.req_to_token, case.req_pool_indices, case.seq_lens,
                           case.tree_mask)
        k, v = draft_kv(case)
        out = verify.forward(case.q[:, mine].reshape(case.q.shape[0], -1), k, v, layer, pool,
                             None if sinks is None else sinks[mine])
        out = gather_heads(out.view(-1, local_heads, 64), all_gather, world_size)
        ref = verify_ops.tree_attn_ref(*case.args(), **case.options)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        name = f"{hq}/{hkv} {options} rank {rank} of {world_size}"
        assert verify_ops.relative_error(out, ref) < tol, name


@pytest.mark.parametrize("backend, world_size", GROUPS)
def test_dcp_verify_matches_reference(backend, world_size):
    run_processes(check_rank, world_size, backend)
