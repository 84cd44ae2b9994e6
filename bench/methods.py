"""The kernels bench/ compares. Each builds per-layer calls over a Workload.

``prepare(workload)`` does the untimed setup (gathers, masks, compiles) and
returns one zero-argument call per layer; each call returns that layer's
output as ``[bs*D, Hq, d]``. Baselines get their KV gathered and masks built
beforehand, as the anchors in ../shared/anchors/ were measured.
"""

from __future__ import annotations

from typing import Callable

import torch

import verify_ops
from verify_ops.trees import qlen_only_to_full_mask

from .workload import Workload

LayerCall = Callable[[], torch.Tensor]


def prepare_verify_ops(w: Workload) -> list[LayerCall]:
    calls = []
    for i in range(len(w.layers)):
        case = w.case(i)
        out = torch.empty_like(case.q)

        def call(case=case, out=out):
            verify_ops.tree_attn_out(*case.args(), out)
            return out
        calls.append(call)
    return calls


def _slots(w: Workload) -> torch.Tensor:
    """[bs, L + D] slots of every request's prefix then drafts."""
    rows = w.req_to_token[w.req_pool_indices]
    return rows[:, : w.shape.seq_len + w.shape.num_drafts].long()


def prepare_triton(w: Workload) -> list[LayerCall]:
    """SGLang's Triton extend_attention_fwd with a FULL_MASK custom mask, as its verify runs.

    is_causal=True as TritonAttnBackend.forward_extend passes it for TARGET_VERIFY
    (sglang 0.5.23 srt/layers/attention/triton_backend.py: ``causal = True``).
    """
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    s = w.shape
    slots = _slots(w)
    prefix_slots, draft_slots = slots[:, : s.seq_len], slots[:, s.seq_len:]
    kv_indices = prefix_slots.flatten().contiguous()
    device = w.tree_mask.device
    kv_indptr = torch.arange(0, s.batch + 1, device=device, dtype=torch.int32) * s.seq_len
    qo_indptr = torch.arange(0, s.batch + 1, device=device, dtype=torch.int32) * s.num_drafts
    custom_mask = qlen_only_to_full_mask(w.tree_mask, w.seq_lens.cpu()).to(device)
    mask_indptr = torch.arange(0, s.batch + 1, device=device, dtype=torch.int32) * (
        s.num_drafts * (s.seq_len + s.num_drafts))
    calls = []
    for layer in w.layers:
        k_extend = layer.k_cache[draft_slots.flatten()].contiguous()
        v_extend = layer.v_cache[draft_slots.flatten()].contiguous()
        q = layer.q.contiguous()
        out = torch.empty_like(q)

        def call(layer=layer, q=q, k_extend=k_extend, v_extend=v_extend, out=out):
            extend_attention_fwd(q, k_extend, v_extend, out, layer.k_cache, layer.v_cache,
                                 qo_indptr, kv_indptr, kv_indices, custom_mask, True,
                                 mask_indptr, s.num_drafts, 1.0, 1.0, sm_scale=w.sm_scale,
                                 skip_prefix_custom_mask=True)
            return out
        calls.append(call)
    return calls


def _gathered(w: Workload, layer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q as [bs, Hq, D, d]; K and V gathered as [bs, Hkv, L + D, d]."""
    s = w.shape
    slots = _slots(w)
    q = layer.q.view(s.batch, s.num_drafts, s.num_q_heads, s.head_dim).transpose(1, 2)
    k = layer.k_cache[slots].transpose(1, 2).contiguous()
    v = layer.v_cache[slots].transpose(1, 2).contiguous()
    return q.contiguous(), k, v


def _visible(w: Workload) -> torch.Tensor:
    """[bs, 1, D, L + D] bool: the prefix is visible, drafts by the tree."""
    s = w.shape
    prefix = torch.ones(s.batch, s.num_drafts, s.seq_len, dtype=torch.bool,
                        device=w.tree_mask.device)
    return torch.cat([prefix, w.tree_mask], dim=2).unsqueeze(1)


def _as_rows(out: torch.Tensor) -> torch.Tensor:
    b, h, d_count, dim = out.shape
    return out.transpose(1, 2).reshape(b * d_count, h, dim)


def prepare_sdpa(w: Workload) -> list[LayerCall]:
    visible = _visible(w)
    calls = []
    for layer in w.layers:
        q, k, v = _gathered(w, layer)

        def call(q=q, k=k, v=v):
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=visible, scale=w.sm_scale, enable_gqa=True)
            return _as_rows(out)
        calls.append(call)
    return calls


# For short queries Flex picks its decoding kernel, which found no valid
# configuration (NoValidChoicesError) at D32-D64 with GQA on torch 2.11; its
# main kernel is then tried instead, and the row says so.
FLEX_FALLBACK_OPTIONS = {"FORCE_USE_FLEX_ATTENTION": True}


def prepare_flex(w: Workload) -> list[LayerCall]:
    """FlexAttention, compiled, with the tree as a mask_mod and the block mask built beforehand."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    s = w.shape
    tree_mask = w.tree_mask

    def mask_mod(b, h, q_idx, kv_idx):
        draft = (kv_idx - s.seq_len).clamp(min=0)
        return (kv_idx < s.seq_len) | tree_mask[b, q_idx, draft]

    block_mask = create_block_mask(mask_mod, B=s.batch, H=None, Q_LEN=s.num_drafts,
                                   KV_LEN=s.seq_len + s.num_drafts, device=w.tree_mask.device)
    gathered = [_gathered(w, layer) for layer in w.layers]
    for kernel_options in (None, FLEX_FALLBACK_OPTIONS):
        # Each case is a new static shape, so a compile of its own: past dynamo's
        # recompile limit (8) one shared compiled function falls back to eager
        # flex_attention, which cannot be captured in a CUDA graph.
        torch._dynamo.reset()
        flex_compiled = torch.compile(flex_attention, dynamic=False)
        calls = []
        for q, k, v in gathered:
            def call(q=q, k=k, v=v, flex=flex_compiled, kernel_options=kernel_options):
                out = flex(q, k, v, block_mask=block_mask, scale=w.sm_scale, enable_gqa=True,
                           kernel_options=kernel_options)
                return _as_rows(out)
            calls.append(call)
        try:
            calls[0]()  # compiles here, untimed
        except Exception:
            if kernel_options is not None:
                raise
            continue
        if kernel_options is not None:
            calls[0].note = f"kernel_options={kernel_options} (the default found no kernel)"
        return calls


METHODS = {
    "verify_ops": prepare_verify_ops,
    "triton": prepare_triton,
    "flex": prepare_flex,
    "sdpa": prepare_sdpa,
}
