"""Synthetic tree-verify inputs in SGLang's native layout, for tests, the demo and bench.

Slot 0 is SGLang's padding slot and is never handed out. Every pool slot that
no request owns is filled with NaN, and every unused ``req_to_token`` cell
points at such a slot, so a kernel that reads one position too many produces
NaN instead of a plausible answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from .trees import eagle_tree, parents_to_mask, random_tree


@dataclass
class TreeAttnCase:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    tree_mask: torch.Tensor
    sm_scale: float
    options: dict = field(default_factory=dict)  # the op's keyword options, if any

    def args(self) -> tuple:
        """The op's positional arguments, in order."""
        return (self.q, self.k_cache, self.v_cache, self.req_to_token,
                self.req_pool_indices, self.seq_lens, self.tree_mask, self.sm_scale)

    @property
    def kv_bytes(self) -> int:
        """K+V bytes the op must read once: every prefix and draft token, every KV head."""
        tokens = int(self.seq_lens.sum()) + self.tree_mask.shape[0] * self.tree_mask.shape[1]
        _, num_kv_heads, head_dim = self.k_cache.shape
        return 2 * tokens * num_kv_heads * head_dim * self.k_cache.element_size()


def make_tree_masks(batch: int, num_drafts: int, tree: str,
                    generator: torch.Generator) -> torch.Tensor:
    """``[batch, D, D]`` masks: "random" recursive trees, "eagle" trees, or "chain"."""
    masks = []
    for _ in range(batch):
        if tree == "random":
            parents = random_tree(num_drafts, generator)
        elif tree == "eagle":
            topk = 4 if num_drafts > 4 else 2
            depth = max(1, -(-(num_drafts - 1 - topk) // (topk * topk)) + 1)
            parents = eagle_tree(topk, depth, num_drafts, generator) if num_drafts > 1 else [-1]
        elif tree == "chain":
            parents = list(range(-1, num_drafts - 1))
        else:
            raise ValueError(f"tree must be 'random', 'eagle' or 'chain', got {tree!r}")
        masks.append(parents_to_mask(parents))
    return torch.stack(masks) if masks else torch.zeros(0, num_drafts, num_drafts, dtype=torch.bool)


@dataclass
class SlotLayout:
    """Where each request's tokens live in a pool of ``pool_size`` slots."""
    req_to_token: torch.Tensor      # [R, max_ctx] int64; unused cells point at unowned slots
    req_pool_indices: torch.Tensor  # [bs] int64
    owned: torch.Tensor             # [pool_size] bool: slots some request owns
    pool_size: int


def make_slot_layout(tokens: Sequence[int], layout: str, spare_slots: int,
                     gen: torch.Generator, page_size: int = 1) -> SlotLayout:
    """Slots for requests of ``tokens[b]`` tokens (prefix plus drafts).

    layout: "fragmented" scatters every token over the pool (page_size 1 after
    churn); "contiguous" gives each request one run of slots; "paged" gives
    each request whole pages of ``page_size`` consecutive slots, the pages
    scattered over the pool (SGLang's paged allocator after churn; slot s is
    in page s // page_size, and page 0 is never handed out).
    """
    batch = len(tokens)
    pool = 1 + sum(tokens) + spare_slots
    max_ctx = max(tokens, default=0) + 8
    num_rows = batch + 3
    if layout == "fragmented":
        perm = torch.randperm(pool - 1, generator=gen) + 1
        bounds = torch.tensor([0] + list(tokens)).cumsum(0).tolist()
        owned = [perm[bounds[b]:bounds[b + 1]] for b in range(batch)]
    elif layout == "contiguous":
        order = torch.randperm(batch, generator=gen).tolist() if batch else []
        starts, cursor = {}, 1 + spare_slots // 2
        for b in order:
            starts[b] = cursor
            cursor += tokens[b]
        owned = [torch.arange(starts[b], starts[b] + tokens[b]) for b in range(batch)]
    elif layout == "paged":
        pages_needed = [-(-n // page_size) for n in tokens]
        num_pages = 1 + sum(pages_needed) + -(-spare_slots // page_size)
        pool = num_pages * page_size
        pages = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
        owned = []
        for n, count in zip(tokens, pages_needed):
            mine, pages = pages[:count], pages[count:]
            slots = [p * page_size + i for p in mine for i in range(page_size)]
            owned.append(torch.tensor(slots[:n], dtype=torch.int64))
    else:
        raise ValueError(f"layout must be 'fragmented', 'contiguous' or 'paged', got {layout!r}")
    used = torch.zeros(pool, dtype=torch.bool)
    for slots in owned:
        used[slots] = True
    unused_slots = (~used).nonzero().flatten()
    rows = torch.randperm(num_rows, generator=gen)[:batch]
    req_to_token = unused_slots[torch.randint(len(unused_slots), (num_rows, max_ctx),
                                              generator=gen)]
    for b, slots in enumerate(owned):
        req_to_token[rows[b], : len(slots)] = slots
    return SlotLayout(req_to_token, rows, used, pool)


def make_case(seq_lens: Sequence[int], num_drafts: int, num_q_heads: int, num_kv_heads: int,
              head_dim: int, *, dtype: torch.dtype = torch.bfloat16,
              kv_dtype: Optional[torch.dtype] = None,
              device: torch.device | str = "cpu", index_dtype: torch.dtype = torch.int32,
              layout: str = "fragmented", page_size: int = 1, strided_q: bool = False,
              tree: str = "random", spare_slots: int = 64, seed: int = 0,
              kv_scales: bool = False, logit_cap: float = 0.0, sinks: bool = False,
              sliding_window: int = -1) -> TreeAttnCase:
    """Random inputs for one verify step (see :func:`make_slot_layout` for ``layout``).

    kv_dtype: the pool's dtype (default q's; float8_e4m3fn or float8_e5m2).
    strided_q: q is the query slice of a fused QKV projection.
    kv_scales, logit_cap, sinks, sliding_window: fill ``case.options`` with
    random k_scale / v_scale, the cap, random ``[Hq]`` sinks and the window.
    """
    gen = torch.Generator().manual_seed(seed)
    batch = len(seq_lens)
    lens = torch.tensor(list(seq_lens), dtype=torch.int64)
    slots = make_slot_layout((lens + num_drafts).tolist(), layout, spare_slots, gen, page_size)

    def cache():
        c = torch.randn(slots.pool_size, num_kv_heads, head_dim, generator=gen)
        c[~slots.owned] = float("nan")
        return c.to(kv_dtype or dtype)

    k_cache, v_cache = cache(), cache()
    total_rows = batch * num_drafts
    if strided_q:
        fused = torch.randn(total_rows, num_q_heads + 2 * num_kv_heads, head_dim,
                            generator=gen).to(dtype)
        q = fused.to(device)[:, :num_q_heads]
    else:
        q = torch.randn(total_rows, num_q_heads, head_dim, generator=gen).to(dtype).to(device)
    options: dict = {}
    if kv_scales:
        options["k_scale"] = (0.5 + torch.rand(1, generator=gen)).to(device)
        options["v_scale"] = (0.5 + torch.rand(1, generator=gen)).to(device)
    if logit_cap > 0:
        options["logit_cap"] = logit_cap
    if sinks:
        options["sinks"] = (2 * torch.randn(num_q_heads, generator=gen)).to(device)
    if sliding_window >= 0:
        options["sliding_window"] = sliding_window
    return TreeAttnCase(
        q=q,
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        req_to_token=slots.req_to_token.to(index_dtype).to(device),
        req_pool_indices=slots.req_pool_indices.to(index_dtype).to(device),
        seq_lens=lens.to(index_dtype).to(device),
        tree_mask=make_tree_masks(batch, num_drafts, tree, gen).to(device),
        sm_scale=head_dim ** -0.5,
        options=options,
    )
