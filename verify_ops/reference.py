"""Readable pure-PyTorch reference for ``verify.tree_attn``; every test uses it."""

from __future__ import annotations

from typing import Optional

import torch

from .trees import mask_depths


def tree_attn_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                  seq_lens: torch.Tensor, tree_mask: torch.Tensor, sm_scale: float, *,
                  k_scale: Optional[torch.Tensor] = None,
                  v_scale: Optional[torch.Tensor] = None, logit_cap: float = 0.0,
                  sinks: Optional[torch.Tensor] = None, sliding_window: int = -1,
                  return_lse: bool = False,
                  compute_dtype: torch.dtype = torch.float64):
    """Reference tree attention, computed request by request in ``compute_dtype``.

    Same arguments and semantics as :func:`verify_ops.tree_attn`. Returns
    ``[bs*D, Hq, d]`` in ``compute_dtype`` (cast it to compare in q's dtype),
    and with ``return_lse`` also the ``[bs*D, Hq]`` natural-log LSE. Rows that
    see no key are zero, with LSE -inf (or the sink).
    """
    bs = seq_lens.shape[0]
    total_rows, num_q_heads, head_dim = q.shape
    device = q.device
    out = torch.zeros(total_rows, num_q_heads, head_dim, dtype=compute_dtype, device=device)
    lse = torch.full((total_rows, num_q_heads), float("-inf"), dtype=compute_dtype,
                     device=device)
    if bs > 0:
        num_drafts = total_rows // bs
        group = num_q_heads // k_cache.shape[1]
        score_scale = sm_scale * (float(k_scale) if k_scale is not None else 1.0)
        value_scale = float(v_scale) if v_scale is not None else 1.0
        depths = mask_depths(tree_mask).to(device)  # [bs, D]
        for b in range(bs):
            prefix = int(seq_lens[b])
            slots = req_to_token[int(req_pool_indices[b]), : prefix + num_drafts].long()
            # [tokens, Hq, d]: each KV head repeated for the query heads of its group.
            k = k_cache[slots].to(compute_dtype).repeat_interleave(group, dim=1)
            v = v_cache[slots].to(compute_dtype).repeat_interleave(group, dim=1)
            qb = q[b * num_drafts:(b + 1) * num_drafts].to(compute_dtype)
            visible = torch.cat(
                [torch.ones(num_drafts, prefix, dtype=torch.bool, device=device),
                 tree_mask[b].to(device)], dim=1)  # [D, prefix + D]
            if sliding_window >= 0:
                # Logical positions: prefix token t at t, draft j at prefix + depth(j).
                key_pos = torch.cat([torch.arange(prefix, device=device), prefix + depths[b]])
                query_pos = prefix + depths[b]
                visible &= key_pos[None, :] >= query_pos[:, None] - sliding_window
            scores = torch.einsum("ihd,thd->hit", qb, k) * score_scale
            if logit_cap > 0:
                scores = logit_cap * torch.tanh(scores / logit_cap)
            scores = scores.masked_fill(~visible, float("-inf"))
            if sinks is not None:
                sink = sinks.to(device, compute_dtype)[:, None, None].expand(-1, num_drafts, 1)
                scores = torch.cat([scores, sink], dim=-1)
            row_lse = torch.logsumexp(scores, dim=-1)  # [Hq, D]; -inf where nothing is seen
            probs = torch.exp(scores - row_lse[..., None]).nan_to_num(0.0)
            if sinks is not None:
                probs = probs[..., :-1]
            rows = slice(b * num_drafts, (b + 1) * num_drafts)
            out[rows] = torch.einsum("hit,thd->ihd", probs, v) * value_scale
            lse[rows] = row_lse.transpose(0, 1)
    return (out, lse) if return_lse else out


def merge_attn_states_ref(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                          lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 merge of two attention states over disjoint key sets (natural-log LSEs)."""
    lse_a, lse_b = lse_a.double(), lse_b.double()
    lse = torch.logaddexp(lse_a, lse_b)
    weight_a = torch.exp(lse_a - lse).nan_to_num(0.0)[..., None]  # -inf - -inf: both empty
    weight_b = torch.exp(lse_b - lse).nan_to_num(0.0)[..., None]
    return weight_a * out_a.double() + weight_b * out_b.double(), lse


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; inf if out has NaN or inf."""
    out64, ref64 = out.double(), ref.double()
    if not torch.isfinite(out64).all():
        return float("inf")
    denom = ref64.norm().item()
    err = (out64 - ref64).norm().item()
    return err / denom if denom > 0 else err
