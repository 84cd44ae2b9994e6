"""The defrag hooks: keep each request's KV in few runs of consecutive slots.

``VERIFY_OPS_DEFRAG`` picks how much is on, in every SGLang process where the
verify_ops backend is configured (``--attention-backend verify_ops``, or the
prefill/decode variants):

- ``0``: off; SGLang's allocators run stock.
- ``1`` (default): Tier 0 plus contiguity-aware allocation. The token and
  paged allocators are built with ``need_sort=True`` and get the policy of
  :mod:`.contiguous_alloc`; SGLang's allocation helpers tell the token
  allocator which request each slot is for. The backend logs the
  fragmentation metric at INFO every ``LOG_EVERY_STEPS`` verify steps.
- ``2``: also Tier 1. Every ``RELOCATE_EVERY_STEPS`` scheduling steps, the
  scheduler waits for the GPU to drain, then moves up to
  ``RELOCATE_MAX_REQUESTS`` of the running batch's most fragmented requests
  into one run each (:mod:`.relocation`), target and draft KV alike.

The hooks go through SGLang's own ``HookRegistry``, which applies them after
all plugins have loaded; nothing of SGLang is forked.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Optional

import torch

from ..fragmentation import measure_fragmentation
from .contiguous_alloc import attach, state_of
from .plugin import BACKEND_NAME
from .relocation import owned_spans, relocate_fragmented

logger = logging.getLogger(__name__)

ENV_VAR = "VERIFY_OPS_DEFRAG"
OFF, ALLOCATOR, RELOCATE = 0, 1, 2
LOG_EVERY_STEPS = 100
RELOCATE_EVERY_STEPS = 64
RELOCATE_MAX_REQUESTS = 4

_ALLOCATORS = "sglang.srt.mem_cache.allocator"
_ALLOCATION = "sglang.srt.mem_cache.allocation"
_installed = False


def defrag_level() -> int:
    value = os.environ.get(ENV_VAR, str(ALLOCATOR))
    if value not in ("0", "1", "2"):
        raise ValueError(f"{ENV_VAR} must be 0 (off), 1 (allocator) or 2 (allocator and live "
                         f"relocation), got {value!r}")
    return int(value)


def install() -> None:
    """Register the hooks for the configured level; safe to call any number of times."""
    global _installed
    level = defrag_level()
    if _installed or level == OFF:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hooks = {
        f"{_ALLOCATORS}.token.TokenToKVPoolAllocator.__init__": _build_allocator,
        f"{_ALLOCATORS}.paged.PagedTokenToKVPoolAllocator.__init__": _build_allocator,
        f"{_ALLOCATION}.alloc_for_extend": _plan_extend,
        f"{_ALLOCATION}.alloc_for_decode_default": _plan_decode,
        f"{_ALLOCATION}.alloc_for_spec_decode": _plan_spec_decode,
    }
    if level == RELOCATE:
        hooks["sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run"] = (
            _relocate_before_scheduling)
    for target, hook in hooks.items():
        HookRegistry.register(target, hook, HookType.AROUND)
    _installed = True


def verify_ops_configured() -> bool:
    """Whether this process's server args pick the verify_ops backend for some phase."""
    from sglang.srt.runtime_context import attention_backends

    try:
        return BACKEND_NAME in attention_backends()
    except ValueError:  # no server args published: not a server process
        return False


# -- Tier 0 and the allocation policy --------------------------------------


def _build_allocator(original, allocator, *args, **kwargs):
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    # Exact classes only: subclasses (NPU, ...) bring allocation paths of their own.
    ours = (type(allocator) in (TokenToKVPoolAllocator, PagedTokenToKVPoolAllocator)
            and verify_ops_configured())
    if not ours:
        return original(allocator, *args, **kwargs)
    call = inspect.signature(original).bind(allocator, *args, **kwargs)
    call.arguments["need_sort"] = True  # Tier 0
    original(*call.args, **call.kwargs)
    attach(allocator)


def _plan_extend(original, batch):
    policy = _token_policy(batch.token_to_kv_pool_allocator)
    if policy is None:
        return original(batch)
    reqs = batch.reqs
    with policy.growing([r.kv.req_pool_idx for r in reqs], batch.prefix_lens, batch.extend_lens,
                        rows_after=lambda: [r.kv.req_pool_idx for r in reqs]):
        return original(batch)


def _plan_decode(original, batch, token_per_req):
    policy = _token_policy(batch.token_to_kv_pool_allocator)
    if policy is None:
        return original(batch, token_per_req)
    reqs = batch.reqs
    with policy.growing([r.kv.req_pool_idx for r in reqs], [r.kv.kv_allocated_len for r in reqs],
                        [token_per_req] * len(reqs)):
        return original(batch, token_per_req)


def _plan_spec_decode(original, *args, **kwargs):
    call = inspect.signature(original).bind(*args, **kwargs).arguments
    policy = _token_policy(call["tree_cache"].token_to_kv_pool_allocator)
    if policy is None:
        return original(*args, **kwargs)
    cur = call["cur_kv_lens_cpu"].tolist()
    nxt = call["nxt_kv_lens_cpu"].tolist()
    with policy.growing([r.kv.req_pool_idx for r in call["reqs"]], cur,
                        [n - c for c, n in zip(cur, nxt)]):
        return original(*args, **kwargs)


def _token_policy(allocator):
    # Plans are for the token allocator; the paged one reads last_loc instead.
    policy = state_of(allocator)
    return None if policy is None or policy.is_paged else policy


# -- the fragmentation log --------------------------------------------------


class FragmentationLog:
    """Logs runs per request of the verify batches at INFO, every ``every`` steps."""

    def __init__(self, every: int = LOG_EVERY_STEPS):
        self.every = every
        self.steps = 0

    @staticmethod
    def for_backend() -> Optional["FragmentationLog"]:
        return FragmentationLog() if defrag_level() != OFF else None

    def observe(self, req_to_token: torch.Tensor, forward_batch) -> None:
        self.steps += 1
        # The summary syncs with the device: never inside a graph capture.
        if self.steps % self.every or (torch.cuda.is_available()
                                       and torch.cuda.is_current_stream_capturing()):
            return
        # CUDA-graph replays pad the batch; the padding rows are not requests.
        real = forward_batch.seq_lens.shape[0] - (getattr(forward_batch, "num_padding", 0) or 0)
        f = measure_fragmentation(req_to_token, forward_batch.req_pool_indices[:real],
                          forward_batch.seq_lens[:real])
        logger.info("verify_ops defrag: KV runs per request mean %.2f p99 %.0f over %d requests "
                    "(verify step %d)", f.mean_runs, f.p99_runs, f.num_requests, self.steps)


# -- Tier 1 -----------------------------------------------------------------


def _relocate_before_scheduling(original, scheduler, *args, **kwargs):
    call = inspect.signature(original).bind(scheduler, *args, **kwargs).arguments
    relocator = scheduler.__dict__.setdefault("_verify_ops_relocator", _LiveRelocation())
    relocator.step(scheduler, call["running_batch"])
    return original(scheduler, *args, **kwargs)


class _LiveRelocation:
    """Tier 1 inside one scheduler: runs before the next batch is built, so no
    batch metadata holds a slot it moves."""

    def __init__(self):
        self.steps = 0
        self.enabled = True

    def step(self, scheduler, running_batch) -> None:
        self.steps += 1
        if (not self.enabled or self.steps % RELOCATE_EVERY_STEPS or running_batch is None
                or not running_batch.reqs):
            return
        allocator = scheduler.token_to_kv_pool_allocator
        caches = _kv_caches(scheduler)
        if state_of(allocator) is None or caches is None:
            logger.info("verify_ops defrag: live relocation needs the contiguity-aware "
                        "allocator and plain MHA KV pools; it stays off in this process")
            self.enabled = False
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the forward in flight (overlap) may still use the slots
        try:
            moved = relocate_fragmented(allocator, scheduler.req_to_token_pool.req_to_token,
                                        caches, owned_spans(running_batch.reqs),
                                        max_requests=RELOCATE_MAX_REQUESTS)
        except Exception:  # the state is consistent; serving goes on without Tier 1
            logger.exception("verify_ops defrag: live relocation failed; it stays off")
            self.enabled = False
            return
        if moved.moved_requests:
            logger.info("verify_ops defrag: moved %d requests (%d slots) into one run each; "
                        "runs before: %s", moved.moved_requests, moved.moved_slots,
                        list(moved.runs_before))


def _kv_caches(scheduler):
    """(K, V) layer lists of every KV pool indexed by the scheduler's slots: the
    target's and the drafts'; None unless all are plain slot-major MHA pools."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    runners = [scheduler.tp_worker.model_runner]
    spec_worker = getattr(scheduler, "draft_worker", None)
    if spec_worker is not None:
        drafts = _draft_runners(spec_worker)
        if drafts is None:  # moving the target's KV alone would strand the drafter's
            return None
        runners += drafts
    pools = list({id(r.token_to_kv_pool): r.token_to_kv_pool for r in runners}.values())
    slots = pools[0].size + pools[0].page_size
    for pool in pools:
        if type(pool) is not MHATokenToKVPool or any(
                t.dim() != 3 or t.shape[0] != slots for t in (*pool.k_buffer, *pool.v_buffer)):
            return None
    return [(pool.k_buffer, pool.v_buffer) for pool in pools]


def _draft_runners(spec_worker):
    """The draft model runners behind ``scheduler.draft_worker``, SGLang's spec
    worker (e.g. ``EAGLEWorkerV2``, whose runners sit on its inner draft worker);
    None where they cannot be found."""
    find = getattr(spec_worker, "_draft_model_runners", None)
    if callable(find):
        return list(find())
    for owner in (spec_worker, getattr(spec_worker, "draft_worker", None)):
        runners = getattr(owner, "draft_runners", None)
        if runners is not None:
            return list(runners)
    return None
