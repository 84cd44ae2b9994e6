"""Why a model, layer or call cannot use ``verify.tree_attn_out``, logged once per reason.

``None`` from a check means the op can serve it; otherwise the reason is a
short phrase for the log line. A model-level reason turns the op off for the
whole backend (it then is exactly SGLang's Triton backend); a layer-level one
found in the model turns it off too, so one mask layout serves every layer.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

logger = logging.getLogger(__name__)

CUDA_HEAD_DIMS = (64, 128, 256)
# Where SGLang's models keep the attention-sink logits they pass to the backend.
SINK_ATTRIBUTES = ("sinks", "attention_sink_bias")
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
    if backend.sliding_window_size is not None or backend.use_sliding_window_kv_pool:
        reasons.append("sliding-window attention")
    if model_runner.model_config.is_encoder_decoder:
        reasons.append("encoder-decoder (cross) attention")
    if backend.dcp_size > 1:
        reasons.append("decode context parallelism")
    if backend.kv_index_translator is not None and backend.kv_index_translator.is_translating:
        reasons.append("a unified KV pool (req_to_token ids need translation)")
    if backend.dllm_attention is not None or backend.enable_deterministic:
        reasons.append("diffusion-LM or deterministic attention")
    if on_cuda and not has_cuda_kernel():
        reasons.append("this verify_ops build without its CUDA kernel")
    # Pool attributes, not get_key_buffer: that one waits on layer-wise KV loading.
    pool = backend.token_to_kv_pool
    allowed = (torch.float16, torch.bfloat16) + (() if on_cuda else (torch.float32,))
    if pool.dtype not in allowed or getattr(pool, "is_quantized_kv_cache", False):
        reasons.append(f"KV cache dtype {pool.dtype} (fp8 or other quantized KV)")
    layout = getattr(pool, "kv_cache_layout", "nhd")
    if layout != "nhd":
        reasons.append(f"KV cache layout {layout!r} (the op reads [slots, heads, head_dim])")
    model = getattr(model_runner, "model", None)
    if model is not None:
        from sglang.srt.layers.radix_attention import RadixAttention

        for module in model.modules():
            # Sinks are passed per call, which under CUDA graphs is too late to
            # fall back: a model that holds them (gpt-oss, Granite, MiMo) keeps
            # Triton's path throughout.
            if (any(isinstance(getattr(module, name, None), torch.Tensor)
                    for name in SINK_ATTRIBUTES) and "attention sinks" not in reasons):
                reasons.append("attention sinks")
            if isinstance(module, RadixAttention):
                reason = layer_fallback_reason(module, on_cuda)
                if reason is not None and reason not in reasons:
                    reasons.append(reason)
    return reasons


def layer_fallback_reason(layer, on_cuda: bool) -> Optional[str]:
    """Reason one ``RadixAttention`` layer cannot use the op, or None."""
    from sglang.srt.layers.radix_attention import AttentionType

    if layer.logit_cap is not None and layer.logit_cap > 0:
        return "logit soft-capping"
    if layer.sliding_window_size is not None and layer.sliding_window_size > -1:
        return "sliding-window attention"
    if layer.is_cross_attention or layer.attn_type != AttentionType.DECODER:
        return "cross, encoder or bidirectional attention"
    if layer.qk_head_dim != layer.v_head_dim:
        return "different q/k and v head dims"
    if on_cuda and layer.qk_head_dim not in CUDA_HEAD_DIMS:
        return f"head_dim {layer.qk_head_dim} on CUDA (supported: {CUDA_HEAD_DIMS})"
    if layer.k_scale is not None or layer.v_scale is not None:
        return "scaled (fp8) KV"
    if layer.xai_temperature_len is not None and layer.xai_temperature_len > 0:
        return "xai temperature scaling"
    return None


def call_fallback_reason(layer, on_cuda: bool, q, k_cache, k, save_kv_cache: bool, sinks,
                         extra_kwargs: dict) -> Optional[str]:
    """Reason this forward call cannot use the op (what only a call shows)."""
    if sinks is not None:
        return "attention sinks"
    if any(extra_kwargs.get(name) is not None for name in ("score_mod", "aux_tensors")):
        return "score_mod / aux_tensors"
    if k is not None and not save_kv_cache:
        # The op reads drafts from the pool; k/v kept out of it would be missed.
        return "save_kv_cache=False with explicit k/v"
    if q.dtype != k_cache.dtype:
        return f"q dtype {q.dtype} with KV cache dtype {k_cache.dtype}"
    return layer_fallback_reason(layer, on_cuda)
