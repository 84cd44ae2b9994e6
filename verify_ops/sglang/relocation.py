"""Tier 1 of the defrag: move the most fragmented requests' KV into one run each, live.

Call it between forward passes, outside CUDA-graph capture, once nothing in
flight still reads or writes the slots it moves. It moves only what a request
owns alone (an :class:`OwnedSpan`; in SGLang ``req.kv``'s
``[cache_protected_len, kv_allocated_len)``). Slots below
``cache_protected_len`` belong to the radix cache, may be shared by other
requests, and are never moved or copied.

The steps run in an order that leaves a consistent state if any of them raises:
take the destination from the allocator, copy every layer's K and V (the
source stays as it was), rewrite ``req_to_token``, and only then free the old
slots. A failure before the rewrite completes puts the old mapping back (the
source KV is untouched) and returns the destination to the allocator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..relocate import relocate_kv
from .contiguous_alloc import state_of

# One pool's (K caches, V caches), one per layer, all indexed by the same slots.
KVCaches = tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]


@dataclass(frozen=True)
class OwnedSpan:
    """Positions ``[start, end)`` of ``req_to_token[row]`` that one request owns alone;
    ``start`` is page-aligned."""
    row: int
    start: int
    end: int


def owned_spans(reqs) -> list[OwnedSpan]:
    """What each SGLang request owns alone: ``req.kv``'s ``[cache_protected_len,
    kv_allocated_len)``. Below ``cache_protected_len`` the radix cache owns the
    slots (a matched or inserted prefix, locked through ``req.last_node``)."""
    return [OwnedSpan(r.kv.req_pool_idx, r.kv.cache_protected_len, r.kv.kv_allocated_len)
            for r in reqs
            if r.kv.holds_kv and r.kv.kv_allocated_len > r.kv.cache_protected_len]


@dataclass(frozen=True)
class Relocation:
    moved_requests: int
    moved_slots: int
    runs_before: tuple[int, ...]  # runs of each moved span before the move (after: 1 each)


def relocate_fragmented(allocator, req_to_token: torch.Tensor, kv_caches: Sequence[KVCaches],
                        spans: Sequence[OwnedSpan], *, max_requests: int = 4,
                        min_runs: int = 2) -> Relocation:
    """Move up to ``max_requests`` spans of at least ``min_runs`` runs, most runs
    first, each into one free run of the (contiguity-aware) ``allocator``.

    Spans whose slots also appear in another span are skipped: a slot owned
    twice is never moved. A span for which no free run is long enough stays.
    Costs two small device-to-host copies (run counts) plus the copy itself.
    """
    state = state_of(allocator)
    if state is None:
        raise ValueError("relocate_fragmented takes its destinations from a contiguity-aware "
                         "allocator: call verify_ops.sglang.contiguous_alloc.attach first")
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("relocate_fragmented must run outside CUDA-graph capture")
    spans = [s for s in spans if s.end > s.start]
    if not spans:
        return Relocation(0, 0, ())
    runs, shared = _span_runs_and_sharing(req_to_token, spans)
    picked = sorted((i for i, s in enumerate(spans) if runs[i] >= min_runs and not shared[i]),
                    key=lambda i: -runs[i])[:max_requests]

    moves: list[tuple[OwnedSpan, torch.Tensor, int]] = []  # span, destination pages, runs
    table_touched = False
    try:
        for i in picked:
            span = spans[i]
            pages = state.take_run(-(-(span.end - span.start) // state.page_size))
            if pages is not None:
                moves.append((span, pages, runs[i]))
        if not moves:
            return Relocation(0, 0, ())
        device = req_to_token.device
        src = torch.cat([req_to_token[s.row, s.start:s.end] for s, _, _ in moves]).long()
        dst = torch.cat([state.slots_of(p)[: s.end - s.start] for s, p, _ in moves]).to(device)
        for k_caches, v_caches in kv_caches:
            relocate_kv(k_caches, v_caches, src, dst)
        table_touched = True
        _rewrite_rows(req_to_token, [s for s, _, _ in moves], dst)
        # Inside the try: if returning the old slots fails (on CUDA it copies
        # their ids to the host), the old mapping comes back instead of a leak.
        allocator.free(src)  # paged: whole pages, the unused tail of the last one included
    except BaseException:
        if table_touched:  # however far the rewrite got, the old mapping goes back
            _rewrite_rows(req_to_token, [s for s, _, _ in moves], src)
        for _, pages, _ in moves:
            state.give_back(pages)
        raise
    ends = dst.new_tensor([s.end - s.start for s, _, _ in moves]).cumsum(0) - 1
    for (span, _, _), last in zip(moves, dst[ends].tolist()):
        state.tails[span.row] = (span.end, last // state.page_size)
    return Relocation(len(moves), src.numel(), tuple(r for _, _, r in moves))


def _span_runs_and_sharing(req_to_token: torch.Tensor,
                           spans: Sequence[OwnedSpan]) -> tuple[list[int], list[bool]]:
    """Per span: runs of consecutive slots, and whether a slot of it is in another span."""
    slots = [req_to_token[s.row, s.start:s.end].long() for s in spans]
    runs = torch.stack([1 + (x[1:] != x[:-1] + 1).sum() for x in slots])
    flat = torch.cat(slots)
    owner = torch.repeat_interleave(torch.arange(len(spans), device=flat.device),
                                    torch.tensor([x.numel() for x in slots], device=flat.device))
    order = flat.argsort()
    repeated = flat[order][1:] == flat[order][:-1]
    shared = torch.zeros(len(spans), dtype=torch.bool, device=flat.device)
    shared[owner[order[1:][repeated]]] = True
    shared[owner[order[:-1][repeated]]] = True
    return runs.tolist(), shared.tolist()


def _rewrite_rows(req_to_token: torch.Tensor, spans: Sequence[OwnedSpan],
                  slots: torch.Tensor) -> None:
    """Point every span's positions at ``slots`` (the spans' slots, in order), in one write."""
    device = req_to_token.device
    rows = torch.cat([torch.full((s.end - s.start,), s.row, device=device) for s in spans])
    positions = torch.cat([torch.arange(s.start, s.end, device=device) for s in spans])
    req_to_token[rows, positions] = slots.to(req_to_token.dtype)
