"""How fragmented requests' KV slots are: runs of consecutive slots per request.

A request whose ``seq_len`` tokens sit in ``req_to_token[row, :seq_len]`` has
one run when its slots are ``s, s+1, ..., s+seq_len-1`` and ``seq_len`` runs
when no two neighbours are adjacent. The count is vectorized over requests and
positions, with no host sync until the summary, so it is cheap enough to leave
on in a server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Cells of req_to_token compared per chunk of requests: bounds temporary memory
# (a few bytes per cell) at any batch size and context length.
_CELLS_PER_CHUNK = 1 << 24


@dataclass(frozen=True)
class Fragmentation:
    mean_runs: float    # mean over requests of runs per request
    p99_runs: float     # 99th percentile, nearest rank: an observed count
    num_requests: int

    @staticmethod
    def of(runs: torch.Tensor) -> "Fragmentation":
        """Summary of per-request run counts (one host sync)."""
        if runs.numel() == 0:
            return Fragmentation(0.0, 0.0, 0)
        runs = runs.double()
        rank = math.ceil(0.99 * runs.numel())  # nearest-rank percentile
        mean, p99 = torch.stack([runs.mean(), runs.kthvalue(rank).values]).tolist()
        return Fragmentation(mean, p99, runs.numel())


def runs_per_request(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                     seq_lens: torch.Tensor) -> torch.Tensor:
    """``[bs]`` int64: maximal runs of consecutive slots in ``req_to_token[row, :seq_len]``.

    ``row = req_pool_indices[b]``; a request with ``seq_len == 0`` has 0 runs.
    Runs on the tensors' device without a host sync.
    """
    lens = seq_lens.to(torch.int64)
    width = req_to_token.shape[1]
    chunk = max(1, _CELLS_PER_CHUNK // max(width, 1))
    pos = torch.arange(1, width, device=req_to_token.device)
    counts = []
    for start in range(0, req_pool_indices.shape[0], chunk):
        rows = req_to_token.index_select(0, req_pool_indices[start:start + chunk])
        chunk_lens = lens[start:start + chunk, None]
        # A position starts a new run when its slot does not follow its neighbour's.
        breaks = (rows[:, 1:] != rows[:, :-1] + 1) & (pos < chunk_lens)
        counts.append(breaks.sum(1) + (chunk_lens[:, 0] > 0))
    if not counts:
        return torch.zeros(0, dtype=torch.int64, device=req_to_token.device)
    return torch.cat(counts)


def measure_fragmentation(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                  seq_lens: torch.Tensor) -> Fragmentation:
    """Mean and p99 over requests of :func:`runs_per_request` (one host sync)."""
    return Fragmentation.of(runs_per_request(req_to_token, req_pool_indices, seq_lens))
