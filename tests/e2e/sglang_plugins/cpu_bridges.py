"""Test-only SGLang plugin that lets ``--device cpu`` serve speculative decoding
without sgl_kernel's CPU build (which no package provides).

It is found through ``verify_ops_e2e_plugins-0.dist-info`` next to this file, so a
server started with this folder on ``PYTHONPATH`` loads it in every process
(SGLang's ``load_plugins()``); nothing is installed. Two gaps of SGLang 0.5.23's
CPU path without ``SGLANG_USE_CPU_ENGINE=1``:

- ``RotaryEmbedding.__init__`` imports ``vllm._custom_ops.rotary_embedding``:
  we provide :mod:`rotary_stand_in` under that name.
- The speculative tree build, greedy tree verify and extend cache-location
  helpers have a branch per platform and none for a plain CPU (the tree build
  raises ``NameError: sgl_build_tree_kernel_efficient``, the cache locations
  come back ``None``). XPU's branch runs SGLang's Triton kernels, which
  ``TRITON_INTERPRET=1`` runs on CPU tensors: we take that branch.
"""

from __future__ import annotations

import logging
import sys
import types

logger = logging.getLogger(__name__)

# Modules whose platform switch has a Triton branch taken for XPU.
TRITON_BRANCH_MODULES = ("sglang.kernels.ops.speculative.spec_tree",
                         "sglang.kernels.ops.speculative.cache_locs")


def register() -> None:
    import importlib

    import torch
    from sglang.srt.utils import is_cpu, is_xpu

    if torch.cuda.is_available() or is_cpu() or is_xpu():
        return  # a platform SGLang serves on its own
    install_rotary_stand_in()
    for name in TRITON_BRANCH_MODULES:
        importlib.import_module(name)._is_xpu = True
    logger.info("e2e cpu_bridges: vllm._custom_ops.rotary_embedding stand-in and the "
                "Triton speculative kernels are in place")


def install_rotary_stand_in() -> None:
    """Make ``from vllm._custom_ops import rotary_embedding`` find the stand-in.
    ``vllm`` is a bare module, so any other ``vllm.*`` import still fails with
    ImportError, as SGLang expects without vLLM."""
    import rotary_stand_in

    if "vllm" not in sys.modules:
        sys.modules["vllm"] = types.ModuleType("vllm")
    sys.modules["vllm._custom_ops"] = rotary_stand_in
