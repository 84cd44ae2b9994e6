"""The defrag hooks: keep each request's KV in few runs of consecutive slots.

``VERIFY_OPS_DEFRAG`` (:func:`.config.defrag_level`) picks how much is on, in
every SGLang process where the verify_ops backend is configured
(``--attention-backend verify_ops``, or the prefill/decode variants):

- ``0``: off; SGLang's allocators run stock.
- ``1`` (default): Tier 0 plus contiguity-aware allocation
  (:mod:`.allocator_hooks`, :mod:`.contiguous_alloc`); the backend logs the
  fragmentation metric (:mod:`.fragmentation_log`).
- ``2``: also Tier 1, live relocation between scheduling steps
  (:mod:`.live_relocation`, :mod:`.relocation`).

The hooks go through SGLang's own ``HookRegistry``, which applies them after
all plugins have loaded; nothing of SGLang is forked.
"""

from __future__ import annotations

from . import allocator_hooks, live_relocation
from .config import DEFRAG_OFF, DEFRAG_RELOCATE, defrag_level

_installed = False


def install() -> None:
    """Register the hooks for the configured level; safe to call any number of times."""
    global _installed
    level = defrag_level()
    if _installed or level == DEFRAG_OFF:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hooks = allocator_hooks.hooks()
    if level == DEFRAG_RELOCATE:
        hooks[live_relocation.HOOK_TARGET] = live_relocation.relocate_before_scheduling
    for target, hook in hooks.items():
        HookRegistry.register(target, hook, HookType.AROUND)
    _installed = True
