"""Test-only SGLang plugin: with ``E2E_RELOCATE_EVERY_STEPS=N`` set, verify_ops'
live relocation (``VERIFY_OPS_DEFRAG=2``) looks for fragmented requests every N
scheduling steps instead of every 64, so that a short test's few dozen steps
see it run. It changes nothing else; without the variable it does nothing.
"""

from __future__ import annotations

import importlib
import logging
import os

logger = logging.getLogger(__name__)

ENV_VAR = "E2E_RELOCATE_EVERY_STEPS"
# Where verify_ops keeps the cadence (the module was split out of defrag.py).
CADENCE_MODULES = ("verify_ops.sglang.live_relocation", "verify_ops.sglang.defrag")
CADENCE_NAME = "RELOCATE_EVERY_STEPS"


def register() -> None:
    value = os.environ.get(ENV_VAR)
    if not value:
        return
    for name in CADENCE_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, CADENCE_NAME):
            setattr(module, CADENCE_NAME, int(value))
            logger.info("e2e relocation_cadence: %s.%s = %s", name, CADENCE_NAME, value)
            return
    raise RuntimeError(f"{ENV_VAR} is set, but none of {CADENCE_MODULES} has {CADENCE_NAME}")
