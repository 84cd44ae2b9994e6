"""Context parallelism for tree verify: each request's KV split over ranks, merged by LSE.

Each rank holds the prefix positions :mod:`.kv_layout` gives it, in its own
pool. A verify step on rank r computes an attention *state* ``(out, lse)``
for every query over the keys it holds; states over disjoint key sets merge
exactly (:func:`verify_ops.merge_attn_states`), so an all-gather of the
states and a merge give every rank the answer over the whole prefix.

Where the drafts go. The D draft keys are computed in exactly one place: a
separate *draft state* over the step's fresh draft K/V (``[bs*D, Hkv, d]``,
the K/V projections of the verified tokens), merged once, after the prefix
states are combined. So the answer never depends on which rank's pool holds
a draft (tree drafts share positions, so an owner by position and an owner
by slot disagree for them), no rank needs a neighbour's draft KV, and it is
what SGLang's own DCP extend does with the new tokens. It costs one small op
call (D keys per request) per layer.

Sinks are passed to the draft state only, so they enter the denominator
once. Soft-capping and KV scales apply per key and go to every call.

The sliding window. A query at depth d (position L + d) sees prefix
positions ``>= L + d - W``. A rank's local call cannot express that cut: its
keys are renumbered, and a call without drafts puts every query at one
position. So the plan splits the window's prefix in two:

- the *safe zone* ``[max(0, L - W + D - 1), L)``: visible to every query at
  any depth <= D - 1; each rank reads its owned part there as a plain
  prefix (no window needed);
- the *window edge* ``L - W + c`` for ``c = 0 .. D-2`` (at most D - 1
  positions): visible to the queries of depth ``<= c``. Each rank passes its
  owned edge positions to a second call as the keys of a pseudo tree of D
  "drafts" with zero prefix, whose mask row for query i shows edge key c
  exactly when ``c >= depth(i)``, with the window off. The op's mask then
  does the depth-dependent cut.

The draft state keeps the window: its keys sit at depth offsets that do not
depend on L. Without a window the edge call is skipped.

Everything here is shape-static and sync-free, so a plan built per batch
and the per-layer calls can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..merge import merge_attn_states
from ..ops import tree_attn
from ..trees import mask_depths
from .exchange import AllGather, all_gather_tensors, gather_heads
from .heads import head_shard
from .kv_layout import owned_count, owner_of


@dataclass
class ContextParallelPlan:
    """One rank's op inputs for a verify batch; every table has one row per request.

    ``prefix_rows`` / ``prefix_lens``: the rank's owned safe-zone positions
    (all owned prefix positions when there is no window), then D padding
    cells. ``edge_rows`` / ``edge_mask``: the window edge (None without a
    window). ``draft_rows``: request b's drafts are rows ``b*D .. b*D+D-1``
    of the draft K/V.
    """
    cp_size: int
    cp_rank: int
    sliding_window: int
    request_rows: torch.Tensor      # [bs] int64: arange, the op's req_pool_indices
    zero_lens: torch.Tensor         # [bs] int64 zeros
    prefix_rows: torch.Tensor       # [bs, width + D] local pool slots
    prefix_lens: torch.Tensor       # [bs] int64
    no_drafts: torch.Tensor         # [bs, D, D] bool, all false
    edge_rows: Optional[torch.Tensor]  # [bs, D] local pool slots (padding where not owned)
    edge_mask: Optional[torch.Tensor]  # [bs, D, D] bool
    draft_rows: torch.Tensor        # [bs, D]
    tree_mask: torch.Tensor         # [bs, D, D] bool, the batch's


def plan_context_parallel(local_rows: torch.Tensor, seq_lens: torch.Tensor,
                          tree_mask: torch.Tensor, cp_size: int, cp_rank: int, *,
                          interleave_size: int = 1, sliding_window: int = -1,
                          padding_slot: int = 0) -> ContextParallelPlan:
    """Plan rank ``cp_rank``'s calls for one verify batch (device ops only, no sync).

    Args:
        local_rows: ``[bs, width]`` int32/int64: request b's owned prefix
            positions' local pool slots in position order (see
            :mod:`.kv_layout`); width at least the most any request owns.
        seq_lens: ``[bs]`` global committed prefix lengths.
        tree_mask: ``[bs, D, D]`` bool, the batch's QLEN_ONLY tree mask.
        sliding_window: -1 (off) or W >= 0, as the op takes it.
        padding_slot: a local pool slot holding finite values (SGLang's slot
            0); the cells the op reads but never attends point there.
    """
    if sliding_window < -1:
        raise ValueError(f"sliding_window must be -1 (off) or >= 0, got {sliding_window}")
    if local_rows.dim() != 2 or local_rows.shape[0] != seq_lens.shape[0]:
        raise ValueError(f"local_rows must be [bs, width] with bs = {seq_lens.shape[0]}, "
                         f"got {list(local_rows.shape)}")
    bs, num_drafts = tree_mask.shape[0], tree_mask.shape[-1]
    device, index_dtype = local_rows.device, local_rows.dtype
    width = local_rows.shape[1]
    lens = seq_lens.to(device=device, dtype=torch.int64)

    def count(ends):
        return owned_count(ends, cp_size, cp_rank, interleave_size)

    def take(local_index, valid):
        """Local slots at ``local_index`` (clamped into the row), padding where not valid."""
        slots = torch.gather(local_rows, 1, local_index.clamp(0, max(width - 1, 0)))
        return torch.where(valid, slots, torch.full_like(slots, padding_slot))

    owned = count(lens)
    if sliding_window >= 0:
        safe_start = torch.minimum((lens - sliding_window + num_drafts - 1).clamp(min=0), lens)
        skipped = count(safe_start)
    else:
        skipped = torch.zeros_like(owned)
    prefix_lens = owned - skipped
    columns = torch.arange(width, device=device)
    if width > 0:
        prefix = take(skipped[:, None] + columns, columns < prefix_lens[:, None])
    else:
        prefix = local_rows
    prefix_rows = torch.cat(
        [prefix, torch.full((bs, num_drafts), padding_slot, dtype=index_dtype, device=device)],
        dim=1)

    edge_rows = edge_mask = None
    if sliding_window >= 0:
        edge = torch.arange(num_drafts, device=device)
        positions = lens[:, None] - sliding_window + edge  # [bs, D]; the last column unused
        valid = ((edge < num_drafts - 1) & (positions >= 0) & (positions < lens[:, None])
                 & (owner_of(positions.clamp(min=0), cp_size, interleave_size) == cp_rank))
        edge_rows = take(count(positions.clamp(min=0)), valid) if width > 0 else \
            torch.full((bs, num_drafts), padding_slot, dtype=index_dtype, device=device)
        depths = mask_depths(tree_mask.to(device))  # [bs, D]
        edge_mask = valid[:, None, :] & (edge[None, None, :] >= depths[:, :, None])

    return ContextParallelPlan(
        cp_size=cp_size, cp_rank=cp_rank, sliding_window=sliding_window,
        request_rows=torch.arange(bs, device=device),
        zero_lens=torch.zeros(bs, dtype=torch.int64, device=device),
        prefix_rows=prefix_rows, prefix_lens=prefix_lens,
        no_drafts=torch.zeros(bs, num_drafts, num_drafts, dtype=torch.bool, device=device),
        edge_rows=edge_rows, edge_mask=edge_mask,
        draft_rows=torch.arange(bs * num_drafts, device=device,
                                dtype=index_dtype).view(bs, num_drafts),
        tree_mask=tree_mask.to(device))


def shard_state(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                plan: ContextParallelPlan, sm_scale: float, *,
                k_scale: Optional[torch.Tensor] = None, v_scale: Optional[torch.Tensor] = None,
                logit_cap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's state ``(out [bs*D, Hq, d] in q's dtype, lse [bs*D, Hq] fp32)`` over
    the prefix keys in its pool (``k_cache``/``v_cache``: its local ``[pool, Hkv, d]``)."""
    options = dict(k_scale=k_scale, v_scale=v_scale, logit_cap=logit_cap, return_lse=True)
    out, lse = tree_attn(q, k_cache, v_cache, plan.prefix_rows, plan.request_rows,
                         plan.prefix_lens, plan.no_drafts, sm_scale, **options)
    if plan.edge_rows is not None:
        edge_out, edge_lse = tree_attn(q, k_cache, v_cache, plan.edge_rows, plan.request_rows,
                                       plan.zero_lens, plan.edge_mask, sm_scale, **options)
        out, lse = merge_attn_states(out, lse, edge_out, edge_lse)
    return out, lse


def draft_state(q: torch.Tensor, draft_k: torch.Tensor, draft_v: torch.Tensor,
                plan: ContextParallelPlan, sm_scale: float, *,
                k_scale: Optional[torch.Tensor] = None, v_scale: Optional[torch.Tensor] = None,
                logit_cap: float = 0.0,
                sinks: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The state over the drafts (and the sinks): ``draft_k``/``draft_v`` ``[bs*D, Hkv, d]``
    are the verified tokens' K/V, request-major, last dim contiguous."""
    return tree_attn(q, draft_k, draft_v, plan.draft_rows, plan.request_rows, plan.zero_lens,
                     plan.tree_mask, sm_scale, k_scale=k_scale, v_scale=v_scale,
                     logit_cap=logit_cap, sinks=sinks, sliding_window=plan.sliding_window,
                     return_lse=True)


def merge_all(outs: Sequence[torch.Tensor],
              lses: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge states over disjoint key sets, accumulating in fp32 (out is fp32)."""
    out, lse = outs[0].float(), lses[0]
    for other_out, other_lse in zip(outs[1:], lses[1:]):
        out, lse = merge_attn_states(out, lse, other_out, other_lse)
    return out, lse


def combine_shard_states(out: torch.Tensor, lse: torch.Tensor, all_gather: AllGather,
                         cp_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All-gather every rank's shard state (one collective) and merge them: the
    state over the whole prefix, fp32, the same on every rank."""
    outs, lses = all_gather_tensors([out, lse], all_gather, cp_size)
    return merge_all(list(outs), list(lses))


def context_parallel_tree_attn(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               draft_k: torch.Tensor, draft_v: torch.Tensor,
                               plan: ContextParallelPlan, sm_scale: float,
                               all_gather: AllGather, *,
                               k_scale: Optional[torch.Tensor] = None,
                               v_scale: Optional[torch.Tensor] = None,
                               logit_cap: float = 0.0, sinks: Optional[torch.Tensor] = None,
                               return_lse: bool = False):
    """Tree verify with every rank holding all heads (q, draft K/V replicated) and its
    share of each request's prefix; every rank returns the whole answer.

    ``k_scale``/``v_scale`` apply to the pool and to the draft K/V alike (pass
    draft K/V as the pool stores them). Returns ``out`` ``[bs*D, Hq, d]`` in
    q's dtype, or ``(out, lse)``, equal to ``tree_attn`` on the unsplit inputs.
    """
    scales = dict(k_scale=k_scale, v_scale=v_scale, logit_cap=logit_cap)
    out, lse = shard_state(q, k_cache, v_cache, plan, sm_scale, **scales)
    out, lse = combine_shard_states(out, lse, all_gather, plan.cp_size)
    drafts = draft_state(q, draft_k, draft_v, plan, sm_scale, sinks=sinks, **scales)
    out, lse = merge_attn_states(out, lse, *drafts)
    out = out.to(q.dtype)
    return (out, lse) if return_lse else out


def decode_context_parallel_tree_attn(q: torch.Tensor, k_cache: torch.Tensor,
                                      v_cache: torch.Tensor, draft_k: torch.Tensor,
                                      draft_v: torch.Tensor, plan: ContextParallelPlan,
                                      sm_scale: float, all_gather: AllGather, *,
                                      k_scale: Optional[torch.Tensor] = None,
                                      v_scale: Optional[torch.Tensor] = None,
                                      draft_k_scale: Optional[torch.Tensor] = None,
                                      draft_v_scale: Optional[torch.Tensor] = None,
                                      logit_cap: float = 0.0,
                                      sinks: Optional[torch.Tensor] = None,
                                      return_lse: bool = False):
    """SGLang's decode context parallelism: the ranks of the group are also
    tensor-parallel ranks, so q holds this rank's ``Hq_local`` heads while the
    pool (and ``draft_k``/``draft_v``) hold the KV heads of the whole group's
    ``cp_size * Hq_local`` query heads, replicated on every rank.

    The query heads are all-gathered, each rank computes its shard state for
    all of them, the shard states are all-gathered and merged, and each rank
    keeps its own heads and merges in the draft state for them, over the KV
    heads those query heads use (:func:`.heads.head_shard`). ``sinks`` are
    this rank's ``[Hq_local]``. ``draft_k_scale``/``draft_v_scale`` scale the
    draft K/V (SGLang's fresh K/V are unscaled even when the pool is fp8).
    Returns this rank's ``[bs*D, Hq_local, d]`` (and lse).
    """
    cp_size, cp_rank = plan.cp_size, plan.cp_rank
    local_heads = q.shape[1]
    group_q = gather_heads(q, all_gather, cp_size)
    out, lse = shard_state(group_q, k_cache, v_cache, plan, sm_scale, k_scale=k_scale,
                           v_scale=v_scale, logit_cap=logit_cap)
    out, lse = combine_shard_states(out, lse, all_gather, cp_size)
    mine = slice(cp_rank * local_heads, (cp_rank + 1) * local_heads)
    kv_heads = head_shard(cp_size * local_heads, k_cache.shape[1], cp_size, cp_rank).kv_heads
    drafts = draft_state(q, draft_k[:, kv_heads], draft_v[:, kv_heads], plan, sm_scale,
                         k_scale=draft_k_scale, v_scale=draft_v_scale, logit_cap=logit_cap,
                         sinks=sinks)
    out, lse = merge_attn_states(out[:, mine], lse[:, mine], *drafts)
    out = out.to(q.dtype)
    return (out, lse) if return_lse else out
