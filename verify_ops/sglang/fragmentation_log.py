"""The fragmentation log: runs per request of the verify batches, at INFO.

The backend observes every verify batch; every ``LOG_EVERY_STEPS``-th one it
logs ``verify_ops defrag: KV runs per request mean <m> p99 <p> over <n>
requests (verify step <s>)``, computed by :func:`verify_ops.measure_fragmentation`.
On at defrag levels 1 and 2 (``VERIFY_OPS_DEFRAG``).
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from ..fragmentation import measure_fragmentation
from .config import DEFRAG_OFF, defrag_level

logger = logging.getLogger(__name__)

LOG_EVERY_STEPS = 100


class FragmentationLog:
    """Logs runs per request of the verify batches at INFO, every ``every`` steps."""

    def __init__(self, every: int = LOG_EVERY_STEPS):
        self.every = every
        self.steps = 0

    @staticmethod
    def for_backend() -> Optional["FragmentationLog"]:
        return FragmentationLog() if defrag_level() != DEFRAG_OFF else None

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
