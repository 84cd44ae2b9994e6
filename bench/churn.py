"""A churn simulation over SGLang's real allocator classes: how fragmented do
requests' KV slots get under stock SGLang, under ``need_sort``, and under the
contiguity-aware policy (``contiguous_alloc``), optionally with Tier 1
relocation?

Requests arrive (Poisson), are prefilled in batches, grow each step, and
finish; prompt and output lengths are log-normal (long-tailed). A step grows
every running request either speculatively (EAGLE in SGLang 0.5.23: KV
allocated ``reserve`` tokens ahead of the committed length, then 1 to
``max_accept`` tokens accepted) or by one decode token. Allocations go through
the allocator as SGLang's allocation helpers call it: ``alloc`` at page size 1,
``alloc_extend`` / ``alloc_decode`` with pages. When the pool runs dry the
newest request is retracted, as SGLang's scheduler does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

from verify_ops.fragmentation import Fragmentation, runs_per_request
from verify_ops.sglang.compat import alloc_req_rows
from verify_ops.sglang.contiguous_alloc import attach
from verify_ops.sglang.relocation import OwnedSpan, relocate_fragmented

POLICIES = ("stock", "need_sort", "ours")


@dataclass(frozen=True)
class ChurnConfig:
    policy: str = "ours"            # one of POLICIES
    mode: str = "spec"              # "spec" (speculative steps) or "decode" (one token a step)
    page_size: int = 1
    pool_tokens: int = 16384
    max_running: int = 48
    steps: int = 300
    arrival_rate: float = 1.0       # mean new requests per step
    prompt_median: int = 256
    output_median: int = 128
    sigma: float = 1.0              # log-normal shape of both lengths: the long tail
    max_request_tokens: int = 4096
    reserve: int = 24               # spec: SGLang's 2 * max(topk * steps, draft tokens), 4x3 / 8
    max_accept: int = 4             # spec: accepted tokens per step, uniform in [1, max_accept]
    relocate_every: int = 0         # ours only: run Tier 1 every N steps (0: never)
    relocate_max_requests: int = 4
    snapshot_every: int = 0         # keep the running batch's layout every N steps (0: never)
    seed: int = 0


@dataclass
class Snapshot:
    """The running batch at one step: its req_to_token rows and committed lengths."""
    req_to_token: torch.Tensor  # [bs, width] int32; row b holds request b's slots
    seq_lens: torch.Tensor      # [bs] int64


@dataclass
class ChurnResult:
    config: ChurnConfig
    runs: Fragmentation         # over every running request at every step
    finished: int
    retracted: int
    relocated_requests: int
    snapshots: list[Snapshot] = field(default_factory=list)


@dataclass
class Request:
    uid: int
    prompt: int
    target: int                 # committed length at which it finishes
    row: Optional[int] = None
    committed: int = 0
    allocated: int = 0


class ChurnSimulation:
    """One run of the simulation; ``run()`` once, then inspect the live state."""

    def __init__(self, config: ChurnConfig):
        if config.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {config.policy!r}")
        if config.relocate_every and config.policy != "ours":
            raise ValueError("relocation needs the 'ours' policy (contiguous destinations)")
        self.config = c = config
        self.gen = torch.Generator().manual_seed(c.seed)
        need_sort = c.policy != "stock"
        if c.page_size == 1:
            self.allocator = TokenToKVPoolAllocator(c.pool_tokens, torch.bfloat16, "cpu", None,
                                                    need_sort)
        else:
            self.allocator = PagedTokenToKVPoolAllocator(c.pool_tokens, c.page_size,
                                                         torch.bfloat16, "cpu", None, need_sort)
            self.allocator.use_triton_kernels = False  # SGLang's torch path: runs on CPU
        self.policy = attach(self.allocator) if c.policy == "ours" else None
        width = c.max_request_tokens + c.reserve + 2 * c.page_size
        self.req_to_token_pool = ReqToTokenPool(size=c.max_running + 1, max_context_len=width,
                                                device="cpu", enable_memory_saver=False)
        self.req_to_token = self.req_to_token_pool.req_to_token
        # One K and one V "layer" whose slots hold (uid, position) stamps, so a
        # relocation that loses or mixes up KV shows; relocate_kv copies any dtype.
        slots = c.pool_tokens + c.page_size
        self.k_stamps = torch.zeros(slots, 1, dtype=torch.int64)
        self.v_stamps = torch.zeros(slots, 1, dtype=torch.int64)
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        self.next_uid = 1
        self.finished = self.retracted = self.relocated = 0

    # -- the loop -------------------------------------------------------------

    def run(self) -> ChurnResult:
        c = self.config
        samples, snapshots = [], []
        for step in range(1, c.steps + 1):
            self._arrive()
            self._admit()
            self._grow()
            self._finish()
            if c.relocate_every and step % c.relocate_every == 0 and self.running:
                self.relocated += relocate_fragmented(
                    self.allocator, self.req_to_token, [([self.k_stamps], [self.v_stamps])],
                    [OwnedSpan(r.row, 0, r.allocated) for r in self.running],
                    max_requests=c.relocate_max_requests).moved_requests
            if self.running:
                rows, lens = self._batch()
                samples.append(runs_per_request(self.req_to_token, rows, lens))
                if c.snapshot_every and step % c.snapshot_every == 0:
                    width = int(max(r.allocated for r in self.running))
                    snapshots.append(Snapshot(self.req_to_token[rows, :width].clone(), lens))
        runs = Fragmentation.of(torch.cat(samples) if samples else torch.zeros(0))
        return ChurnResult(c, runs, self.finished, self.retracted, self.relocated, snapshots)

    def stamp(self, uid: int, positions: torch.Tensor) -> torch.Tensor:
        """What K holds for a request's positions (V holds the negation)."""
        return uid * (1 << 32) + positions

    # -- steps ----------------------------------------------------------------

    def _lognormal(self, median: int) -> int:
        z = float(torch.randn((), generator=self.gen))
        return max(1, min(self.config.max_request_tokens // 2, round(median * math.exp(
            self.config.sigma * z))))

    def _arrive(self) -> None:
        rate = torch.tensor([self.config.arrival_rate])
        for _ in range(int(torch.poisson(rate, generator=self.gen))):
            prompt = self._lognormal(self.config.prompt_median)
            target = prompt + self._lognormal(self.config.output_median)
            self.waiting.append(Request(self.next_uid, prompt, target))
            self.next_uid += 1

    def _admit(self) -> None:
        c, batch = self.config, []
        headroom = c.reserve + 2 * c.page_size
        while (self.waiting and len(self.running) + len(batch) < c.max_running
               and self.allocator.available_size() - sum(r.prompt for r in batch)
               >= self.waiting[0].prompt + (len(self.running) + len(batch) + 1) * headroom):
            batch.append(self.waiting.pop(0))
        if not batch:
            return
        for req, row in zip(batch, alloc_req_rows(self.req_to_token_pool, len(batch))):
            req.row = row
        if self._extend(batch, [r.prompt for r in batch]):
            self.running.extend(batch)
            for req in batch:
                req.committed = req.prompt
        else:  # the admission estimate was off: give the rows back, retry later
            self.req_to_token_pool.free_rows([r.row for r in batch])
            self.waiting[:0] = batch

    def _grow(self) -> None:
        c = self.config
        while self.running:
            if c.mode == "decode":
                ends = [r.allocated + 1 for r in self.running]
            else:
                ends = [max(r.allocated, -(-(r.committed + c.reserve) // c.page_size) * c.page_size)
                        for r in self.running]
            if self._extend(self.running, ends, decode=c.mode == "decode"):
                break
            self._retract(self.running[-1])
        for req in self.running:
            accepted = 1 if c.mode == "decode" else int(
                torch.randint(1, c.max_accept + 1, (), generator=self.gen))
            req.committed = min(req.committed + accepted, req.target, req.allocated)

    def _finish(self) -> None:
        for req in [r for r in self.running if r.committed >= r.target]:
            self._release(req)
            self.finished += 1

    def _retract(self, req: Request) -> None:
        self._release(req)
        req.row, req.committed, req.allocated = None, 0, 0
        self.waiting.insert(0, req)
        self.retracted += 1

    def _release(self, req: Request) -> None:
        self.allocator.free(self.req_to_token[req.row, : req.allocated].long())
        self.req_to_token_pool.free_rows([req.row])
        self.running.remove(req)

    # -- allocation, as SGLang's helpers call the allocator ------------------

    def _extend(self, reqs: list[Request], ends: list[int], decode: bool = False) -> bool:
        """Allocate positions [allocated, end) of each request; False (nothing taken) if short."""
        starts = [r.allocated for r in reqs]
        counts = [e - s for s, e in zip(starts, ends)]
        if sum(counts) == 0:
            return True
        if self.config.page_size == 1:
            slots = self._alloc_tokens([r.row for r in reqs], starts, counts)
        else:
            slots = self._alloc_pages(reqs, starts, ends, decode)
        if slots is None:
            return False
        offset = 0
        for req, start, count in zip(reqs, starts, counts):
            new = slots[offset: offset + count]
            self.req_to_token[req.row, start: start + count] = new.to(torch.int32)
            positions = torch.arange(start, start + count)
            self.k_stamps[new, 0] = self.stamp(req.uid, positions)
            self.v_stamps[new, 0] = -self.stamp(req.uid, positions)
            req.allocated = start + count
            offset += count
        return True

    def _alloc_tokens(self, rows, starts, counts) -> Optional[torch.Tensor]:
        if self.policy is None:
            return self.allocator.alloc(sum(counts))
        with self.policy.growing(rows, starts, counts):
            return self.allocator.alloc(sum(counts))

    def _alloc_pages(self, reqs, starts, ends, decode) -> Optional[torch.Tensor]:
        prefix = torch.tensor(starts, dtype=torch.int64)
        seq = torch.tensor(ends, dtype=torch.int64)
        last_loc = torch.tensor([int(self.req_to_token[r.row, s - 1]) if s > 0 else -1
                                 for r, s in zip(reqs, starts)], dtype=torch.int64)
        if decode:
            return self.allocator.alloc_decode(seq, seq, last_loc)
        return self.allocator.alloc_extend(prefix, prefix, seq, seq, last_loc,
                                           int((seq - prefix).sum()))

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.tensor([r.row for r in self.running], dtype=torch.int64)
        lens = torch.tensor([r.committed for r in self.running], dtype=torch.int64)
        return rows, lens


def simulate(config: ChurnConfig) -> ChurnResult:
    return ChurnSimulation(config).run()
