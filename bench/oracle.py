"""The checks that gate every timing: each method's output against the float64
reference (verify_ops.tree_attn_ref), at the case's context and at a short one."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from verify_ops.cases import TreeAttnCase
from verify_ops.reference import relative_error, tree_attn_ref

from .workload import Shape, Workload

CHECK_TOL = 1e-2
# At long context the drafts carry little of the softmax weight: an output that
# drops them is within CHECK_TOL of the reference (5.9e-3 at 64k D8). So every
# method is also checked on the same heads, drafts and layout at this short
# context, where the tree dominates the output.
CHECK_SHORT_CONTEXT = 64
# The reference repeats each KV head for its query heads in float64: 17 GB for
# K at 256k with 64 query heads. Past this many float64 elements it runs one
# KV head at a time (the same arithmetic, a group's share of the memory).
REFERENCE_CHUNK_ELEMS = 1 << 28


def short_check_shape(shape: Shape) -> Shape:
    """The tree-sensitive check case of ``shape``: same everything, a short prefix."""
    return Shape(shape.batch, min(shape.seq_len, CHECK_SHORT_CONTEXT), shape.num_drafts,
                 shape.num_q_heads, shape.num_kv_heads, shape.head_dim, shape.layout,
                 shape.tree)


def reference(case: TreeAttnCase) -> torch.Tensor:
    """``tree_attn_ref`` of ``case`` in float64, ``[bs*D, Hq, d]``; one KV head at a
    time where the whole would repeat more than REFERENCE_CHUNK_ELEMS elements."""
    q, k_cache = case.q, case.k_cache
    num_kv_heads = k_cache.shape[1]
    tokens = int(case.seq_lens.max()) + case.tree_mask.shape[1] if case.seq_lens.numel() else 0
    if num_kv_heads == 1 or tokens * q.shape[1] * q.shape[2] <= REFERENCE_CHUNK_ELEMS:
        return tree_attn_ref(*case.args())
    group = q.shape[1] // num_kv_heads
    parts = []
    for h in range(num_kv_heads):
        heads = slice(h * group, (h + 1) * group)
        parts.append(tree_attn_ref(q[:, heads], k_cache[:, h:h + 1], case.v_cache[:, h:h + 1],
                                   *case.args()[3:]))
    return torch.cat(parts, dim=1)


def worst_error(calls: Sequence[Callable[[], torch.Tensor]], w: Workload) -> float:
    """Largest relative error of per-layer ``calls`` (run eagerly) over the layers of ``w``."""
    worst = 0.0
    for i, call in enumerate(calls):
        worst = max(worst, relative_error(call().float(), reference(w.case(i))))
    return worst


def check_method(name: str, w: Workload) -> float:
    """Largest relative error of method ``name`` over every layer of ``w`` (eager calls)."""
    from .methods import METHODS

    calls = METHODS[name](w)
    try:
        return worst_error(calls, w)
    finally:
        del calls
