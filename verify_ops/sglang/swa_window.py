"""Window layers on SGLang's hybrid SWA KV pool (``SWAKVPool``).

There the sliding-window layers keep their K/V in a smaller pool of their own,
while ``req_to_token`` holds full-pool slots; ``full_to_swa_index_mapping``
(registered by SGLang's SWA allocator) translates one into the other. Per
batch, :func:`window_table` builds, with fixed shapes and no host sync (so it
may run inside a CUDA-graph capture), a translated ``req_to_token`` for the
window layers that covers only the positions a window reaches:
``[max(0, L - W), L + D)`` of each request, ``W + D`` columns. The op then sees
each request shifted by ``start = max(0, L - W)``: prefix length ``L - start``,
the same drafts, the same relative positions, so the same window.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class WindowTable:
    """The op's ``req_to_token`` / ``req_pool_indices`` / ``seq_lens`` for the
    window layers of one batch."""
    req_to_token: torch.Tensor      # [bs, W + D] int32, SWA-pool slots
    req_pool_indices: torch.Tensor  # [bs] int64: row b is request b
    seq_lens: torch.Tensor          # [bs] int64: L - start
    out_cache_loc: torch.Tensor     # [bs * D] int64: the drafts' SWA-pool slots


def is_window_pool_layer(pool, layer_id: int) -> bool:
    """Whether ``layer_id`` keeps its K/V in the SWA sub-pool of a hybrid pool."""
    mapping = getattr(pool, "layers_mapping", None)
    return mapping is not None and mapping[layer_id][1]


def window_table(full_to_swa: torch.Tensor, req_to_token: torch.Tensor,
                 req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                 out_cache_loc: torch.Tensor, window: int, num_drafts: int) -> WindowTable:
    """Translate the window's part of each request's ``req_to_token`` row.

    ``full_to_swa``: [full slots] int, full-pool slot -> SWA-pool slot;
    ``window``: the largest window W of the model's window layers.
    """
    width = window + num_drafts
    start = (seq_lens - window).clamp(min=0)
    columns = torch.arange(width, device=seq_lens.device)
    # Past L + D the op reads nothing; clamping keeps the gather in bounds.
    positions = (start[:, None] + columns[None, :]).clamp(max=req_to_token.shape[1] - 1)
    full_slots = req_to_token[req_pool_indices[:, None], positions].long()
    return WindowTable(
        req_to_token=full_to_swa[full_slots].to(torch.int32),
        req_pool_indices=torch.arange(seq_lens.shape[0], device=seq_lens.device),
        seq_lens=seq_lens - start,
        out_cache_loc=full_to_swa[out_cache_loc.long()].long())
