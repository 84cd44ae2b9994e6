"""One synthetic verify case (:mod:`verify_ops.cases`) cut into one rank's inputs,
for the tests and bench/multi_gpu.py: its heads (tensor parallel) or its share of
each request's KV in a pool of its own (context parallel)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..cases import TreeAttnCase
from .heads import head_shard
from .kv_layout import local_row_width, owner_of


def split_heads(case: TreeAttnCase, tp_size: int, tp_rank: int) -> TreeAttnCase:
    """Rank ``tp_rank``'s case: its query heads, its KV heads (a pool of its own,
    as each rank allocates one) and its sinks; everything else shared."""
    shard = head_shard(case.q.shape[1], case.k_cache.shape[1], tp_size, tp_rank)
    options = dict(case.options)
    if "sinks" in options:
        options["sinks"] = options["sinks"][shard.q_heads].contiguous()
    return replace(case, q=case.q[:, shard.q_heads],
                   k_cache=case.k_cache[:, shard.kv_heads].contiguous(),
                   v_cache=case.v_cache[:, shard.kv_heads].contiguous(), options=options)


@dataclass
class ContextShard:
    """One rank's context-parallel inputs.

    ``k_cache``/``v_cache``: its own pool: slot 0 zeros (the padding slot),
    then its owned prefix tokens in shuffled slots, then NaN spare slots that
    nothing should read. ``local_rows``: ``[bs, width]`` local slots of its
    owned positions in order (unused cells point at NaN slots).
    ``draft_k``/``draft_v``: ``[bs*D, Hkv, d]`` the drafts' K/V (every rank's copy).
    """
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    local_rows: torch.Tensor
    draft_k: torch.Tensor
    draft_v: torch.Tensor


def split_context(case: TreeAttnCase, cp_size: int, cp_rank: int, interleave_size: int = 1,
                  spare_slots: int = 8, seed: int = 0) -> ContextShard:
    """Rank ``cp_rank``'s share of ``case`` under :mod:`.kv_layout`'s rule."""
    device = case.k_cache.device
    gen = torch.Generator().manual_seed(seed * 1009 + cp_rank)
    bs, num_drafts = case.tree_mask.shape[0], case.tree_mask.shape[-1]
    lens = case.seq_lens.long().cpu()
    rows = case.req_to_token[case.req_pool_indices.long()].long()  # [bs, max_ctx]
    positions = torch.arange(rows.shape[1], device=device)
    mine = owner_of(positions, cp_size, interleave_size) == cp_rank
    owned = [rows[b, : int(lens[b])][mine[: int(lens[b])]] for b in range(bs)]
    global_slots = torch.cat(owned) if owned else rows.new_empty(0)
    num_owned = global_slots.numel()

    pool = 1 + num_owned + spare_slots
    placement = (torch.randperm(pool - 1, generator=gen) + 1).to(device)
    local_slots, spare = placement[:num_owned], placement[num_owned:]
    caches = []
    for cache in (case.k_cache, case.v_cache):
        local = torch.full((pool, *cache.shape[1:]), float("nan"), device=device).to(cache.dtype)
        local[0] = 0
        local[local_slots] = cache[global_slots]
        caches.append(local)

    width = local_row_width(rows.shape[1], cp_size, interleave_size)
    fill = spare[torch.randint(len(spare), (bs, width), generator=gen).to(device)] \
        if spare_slots else torch.zeros(bs, width, dtype=torch.long, device=device)
    local_rows = fill.clone()
    start = 0
    for b, slots in enumerate(owned):
        local_rows[b, : slots.numel()] = local_slots[start:start + slots.numel()]
        start += slots.numel()

    draft_positions = lens[:, None] + torch.arange(num_drafts)
    draft_slots = torch.gather(rows, 1, draft_positions.to(device)).reshape(-1)
    return ContextShard(k_cache=caches[0], v_cache=caches[1],
                        local_rows=local_rows.to(case.req_to_token.dtype),
                        draft_k=case.k_cache[draft_slots], draft_v=case.v_cache[draft_slots])
