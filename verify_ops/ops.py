"""Python wrappers and fake (meta) kernels for the ``torch.ops.verify`` ops.

The schemas live in ``csrc/torch_bindings.cpp``. The fake kernels run the same
shape checks as the C++ kernels (``csrc/common/tree_attn_checks.cpp``), with the same messages,
so ``torch.compile`` rejects bad input at trace time the way eager code does.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import _C  # noqa: F401  (loads the library that registers the ops)

_OP = "verify.tree_attn"
_INDEX_DTYPES = (torch.int32, torch.int64)


def _fail(message: str) -> None:
    raise RuntimeError(f"{_OP}: {message}")


# c10's ScalarType names, which the C++ messages print.
_SCALAR_TYPE_NAMES = {
    torch.float64: "Double", torch.float32: "Float", torch.float16: "Half",
    torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int", torch.int16: "Short",
    torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool",
    torch.uint16: "UInt16", torch.uint32: "UInt32", torch.uint64: "UInt64",
    torch.complex32: "ComplexHalf", torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble", torch.float8_e4m3fn: "Float8_e4m3fn",
    torch.float8_e5m2: "Float8_e5m2", torch.float8_e4m3fnuz: "Float8_e4m3fnuz",
    torch.float8_e5m2fnuz: "Float8_e5m2fnuz",
}


def _dtype_str(dtype: torch.dtype) -> str:
    return _SCALAR_TYPE_NAMES.get(dtype, str(dtype))


def _shape_str_of(sizes) -> str:
    return "[" + ", ".join(str(s) for s in sizes) + "]"


def _shape_str(t: torch.Tensor) -> str:
    return _shape_str_of(t.shape)


_FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def check_tree_attn_args(q, k_cache, v_cache, req_to_token, req_pool_indices,
                         seq_lens, tree_mask, out=None, k_scale=None, v_scale=None,
                         logit_cap=0.0, sinks=None, sliding_window=-1, lse=None) -> int:
    """Mirror of ``check_tree_attn_args`` in csrc/common/tree_attn_checks.cpp; returns D."""
    for t, name, rank, layout in (
        (q, "q", 3, "[bs*D, Hq, head_dim]"),
        (k_cache, "k_cache", 3, "[pool, Hkv, head_dim]"),
        (v_cache, "v_cache", 3, "[pool, Hkv, head_dim]"),
        (req_to_token, "req_to_token", 2, "[R, max_ctx]"),
        (req_pool_indices, "req_pool_indices", 1, "[bs]"),
        (seq_lens, "seq_lens", 1, "[bs]"),
        (tree_mask, "tree_mask", 3, "[bs, D, D]"),
    ):
        if t.dim() != rank:
            _fail(f"{name} must be {rank}-D {layout}, got {t.dim()}-D with shape {_shape_str(t)}")

    on_cpu = q.device.type in ("cpu", "meta")  # meta: the real device is unknown
    allowed = (torch.bfloat16, torch.float16) + ((torch.float32,) if on_cpu else ())
    if q.dtype not in allowed:
        cpu_note = " (float32 is also accepted on CPU)" if on_cpu else ""
        _fail(f"q must have dtype bfloat16 or float16{cpu_note}, "
              f"got {_dtype_str(q.dtype)} on {q.device}")
    if k_cache.dtype != q.dtype and k_cache.dtype not in _FP8_KV_DTYPES:
        _fail(f"k_cache must have the dtype of q ({_dtype_str(q.dtype)}) or be float8_e4m3fn "
              f"or float8_e5m2, got {_dtype_str(k_cache.dtype)}")
    if v_cache.dtype != k_cache.dtype:
        _fail(f"v_cache must have the dtype of k_cache ({_dtype_str(k_cache.dtype)}), "
              f"got {_dtype_str(v_cache.dtype)}")
    for t, name in ((req_to_token, "req_to_token"), (req_pool_indices, "req_pool_indices"),
                    (seq_lens, "seq_lens")):
        if t.dtype not in _INDEX_DTYPES:
            _fail(f"{name} must have dtype int32 or int64, got {_dtype_str(t.dtype)}")
    if tree_mask.dtype != torch.bool:
        _fail(f"tree_mask must have dtype bool, got {_dtype_str(tree_mask.dtype)}")
    for t, name in ((k_cache, "k_cache"), (v_cache, "v_cache"), (req_to_token, "req_to_token"),
                    (req_pool_indices, "req_pool_indices"), (seq_lens, "seq_lens"),
                    (tree_mask, "tree_mask")):
        if t.device != q.device:
            _fail(f"{name} must be on the same device as q ({q.device}), got {t.device}")

    bs = seq_lens.shape[0]
    if req_pool_indices.shape[0] != bs:
        _fail(f"req_pool_indices must have bs = seq_lens.size(0) = {bs} entries, "
              f"got {req_pool_indices.shape[0]}")
    if tree_mask.shape[0] != bs:
        _fail(f"tree_mask.size(0) must equal bs = seq_lens.size(0) = {bs}, got {tree_mask.shape[0]}")
    if bs > 0:
        if q.shape[0] % bs != 0:
            _fail(f"q.size(0) must be a multiple of bs = {bs}, got {q.shape[0]}")
        num_drafts = q.shape[0] // bs
    else:
        if q.shape[0] != 0:
            _fail(f"q.size(0) must be 0 when bs = 0, got {q.shape[0]}")
        num_drafts = tree_mask.shape[1]
    if tree_mask.shape[1] != num_drafts or tree_mask.shape[2] != num_drafts:
        _fail(f"tree_mask must have shape [bs, D, D] = [{bs}, {num_drafts}, {num_drafts}] "
              f"(D = q.size(0) / bs), got {_shape_str(tree_mask)}")

    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[1]
    if head_dim <= 0:
        _fail(f"head_dim must be positive, got {head_dim}")
    if num_kv_heads <= 0 or num_q_heads % num_kv_heads != 0:
        _fail(f"Hq (q.size(1) = {num_q_heads}) must be a positive multiple of "
              f"Hkv (k_cache.size(1) = {num_kv_heads})")
    if k_cache.shape[2] != head_dim:
        _fail(f"k_cache head_dim must equal q's ({head_dim}), got {k_cache.shape[2]}")
    if v_cache.shape != k_cache.shape:
        _fail(f"v_cache must have the shape of k_cache ({_shape_str(k_cache)}), "
              f"got {_shape_str(v_cache)}")
    for t, name in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache")):
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            _fail(f"{name} must have a contiguous last dim (stride 1), got stride {t.stride(-1)}")
    if out is not None:
        if out.shape != q.shape:
            _fail(f"out must have the shape of q ({_shape_str(q)}), got {_shape_str(out)}")
        if out.dtype != q.dtype:
            _fail(f"out must have the dtype of q ({_dtype_str(q.dtype)}), got {_dtype_str(out.dtype)}")
        if out.device != q.device:
            _fail(f"out must be on the same device as q ({q.device}), got {out.device}")
        if out.shape[-1] > 1 and out.stride(-1) != 1:
            _fail(f"out must have a contiguous last dim (stride 1), got stride {out.stride(-1)}")
        # Strides first: a normal out then adds no guard on its symbolic sizes.
        if any(stride == 0 and size > 1 for stride, size in zip(out.stride(), out.shape)):
            _fail("out must not overlap itself (stride 0 on a dim of size > 1), got strides "
                  f"{_shape_str_of(out.stride())} for shape {_shape_str(out)}")
    _check_options(q, num_q_heads, k_scale, v_scale, logit_cap, sinks, sliding_window, lse)
    if q.device.type == "cuda" and head_dim not in (64, 128, 256):
        _fail(f"head_dim must be 64, 128 or 256 on CUDA, got {head_dim}")
    return num_drafts


def _check_options(q, num_q_heads, k_scale, v_scale, logit_cap, sinks, sliding_window,
                   lse) -> None:
    for scale, name in ((k_scale, "k_scale"), (v_scale, "v_scale")):
        if scale is not None and (scale.numel() != 1 or scale.dtype != torch.float32
                                  or scale.device != q.device):
            _fail(f"{name} must be a one-element float32 tensor on q's device ({q.device}), "
                  f"got {scale.numel()} elements of {_dtype_str(scale.dtype)} on {scale.device}")
    if not (logit_cap >= 0 and math.isfinite(logit_cap)):
        _fail(f"logit_cap must be >= 0 (0 = off) and finite, got {logit_cap:f}")
    if sliding_window < -1:
        _fail(f"sliding_window must be -1 (off) or >= 0, got {sliding_window}")
    if sinks is not None:
        if sinks.dtype != torch.float32:
            _fail(f"sinks must have dtype float32, got {_dtype_str(sinks.dtype)}")
        if sinks.device != q.device:
            _fail(f"sinks must be on the same device as q ({q.device}), got {sinks.device}")
        if sinks.dim() != 1 or sinks.shape[0] != num_q_heads:
            _fail(f"sinks must have shape [Hq] = [{num_q_heads}], got {_shape_str(sinks)}")
    if lse is not None:
        if lse.dtype != torch.float32:
            _fail(f"lse must have dtype float32, got {_dtype_str(lse.dtype)}")
        if lse.device != q.device:
            _fail(f"lse must be on the same device as q ({q.device}), got {lse.device}")
        if lse.dim() != 2 or lse.shape[0] != q.shape[0] or lse.shape[1] != num_q_heads:
            _fail(f"lse must have shape [bs*D, Hq] = [{q.shape[0]}, {num_q_heads}], "
                  f"got {_shape_str(lse)}")
        if any(stride == 0 and size > 1 for stride, size in zip(lse.stride(), lse.shape)):
            _fail("lse must not overlap itself (stride 0 on a dim of size > 1), got strides "
                  f"{_shape_str_of(lse.stride())} for shape {_shape_str(lse)}")


@torch.library.register_fake("verify::tree_attn_out")
def _tree_attn_out_fake(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                        tree_mask, sm_scale, out, *, k_scale=None, v_scale=None, logit_cap=0.0,
                        sinks=None, sliding_window=-1, lse=None):
    check_tree_attn_args(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                         tree_mask, out, k_scale, v_scale, logit_cap, sinks, sliding_window, lse)


_OPTIONS_DOC = """
    Options (keyword-only; each default keeps plain attention, and all combine):
        k_scale, v_scale: ``None`` (1.0) or one-element float32 tensors on q's
            device, for fp8 pools as SGLang's layers carry them: scores are
            ``sm_scale * k_scale * (q . k)`` and the output is
            ``v_scale * (P . v)``. Tensors, so that a captured graph reads the
            value current at each replay.
        logit_cap: ``> 0`` soft-caps each scaled score to
            ``cap * tanh(score / cap)`` before the softmax (SGLang's
            ``RadixAttention.logit_cap``, Grok and Gemma); 0 is off.
        sinks: ``None`` or float32 ``[Hq]``: one logit per q head that enters
            the softmax denominator only (gpt-oss).
        sliding_window: ``-1`` (off) or W >= 0, by logical position: prefix
            token t sits at t and draft j at ``seq_lens[b] + depth(j)``, its
            depth in the tree (the number of other drafts its mask row
            shows), never its flattened index; a query at position P sees
            keys at P - W .. P (SGLang's ``sliding_window_size``, FlashAttention
            ``window_size=(W, 0)``). KV wholly before ``seq_lens[b] - W`` is
            never read.
"""


def tree_attn(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
              seq_lens: torch.Tensor, tree_mask: torch.Tensor, sm_scale: float, *,
              k_scale: Optional[torch.Tensor] = None, v_scale: Optional[torch.Tensor] = None,
              logit_cap: float = 0.0, sinks: Optional[torch.Tensor] = None,
              sliding_window: int = -1, return_lse: bool = False):
    """Tree attention for speculative-decoding verify over SGLang's KV buffers.

    Request ``b`` has ``D = q.shape[0] // bs`` draft tokens. Draft ``i`` of
    request ``b`` attends to the request's ``seq_lens[b]`` committed prefix
    tokens and to every draft ``j`` with ``tree_mask[b, i, j]`` true (itself
    and its ancestors). The K/V of position ``p`` (prefix ``0..L-1``, then
    drafts ``L..L+D-1``) sits in pool slot
    ``req_to_token[req_pool_indices[b], p]``; SGLang writes the drafts' K/V
    there before attention runs. Softmax uses ``sm_scale`` and accumulates in
    fp32. A query row that sees no key at all outputs zeros.

    Args:
        q: ``[bs*D, Hq, d]``, bfloat16 or float16 (float32 also on CPU). Rows
            ``b*D .. b*D+D-1`` belong to request ``b``. The last dim must be
            contiguous; other strides are free (a view into a fused QKV).
        k_cache, v_cache: ``[pool, Hkv, d]``: one layer of SGLang's token KV
            pool, in q's dtype or float8_e4m3fn / float8_e5m2 (both the same).
            ``Hq % Hkv == 0`` (GQA/MQA). Paged pools (page_size > 1) are the
            same buffers; ``req_to_token`` still holds token slots.
        req_to_token: ``[R, max_ctx]`` int32 (int64 accepted): SGLang's
            ReqToTokenPool.
        req_pool_indices: ``[bs]`` int64 (int32 accepted).
        seq_lens: ``[bs]`` int64 (int32 accepted): committed prefix lengths,
            drafts excluded.
        tree_mask: ``[bs, D, D]`` bool, SGLang's QLEN_ONLY layout.
        sm_scale: softmax scale, usually ``d ** -0.5``.
        return_lse: also return the ``[bs*D, Hq]`` float32 natural-log
            log-sum-exp of each row's scores (sinks included; -inf for a row
            that sees nothing), for :func:`verify_ops.merge_attn_states`.
{options}
    Returns:
        ``[bs*D, Hq, d]`` in q's dtype, or ``(out, lse)`` with ``return_lse``.

    CUDA supports head dims 64, 128 and 256, and at most 65535 (request, KV
    head) pairs, 2^32 pool slots, 2^31 - 1 positions per request and 2^31 - 1
    query rows. Value checks (slots inside the pool, ``seq_lens + D <=
    max_ctx``, request rows in range) always run on CPU; on CUDA they need a
    device sync and run only with ``VERIFY_OPS_DEBUG=1``. On CPU the KV range
    is split across threads when (request, KV head) pairs are fewer than
    ``torch.get_num_threads()``, so results may differ in the last bits
    between thread counts; never with where a request's slots lie.
    """
    options = dict(k_scale=k_scale, v_scale=v_scale, logit_cap=logit_cap, sinks=sinks,
                   sliding_window=sliding_window)
    if not return_lse:
        return torch.ops.verify.tree_attn(q, k_cache, v_cache, req_to_token, req_pool_indices,
                                          seq_lens, tree_mask, sm_scale, **options)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    torch.ops.verify.tree_attn_out(q, k_cache, v_cache, req_to_token, req_pool_indices,
                                   seq_lens, tree_mask, sm_scale, out, lse=lse, **options)
    return out, lse


def tree_attn_out(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                  seq_lens: torch.Tensor, tree_mask: torch.Tensor, sm_scale: float,
                  out: torch.Tensor, *, k_scale: Optional[torch.Tensor] = None,
                  v_scale: Optional[torch.Tensor] = None, logit_cap: float = 0.0,
                  sinks: Optional[torch.Tensor] = None, sliding_window: int = -1,
                  lse: Optional[torch.Tensor] = None) -> None:
    """:func:`tree_attn` writing into a preallocated ``out`` of q's shape and dtype.

    ``out``'s last dim must be contiguous. ``lse``, if given, is a float32
    ``[bs*D, Hq]`` tensor that receives each row's natural-log log-sum-exp.
    Nothing is allocated beyond split-KV workspace from PyTorch's caching
    allocator, so the call is safe to capture in a CUDA graph.
{options}"""
    torch.ops.verify.tree_attn_out(q, k_cache, v_cache, req_to_token, req_pool_indices,
                                   seq_lens, tree_mask, sm_scale, out, k_scale=k_scale,
                                   v_scale=v_scale, logit_cap=logit_cap, sinks=sinks,
                                   sliding_window=sliding_window, lse=lse)


tree_attn.__doc__ = tree_attn.__doc__.format(options=_OPTIONS_DOC)
tree_attn_out.__doc__ = tree_attn_out.__doc__.format(options=_OPTIONS_DOC)


def has_cuda_kernel() -> bool:
    """True when this build has the CUDA kernels and a GPU is visible."""
    return bool(_C.built_with_cuda) and torch.cuda.is_available()
