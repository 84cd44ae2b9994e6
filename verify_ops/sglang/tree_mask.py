"""The QLEN_ONLY verify mask the backend owns, and its ``[bs, D, D]`` view for the op.

SGLang's drafter writes the tree mask straight into ``verify_mask.buffer``
when the batch fits: ``D * D`` cells per request, request-major, which is the
op's ``tree_mask[b, i, j]`` layout. Triton's FULL_MASK needs ``D * (ctx + D)``.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.verify_mask import VerifyMask, tree_mask_numel
from sglang.srt.speculative.eagle_utils import TreeMaskMode


def allocate_verify_mask(max_bs: int, num_draft_tokens: int,
                         device: torch.device | str) -> VerifyMask:
    numel = tree_mask_numel(TreeMaskMode.QLEN_ONLY, max_bs, num_draft_tokens, 0)
    # Ones: rows nobody wrote yet (padded graph batches) still see their root.
    return VerifyMask(buffer=torch.ones(numel, dtype=torch.bool, device=device),
                      mode=TreeMaskMode.QLEN_ONLY, max_bs=max_bs, is_read=True)


def batch_tree_mask(flat_mask: torch.Tensor, bs: int, num_draft_tokens: int) -> torch.Tensor:
    """``[bs, D, D]`` bool view of the first ``bs`` requests of a flat QLEN_ONLY mask."""
    cells = bs * num_draft_tokens * num_draft_tokens
    if flat_mask.numel() < cells:
        raise ValueError(f"verify mask has {flat_mask.numel()} cells, QLEN_ONLY needs "
                         f"bs * D * D = {bs} * {num_draft_tokens}^2 = {cells}")
    if flat_mask.dtype == torch.uint8:
        flat_mask = flat_mask.view(torch.bool)
    return flat_mask.reshape(-1)[:cells].view(bs, num_draft_tokens, num_draft_tokens)


def copy_into(verify_mask: VerifyMask, flat_mask: torch.Tensor, bs: int,
              num_draft_tokens: int) -> torch.Tensor:
    """Copy a batch's mask into the owned buffer and return the buffer's
    ``[bs, D, D]`` view, so graph replays read one address. No copy when the
    drafter already wrote the buffer; a shorter mask (unpadded batch) fills
    only its own requests, the padded ones read whatever is there."""
    owned = batch_tree_mask(verify_mask.buffer, bs, num_draft_tokens)
    if flat_mask.data_ptr() != verify_mask.buffer.data_ptr():
        rows = min(bs, flat_mask.numel() // (num_draft_tokens * num_draft_tokens))
        owned[:rows].copy_(batch_tree_mask(flat_mask, rows, num_draft_tokens))
    return owned
