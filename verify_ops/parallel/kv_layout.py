"""Context parallelism's KV layout: which rank holds which position of a request.

Position p of every request lives on rank ``(p // I) % N`` of ``N`` ranks:
runs of ``I`` (``interleave_size``) consecutive positions rotate over the
ranks. ``I = 1`` is SGLang's decode context parallelism on CUDA/ROCm (token
interleaved, ``get_dcp_lens`` with its default); a larger ``I`` gives blocked
runs, as its NPU path uses one KV page per run. The rule depends only on the
position, so a token's owner is fixed when it is written, however long the
request grows (a split into N contiguous halves would need the final length).

A rank's *local row* for a request lists the local pool slots of the
positions it owns, in position order: entry k holds owned position
``local_position(k)``. The op then reads a rank's share of a request like a
shorter request.
"""

from __future__ import annotations

import torch


def _check(cp_size: int, cp_rank: int, interleave_size: int) -> None:
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank must be in [0, cp_size = {cp_size}), got {cp_rank}")
    if interleave_size < 1:
        raise ValueError(f"interleave_size must be >= 1, got {interleave_size}")


def owner_of(positions: torch.Tensor, cp_size: int, interleave_size: int = 1) -> torch.Tensor:
    """The rank that holds each (non-negative) position."""
    return torch.div(positions, interleave_size, rounding_mode="floor") % cp_size


def owned_count(ends: torch.Tensor, cp_size: int, cp_rank: int,
                interleave_size: int = 1) -> torch.Tensor:
    """How many of the positions ``0 .. end-1`` rank ``cp_rank`` holds, per element
    of ``ends`` (>= 0); also the local index of the first owned position >= end."""
    _check(cp_size, cp_rank, interleave_size)
    cycle = cp_size * interleave_size
    ends = ends.long()
    into_cycle = (ends % cycle - cp_rank * interleave_size).clamp(0, interleave_size)
    return torch.div(ends, cycle, rounding_mode="floor") * interleave_size + into_cycle


def local_positions(num_local: int, cp_size: int, cp_rank: int, interleave_size: int = 1,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """``[num_local]`` int64: the global position of local index k on rank ``cp_rank``."""
    _check(cp_size, cp_rank, interleave_size)
    k = torch.arange(num_local, device=device)
    run, within = torch.div(k, interleave_size, rounding_mode="floor"), k % interleave_size
    return (run * cp_size + cp_rank) * interleave_size + within


def local_row_width(max_ctx: int, cp_size: int, interleave_size: int = 1) -> int:
    """Entries a local row needs for requests of up to ``max_ctx`` positions on any rank."""
    runs = -(-max_ctx // interleave_size)
    return -(-runs // cp_size) * interleave_size
