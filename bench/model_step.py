"""The verify step of whole models, with attention swapped between verify_ops,
SGLang's Triton verify and FlashInfer, everything else the same.

    python -m bench.model_step                          # every case; JSON in bench_out/
    python -m bench.model_step --models qwen3-235b-a22b-tp8 --batches 1 --contexts 65536

Each case is one verify step of D draft tokens per request (D = 4 as SGLang's
default chain, 8 and 16 as EAGLE trees), run as one CUDA graph over every
layer of a model with random bf16 weights: embedding rows, then per layer the
residual add with RMSNorm, the QKV projection, RoPE (after a per-head RMSNorm of
q and k in Qwen3) with the drafts' K and V written to the layer's pool, tree
attention over the fragmented page_size-1 pool, the O projection, the residual
add with RMSNorm and the MLP (dense: gate-up, SiLU-and-mul, down; MoE: the
router, top-k, a grouped GEMM over the routed experts only, the weighted sum),
and last the final norm and the LM head over the D tokens
(bench/model_kernels.py has the fused pieces). The models:

- ``llama3.1-8b``: 32 layers, 32/8/128 heads, hidden 4096, MLP 14336, vocab 128256.
- ``qwen3-235b-a22b-tp8``: one rank of Qwen3-235B-A22B at tensor parallel 8: 94
  layers, 8/1/128 heads (64 query heads and 4 KV heads over 8 ranks, the KV heads
  replicated), 128 experts with top-8 routing, each expert's intermediate
  1536 / 8 = 192 on this rank, a vocab shard of 151936 / 8. The all-reduces
  after attention and the MoE (and the LM head's gather) are left out: a rank's
  kernels alone are timed.

Each layer has its own K/V pool, as a model's does, as many as fit (the weights
first, then the K/V in what memory is left, less a reserve): where all of a
model's layers do not fit (Llama at batch 8 past 64k), layer i reads pool i mod
G. Every pool is over 4x the L2 there, so each layer still reads its K/V from
memory; ``kv_pools`` in each row says how many there were.

First the fused kernels are checked, in float32, against plain torch through a
whole step of two small models with every feature of the two above
(``check_step``). Before timing, each method's attention is checked against the
float64 reference on layer 0's pool (and at a 64-token context, where the tree
dominates), as in the kernel table, and each step's logits must be finite. A
fourth graph, ``none``, leaves attention out: the rest of the step, which gives
attention's share of each method's step. The median replay after 0.3 s of
replays (bench/timing.py) is reported in ms per step.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import sys
import time
from dataclasses import dataclass, replace

import torch

BACKENDS = ("verify_ops", "triton", "flashinfer", "fa3")
# Memory kept free beside the weights and the pools: workspaces (FlashInfer's is
# 512 MB for Qwen models), four graphs' activations and the float64 check.
RESERVE_BYTES = 10 << 30
L2_BYTES = 60 << 20


@dataclass(frozen=True)
class ModelConfig:
    name: str
    num_layers: int
    hidden: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int                   # the rank's vocab (a TP shard for the MoE rank)
    rope_theta: float
    rms_eps: float
    intermediate: int = 0        # dense MLP
    num_experts: int = 0         # MoE
    top_k: int = 0
    expert_intermediate: int = 0  # per rank
    qk_norm: bool = False
    flashinfer_workspace_bytes: int = 384 << 20  # SGLang's default; 512 MB for Qwen3

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def qkv_width(self) -> int:
        return (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim

    def attention_params(self) -> int:
        """QKV and O projection weights of a layer."""
        return self.hidden * self.qkv_width + self.num_q_heads * self.head_dim * self.hidden

    def expert_params(self) -> int:
        """One expert's gate-up and down weights (this rank's share)."""
        return 3 * self.hidden * self.expert_intermediate

    def mlp_params(self) -> int:
        """A layer's MLP weights: all experts and the router for MoE."""
        if self.is_moe:
            return self.num_experts * self.expert_params() + self.num_experts * self.hidden
        return 3 * self.hidden * self.intermediate

    def weight_bytes(self) -> int:
        """All bf16 weights: layers, embedding and LM head (norm weights are noise)."""
        per_layer = self.attention_params() + self.mlp_params()
        return 2 * (self.num_layers * per_layer + 2 * self.vocab * self.hidden)


MODELS = {
    "llama3.1-8b": ModelConfig(
        "llama3.1-8b", num_layers=32, hidden=4096, num_q_heads=32, num_kv_heads=8,
        head_dim=128, vocab=128256, rope_theta=500000.0, rms_eps=1e-5, intermediate=14336),
    "qwen3-235b-a22b-tp8": ModelConfig(
        "qwen3-235b-a22b-tp8", num_layers=94, hidden=4096, num_q_heads=8, num_kv_heads=1,
        head_dim=128, vocab=151936 // 8, rope_theta=1000000.0, rms_eps=1e-6, num_experts=128,
        top_k=8, expert_intermediate=1536 // 8, qk_norm=True,
        flashinfer_workspace_bytes=512 << 20),
}


# Small models with every feature of the two above, for the step's own check.
TINY_MODELS = (
    ModelConfig("tiny-dense", num_layers=3, hidden=64, num_q_heads=4, num_kv_heads=2,
                head_dim=32, vocab=50, rope_theta=10000.0, rms_eps=1e-5, intermediate=96),
    ModelConfig("tiny-moe", num_layers=3, hidden=64, num_q_heads=4, num_kv_heads=1,
                head_dim=32, vocab=50, rope_theta=1000000.0, rms_eps=1e-6, num_experts=8,
                top_k=2, expert_intermediate=24, qk_norm=True),
)
STEP_CHECK_TOL = 1e-3  # float32 logits, kernels against plain torch


@dataclass(frozen=True)
class Case:
    model: str
    batch: int
    seq_len: int
    num_drafts: int
    tree: str        # "chain" or "eagle"

    @property
    def tokens(self) -> int:
        return self.batch * self.num_drafts

    def label(self) -> str:
        context = f"{self.seq_len // 1024}k" if self.seq_len % 1024 == 0 else str(self.seq_len)
        return f"{self.model} bs{self.batch} L{context} D{self.num_drafts} {self.tree}"


def tree_for(num_drafts: int, chain_drafts: list[int]) -> str:
    return "chain" if num_drafts in chain_drafts else "eagle"


def cases_of(models: list[str], batches: list[int], contexts: list[int], drafts: list[int],
             chain_drafts: list[int]) -> list[Case]:
    """The product of the lists, model by model, then batch, context and D (the order
    that reuses one model's weights and one (batch, context)'s pools)."""
    for name in models:
        if name not in MODELS:
            raise ValueError(f"unknown model {name!r}; models: {', '.join(MODELS)}")
    return [Case(m, b, ctx, d, tree_for(d, chain_drafts))
            for m, b, ctx, d in itertools.product(models, batches, contexts, drafts)]


def parse_case(text: str) -> Case:
    """``model/batch/context/drafts/tree``, e.g. ``llama3.1-8b/1/65536/8/eagle``."""
    fields = text.split("/")
    if len(fields) != 5 or fields[0] not in MODELS or fields[4] not in ("chain", "eagle"):
        raise ValueError(f"a case is model/batch/context/drafts/tree with model one of "
                         f"{', '.join(MODELS)} and tree chain or eagle, got {text!r}")
    return Case(fields[0], int(fields[1]), int(fields[2]), int(fields[3]), fields[4])


# ------------------------------------------------------------------ arithmetic

def kv_bytes_per_layer(cfg: ModelConfig, case: Case) -> int:
    """K+V bytes one layer reads: every prefix and draft token, every KV head."""
    return 2 * case.batch * (case.seq_len + case.num_drafts) * cfg.num_kv_heads * cfg.head_dim * 2


def expected_experts(cfg: ModelConfig, tokens: int) -> float:
    """Experts a layer reads when ``tokens`` tokens each pick top_k of num_experts at
    random: each expert is missed by all of them with probability (1 - k/E)^T."""
    if not cfg.is_moe:
        return 0.0
    return cfg.num_experts * (1 - (1 - cfg.top_k / cfg.num_experts) ** tokens)


def step_bytes(cfg: ModelConfig, case: Case) -> dict:
    """Bytes one verify step must read, by part (MoE experts: the expected count)."""
    if cfg.is_moe:
        mlp = (expected_experts(cfg, case.tokens) * cfg.expert_params()
               + cfg.num_experts * cfg.hidden)
    else:
        mlp = cfg.mlp_params()
    weights = 2 * (cfg.num_layers * (cfg.attention_params() + mlp) + cfg.vocab * cfg.hidden
                   + case.tokens * cfg.hidden)
    kv = cfg.num_layers * kv_bytes_per_layer(cfg, case)
    return {"weights": int(weights), "kv": kv, "total": int(weights) + kv}


def step_flops(cfg: ModelConfig, case: Case) -> dict:
    """FLOPs of one verify step: the matmuls over the step's tokens, and attention."""
    per_token = cfg.attention_params() + (
        cfg.top_k * cfg.expert_params() + cfg.num_experts * cfg.hidden if cfg.is_moe
        else cfg.mlp_params())
    matmul = 2 * case.tokens * (cfg.num_layers * per_token + cfg.vocab * cfg.hidden)
    attention = cfg.num_layers * (4 * cfg.head_dim * cfg.num_q_heads * case.num_drafts
                                  * (case.seq_len + case.num_drafts) * case.batch)
    return {"matmul": matmul, "attention": attention, "total": matmul + attention}


def kv_pools(cfg: ModelConfig, case: Case, free_bytes: int) -> int:
    """How many layers get a pool of their own in ``free_bytes`` (the rest share them
    in turn); at least 1, and enough that a pool's reuse is 4x the L2 away."""
    per_layer = kv_bytes_per_layer(cfg, case)
    fit = max(1, min(cfg.num_layers, int(free_bytes // per_layer)))
    if fit < cfg.num_layers and fit * per_layer < 4 * L2_BYTES:
        raise ValueError(f"{case.label()}: {fit} pools of {per_layer / 1e6:.0f} MB leave the "
                         f"K/V in the L2; free more memory")
    return fit


def replays_for(step_ms: float, budget_s: float = 2.0, least: int = 3, most: int = 15) -> int:
    """Timed replays: as many as take ``budget_s``, within [least, most]."""
    return max(least, min(most, int(budget_s * 1e3 / max(step_ms, 1e-3))))


# ------------------------------------------------------------------- the table

def _ms(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _ratio(num, den) -> str:
    return "-" if num is None or den is None else f"{num / den:.2f}"


def _share(ms, rest) -> str:
    return "-" if ms is None or rest is None else f"{100 * (ms - rest) / ms:.0f}%"


def format_table(rows: list[dict]) -> str:
    """One line per case: ms per step with verify_ops, each other backend's ms and
    verify_ops' speedup over it, the step without attention (``rest``), and attention's
    share of each backend's step. A backend skipped on every row gets no column."""
    others = [m for m in BACKENDS[1:]
              if any("skipped" not in r["methods"].get(m, {"skipped": ""}) for r in rows)]
    shown = ["verify_ops", *others]
    head = f"{'model case':44} {'ours ms':>8}"
    for m in others:
        head += f" {m[:8]:>9} {'x':>6}"
    head += f" {'rest ms':>8}  attention share {'/'.join(m[:5] for m in shown)}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ms = {m: r["methods"].get(m, {}).get("ms") for m in (*BACKENDS, "none")}
        line = f"{r['label']:44} {_ms(ms['verify_ops']):>8}"
        for m in others:
            line += f" {_ms(ms[m]):>9} {_ratio(ms[m], ms['verify_ops']):>6}"
        shares = "/".join(_share(ms[m], ms["none"]) for m in shown)
        lines.append(f"{line} {_ms(ms['none']):>8}  {shares}")
    problems = [f"{r['label']} {m}: {res.get('skipped') or res.get('error')}"
                for r in rows for m, res in r["methods"].items()
                if "skipped" in res or "error" in res]
    return "\n".join(lines + problems)


# ------------------------------------------------------------------- on the GPU

@dataclass
class LayerWeights:
    ln1: torch.Tensor
    ln2: torch.Tensor
    qkv: torch.Tensor            # [(Hq + 2 Hkv) d, H]
    o: torch.Tensor              # [H, Hq d]
    q_norm: torch.Tensor | None  # [d] (Qwen3)
    k_norm: torch.Tensor | None
    gate_up: torch.Tensor | None  # dense [2 I, H]; MoE [E, 2 I_e, H]
    down: torch.Tensor | None     # dense [H, I];    MoE [E, H, I_e]
    router: torch.Tensor | None   # MoE [E, H]


@dataclass
class ModelWeights:
    cfg: ModelConfig
    embed: torch.Tensor
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    layers: list[LayerWeights]


def make_weights(cfg: ModelConfig, device="cuda", dtype=torch.bfloat16) -> ModelWeights:
    """Random weights of std 1/sqrt(fan-in), so that activations keep unit scale, and
    norm weights of N(1, 0.1) (not all ones: a norm that skipped them would show)."""
    def linear(out_features, in_features, *lead):
        w = torch.empty(*lead, out_features, in_features, dtype=dtype, device=device)
        return w.normal_(0.0, in_features ** -0.5)

    def norm(n):
        return torch.empty(n, dtype=dtype, device=device).normal_(1.0, 0.1)

    layers = []
    for _ in range(cfg.num_layers):
        if cfg.is_moe:
            e, inner = cfg.num_experts, cfg.expert_intermediate
            mlp = (linear(2 * inner, cfg.hidden, e), linear(cfg.hidden, inner, e),
                   linear(e, cfg.hidden))
        else:
            mlp = (linear(2 * cfg.intermediate, cfg.hidden),
                   linear(cfg.hidden, cfg.intermediate), None)
        layers.append(LayerWeights(
            ln1=norm(cfg.hidden), ln2=norm(cfg.hidden), qkv=linear(cfg.qkv_width, cfg.hidden),
            o=linear(cfg.hidden, cfg.num_q_heads * cfg.head_dim),
            q_norm=norm(cfg.head_dim) if cfg.qk_norm else None,
            k_norm=norm(cfg.head_dim) if cfg.qk_norm else None,
            gate_up=mlp[0], down=mlp[1], router=mlp[2]))
    embed = torch.empty(cfg.vocab, cfg.hidden, dtype=dtype, device=device).normal_()
    return ModelWeights(cfg, embed, norm(cfg.hidden), linear(cfg.vocab, cfg.hidden), layers)


@dataclass
class StepInputs:
    """One verify step's inputs and the buffers every backend's graph shares."""
    token_ids: torch.Tensor   # [T]
    positions: torch.Tensor   # [T] int64: prefix length + depth in the tree
    slots: torch.Tensor       # [T] int64: where the drafts' K and V go (out_cache_loc)
    buffers: dict


def make_step_inputs(cfg: ModelConfig, w, device="cuda", dtype=torch.bfloat16) -> StepInputs:
    """``w``: a Workload of the case (its slot layout, lengths and tree masks)."""
    s = w.shape
    tokens = s.batch * s.num_drafts
    depth = w.tree_mask.sum(-1).flatten() - 1
    positions = (w.seq_lens.repeat_interleave(s.num_drafts) + depth).to(torch.int64)
    def new(*shape, dtype=dtype):
        return torch.zeros(*shape, dtype=dtype, device=device)

    buffers = {
        "x": new(tokens, cfg.hidden), "residual": new(tokens, cfg.hidden),
        "h": new(tokens, cfg.hidden), "qkv": new(tokens, cfg.qkv_width),
        "q": new(tokens, cfg.num_q_heads, cfg.head_dim),
        "k": new(tokens, cfg.num_kv_heads, cfg.head_dim),
        "v": new(tokens, cfg.num_kv_heads, cfg.head_dim),
        "attn": new(tokens, cfg.num_q_heads, cfg.head_dim),
        "logits": new(tokens, cfg.vocab),
    }
    if cfg.is_moe:
        pairs = tokens * cfg.top_k
        buffers.update({
            "router": new(tokens, cfg.num_experts),
            "sorted": new(pairs, dtype=torch.int32),
            "offsets": new(cfg.num_experts + 1, dtype=torch.int32),
            "up": new(pairs, 2 * cfg.expert_intermediate),
            "act": new(pairs, cfg.expert_intermediate),
            "down": new(pairs, cfg.hidden)})
    else:
        buffers.update({"gate_up": new(tokens, 2 * cfg.intermediate),
                        "act": new(tokens, cfg.intermediate)})
    gen = torch.Generator().manual_seed(1)
    return StepInputs(torch.randint(cfg.vocab, (tokens,), generator=gen).to(device),
                      positions.to(device), w.draft_slots().to(device), buffers)


def step_fn(weights: ModelWeights, inputs: StepInputs, pools, attend):
    """The verify step as a function of no arguments (for capture): ``pools`` is a
    list of (k_cache, v_cache), layer i using pools[i % len(pools)]; ``attend`` is
    a bench.methods attention, or None to leave attention out."""
    from . import model_kernels as mk

    cfg, b = weights.cfg, inputs.buffers
    tokens = inputs.token_ids.numel()

    def mlp(layer: LayerWeights):
        if not cfg.is_moe:
            torch.mm(b["h"], layer.gate_up.t(), out=b["gate_up"])
            mk.silu_mul(b["gate_up"], b["act"])
            torch.mm(b["act"], layer.down.t(), out=b["x"])
            return
        torch.mm(b["h"], layer.router.t(), out=b["router"])
        top_logits, experts = torch.topk(b["router"], cfg.top_k, dim=-1)
        # Qwen3 renormalizes the top-k probabilities: a softmax over the top-k logits.
        gates = torch.softmax(top_logits.float(), dim=-1).to(b["h"].dtype)
        mk.moe_align(experts, b["sorted"], b["offsets"])
        mk.moe_gemm(b["h"], layer.gate_up, b["up"], b["sorted"], b["offsets"], cfg.top_k,
                    a_per_pair=False)
        mk.silu_mul(b["up"], b["act"])
        mk.moe_gemm(b["act"], layer.down, b["down"], b["sorted"], b["offsets"], cfg.top_k,
                    a_per_pair=True)
        torch.bmm(gates.view(tokens, 1, cfg.top_k), b["down"].view(tokens, cfg.top_k, -1),
                  out=b["x"].view(tokens, 1, -1))

    def step():
        torch.index_select(weights.embed, 0, inputs.token_ids, out=b["x"])
        for i, layer in enumerate(weights.layers):
            k_cache, v_cache = pools[i % len(pools)]
            mk.add_rmsnorm(b["x"], b["residual"], layer.ln1, b["h"], cfg.rms_eps, i > 0)
            torch.mm(b["h"], layer.qkv.t(), out=b["qkv"])
            mk.qk_rope_store(b["qkv"], inputs.positions, inputs.slots, b["q"], b["k"], b["v"],
                             k_cache, v_cache, cfg.rope_theta, layer.q_norm, layer.k_norm,
                             cfg.rms_eps)
            if attend is not None:
                attend(b["q"], b["k"], b["v"], k_cache, v_cache, b["attn"])
            torch.mm(b["attn"].view(tokens, -1), layer.o.t(), out=b["x"])
            mk.add_rmsnorm(b["x"], b["residual"], layer.ln2, b["h"], cfg.rms_eps, True)
            mlp(layer)
        mk.add_rmsnorm(b["x"], b["residual"], weights.final_norm, b["h"], cfg.rms_eps, True)
        torch.mm(b["h"], weights.lm_head.t(), out=b["logits"])
    return step


def reference_step(weights: ModelWeights, inputs: StepInputs, pools, w) -> torch.Tensor:
    """The same step in plain torch with verify_ops' float64 reference attention, written
    apart from step_fn and its kernels: the logits [T, vocab] in float32. Writes the
    drafts' K and V to ``pools`` as the step does."""
    from verify_ops.reference import tree_attn_ref

    from . import model_kernels as mk

    cfg = weights.cfg
    tokens = inputs.token_ids.numel()
    x = weights.embed[inputs.token_ids]
    residual = torch.zeros_like(x)
    for i, layer in enumerate(weights.layers):
        k_cache, v_cache = pools[i % len(pools)]
        h, residual = mk.add_rmsnorm_ref(x, residual, layer.ln1, cfg.rms_eps, i > 0)
        q, k, v = mk.qk_rope_store_ref(h @ layer.qkv.t(), inputs.positions, cfg.num_q_heads,
                                       cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta,
                                       layer.q_norm, layer.k_norm, cfg.rms_eps)
        k_cache[inputs.slots] = k
        v_cache[inputs.slots] = v
        attn = tree_attn_ref(q, k_cache, v_cache, w.req_to_token, w.req_pool_indices,
                             w.seq_lens, w.tree_mask, w.sm_scale).to(x.dtype)
        x = attn.view(tokens, -1) @ layer.o.t()
        h, residual = mk.add_rmsnorm_ref(x, residual, layer.ln2, cfg.rms_eps, True)
        if cfg.is_moe:
            top_logits, experts = torch.topk(h @ layer.router.t(), cfg.top_k, dim=-1)
            gates = torch.softmax(top_logits.float(), dim=-1)
            up = mk.moe_gemm_ref(h, layer.gate_up, experts, a_per_pair=False)
            down = mk.moe_gemm_ref(mk.silu_mul_ref(up), layer.down, experts, a_per_pair=True)
            x = (gates[..., None] * down.view(tokens, cfg.top_k, -1).float()).sum(1).to(h.dtype)
        else:
            x = mk.silu_mul_ref(h @ layer.gate_up.t()) @ layer.down.t()
    h, _ = mk.add_rmsnorm_ref(x, residual, weights.final_norm, cfg.rms_eps, True)
    return (h @ weights.lm_head.t()).float()


def check_step(cfg: ModelConfig, device="cuda", dtype=torch.float32) -> float:
    """Relative error of step_fn's logits against reference_step's, on random weights, two
    requests of a 37-token prefix and EAGLE trees of 4 drafts, the layers sharing 2 pools.
    Both attend through the float64 reference (the backends are checked on their own),
    so this checks the fused kernels and the step's plumbing, in float32."""
    from verify_ops.reference import tree_attn_ref

    from .workload import Shape, make_workload

    case = Case(cfg.name, 2, 37, 4, "eagle")
    w = make_workload(Shape(case.batch, case.seq_len, case.num_drafts, cfg.num_q_heads,
                            cfg.num_kv_heads, cfg.head_dim, "fragmented"), num_layers=0,
                      device=device)
    weights = make_weights(cfg, device, dtype)
    inputs = make_step_inputs(cfg, w, device, dtype)
    pools = allocate_pools(cfg, case, 2, device, dtype, max_drafts=case.num_drafts)
    ref_pools = [(k.clone(), v.clone()) for k, v in pools]
    def attend(q, k_new, v_new, k_cache, v_cache, out):
        out.copy_(tree_attn_ref(q, k_cache, v_cache, w.req_to_token, w.req_pool_indices,
                                w.seq_lens, w.tree_mask, w.sm_scale))
        return out

    step_fn(weights, inputs, pools, attend)()
    want = reference_step(weights, inputs, ref_pools, w)
    got = inputs.buffers["logits"].float()
    return ((got - want).norm() / want.norm()).item()


def check_attention(name: str, attend, w, pool) -> dict:
    """The backend's attention on layer 0's pool against the float64 reference, at the
    case's context and at a short one (bench.oracle's checks)."""
    from verify_ops.cases import TreeAttnCase
    from verify_ops.reference import relative_error

    from .oracle import check_method, reference, short_check_shape
    from .workload import make_workload

    s = w.shape
    k_cache, v_cache = pool
    slots = w.draft_slots()
    q = torch.randn(s.batch * s.num_drafts, s.num_q_heads, s.head_dim, dtype=torch.bfloat16,
                    device=k_cache.device)
    out = torch.full_like(q, float("nan"))  # a row left unwritten fails the check
    attend(q, k_cache[slots].contiguous(), v_cache[slots].contiguous(), k_cache, v_cache, out)
    ref = reference(TreeAttnCase(q, k_cache, v_cache, w.req_to_token, w.req_pool_indices,
                                 w.seq_lens, w.tree_mask, w.sm_scale))
    return {"rel_err": relative_error(out.float(), ref),
            "rel_err_short": check_method(name, make_workload(short_check_shape(s), num_layers=1))}


def time_step(step) -> float:
    """Median ms per replay of ``step`` captured in one CUDA graph (replays: as
    many as take about 2 s, 3 to 15, after bench/timing.py's settling)."""
    from .timing import capture_graph, median_event_us

    graph = capture_graph(step)
    start = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    once_ms = (time.perf_counter() - start) * 1e3
    ms = median_event_us(graph.replay, replays_for(once_ms)) / 1e3
    del graph
    return ms


def run_case(case: Case, weights: ModelWeights, pools, backends: list[str]) -> dict:
    from .methods import ATTENTIONS, MethodUnavailable, flashinfer_attention
    from .oracle import CHECK_TOL
    from .workload import Shape, make_workload

    cfg = weights.cfg
    start = time.perf_counter()
    shape = Shape(case.batch, case.seq_len, case.num_drafts, cfg.num_q_heads, cfg.num_kv_heads,
                  cfg.head_dim, "fragmented", case.tree)
    w = make_workload(shape, num_layers=0)
    inputs = make_step_inputs(cfg, w)
    row = {"case": case.__dict__, "label": case.label(), "tokens": case.tokens,
           "kv_pools": len(pools), "kv_bytes_per_layer": kv_bytes_per_layer(cfg, case),
           "bytes": step_bytes(cfg, case), "flops": step_flops(cfg, case), "methods": {}}
    logits = {}
    for name in [*backends, "none"]:
        result = {}
        try:
            attend = None
            if name == "flashinfer":
                attend = flashinfer_attention(w, cfg.flashinfer_workspace_bytes)
            elif name != "none":
                attend = ATTENTIONS[name](w)
            if attend is not None:
                result.update(check_attention(name, attend, w, pools[0]))
            if max(result.get("rel_err", 0.0), result.get("rel_err_short", 0.0)) >= CHECK_TOL:
                result["error"] = (f"WRONG: relative error {result['rel_err']:.3g}, "
                                   f"{result['rel_err_short']:.3g} at the short context")
            else:
                inputs.buffers["attn"].zero_()  # "none" leaves it so
                result["ms"] = time_step(step_fn(weights, inputs, pools, attend))
                logits[name] = inputs.buffers["logits"].float().clone()
                if not torch.isfinite(logits[name]).all():
                    result["error"] = "the step's logits are not finite"
                    del result["ms"]
            del attend
        except MethodUnavailable as exc:
            result = {"skipped": str(exc)}
        except Exception as exc:  # reported in the row; the other backends go on
            result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        row["methods"][name] = result
        gc.collect()
        torch.cuda.empty_cache()
    if cfg.is_moe:  # the last layer's routing (the buffers are shared by the layers)
        offsets = inputs.buffers["offsets"]
        row["experts_read_last_layer"] = int(((offsets[1:] - offsets[:-1]) > 0).sum())
    base = logits.get("verify_ops")
    for name, value in logits.items():
        if base is not None and name not in ("verify_ops", "none"):
            row["methods"][name]["logits_rel_diff_vs_verify_ops"] = (
                (value - base).norm() / base.norm()).item()
    row["elapsed_s"] = time.perf_counter() - start
    return row


def allocate_pools(cfg: ModelConfig, case: Case, count: int, device="cuda",
                   dtype=torch.bfloat16, max_drafts: int = 16):
    """``count`` (k_cache, v_cache) pools of random K/V, each big enough for the case's
    slot layout at up to ``max_drafts`` drafts (bench.workload's pool size)."""
    pool = 1 + case.batch * (case.seq_len + max_drafts) + 64
    shape = (pool, cfg.num_kv_heads, cfg.head_dim)
    return [(torch.randn(shape, dtype=dtype, device=device),
             torch.randn(shape, dtype=dtype, device=device)) for _ in range(count)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batches", default="1,8")
    p.add_argument("--contexts", default="4096,16384,65536,131072")
    p.add_argument("--drafts", default="4,8,16")
    p.add_argument("--chain-drafts", default="4", help="draft counts run as a chain")
    p.add_argument("--cases", default=None,
                   help="explicit cases model/batch/context/drafts/tree, comma-separated")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--out", default="bench_out/model_step.json", help="JSON results path")
    return p.parse_args(argv)


def _ints(text):
    return [int(x) for x in text.split(",") if x]


def cases_from_args(args) -> list[Case]:
    if args.cases:
        return [parse_case(c) for c in args.cases.split(",") if c]
    return cases_of(args.models.split(","), _ints(args.batches), _ints(args.contexts),
                    _ints(args.drafts), _ints(args.chain_drafts))


def require_gpu() -> None:
    """Fails at once, saying why, where the step cannot run."""
    import verify_ops

    if not torch.cuda.is_available():
        raise SystemExit("bench.model_step needs a CUDA GPU: it times whole-model verify steps "
                         "as CUDA graphs (its arithmetic and table run anywhere; see its tests)")
    if not verify_ops.has_cuda_kernel():
        raise SystemExit("bench.model_step needs verify_ops built with its CUDA kernels")
    from . import model_kernels

    model_kernels._require_triton()


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    cases = cases_from_args(args)
    backends = [b for b in args.backends.split(",") if b]
    require_gpu()
    from .report import run_meta, save_rows
    from .timing import burst_ceilings

    torch.manual_seed(0)
    step_checks = {cfg.name: check_step(cfg) for cfg in TINY_MODELS}
    print(f"step checks (float32 logits against plain torch): {step_checks}", flush=True)
    if max(step_checks.values()) >= STEP_CHECK_TOL:
        raise SystemExit(f"the step's kernels disagree with plain torch: {step_checks}")
    ceilings = burst_ceilings()
    meta = run_meta("bench.model_step", argv if argv is not None else sys.argv[1:], **ceilings,
                    step_checks=step_checks,
                    communication="left out: a TP8 rank's all-reduces and the LM head's gather")
    rows, weights, pools, pool_key = [], None, None, None
    max_drafts = max(c.num_drafts for c in cases)  # the pools serve every D of a context
    for case in cases:
        cfg = MODELS[case.model]
        if weights is None or weights.cfg is not cfg:
            weights = pools = None
            gc.collect()
            torch.cuda.empty_cache()
            t0 = time.perf_counter()
            weights = make_weights(cfg)
            print(f"{cfg.name}: {cfg.weight_bytes() / 1e9:.1f} GB of weights in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
        if pool_key != (case.model, case.batch, case.seq_len) or pools is None:
            pools = None
            gc.collect()
            torch.cuda.empty_cache()
            free = torch.cuda.mem_get_info()[0] - RESERVE_BYTES
            count = kv_pools(cfg, replace(case, num_drafts=max_drafts), free)
            pools = allocate_pools(cfg, case, count, max_drafts=max_drafts)
            pool_key = (case.model, case.batch, case.seq_len)
        row = run_case(case, weights, pools, backends)
        row["memory_floor_ms"] = row["bytes"]["total"] / ceilings["copy_bytes_per_s"] * 1e3
        rows.append(row)
        brief = {m: (f"{r['ms']:.3f}ms" if "ms" in r else "skip" if "skipped" in r else "fail")
                 for m, r in row["methods"].items()}
        print(f"{case.label():44} pools {row['kv_pools']:>3} floor "
              f"{row['memory_floor_ms']:.3f}ms {brief} ({row['elapsed_s']:.1f} s)", flush=True)
        save_rows(args.out, meta, rows)
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
