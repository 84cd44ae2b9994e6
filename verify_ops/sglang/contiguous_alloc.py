"""Contiguity-aware allocation for SGLang's ``TokenToKVPoolAllocator`` and
``PagedTokenToKVPoolAllocator``, as hooks on one allocator instance.

:func:`attach` shadows the instance's alloc and free methods with instance
attributes; the classes stay stock. The policy keeps each request's KV in as
few runs of consecutive slots as it can:

- A growing request gets the pages right after its last page when they are free.
- Otherwise (blocked, or a new request) it gets a free run with room to grow
  (:meth:`FreeRuns.carve`).
- Freed pages return to the free set whole, between allocations, so a
  finished request's hole is reused as one run (SGLang's ``need_sort`` holds
  them back for the same reason).

The free set lives in a host-side mask, so choosing pages never waits for the
device. Freed page ids travel to the host by an asynchronous copy; an
allocation folds in those that have arrived, and waits for the rest only when
it would otherwise run short.

The token allocator's ``alloc(n)`` does not say which requests its ``n`` slots
go to; a :class:`GrowthPlan` set around the call does (``defrag.py`` sets one
at SGLang's allocation call sites). The paged allocator's ``alloc_extend`` and
``alloc_decode`` receive each request's last slot (``last_loc``) and need no
plan; they copy it to the host (bs integers per call).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Sequence

import torch
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.paged import alloc_extend_naive  # SGLang 0.5.17 and 0.5.23

from .free_runs import FreeRuns

_STATE_ATTR = "_verify_ops_contiguity"

# (first page wanted or None, pages needed, pages of room wanted for growth)
Want = tuple[Optional[int], int, int]


@dataclass
class GrowthPlan:
    """How the token allocator's next ``alloc(sum(counts))`` splits, in order:
    request i takes ``counts[i]`` slots for positions ``starts[i]...`` of
    req_to_token row ``rows[i]`` (None while the request has no row yet)."""
    rows: list[Optional[int]]
    starts: list[int]
    counts: list[int]
    last_pages: Optional[list[Optional[int]]] = None  # set by the alloc that follows it


class ContiguousAllocation:
    """The policy's state for one allocator: free mask, held-back frees, row tails."""

    def __init__(self, allocator):
        self.allocator = allocator
        self.is_paged = isinstance(allocator, PagedTokenToKVPoolAllocator)
        self._stock_clear = allocator.clear
        self.plan: Optional[GrowthPlan] = None
        self._reset(allocator.get_all_free_pages())

    def _reset(self, free_pages: torch.Tensor) -> None:
        a = self.allocator
        self.page_size = a.page_size
        self.num_pages = a.size // a.page_size
        self.is_free = torch.zeros(self.num_pages + 1, dtype=torch.bool)  # page 0: padding
        self.is_free[free_pages.cpu()] = True
        self.num_free = int(self.is_free.sum())
        # Freed page ids on their way to the host: (host tensor, copy-done event or None).
        self.pending: list[tuple[torch.Tensor, Optional[torch.cuda.Event]]] = []
        self.num_pending = 0
        # row -> (end position, last page) after its last planned growth or relocation.
        self.tails: dict[int, tuple[int, int]] = {}

    def _install(self) -> None:
        a = self.allocator
        a.alloc = self.alloc
        a.clear = self.clear
        a.available_size = self.available_size
        a.get_all_free_pages = self.get_all_free_pages
        a.merge_and_sort_free = self.fold_pending
        if self.is_paged:
            a.alloc_extend = self.alloc_extend
            a.alloc_decode = self.alloc_decode
            a._release_page_ids = self._hold  # every paged free path ends here
        else:
            a.free = self.free

    # -- the allocator's interface ------------------------------------------

    def clear(self) -> None:
        self._stock_clear()
        self._reset(torch.arange(1, self.allocator.size // self.allocator.page_size + 1))

    def available_size(self) -> int:
        return (self.num_free + self.num_pending) * self.page_size

    def get_all_free_pages(self) -> torch.Tensor:
        self.fold_pending()
        return self.is_free.nonzero().flatten().to(self.allocator.device)

    def free(self, free_index: torch.Tensor) -> None:
        a = self.allocator
        if free_index.numel() == 0:
            return
        if a.free_group is not None:
            a.free_group.append(a._copy_for_free_group(free_index))
        else:
            self._hold(free_index)

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        plan = self.plan
        follows_plan = (plan is not None and not self.is_paged
                        and sum(plan.counts) == need_size)
        if follows_plan:
            wants = [(self._after_tail(row, start), count, start + 2 * count)
                     for row, start, count in zip(plan.rows, plan.starts, plan.counts)]
        else:
            count = need_size // self.page_size
            wants = [(None, count, 2 * count)]
        pages = self.take(wants)
        if pages is None:
            return None
        if follows_plan:
            plan.last_pages = [int(p[-1]) if p.numel() else None for p in pages]
        return self.slots_of(torch.cat(pages)).to(self.allocator.device, non_blocking=True)

    def alloc_extend(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc,
                     extend_num_tokens, num_new_pages=None):
        ps = self.page_size
        pages_before = (prefix_lens_cpu + ps - 1) // ps
        pages_after = (seq_lens_cpu + ps - 1) // ps
        last_pages = torch.div(last_loc, ps, rounding_mode="floor").tolist()
        wants = [(last + 1 if last >= 0 else None, new, new + after)
                 for last, new, after in zip(last_pages, (pages_after - pages_before).tolist(),
                                             pages_after.tolist())]
        pages = self.take(wants)
        if pages is None:
            return None
        out = torch.empty((extend_num_tokens,), dtype=torch.int64, device=self.allocator.device)
        # SGLang's own index arithmetic, over the pages chosen here, in request order.
        alloc_extend_naive(prefix_lens, seq_lens, last_loc,
                           torch.cat(pages).to(self.allocator.device), out, ps,
                           self.allocator.device)
        return out

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc):
        ps = self.page_size
        opens_page = ((seq_lens_cpu - 1) % ps == 0).tolist()
        last_pages = torch.div(last_loc, ps, rounding_mode="floor").tolist()
        wants = [(last + 1, 1, 1 + (int(n) + ps - 1) // ps)
                 for last, n, opens in zip(last_pages, seq_lens_cpu.tolist(), opens_page) if opens]
        pages = self.take(wants)
        if pages is None:
            return None
        new_pages = torch.cat(pages) if pages else torch.zeros(0, dtype=torch.int64)
        return decode_slots(seq_lens, last_loc, new_pages.to(self.allocator.device), ps)

    def fold_pending(self) -> None:
        """Return every freed page to the free mask, waiting for copies in flight."""
        self._fold(wait=True)

    def _fold(self, wait: bool) -> None:
        arrived, in_flight = [], []
        for pages, done in self.pending:
            ready = wait or done is None or done.query()
            (arrived if ready else in_flight).append((pages, done))
        if not arrived:
            return
        for _, done in arrived:
            if done is not None:
                done.synchronize()
        self.pending = in_flight
        self.num_pending = sum(pages.numel() for pages, _ in in_flight)
        self.is_free[torch.cat([pages for pages, _ in arrived])] = True
        self.num_free = int(self.is_free.sum())
        if self.tails:  # a row whose last page came back free has finished
            rows = list(self.tails)
            alive = (~self.is_free[torch.tensor([self.tails[r][1] for r in rows])]).tolist()
            self.tails = {r: self.tails[r] for r, keep in zip(rows, alive) if keep}

    # -- the policy -----------------------------------------------------------

    @contextmanager
    def growing(self, rows: Sequence[Optional[int]], starts: Sequence[int],
                counts: Sequence[int],
                rows_after: Optional[Callable[[], Sequence[Optional[int]]]] = None
                ) -> Iterator[GrowthPlan]:
        """Plan the next ``alloc(sum(counts))``; on success, remember where each
        row now ends (``rows_after()`` names rows assigned during the call)."""
        plan = GrowthPlan(list(rows), [int(s) for s in starts], [int(c) for c in counts])
        self.plan = plan
        try:
            yield plan
        finally:
            self.plan = None
        if plan.last_pages is not None:
            for row, start, count, last in zip(rows_after() if rows_after else plan.rows,
                                               plan.starts, plan.counts, plan.last_pages):
                if row is not None and last is not None:
                    self.tails[row] = (start + count, last)

    def take(self, wants: Sequence[Want]) -> Optional[list[torch.Tensor]]:
        """CPU page ids for each want, in order; None (nothing taken) when short."""
        total = sum(count for _, count, _ in wants)
        self._fold(wait=False)
        if total > self.num_free:
            self.fold_pending()
            if total > self.num_free:
                return None
        live_tails = {last for _, last in self.tails.values()}
        live_tails.update(first - 1 for first, _, _ in wants if first is not None)
        pages: list[list[torch.Tensor]] = [[] for _ in wants]
        missing = [count for _, count, _ in wants]
        # Extensions in place go first, so no new placement lands in their way;
        # a request takes whatever part of its next pages is free.
        for i, (first, count, _) in enumerate(wants):
            if first is None or count == 0:
                continue
            ahead = self.is_free[first:first + count].to(torch.int8)
            free_ahead = int(ahead.cumprod(0).sum()) if ahead.numel() else 0
            if free_ahead:
                pages[i].append(self._mark_taken(torch.arange(first, first + free_ahead)))
                missing[i] -= free_ahead
                live_tails.add(first + free_ahead - 1)
        runs = None
        for i, (_, _, room) in enumerate(wants):
            if missing[i] == 0:
                continue
            if runs is None:
                runs = FreeRuns(self.is_free)
            if missing[i] > runs.largest() and self.pending:
                self.fold_pending()  # frees still in flight may hold a run that fits
                runs = FreeRuns(self.is_free)
            pages[i].append(self._mark_taken(runs.carve(missing[i], room, live_tails)))
            live_tails.add(int(pages[i][-1][-1]))
        return [torch.cat(p) if p else torch.zeros(0, dtype=torch.int64) for p in pages]

    def take_run(self, count: int) -> Optional[torch.Tensor]:
        """``count`` consecutive CPU page ids, or None when no free run is that long."""
        self._fold(wait=False)
        runs = FreeRuns(self.is_free)
        if runs.largest() < count and self.pending:
            self.fold_pending()
            runs = FreeRuns(self.is_free)
        if runs.largest() < count:
            return None
        live_tails = {last for _, last in self.tails.values()}
        return self._mark_taken(runs.carve(count, 2 * count, live_tails))

    def give_back(self, pages: torch.Tensor) -> None:
        """Undo a take whose pages were never handed to anyone."""
        self.is_free[pages] = True
        self.num_free += pages.numel()

    def _hold(self, *page_ids: torch.Tensor) -> None:
        # Copied now, in stream order: callers free views of req_to_token rows
        # that are rewritten later.
        for ids in page_ids:
            if ids.numel() == 0:
                continue
            if ids.is_cuda:
                host = torch.empty(ids.shape, dtype=torch.int64, pin_memory=True)
                host.copy_(ids.to(torch.int64), non_blocking=True)
                done = torch.cuda.Event()
                done.record()
                self.pending.append((host, done))
            else:
                self.pending.append((ids.to(torch.int64, copy=True), None))
            self.num_pending += ids.numel()

    def _mark_taken(self, pages: torch.Tensor) -> torch.Tensor:
        self.is_free[pages] = False
        self.num_free -= pages.numel()
        return pages

    def _after_tail(self, row: Optional[int], start: int) -> Optional[int]:
        tail = self.tails.get(row) if row is not None else None
        return tail[1] + 1 if tail is not None and tail[0] == start else None

    def slots_of(self, pages: torch.Tensor) -> torch.Tensor:
        """Every slot of ``pages``, in order."""
        if self.page_size == 1:
            return pages
        return (pages[:, None] * self.page_size + torch.arange(self.page_size)).reshape(-1)


# The allocator internals the policy takes over or calls, as SGLang 0.5.23 has them
# (0.5.17 frees through other paths: the policy stays off there).
_TOKEN_INTERNALS = ("get_all_free_pages", "_copy_for_free_group")
_PAGED_INTERNALS = ("get_all_free_pages", "_release_page_ids")


def unsupported_reason() -> Optional[str]:
    """Why this SGLang's allocators cannot take the policy, or None."""
    missing = [f"{cls.__name__}.{name}" for cls, names in (
        (TokenToKVPoolAllocator, _TOKEN_INTERNALS), (PagedTokenToKVPoolAllocator, _PAGED_INTERNALS))
        for name in names if not hasattr(cls, name)]
    return f"this SGLang's allocators lack {', '.join(missing)}" if missing else None


def attach(allocator) -> ContiguousAllocation:
    """Make one stock token or paged allocator contiguity-aware; idempotent."""
    if type(allocator) not in (TokenToKVPoolAllocator, PagedTokenToKVPoolAllocator):
        raise TypeError("contiguity-aware allocation hooks TokenToKVPoolAllocator and "
                        f"PagedTokenToKVPoolAllocator only, got {type(allocator).__name__}")
    reason = unsupported_reason()
    if reason is not None:
        raise TypeError(f"contiguity-aware allocation: {reason}")
    state = state_of(allocator)
    if state is None:
        state = ContiguousAllocation(allocator)
        setattr(allocator, _STATE_ATTR, state)
        state._install()
    return state


def state_of(allocator) -> Optional[ContiguousAllocation]:
    """The policy attached to ``allocator``, if any."""
    return getattr(allocator, _STATE_ATTR, None)


def decode_slots(seq_lens: torch.Tensor, last_loc: torch.Tensor, new_pages: torch.Tensor,
                 page_size: int) -> torch.Tensor:
    """Each request's decode slot: the slot after ``last_loc``, or the first slot of
    the next of ``new_pages`` (in request order) for a request whose token opens a
    page. ``seq_lens`` counts that token."""
    opens_page = (seq_lens - 1) % page_size == 0
    if new_pages.numel() == 0:
        return last_loc + 1
    rank = (torch.cumsum(opens_page.long(), 0) - 1).clamp(min=0, max=new_pages.numel() - 1)
    return torch.where(opens_page, new_pages[rank] * page_size, last_loc + 1)

