"""What differs between the SGLang lines verify_ops supports (0.5.17 to 0.5.23),
found by feature detection, never by version strings.

0.5.17 lacks ``runtime_context.attention_backends``,
``TritonAttnBackend._target_verify_num_tokens_per_req``, the
``kv_index_translator`` (its unified pool translates through
``_translate_kv_loc``), ``dllm_attention`` and ``KVWriteLoc.for_batch``.
"""

from __future__ import annotations

from typing import Optional

import torch

from .config import BACKEND_NAME


def configured_attention_backends() -> tuple:
    """The backend names this process's server args pick for any phase; raises
    ValueError (0.5.23) or returns () (0.5.17) when no server args are published."""
    from sglang.srt import runtime_context

    if hasattr(runtime_context, "attention_backends"):
        return tuple(runtime_context.attention_backends())
    args = runtime_context.get_server_args()
    if args is None:
        return ()
    return tuple(getattr(args, name, None) for name in (
        "attention_backend", "prefill_attention_backend", "decode_attention_backend"))


def verify_ops_configured() -> bool:
    """Whether this process's server args pick the verify_ops backend for some phase."""
    try:
        return BACKEND_NAME in configured_attention_backends()
    except ValueError:  # no server args published: not a server process
        return False


def num_tokens_per_req(backend, spec_info) -> int:
    """Draft tokens per request (D) of a TARGET_VERIFY batch."""
    per_req = getattr(backend, "_target_verify_num_tokens_per_req", None)
    if per_req is not None:
        return per_req(spec_info)
    draft_tokens = getattr(spec_info, "draft_token_num", None)
    return int(draft_tokens) if draft_tokens is not None else backend.num_draft_tokens


def translates_kv_ids(backend) -> bool:
    """Whether ``req_to_token`` holds ids that need translating before they index
    the KV pool (a unified pool)."""
    translator = getattr(backend, "kv_index_translator", None)
    if translator is not None:
        return bool(translator.is_translating)
    return getattr(backend, "_translate_kv_loc", None) is not None


def runs_diffusion_lm(backend) -> bool:
    return getattr(backend, "dllm_attention", None) is not None


def kv_write_loc(forward_batch, swa_loc: Optional[torch.Tensor] = None):
    """The batch's ``out_cache_loc`` as ``set_kv_buffer``'s write loc, with the
    sliding-window sub-pool's ids for hybrid SWA pools."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if hasattr(KVWriteLoc, "for_batch"):
        return KVWriteLoc.for_batch(forward_batch, swa_loc=swa_loc)
    return KVWriteLoc(forward_batch.out_cache_loc, swa_loc)


def alloc_req_rows(req_to_token_pool, count: int) -> Optional[list]:
    """``count`` free rows of a ``ReqToTokenPool`` (``alloc_rows`` since 0.5.23;
    0.5.17 allocates rows for request objects), None when too few are free."""
    if hasattr(req_to_token_pool, "alloc_rows"):
        return req_to_token_pool.alloc_rows(count)
    from types import SimpleNamespace

    return req_to_token_pool.alloc([SimpleNamespace(req_pool_idx=None) for _ in range(count)])
