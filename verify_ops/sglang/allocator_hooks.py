"""Hooks on SGLang's allocators and allocation helpers (defrag levels 1 and 2).

- Tier 0: ``TokenToKVPoolAllocator`` and ``PagedTokenToKVPoolAllocator`` are
  built with ``need_sort=True`` and get the placement policy of
  :mod:`.contiguous_alloc` (where their internals are SGLang 0.5.23's; under
  0.5.17 Tier 0 alone, logged once).
- SGLang's ``alloc_for_extend``, ``alloc_for_decode_default`` and
  ``alloc_for_spec_decode`` tell the token allocator which request each slot
  is for (the paged allocator reads that from ``last_loc``).

Each hook has the form ``hook(original, *args, **kwargs)`` of an AROUND hook
in SGLang's ``HookRegistry``; :mod:`.defrag` registers them.
"""

from __future__ import annotations

import inspect
import logging

from .compat import verify_ops_configured
from .contiguous_alloc import attach, state_of, unsupported_reason

logger = logging.getLogger(__name__)

_ALLOCATORS = "sglang.srt.mem_cache.allocator"
_ALLOCATION = "sglang.srt.mem_cache.allocation"


def hooks() -> dict:
    """``{dotted target: AROUND hook}`` for every allocator hook this SGLang can take:
    Tier 0 always; the policy's plans where its allocators have what it needs."""
    targets = {
        f"{_ALLOCATORS}.token.TokenToKVPoolAllocator.__init__": build_allocator,
        f"{_ALLOCATORS}.paged.PagedTokenToKVPoolAllocator.__init__": build_allocator,
    }
    reason = unsupported_reason()
    if reason is not None:
        logger.warning("verify_ops defrag: %s; contiguity-aware allocation and live "
                       "relocation stay off (Tier 0, need_sort, stays on)", reason)
        return targets
    return {**targets,
            f"{_ALLOCATION}.alloc_for_extend": plan_extend,
            f"{_ALLOCATION}.alloc_for_decode_default": plan_decode,
            f"{_ALLOCATION}.alloc_for_spec_decode": plan_spec_decode}


def build_allocator(original, allocator, *args, **kwargs):
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    # Exact classes only: subclasses (NPU, ...) bring allocation paths of their own.
    ours = (type(allocator) in (TokenToKVPoolAllocator, PagedTokenToKVPoolAllocator)
            and verify_ops_configured())
    if not ours:
        return original(allocator, *args, **kwargs)
    call = inspect.signature(original).bind(allocator, *args, **kwargs)
    call.arguments["need_sort"] = True  # Tier 0
    original(*call.args, **call.kwargs)
    if unsupported_reason() is None:
        attach(allocator)


def plan_extend(original, batch):
    policy = _token_policy(batch.token_to_kv_pool_allocator)
    if policy is None:
        return original(batch)
    reqs = batch.reqs
    with policy.growing([r.kv.req_pool_idx for r in reqs], batch.prefix_lens, batch.extend_lens,
                        rows_after=lambda: [r.kv.req_pool_idx for r in reqs]):
        return original(batch)


def plan_decode(original, batch, token_per_req):
    policy = _token_policy(batch.token_to_kv_pool_allocator)
    if policy is None:
        return original(batch, token_per_req)
    reqs = batch.reqs
    with policy.growing([r.kv.req_pool_idx for r in reqs], [r.kv.kv_allocated_len for r in reqs],
                        [token_per_req] * len(reqs)):
        return original(batch, token_per_req)


def plan_spec_decode(original, *args, **kwargs):
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
