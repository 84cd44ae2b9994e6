"""A benchmark case: one verify step over N layers, each with its own KV buffers, on the GPU."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verify_ops.cases import TreeAttnCase, make_slot_layout, make_tree_masks

L2_BYTES = 60 << 20
# The layers of one case hold at most this much K+V: 4 layers at 256k, batch 8,
# 64/8/128 (8.6 GB each), so that a case and its float64 check fit an 80 GB
# card. Every case up to 128k keeps its 8 layers or more (4.3 GB at most).
KV_BYTES_PER_CASE = 40e9
TREES = ("eagle", "chain")


@dataclass(frozen=True)
class Shape:
    batch: int
    seq_len: int      # committed prefix per request (all requests equal)
    num_drafts: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    layout: str       # "fragmented" or "contiguous"
    tree: str = "eagle"  # "eagle": EAGLE top-k trees; "chain": SGLang's top-1 chain

    @property
    def kv_bytes(self) -> int:
        """K+V bytes of one layer, each read once."""
        tokens = self.batch * (self.seq_len + self.num_drafts)
        return 2 * tokens * self.num_kv_heads * self.head_dim * 2

    @property
    def flops(self) -> int:
        """QK and PV FLOPs of one layer: 4 d Hq D (L + D) per request."""
        return (4 * self.head_dim * self.num_q_heads * self.num_drafts
                * (self.seq_len + self.num_drafts) * self.batch)

    @property
    def num_layers(self) -> int:
        """Enough layers to stream 4x the L2, between 8 and 64; fewer (2 at least)
        where 8 would hold more than KV_BYTES_PER_CASE."""
        streamed = max(8, min(64, -(-4 * L2_BYTES // self.kv_bytes)))
        return max(2, min(streamed, int(KV_BYTES_PER_CASE // self.kv_bytes)))

    def label(self) -> str:
        context = (f"{self.seq_len // 1024}k" if self.seq_len % 1024 == 0 and self.seq_len
                   else str(self.seq_len))
        label = (f"bs{self.batch} L{context} D{self.num_drafts} "
                 f"{self.num_q_heads}/{self.num_kv_heads}/{self.head_dim} {self.layout[:4]}")
        return label if self.tree == "eagle" else f"{label} {self.tree}"


def parse_case(text: str) -> Shape:
    """``batch/context/drafts/Hq/Hkv/head_dim/layout[/tree]``, e.g.
    ``1/65536/16/64/8/128/fragmented`` or ``1/4096/4/8/1/128/fragmented/chain``."""
    fields = text.split("/")
    if len(fields) not in (7, 8) or (len(fields) == 8 and fields[7] not in TREES):
        raise ValueError("a case is batch/context/drafts/Hq/Hkv/head_dim/layout[/tree] with "
                         f"tree one of {TREES}, got {text!r}")
    return Shape(*(int(x) for x in fields[:6]), *fields[6:])


@dataclass
class Layer:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor


@dataclass
class Workload:
    shape: Shape
    req_to_token: torch.Tensor      # int32, as SGLang's ReqToTokenPool
    req_pool_indices: torch.Tensor  # int64
    seq_lens: torch.Tensor          # int64
    tree_mask: torch.Tensor         # [bs, D, D] bool
    layers: list[Layer]

    @property
    def sm_scale(self) -> float:
        return self.shape.head_dim ** -0.5

    def case(self, layer: int) -> TreeAttnCase:
        lay = self.layers[layer]
        return TreeAttnCase(lay.q, lay.k_cache, lay.v_cache, self.req_to_token,
                            self.req_pool_indices, self.seq_lens, self.tree_mask, self.sm_scale)

    def draft_slots(self) -> torch.Tensor:
        """[bs * D] pool slots of the drafts, request by request (SGLang's out_cache_loc)."""
        s = self.shape
        rows = self.req_to_token[self.req_pool_indices]
        return rows[:, s.seq_len: s.seq_len + s.num_drafts].reshape(-1).long()


def make_workload(shape: Shape, seed: int = 0, num_layers: int | None = None,
                  device: str = "cuda") -> Workload:
    gen = torch.Generator().manual_seed(seed)
    tokens = [shape.seq_len + shape.num_drafts] * shape.batch
    slots = make_slot_layout(tokens, shape.layout, spare_slots=64, gen=gen)
    layers = []
    for _ in range(shape.num_layers if num_layers is None else num_layers):
        kv = (slots.pool_size, shape.num_kv_heads, shape.head_dim)
        layers.append(Layer(
            q=torch.randn(shape.batch * shape.num_drafts, shape.num_q_heads, shape.head_dim,
                          device=device, dtype=torch.bfloat16),
            k_cache=torch.randn(kv, device=device, dtype=torch.bfloat16),
            v_cache=torch.randn(kv, device=device, dtype=torch.bfloat16),
        ))
    return Workload(
        shape=shape,
        req_to_token=slots.req_to_token.to(torch.int32).to(device),
        req_pool_indices=slots.req_pool_indices.to(device),
        seq_lens=torch.full((shape.batch,), shape.seq_len, dtype=torch.int64, device=device),
        tree_mask=make_tree_masks(shape.batch, shape.num_drafts, shape.tree, gen).to(device),
        layers=layers,
    )
