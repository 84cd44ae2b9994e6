"""Merging attention states: partial results over disjoint key sets, with their LSEs.

A state is ``(out, lse)``: the softmax-normalized output over some keys and
the natural-log log-sum-exp of their scores, as ``tree_attn(...,
return_lse=True)`` returns them. Two states over disjoint keys merge into the
state over their union, so context-parallel ranks, or a cascade of a shared
prefix and per-request suffixes, combine exactly (SGLang's and FlashInfer's
``merge_state``, in natural-log units).
"""

from __future__ import annotations

import torch


def merge_attn_states(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                      lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two attention states over disjoint key sets.

    Args:
        out_a, out_b: ``[N, H, d]`` outputs, each normalized over its own keys
            (any float dtype; the math runs in fp32).
        lse_a, lse_b: ``[N, H]`` float32 natural-log log-sum-exp of each part's
            scores; ``-inf`` marks a part that saw no key (it weighs nothing).

    Returns:
        ``(out, lse)``: ``out`` ``[N, H, d]`` in out_a's dtype, the output over
        both key sets, and ``lse`` ``[N, H]`` float32, the log-sum-exp over
        both. Where both parts are empty, out is 0 and lse is -inf.

    Elementwise and allocation-only, so it is safe to capture in a CUDA graph.
    """
    if out_a.shape != out_b.shape or out_a.dim() != 3:
        raise ValueError(f"out_a and out_b must have one shape [N, H, d], got "
                         f"{list(out_a.shape)} and {list(out_b.shape)}")
    if lse_a.shape != out_a.shape[:2] or lse_b.shape != out_a.shape[:2]:
        raise ValueError(f"lse_a and lse_b must have shape [N, H] = {list(out_a.shape[:2])}, "
                         f"got {list(lse_a.shape)} and {list(lse_b.shape)}")
    lse_a, lse_b = lse_a.float(), lse_b.float()
    lse_max = torch.maximum(lse_a, lse_b)
    # Both parts empty: any finite reference keeps the weights at exp(-inf) = 0.
    reference = torch.where(torch.isfinite(lse_max), lse_max, torch.zeros_like(lse_max))
    weight_a = torch.exp(lse_a - reference)
    weight_b = torch.exp(lse_b - reference)
    total = weight_a + weight_b
    inv_total = torch.where(total > 0, 1.0 / total, torch.zeros_like(total))
    out = (out_a.float() * (weight_a * inv_total)[..., None]
           + out_b.float() * (weight_b * inv_total)[..., None])
    lse = reference + torch.log(total)
    return out.to(out_a.dtype), lse
