"""Names and settings the SGLang integration shares: the backend's name and the
environment variables that configure it.

A leaf: it imports nothing of ``verify_ops.sglang``, so every other module may
import it without an import circle.

- ``VERIFY_OPS_DEFRAG`` = ``0`` (off), ``1`` (default: Tier 0 and the
  contiguity-aware allocator, plus the fragmentation log) or ``2`` (also Tier 1,
  live relocation); see :mod:`.defrag`.
- ``VERIFY_OPS_LOG_VERIFY=1``: the backend logs one INFO line per
  TARGET_VERIFY batch saying whether the op or Triton's fallback served it;
  see :mod:`.stats`.
"""

from __future__ import annotations

import os

BACKEND_NAME = "verify_ops"

DEFRAG_ENV_VAR = "VERIFY_OPS_DEFRAG"
DEFRAG_OFF, DEFRAG_ALLOCATOR, DEFRAG_RELOCATE = 0, 1, 2


def defrag_level() -> int:
    """``VERIFY_OPS_DEFRAG`` as one of the three levels; any other value is an error."""
    value = os.environ.get(DEFRAG_ENV_VAR, str(DEFRAG_ALLOCATOR))
    if value not in ("0", "1", "2"):
        raise ValueError(f"{DEFRAG_ENV_VAR} must be 0 (off), 1 (allocator) or 2 (allocator and "
                         f"live relocation), got {value!r}")
    return int(value)


# 1: one INFO line per TARGET_VERIFY batch saying what served it (stats.py).
LOG_VERIFY_ENV_VAR = "VERIFY_OPS_LOG_VERIFY"


def log_verify() -> bool:
    return os.environ.get(LOG_VERIFY_ENV_VAR, "0") not in ("", "0")
