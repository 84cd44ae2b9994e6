"""Tier 1 in a live server (defrag level 2): relocation between scheduling steps.

Every ``RELOCATE_EVERY_STEPS`` scheduling steps, before the scheduler builds
the next batch, the GPU drains and up to ``RELOCATE_MAX_REQUESTS`` of the
running batch's most fragmented requests move into one run each
(:func:`.relocation.relocate_fragmented`), the target's KV and the drafts'
alike. :func:`relocate_before_scheduling` is an AROUND hook on
``Scheduler.get_next_batch_to_run``; :mod:`.defrag` registers it.
"""

from __future__ import annotations

import inspect
import logging

import torch

from .contiguous_alloc import state_of
from .relocation import owned_spans, relocate_fragmented

logger = logging.getLogger(__name__)

HOOK_TARGET = "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run"
RELOCATE_EVERY_STEPS = 64
RELOCATE_MAX_REQUESTS = 4


def relocate_before_scheduling(original, scheduler, *args, **kwargs):
    call = inspect.signature(original).bind(scheduler, *args, **kwargs).arguments
    relocator = scheduler.__dict__.setdefault("_verify_ops_relocator", LiveRelocation())
    relocator.step(scheduler, call["running_batch"])
    return original(scheduler, *args, **kwargs)


class LiveRelocation:
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
        caches = kv_caches(scheduler)
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


def kv_caches(scheduler):
    """(K, V) layer lists of every KV pool indexed by the scheduler's slots: the
    target's and the drafts'; None unless all are plain slot-major MHA pools."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    runners = [scheduler.tp_worker.model_runner]
    spec_worker = getattr(scheduler, "draft_worker", None)
    if spec_worker is not None:
        drafts = draft_runners(spec_worker)
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


def draft_runners(spec_worker):
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
