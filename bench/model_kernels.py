"""The fused kernels of bench/model_step.py's decoder layers, in Triton, each with
the plain-torch function it must match (the tests run both).

A verify step moves a few dozen tokens, so each of these is a handful of
microseconds; run as chains of plain torch ops they would be several launches
each and make the rest of the step look slower than a serving engine's fused
kernels, and attention's share of it smaller. They are what SGLang fuses: the
residual add with RMSNorm, QK-norm with RoPE and the KV write, SiLU-and-mul,
and the MoE token routing (sort by expert) with a grouped GEMM that reads only
the routed experts' weights.
"""

from __future__ import annotations

import math

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch references and the rest of bench/ need no Triton
    triton = None


def _require_triton() -> None:
    if triton is None:
        raise RuntimeError("bench.model_kernels needs Triton")


# ---------------------------------------------------------------- residual add + RMSNorm

def add_rmsnorm_ref(x, residual, weight, eps, has_residual):
    """``residual = x + residual`` (or ``x``), then ``rmsnorm(residual) * weight``;
    returns (normed, residual) without touching the inputs. [T, H] each."""
    total = x.float() + residual.float() if has_residual else x.float()
    normed = total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return normed.to(x.dtype), total.to(x.dtype)


if triton is not None:
    @triton.jit
    def _add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, H, eps,
                            HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        m = offs < H
        x = tl.load(x_ptr + row * H + offs, mask=m, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            x += tl.load(res_ptr + row * H + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(res_ptr + row * H + offs, x.to(res_ptr.dtype.element_ty), mask=m)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
        w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * H + offs, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=m)


def add_rmsnorm(x, residual, weight, out, eps, has_residual):
    """In place: ``residual = x + residual`` (``x`` where not ``has_residual``), and
    ``out = rmsnorm(residual) * weight``. All [T, H] contiguous but weight [H]."""
    _require_triton()
    rows, hidden = x.shape
    block = triton.next_power_of_2(hidden)
    _add_rmsnorm_kernel[(rows,)](x, residual, weight, out, hidden, eps, HAS_RESIDUAL=has_residual,
                                 BLOCK=block, num_warps=min(16, max(1, block // 256)))


# ------------------------------------------------- QK-norm, RoPE, and the KV write

def rope_angles(positions, head_dim, theta):
    """[T, head_dim / 2] float32 angles of NeoX-style RoPE (halves rotated)."""
    inv_freq = theta ** (-torch.arange(0, head_dim // 2, dtype=torch.float32,
                                       device=positions.device) * 2 / head_dim)
    return positions.float()[:, None] * inv_freq[None, :]


def qk_rope_store_ref(qkv, positions, num_q_heads, num_kv_heads, head_dim, theta,
                      q_norm=None, k_norm=None, eps=1e-6):
    """(q [T, Hq, d], k [T, Hkv, d], v [T, Hkv, d]) from a fused QKV projection [T, (Hq +
    2 Hkv) d]: q and k per-head RMSNormed where given (Qwen3), then rotated."""
    tokens = qkv.shape[0]
    heads = qkv.view(tokens, num_q_heads + 2 * num_kv_heads, head_dim).float()
    q, k = heads[:, :num_q_heads], heads[:, num_q_heads:num_q_heads + num_kv_heads]
    v = heads[:, num_q_heads + num_kv_heads:]
    if q_norm is not None:
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps) * q_norm.float()
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps) * k_norm.float()
    angles = rope_angles(positions, head_dim, theta)[:, None, :]
    cos, sin = angles.cos(), angles.sin()

    def rotate(x):
        x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return rotate(q).to(qkv.dtype), rotate(k).to(qkv.dtype), v.to(qkv.dtype)


if triton is not None:
    @triton.jit
    def _qk_rope_store_kernel(qkv_ptr, pos_ptr, slot_ptr, qn_ptr, kn_ptr, q_ptr, k_ptr, v_ptr,
                              k_cache_ptr, v_cache_ptr, k_cache_stride, v_cache_stride, eps,
                              log2_theta, HQ: tl.constexpr, HKV: tl.constexpr,
                              D: tl.constexpr, QK_NORM: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        is_q = h < HQ
        qh = tl.minimum(h, HQ - 1)
        kh = tl.maximum(h - HQ, 0)
        half = tl.arange(0, D // 2)
        # q heads, then k heads, then v heads: head h's columns start at h * D.
        row = qkv_ptr + t * (HQ + 2 * HKV) * D
        x1 = tl.load(row + h * D + half).to(tl.float32)
        x2 = tl.load(row + h * D + D // 2 + half).to(tl.float32)
        if QK_NORM:
            rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / D + eps)
            w1 = tl.where(is_q, tl.load(qn_ptr + half), tl.load(kn_ptr + half)).to(tl.float32)
            w2 = tl.where(is_q, tl.load(qn_ptr + D // 2 + half),
                          tl.load(kn_ptr + D // 2 + half)).to(tl.float32)
            x1 = x1 * rstd * w1
            x2 = x2 * rstd * w2
        pos = tl.load(pos_ptr + t).to(tl.float32)
        angle = pos * tl.exp2(-(half.to(tl.float32) * 2.0 / D) * log2_theta)
        cos = tl.cos(angle)
        sin = tl.sin(angle)
        o1 = (x1 * cos - x2 * sin).to(q_ptr.dtype.element_ty)
        o2 = (x2 * cos + x1 * sin).to(q_ptr.dtype.element_ty)
        as_q = tl.full([D // 2], 0, tl.int1) | is_q
        as_k = ~as_q
        q_row = q_ptr + (t * HQ + qh) * D
        tl.store(q_row + half, o1, mask=as_q)
        tl.store(q_row + D // 2 + half, o2, mask=as_q)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        k_row = k_ptr + (t * HKV + kh) * D
        kc_row = k_cache_ptr + slot * k_cache_stride + kh * D
        tl.store(k_row + half, o1, mask=as_k)
        tl.store(k_row + D // 2 + half, o2, mask=as_k)
        tl.store(kc_row + half, o1, mask=as_k)
        tl.store(kc_row + D // 2 + half, o2, mask=as_k)
        dims = tl.arange(0, D)
        as_v = tl.full([D], 0, tl.int1) | (h >= HQ)
        v = tl.load(row + (HQ + HKV + kh) * D + dims, mask=as_v, other=0.0)
        tl.store(v_ptr + (t * HKV + kh) * D + dims, v, mask=as_v)
        tl.store(v_cache_ptr + slot * v_cache_stride + kh * D + dims, v, mask=as_v)


def qk_rope_store(qkv, positions, slots, q, k, v, k_cache, v_cache, theta,
                  q_norm=None, k_norm=None, eps=1e-6):
    """Writes q [T, Hq, d], k and v [T, Hkv, d] (as :func:`qk_rope_store_ref`), and k
    and v into the caches [pool, Hkv, d] at ``slots`` [T] (SGLang's set_kv_buffer)."""
    _require_triton()
    tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    has_norm = q_norm is not None
    _qk_rope_store_kernel[(tokens, num_q_heads + num_kv_heads)](
        qkv, positions, slots, q_norm if has_norm else q, k_norm if has_norm else q, q, k, v,
        k_cache, v_cache, k_cache.stride(0), v_cache.stride(0), eps, math.log2(theta),
        HQ=num_q_heads, HKV=num_kv_heads, D=head_dim, QK_NORM=has_norm, num_warps=1)


# ---------------------------------------------------------------------- SiLU and mul

def silu_mul_ref(gate_up):
    """[T, 2I] (gate then up) to [T, I]."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(gate_up.dtype)


if triton is not None:
    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, inner, BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < inner
        gate = tl.load(x_ptr + t * 2 * inner + cols, mask=m, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + t * 2 * inner + inner + cols, mask=m, other=0.0).to(tl.float32)
        out = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + t * inner + cols, out.to(out_ptr.dtype.element_ty), mask=m)


def silu_mul(gate_up, out):
    _require_triton()
    rows, inner = out.shape
    block = min(1024, triton.next_power_of_2(inner))
    _silu_mul_kernel[(rows, triton.cdiv(inner, block))](gate_up, out, inner, BLOCK=block)


# ------------------------------------------------------------------------- MoE

def moe_align_ref(expert_ids, num_experts):
    """(pair indices sorted by expert, stably; [E + 1] offsets of each expert's run)."""
    flat = expert_ids.flatten()
    order = torch.sort(flat, stable=True).indices.to(torch.int32)
    counts = torch.bincount(flat, minlength=num_experts)
    offsets = torch.zeros(num_experts + 1, dtype=torch.int32, device=flat.device)
    offsets[1:] = counts.cumsum(0)
    return order, offsets


if triton is not None:
    @triton.jit
    def _moe_align_kernel(ids_ptr, sorted_ptr, offsets_ptr, pairs, E: tl.constexpr,
                          BLOCK: tl.constexpr):
        # One program: a counting sort of <= BLOCK (token, expert) pairs over E experts.
        offs = tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + offs, mask=offs < pairs, other=E).to(tl.int32)
        base = tl.sum(tl.zeros([BLOCK], tl.int32), axis=0)
        for e in range(E):
            hit = (ids == e).to(tl.int32)
            rank = tl.cumsum(hit, axis=0) - 1
            tl.store(sorted_ptr + base + rank, offs, mask=hit > 0)
            tl.store(offsets_ptr + e, base)
            base += tl.sum(hit, axis=0)
        tl.store(offsets_ptr + E, base)


def moe_align(expert_ids, sorted_pairs, offsets):
    """As :func:`moe_align_ref`, into ``sorted_pairs`` [P] and ``offsets`` [E + 1] (int32)."""
    _require_triton()
    pairs = expert_ids.numel()
    _moe_align_kernel[(1,)](expert_ids, sorted_pairs, offsets, pairs, E=offsets.numel() - 1,
                            BLOCK=triton.next_power_of_2(pairs), num_warps=4)


def moe_gemm_ref(a, weights, expert_ids, a_per_pair):
    """[P, N]: row p is ``a[row] @ weights[expert_ids[p]].T`` with row = p (``a_per_pair``)
    or p // top_k (a's rows are tokens). weights [E, N, K]."""
    flat = expert_ids.flatten()
    top_k = expert_ids.shape[-1] if expert_ids.dim() > 1 else 1
    rows = torch.arange(flat.numel(), device=a.device)
    a_rows = a[rows if a_per_pair else rows // top_k].float()
    return torch.einsum("pk,pnk->pn", a_rows, weights[flat].float()).to(a.dtype)


if triton is not None:
    @triton.jit
    def _moe_gemm_kernel(a_ptr, w_ptr, c_ptr, sorted_ptr, offsets_ptr, N, K: tl.constexpr,
                         stride_a, stride_we, stride_wn, stride_c, TOP_K: tl.constexpr,
                         A_PER_PAIR: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
        # Program (expert, column block): its pairs' rows times its weight block. An
        # expert no pair routes to loads nothing: only routed experts are read.
        e = tl.program_id(0)
        start = tl.load(offsets_ptr + e)
        end = tl.load(offsets_ptr + e + 1)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        w_base = w_ptr + e.to(tl.int64) * stride_we
        # Loop bounds that are not tensors (a while, a constexpr K): Triton 3.6's
        # interpreter (the H200 box's) cannot range() over a loaded value or a
        # scalar argument under NumPy 2.4 (triton-lang/triton#9171).
        m0 = start
        while m0 < end:
            r = m0 + tl.arange(0, BLOCK_M)
            row_ok = r < end
            pair = tl.load(sorted_ptr + r, mask=row_ok, other=0).to(tl.int64)
            a_row = pair if A_PER_PAIR else pair // TOP_K
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                k_ok = ks < K
                a = tl.load(a_ptr + a_row[:, None] * stride_a + ks[None, :],
                            mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(w_base + cols[None, :] * stride_wn + ks[:, None],
                            mask=k_ok[:, None] & col_ok[None, :], other=0.0)
                if IEEE:  # float32 checks: TF32 would blur the routing of later layers
                    acc = tl.dot(a, w, acc, input_precision="ieee")
                else:
                    acc = tl.dot(a, w, acc)
            tl.store(c_ptr + pair[:, None] * stride_c + cols[None, :],
                     acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
            m0 += BLOCK_M


def moe_gemm(a, weights, out, sorted_pairs, offsets, top_k, a_per_pair, block_m=16):
    """``out`` [P, N] as :func:`moe_gemm_ref`, from :func:`moe_align`'s outputs."""
    _require_triton()
    num_experts, n, k = weights.shape
    block_n = 64
    block_k = 128 if k >= 128 else triton.next_power_of_2(k)
    _moe_gemm_kernel[(num_experts, triton.cdiv(n, block_n))](
        a, weights, out, sorted_pairs, offsets, n, k, a.stride(0), weights.stride(0),
        weights.stride(1), out.stride(0), TOP_K=top_k, A_PER_PAIR=a_per_pair,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, IEEE=a.dtype == torch.float32,
        num_warps=4, num_stages=3)
