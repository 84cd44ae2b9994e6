"""Decode context parallelism (``--dcp-size N``) for TARGET_VERIFY on the tree op.

SGLang 0.5.23's DCP, as its MHA (Triton) path lays it out:

- The DCP group is N consecutive attention-TP ranks (``dcp_rank = tp_rank %
  N``). Each rank keeps its ``Hq / tp`` query heads, and the group's KV heads
  (``ModelConfig.get_num_kv_heads(tp, dcp)``: KV shards over ``tp / N``
  groups) are replicated on its N ranks.
- KV tokens are split: the allocator's page is ``page_size * N`` (widened
  ids), so a request's position p sits in a widened slot s with
  ``s % N == p % N``; rank ``s % N`` stores it at local row ``s // N``
  (``create_triton_kv_indices_for_dcp_triton``; the write masks by
  ``positions % N`` in ``TritonAttnBackend._set_kv_buffer``).
- Attention all-gathers q over the group's heads, runs on the local KV,
  all-gathers the LSEs and merges (``cp_lse_ag_out_rs_mha``), and each rank
  keeps its heads; the new tokens of an extend are attended from the fresh
  k/v per rank (``_forward_extend_dcp``), which refuses custom masks, so
  SGLang's Triton path cannot verify a tree under DCP at all.

:class:`DcpTreeVerify` does the same with the tree op
(:func:`verify_ops.parallel.decode_context_parallel_tree_attn`): the prefix
from the local pool, the drafts from the fresh k/v, sliding windows and
sinks included. What the backend (``backend.py``) must call, and where:

1. ``__init__``: when ``self.dcp_size > 1`` and the model qualifies (below),
   ``self.dcp_verify = DcpTreeVerify.from_sglang()`` instead of the
   "decode context parallelism" fallback reason in ``fallback.py``.
2. ``self.dcp_verify.begin_batch(self.req_to_token,
   forward_batch.req_pool_indices, forward_batch.seq_lens, self.tree_mask)``
   for each verify batch, after the tree mask is set: in
   ``init_forward_metadata`` when eager, and under CUDA graphs in
   ``init_forward_metadata_in_graph`` (inside the capture), so that every
   replay re-derives the local rows and plans from the graph's static
   buffers; it allocates, so calling it out of the graph would leave the
   captured kernels reading stale tensors. Device ops only, no sync.
3. ``forward_extend`` (verify): ``self.dcp_verify.write_drafts(
   self.token_to_kv_pool, layer, forward_batch, k, v)`` instead of the plain
   ``set_kv_buffer``, then ``return self.dcp_verify.forward(q, k, v, layer,
   self.token_to_kv_pool, sinks)``.

The write goes by the slot's residue, not the position's: tree drafts
share positions (siblings), and the reads go by slot. For a chain
(``--speculative-eagle-topk 1``) both rules agree.

What SGLang's DCP interface lacks, so that only chains (topk 1) can be
served without a fork: with topk > 1 EAGLE moves the accepted path's KV to
the front of the verify window (``move_accept_tokens_to_target_kvcache`` ->
``MHATokenToKVPool.move_kv_cache(tgt, src)``). Under DCP a source slot and
its target generally have different residues, so the KV must cross ranks,
and ``move_kv_cache`` indexes the rank-local buffers with widened ids
without translating them (no ``// N``, no owner mask, no exchange). The
pool exposes no DCP-aware move, and a backend cannot supply one. Prefill
stays on SGLang's Triton DCP path, which raises for sliding windows and
sinks (``_forward_extend_dcp``), so those models cannot run under DCP
whatever verify does; fp8 KV is refused by the backend already.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..parallel.context import (ContextParallelPlan, decode_context_parallel_tree_attn,
                                plan_context_parallel)
from ..parallel.exchange import AllGather
from ..parallel.kv_layout import local_positions, local_row_width


def dcp_local_rows(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                   dcp_size: int, dcp_rank: int) -> torch.Tensor:
    """``[bs, ceil(max_ctx / N)]``: the local rows of this rank's positions
    ``dcp_rank, dcp_rank + N, ...`` of each request (widened slot ``// N``).
    Cells past a request's length hold whatever ``req_to_token`` holds there;
    the plan never lets the op read them."""
    max_ctx = req_to_token.shape[1]
    width = local_row_width(max_ctx, dcp_size)
    positions = local_positions(width, dcp_size, dcp_rank,
                                device=req_to_token.device).clamp(max=max_ctx - 1)
    rows = req_to_token.index_select(0, req_pool_indices.long())
    return torch.div(rows[:, positions], dcp_size, rounding_mode="floor")


def dcp_write_loc(out_cache_loc: torch.Tensor, dcp_size: int,
                  dcp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(local_loc, mine)``: where this rank stores each new token's KV, and
    whether it stores it at all (the owner of widened slot s is ``s % N``)."""
    return (torch.div(out_cache_loc, dcp_size, rounding_mode="floor"),
            out_cache_loc % dcp_size == dcp_rank)


class DcpTreeVerify:
    """One rank's tree verify under SGLang's decode context parallelism."""

    def __init__(self, dcp_size: int, dcp_rank: int, all_gather: AllGather):
        self.dcp_size, self.dcp_rank, self.all_gather = dcp_size, dcp_rank, all_gather
        self._batch: Optional[tuple] = None
        self._plans: dict[int, ContextParallelPlan] = {}

    @classmethod
    def from_sglang(cls) -> "DcpTreeVerify":
        """The running SGLang rank's DCP group (its coordinator's all-gather)."""
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
        group = parallel.dcp_group
        gather: Callable = lambda buffer: group.all_gather(buffer, dim=0)  # noqa: E731
        return cls(parallel.attn_dcp_size, parallel.attn_dcp_rank, gather)

    def begin_batch(self, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                    seq_lens: torch.Tensor, tree_mask: torch.Tensor) -> None:
        """A new verify batch: its local rows now; a plan per sliding window on first use."""
        local_rows = dcp_local_rows(req_to_token, req_pool_indices, self.dcp_size,
                                    self.dcp_rank)
        self._batch = (local_rows, seq_lens, tree_mask)
        self._plans = {}

    def plan(self, sliding_window: int = -1) -> ContextParallelPlan:
        if self._batch is None:
            raise RuntimeError("DcpTreeVerify.plan: begin_batch was not called for this batch")
        if sliding_window not in self._plans:
            local_rows, seq_lens, tree_mask = self._batch
            self._plans[sliding_window] = plan_context_parallel(
                local_rows, seq_lens, tree_mask, self.dcp_size, self.dcp_rank,
                sliding_window=sliding_window)
        return self._plans[sliding_window]

    def write_drafts(self, pool, layer, forward_batch, k: torch.Tensor,
                     v: torch.Tensor) -> None:
        """Store the verified tokens' K/V on the ranks that own their slots."""
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        local_loc, mine = dcp_write_loc(forward_batch.out_cache_loc, self.dcp_size,
                                        self.dcp_rank)
        pool.set_kv_buffer(layer, KVWriteLoc(local_loc,
                                             physical=forward_batch.out_cache_loc_is_physical),
                           k, v, dcp_kv_mask=mine)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer, pool,
                sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Verify attention for ``layer``: ``[tokens, Hq_local * d]`` in q's dtype.

        ``k``/``v``: the verified tokens' fresh ``[tokens, Hkv, d]``; the
        prefix comes from ``pool``'s local buffers for ``layer``.
        """
        heads, kv_heads, head_dim = layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim
        window = layer.sliding_window_size
        window = -1 if window is None or window < 0 else window
        out = decode_context_parallel_tree_attn(
            q.view(-1, heads, head_dim), pool.get_key_buffer(layer.layer_id),
            pool.get_value_buffer(layer.layer_id), k.view(-1, kv_heads, head_dim),
            v.view(-1, kv_heads, head_dim), self.plan(window), layer.scaling,
            self.all_gather, logit_cap=layer.logit_cap or 0.0, sinks=sinks)
        return out.reshape(-1, heads * head_dim)
