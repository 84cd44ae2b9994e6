"""``verify.relocate_kv``: move KV slots to new slots in every layer, in one launch.

The schema lives in ``csrc/torch_bindings.cpp``. The fake kernel runs the same
checks as ``csrc/common/relocate_kv_checks.cpp``, with the same messages.
"""

from __future__ import annotations

from typing import Sequence

import torch

from . import _C  # noqa: F401  (loads the library that registers the ops)
from .ops import _dtype_str, _shape_str

_OP = "verify.relocate_kv"


def _fail(message: str) -> None:
    raise RuntimeError(f"{_OP}: {message}")


def _check_cache_list(caches: Sequence[torch.Tensor], name: str, first_k: torch.Tensor) -> None:
    for i, t in enumerate(caches):
        if t.dim() < 1:
            _fail(f"{name}[{i}] must be at least 1-D [pool, ...], got 0-D")
        if t.dtype != first_k.dtype:
            _fail(f"{name}[{i}] must have the dtype of k_caches[0] ({_dtype_str(first_k.dtype)}), "
                  f"got {_dtype_str(t.dtype)}")
        if t.device != first_k.device:
            _fail(f"{name}[{i}] must be on the device of k_caches[0] ({first_k.device}), "
                  f"got {t.device}")
        if t.shape != caches[0].shape:
            _fail(f"{name}[{i}] must have the shape of {name}[0] ({_shape_str(caches[0])}), "
                  f"got {_shape_str(t)}")
        expected = 1
        for d in range(t.dim() - 1, 0, -1):
            if t.shape[d] != 1 and t.stride(d) != expected:
                _fail(f"{name}[{i}] must store each slot contiguously (dims after the first in "
                      f"row-major order), got shape {_shape_str(t)} with strides "
                      f"[{', '.join(str(s) for s in t.stride())}]")
            expected *= t.shape[d]


def _check_slots(t: torch.Tensor, name: str, first_k: torch.Tensor) -> None:
    if t.dim() != 1:
        _fail(f"{name} must be 1-D [n], got {t.dim()}-D with shape {_shape_str(t)}")
    if t.dtype not in (torch.int32, torch.int64):
        _fail(f"{name} must have dtype int32 or int64, got {_dtype_str(t.dtype)}")
    if t.device != first_k.device:
        _fail(f"{name} must be on the device of k_caches[0] ({first_k.device}), got {t.device}")


def check_relocate_kv_args(k_caches, v_caches, src_slots, dst_slots) -> None:
    """Mirror of ``check_relocate_kv_args`` in csrc/common/relocate_kv_checks.cpp."""
    if len(k_caches) == 0:
        _fail("k_caches must hold at least one layer, got 0")
    if len(v_caches) != len(k_caches):
        _fail(f"v_caches must hold one cache per layer of k_caches ({len(k_caches)}), "
              f"got {len(v_caches)}")
    first_k = k_caches[0]
    _check_cache_list(k_caches, "k_caches", first_k)
    _check_cache_list(v_caches, "v_caches", first_k)
    if v_caches[0].shape[0] != first_k.shape[0]:
        _fail(f"v_caches[0].size(0) must equal the pool size k_caches[0].size(0) = "
              f"{first_k.shape[0]}, got {v_caches[0].shape[0]}")
    _check_slots(src_slots, "src_slots", first_k)
    _check_slots(dst_slots, "dst_slots", first_k)
    if dst_slots.dtype != src_slots.dtype:
        _fail(f"dst_slots must have the dtype of src_slots ({_dtype_str(src_slots.dtype)}), "
              f"got {_dtype_str(dst_slots.dtype)}")
    if dst_slots.shape[0] != src_slots.shape[0]:
        _fail(f"dst_slots must have the length of src_slots ({src_slots.shape[0]}), "
              f"got {dst_slots.shape[0]}")


@torch.library.register_fake("verify::relocate_kv")
def _relocate_kv_fake(k_caches, v_caches, src_slots, dst_slots):
    check_relocate_kv_args(k_caches, v_caches, src_slots, dst_slots)


def relocate_kv(k_caches: Sequence[torch.Tensor], v_caches: Sequence[torch.Tensor],
                src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
    """Copy KV slot ``src_slots[i]`` to ``dst_slots[i]`` in every layer's K and V cache.

    ``dst[i] = src[i]`` for all layers; the source slots keep their contents.
    On CUDA every layer's K and V move in one kernel launch (one per 224
    layers), with 16-byte vector copies where alignment allows.

    Args:
        k_caches, v_caches: one cache per layer, ``[pool, ...]``, all of one
            dtype and device. K caches share one shape, V caches share one
            shape (V may differ from K past dim 0). Each slot's row (the dims
            after the first) must be contiguous; the slot stride is free.
        src_slots, dst_slots: ``[n]``, int32 or int64 (both the same), on the
            caches' device.

    ``src_slots`` and ``dst_slots`` must be disjoint and ``dst_slots`` must
    not repeat a slot, or the result depends on the copy order. Those value
    checks (plus slots inside the pool) always run on CPU; on CUDA they need a
    device sync and run only with ``VERIFY_OPS_DEBUG=1``, so by default the op
    is safe to capture. The caches' version counters are bumped.
    """
    torch.ops.verify.relocate_kv(list(k_caches), list(v_caches), src_slots, dst_slots)
