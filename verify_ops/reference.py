"""Readable pure-PyTorch reference for ``verify.tree_attn``; every test uses it."""

from __future__ import annotations

import torch


def tree_attn_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                  seq_lens: torch.Tensor, tree_mask: torch.Tensor, sm_scale: float,
                  compute_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Reference tree attention, computed request by request in ``compute_dtype``.

    Same arguments and semantics as :func:`verify_ops.tree_attn`. Returns
    ``[bs*D, Hq, d]`` in ``compute_dtype`` (cast it to compare in q's dtype).
    Rows that see no key are zero.
    """
    bs = seq_lens.shape[0]
    total_rows, num_q_heads, head_dim = q.shape
    out = torch.zeros(total_rows, num_q_heads, head_dim, dtype=compute_dtype, device=q.device)
    if bs == 0:
        return out
    num_drafts = total_rows // bs
    group = num_q_heads // k_cache.shape[1]
    for b in range(bs):
        prefix = int(seq_lens[b])
        slots = req_to_token[int(req_pool_indices[b]), : prefix + num_drafts].long()
        # [tokens, Hq, d]: each KV head repeated for the query heads of its group.
        k = k_cache[slots].to(compute_dtype).repeat_interleave(group, dim=1)
        v = v_cache[slots].to(compute_dtype).repeat_interleave(group, dim=1)
        qb = q[b * num_drafts:(b + 1) * num_drafts].to(compute_dtype)
        visible = torch.cat(
            [torch.ones(num_drafts, prefix, dtype=torch.bool, device=q.device),
             tree_mask[b].to(q.device)], dim=1)  # [D, prefix + D]
        scores = torch.einsum("ihd,thd->hit", qb, k) * sm_scale
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all-masked rows -> 0
        out[b * num_drafts:(b + 1) * num_drafts] = torch.einsum("hit,thd->ihd", probs, v)
    return out


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; inf if out has NaN or inf."""
    out64, ref64 = out.double(), ref.double()
    if not torch.isfinite(out64).all():
        return float("inf")
    denom = ref64.norm().item()
    err = (out64 - ref64).norm().item()
    return err / denom if denom > 0 else err
