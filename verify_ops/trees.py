"""Draft-tree helpers: parent lists, EAGLE-style trees, SGLang mask layouts, bit-packing.

A tree of D drafts is a parent list: ``parents[i]`` is the index of draft i's
parent, ``-1`` for a root, and every parent comes before its child. Its mask
(SGLang's QLEN_ONLY layout) is ``[D, D]`` bool with ``mask[i, j]`` true when
draft i may attend to draft j: j is i itself or one of i's ancestors.
"""

from __future__ import annotations

from typing import Sequence

import torch


def parents_to_mask(parents: Sequence[int], device: torch.device | str | None = None) -> torch.Tensor:
    """``[D, D]`` bool ancestor-or-self mask of a parent list."""
    num_drafts = len(parents)
    mask = torch.zeros(num_drafts, num_drafts, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(
                f"parents[{i}] must be -1 (a root) or an earlier draft in [0, {i}), got {parent}")
        if parent >= 0:
            mask[i] = mask[parent]
        mask[i, i] = True
    return mask.to(device) if device is not None else mask


def mask_depths(tree_mask: torch.Tensor) -> torch.Tensor:
    """``[..., D]`` int64 depth of each draft in a ``[..., D, D]`` tree mask.

    A draft's depth is the number of other drafts its mask row shows (its
    ancestors): the root has depth 0 and siblings share one. Draft j of a
    request with L committed tokens sits at position L + depth(j), not L + j.
    """
    num_drafts = tree_mask.shape[-1]
    eye = torch.eye(num_drafts, dtype=torch.bool, device=tree_mask.device)
    return (tree_mask.to(torch.bool) & ~eye).sum(-1)


def eagle_tree(topk: int, depth: int, num_draft_tokens: int,
               generator: torch.Generator | None = None) -> list[int]:
    """Parent list of an EAGLE-style draft tree with random draft scores.

    Draft 0 is the root (the last verified token). Each of ``depth`` steps
    expands the ``topk`` best leaves of the previous step by ``topk`` children
    each; the ``num_draft_tokens - 1`` best candidates by cumulative score are
    kept, as EAGLE's re-ranking does, so the tree is ragged, not a chain
    (unless ``topk == 1``). Kept drafts are ordered by depth, parents first.
    """
    if topk < 1 or depth < 1:
        raise ValueError(f"topk and depth must be >= 1, got topk={topk}, depth={depth}")
    max_drafts = 1 + topk + (depth - 1) * topk * topk
    if not 1 <= num_draft_tokens <= max_drafts:
        raise ValueError(f"num_draft_tokens must lie in [1, {max_drafts}] for topk={topk}, "
                         f"depth={depth}, got {num_draft_tokens}")
    # Candidates: (cumulative log-prob, depth, parent candidate or -1).
    candidates: list[tuple[float, int, int]] = []
    frontier = [(0.0, -1)]  # (score, candidate index) of the leaves to expand
    for level in range(depth):
        children = []
        for score, parent in frontier:
            logp = torch.log_softmax(torch.randn(topk, generator=generator), 0)
            for c in range(topk):
                candidates.append((score + float(logp[c]), level, parent))
                children.append((score + float(logp[c]), len(candidates) - 1))
        frontier = sorted(children, reverse=True)[:topk]
    # Keep the best; a kept candidate's ancestors score at least as high, so
    # the kept set is closed under parents (ties aside, which we repair).
    order = sorted(range(len(candidates)), key=lambda c: -candidates[c][0])
    kept: set[int] = set()
    for c in order:
        if len(kept) == num_draft_tokens - 1:
            break
        chain = []
        while c >= 0 and c not in kept:
            chain.append(c)
            c = candidates[c][2]
        if len(kept) + len(chain) <= num_draft_tokens - 1:
            kept.update(chain)
    ranked = sorted(kept, key=lambda c: (candidates[c][1], c))
    position = {c: i + 1 for i, c in enumerate(ranked)}
    parents = [-1]
    for c in ranked:
        parent = candidates[c][2]
        parents.append(0 if parent < 0 else position[parent])
    return parents


def random_tree(num_drafts: int, generator: torch.Generator | None = None) -> list[int]:
    """Parent list of a uniformly random recursive tree rooted at draft 0."""
    parents = [-1]
    for i in range(1, num_drafts):
        parents.append(int(torch.randint(0, i, (1,), generator=generator)))
    return parents


def full_mask_to_qlen_only(custom_mask: torch.Tensor, seq_lens: torch.Tensor,
                           num_drafts: int) -> torch.Tensor:
    """SGLang FULL_MASK layout to QLEN_ONLY ``[bs, D, D]``.

    ``custom_mask`` is flat: for each request b in order, ``D * (seq_lens[b] + D)``
    cells, row-major over (draft, key position). The prefix columns are
    dropped; only the last D columns of each row (the drafts) are kept.
    """
    lens = seq_lens.tolist()
    expected = sum(num_drafts * (prefix + num_drafts) for prefix in lens)
    if custom_mask.numel() != expected:
        raise ValueError(f"custom_mask has {custom_mask.numel()} cells, expected {expected} "
                         f"for seq_lens={lens} and D={num_drafts}")
    rows = []
    offset = 0
    for prefix in lens:
        width = prefix + num_drafts
        block = custom_mask[offset: offset + num_drafts * width].view(num_drafts, width)
        rows.append(block[:, prefix:].to(torch.bool))
        offset += num_drafts * width
    return torch.stack(rows) if rows else custom_mask.new_zeros(0, num_drafts, num_drafts,
                                                                dtype=torch.bool)


def qlen_only_to_full_mask(tree_mask: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """QLEN_ONLY ``[bs, D, D]`` to SGLang's flat FULL_MASK layout (prefix all visible)."""
    num_drafts = tree_mask.shape[1]
    parts = []
    for b, prefix in enumerate(seq_lens.tolist()):
        prefix_cols = torch.ones(num_drafts, prefix, dtype=torch.bool, device=tree_mask.device)
        parts.append(torch.cat([prefix_cols, tree_mask[b].to(torch.bool)], dim=1).flatten())
    if not parts:
        return torch.zeros(0, dtype=torch.bool, device=tree_mask.device)
    return torch.cat(parts)


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """Bit-pack a bool mask along its last dim into uint8, little bit order.

    Bit ``j % 8`` of byte ``j // 8`` holds column j (as ``numpy.packbits(...,
    bitorder="little")``). The last dim of the result is ``ceil(D / 8)``.
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be bool, got {mask.dtype}")
    num_cols = mask.shape[-1]
    padded = torch.nn.functional.pad(mask.to(torch.uint8), (0, (-num_cols) % 8))
    bits = padded.view(*mask.shape[:-1], (num_cols + 7) // 8, 8)  # -1 is ambiguous when empty
    weights = (1 << torch.arange(8, device=mask.device, dtype=torch.int32)).to(torch.uint8)
    return (bits * weights).sum(-1, dtype=torch.int32).to(torch.uint8)


def unpack_mask(packed: torch.Tensor, num_cols: int) -> torch.Tensor:
    """Inverse of :func:`pack_mask`: uint8 ``[..., ceil(D/8)]`` to bool ``[..., num_cols]``."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed must be uint8, got {packed.dtype}")
    shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
    bits = (packed.unsqueeze(-1) >> shifts) & 1
    return bits.flatten(-2)[..., :num_cols].to(torch.bool)
