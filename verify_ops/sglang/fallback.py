"""Why a model, layer or call cannot use ``verify.tree_attn_out``, logged once per reason.

``None`` from a check means the op can serve it; otherwise the reason is a
short phrase for the log line. A model-level reason turns the op off for the
whole backend (it then is exactly SGLang's Triton backend); a layer-level one
found in the model turns it off too, so one mask layout serves every layer.
Every batch that falls back is also counted (:mod:`.stats`).
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from .compat import runs_diffusion_lm, translates_kv_ids

logger = logging.getLogger(__name__)

CUDA_HEAD_DIMS = (64, 128, 256)
FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# Algorithms whose drafter builds the verify mask through the backend's
# ``verify_mask`` (``build_eagle_verify_input``); the others always write FULL_MASK.
MASK_HONORING_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")

_logged: set[str] = set()


def log_fallback_once(reason: str) -> None:
    if reason not in _logged:
        _logged.add(reason)
        logger.warning("verify_ops: %s is not supported by the tree op; "
                       "TARGET_VERIFY uses Triton's path instead", reason)


def model_fallback_reasons(backend, model_runner) -> list[str]:
    """Reasons the whole model must keep Triton's verify path (empty: use the op)."""
    from sglang.srt.runtime_context import get_spec

    from .. import has_cuda_kernel

    reasons = []
    on_cuda = torch.device(backend.device).type == "cuda"
    algorithm = str(get_spec().speculative_algorithm or "").upper()
    if algorithm not in MASK_HONORING_ALGORITHMS:
        reasons.append(f"speculative algorithm {algorithm or 'NONE'} "
                       "(its drafter writes FULL_MASK)")
    if backend.use_mla:
        reasons.append("MLA attention")
    if model_runner.model_config.is_encoder_decoder:
        reasons.append("encoder-decoder (cross) attention")
    if backend.dcp_size > 1:
        reasons.append("decode context parallelism")
    if translates_kv_ids(backend):
        reasons.append("a unified KV pool (req_to_token ids need translation)")
    if runs_diffusion_lm(backend) or backend.enable_deterministic:
        reasons.append("diffusion-LM or deterministic attention")
    if on_cuda and not has_cuda_kernel():
        reasons.append("this verify_ops build without its CUDA kernel")
    pool = backend.token_to_kv_pool
    if backend.use_sliding_window_kv_pool:
        reason = hybrid_pool_reason(pool)
        if reason is not None:
            reasons.append(reason)
    for part in kv_pools(pool):
        reason = kv_pool_reason(part, on_cuda)
        if reason is not None and reason not in reasons:
            reasons.append(reason)
    model = getattr(model_runner, "model", None)
    if model is not None:
        from sglang.srt.layers.radix_attention import RadixAttention

        for module in model.modules():
            if isinstance(module, RadixAttention):
                reason = layer_fallback_reason(module, on_cuda)
                if reason is not None and reason not in reasons:
                    reasons.append(reason)
    return reasons


def kv_pools(pool) -> list:
    """The pools that hold K/V: the sub-pools of a hybrid SWA pool, else ``pool``."""
    parts = [getattr(pool, name, None) for name in ("full_kv_pool", "swa_kv_pool")]
    return [p for p in parts if p is not None] or [pool]


def kv_pool_reason(pool, on_cuda: bool) -> Optional[str]:
    """Reason the op cannot read ``pool``'s buffers (pool attributes only, not
    ``get_key_buffer``: that one waits on layer-wise KV loading)."""
    allowed = (torch.float16, torch.bfloat16, *FP8_KV_DTYPES) + (
        () if on_cuda else (torch.float32,))
    if pool.dtype not in allowed or getattr(pool, "is_quantized_kv_cache", False):
        return f"KV cache dtype {pool.dtype} (quantized KV with per-token scales)"
    layout = getattr(pool, "kv_cache_layout", "nhd")
    if layout != "nhd":
        return f"KV cache layout {layout!r} (the op reads [slots, heads, head_dim])"
    return None


def hybrid_pool_reason(pool) -> Optional[str]:
    """Reason a hybrid (full + sliding-window) pool cannot be read through a
    translated ``req_to_token`` (:mod:`.swa_window`), or None."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    if not (hasattr(pool, "layers_mapping") and hasattr(pool, "full_to_swa_index_mapping")
            and all(isinstance(p, MHATokenToKVPool) for p in kv_pools(pool))
            and len(kv_pools(pool)) == 2):
        return f"hybrid sliding-window KV pool {type(pool).__name__} (not two MHA pools)"
    return None


def layer_fallback_reason(layer, on_cuda: bool) -> Optional[str]:
    """Reason one ``RadixAttention`` layer cannot use the op, or None."""
    from sglang.srt.layers.radix_attention import AttentionType

    if (layer.logit_cap is not None and layer.logit_cap > 0
            and getattr(layer, "logit_capping_method", "tanh") != "tanh"):
        return f"logit soft-capping method {layer.logit_capping_method!r}"
    if layer.is_cross_attention or layer.attn_type != AttentionType.DECODER:
        return "cross, encoder or bidirectional attention"
    if layer.qk_head_dim != layer.v_head_dim:
        return "different q/k and v head dims"
    if on_cuda and layer.qk_head_dim not in CUDA_HEAD_DIMS:
        return f"head_dim {layer.qk_head_dim} on CUDA (supported: {CUDA_HEAD_DIMS})"
    if layer.xai_temperature_len is not None and layer.xai_temperature_len > 0:
        return "xai temperature scaling"
    return None


def call_fallback_reason(layer, on_cuda: bool, q, k_cache, k, save_kv_cache: bool,
                         extra_kwargs: dict) -> Optional[str]:
    """Reason this forward call cannot use the op (what only a call shows)."""
    if any(extra_kwargs.get(name) is not None for name in ("score_mod", "aux_tensors")):
        return "score_mod / aux_tensors"
    if k is not None and not save_kv_cache:
        # The op reads drafts from the pool; k/v kept out of it would be missed.
        return "save_kv_cache=False with explicit k/v"
    fp8_queries = (torch.float16, torch.bfloat16) + (() if on_cuda else (torch.float32,))
    if q.dtype != k_cache.dtype and not (k_cache.dtype in FP8_KV_DTYPES
                                         and q.dtype in fp8_queries):
        return f"q dtype {q.dtype} with KV cache dtype {k_cache.dtype}"
    return layer_fallback_reason(layer, on_cuda)
