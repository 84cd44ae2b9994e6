"""How the backend served TARGET_VERIFY batches: counters readable in-process,
and with ``VERIFY_OPS_LOG_VERIFY=1`` one INFO line per batch.

Every TARGET_VERIFY batch of a backend that verifies (the target model's, not a
drafter's) counts once: as ``served`` when ``verify.tree_attn_out`` served it,
else under ``fallbacks[reason]`` when Triton's verify path did. The log lines
are exactly::

    verify_ops: TARGET_VERIFY served by tree_attn (bs=<bs>, D=<D>)
    verify_ops: TARGET_VERIFY served by Triton fallback (<reason>)

``bs`` counts the batch's requests without CUDA-graph padding. Under CUDA
graphs a batch counts when its metadata is prepared for the replay; eagerly,
at its first layer. A batch whose layers differ (a layer falls back at forward
time after an earlier one was served) also counts, and logs, each fallback.
The once-per-reason WARNING of :mod:`.fallback` is logged as well.

    >>> from verify_ops.sglang import stats
    >>> stats.snapshot()   # {"served": N, "fallbacks": {reason: N, ...}}
"""

from __future__ import annotations

import logging
from collections import Counter

from .config import log_verify

logger = logging.getLogger(__name__)

served = 0
fallbacks: Counter = Counter()


def record_served(bs: int, num_drafts: int) -> None:
    global served
    served += 1
    if log_verify():
        logger.info("verify_ops: TARGET_VERIFY served by tree_attn (bs=%d, D=%d)", bs,
                    num_drafts)


def record_fallback(reason: str) -> None:
    fallbacks[reason] += 1
    if log_verify():
        logger.info("verify_ops: TARGET_VERIFY served by Triton fallback (%s)", reason)


def snapshot() -> dict:
    """``{"served": int, "fallbacks": {reason: int}}``, a copy."""
    return {"served": served, "fallbacks": dict(fallbacks)}


def reset() -> None:
    global served
    served = 0
    fallbacks.clear()
