"""The op's options on the GPU, each against the plain call on the same case.

    python -m bench.options_bench --out bench_out/options.json [--quick]

Timed as bench_tree_attn times the op (one CUDA graph over N layers, each
with its own KV, median per layer after the settle time). Rows:
- fp8 KV (e4m3, e5m2, with k_scale/v_scale) against bf16 KV, memory-bound
  cases at 64k: the issue's bar is >= 1.7x bf16's speed;
- a 128-token window at 64k against the same case at 256 tokens of context
  (bar: within 1.5x), and against full attention at 64k;
- sinks, soft-cap and LSE output, each alone (bar: <= 5 % over plain);
- the gpt-oss shapes (64/8/64 and its TP8 rank 8/1/64): window 128 with
  sinks, and their full-attention layers (sinks only).
Every method is checked against the float64 reference on a short context
(where the tree dominates) before it is timed.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

import verify_ops

from .timing import copy_bandwidth_bytes_per_s, matmul_flops_per_s, time_per_layer_us
from .workload import Shape, Workload, make_workload

TOLERANCE = 1e-2


@dataclass(frozen=True)
class Variant:
    name: str
    kv_dtype: str = "bf16"  # bf16, e4m3 or e5m2
    options: tuple = ()     # (name, value) pairs: sinks, logit_cap, sliding_window, lse, scales

    def option_dict(self) -> dict:
        return dict(self.options)


PLAIN = Variant("plain")
FP8 = [Variant("fp8 e4m3", "e4m3", (("scales", True),)),
       Variant("fp8 e5m2", "e5m2", (("scales", True),))]
EACH = [Variant("sinks", options=(("sinks", True),)),
        Variant("soft-cap 30", options=(("logit_cap", 30.0),)),
        Variant("lse", options=(("lse", True),))]
WINDOW = Variant("window 128", options=(("sliding_window", 128),))
GPT_OSS_SWA = Variant("window 128 + sinks", options=(("sliding_window", 128), ("sinks", True)))
GPT_OSS_FULL = Variant("sinks (full layer)", options=(("sinks", True),))

_FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@dataclass
class Row:
    group: str
    shape: str
    variant: str
    us: float
    kv_bytes: int
    roofline_us: float
    relative_error: float
    baseline_us: float | None = None  # the row this one is compared with
    ratio: float | None = None        # baseline_us / us: > 1 is faster
    notes: list = field(default_factory=list)


def roofline_work(shape: Shape, variant: Variant) -> tuple[int, int]:
    """(K+V bytes, FLOPs) one layer must move and do: fp8 halves the bytes, and
    a window reads and multiplies only its W prefix keys and the D drafts."""
    kv_bytes, flops = shape.kv_bytes, shape.flops
    if variant.kv_dtype != "bf16":
        kv_bytes //= 2
    window = variant.option_dict().get("sliding_window")
    if window is not None:
        keys, seen = shape.seq_len + shape.num_drafts, min(shape.seq_len, window) + shape.num_drafts
        kv_bytes, flops = kv_bytes * seen // keys, flops * seen // keys
    return kv_bytes, flops


def layer_calls(w: Workload, variant: Variant):
    """One zero-argument call per layer, and the (args, kwargs) of layer 0."""
    options = variant.option_dict()
    device = w.tree_mask.device
    gen = torch.Generator().manual_seed(7)
    sinks = 2 * torch.randn(w.shape.num_q_heads, generator=gen).to(device)
    calls, first = [], None
    for i, layer in enumerate(w.layers):
        case = w.case(i)
        k, v = case.k_cache, case.v_cache
        if variant.kv_dtype != "bf16":
            k, v = k.to(_FP8_DTYPES[variant.kv_dtype]), v.to(_FP8_DTYPES[variant.kv_dtype])
            layer.k_cache, layer.v_cache = k, v  # the bf16 copies go
        kwargs = {}
        if options.get("scales"):
            kwargs["k_scale"] = torch.tensor([0.75], device=device)
            kwargs["v_scale"] = torch.tensor([1.25], device=device)
        if options.get("sinks"):
            kwargs["sinks"] = sinks
        if options.get("logit_cap"):
            kwargs["logit_cap"] = options["logit_cap"]
        if "sliding_window" in options:
            kwargs["sliding_window"] = options["sliding_window"]
        out = torch.empty_like(case.q)
        if options.get("lse"):
            kwargs["lse"] = torch.empty(case.q.shape[:2], device=device)
        args = (case.q, k, v, *case.args()[3:], out)

        def call(args=args, kwargs=kwargs):
            verify_ops.tree_attn_out(*args, **kwargs)
            return args[-1]
        calls.append(call)
        if first is None:
            first = (args, kwargs)
    return calls, first


def check(shape: Shape, variant: Variant) -> float:
    """Relative error against the float64 reference at a 64-token context."""
    small = Shape(shape.batch, 64, shape.num_drafts, shape.num_q_heads, shape.num_kv_heads,
                  shape.head_dim, shape.layout)
    w = make_workload(small, seed=3, num_layers=1)
    calls, (args, kwargs) = layer_calls(w, variant)
    args[-1].fill_(float("nan"))
    out = calls[0]()
    ref_kwargs = {k: v for k, v in kwargs.items() if k != "lse"}
    ref = verify_ops.tree_attn_ref(*args[:-1], **ref_kwargs)
    return verify_ops.relative_error(out, ref)


def time_variant(shape: Shape, variant: Variant, copy_rate: float, matmul_rate: float,
                 group: str) -> Row:
    err = check(shape, variant)
    w = make_workload(shape, seed=1)
    calls, _ = layer_calls(w, variant)
    us = time_per_layer_us(calls)
    del calls, w
    torch.cuda.empty_cache()
    kv_bytes, flops = roofline_work(shape, variant)
    roofline = max(kv_bytes / copy_rate, flops / matmul_rate) * 1e6
    notes = [] if err < TOLERANCE else [f"relative error {err:.3g} >= {TOLERANCE}"]
    return Row(group, shape.label(), variant.name, us, kv_bytes, roofline, err, notes=notes)


def plan(quick: bool) -> list[tuple[str, Shape, list[Variant], Shape | None]]:
    """(group, shape, variants compared with the first, the first's shape if other)."""
    contexts = [65536] if quick else [16384, 65536]
    groups = []
    for ctx in contexts:
        for hq, hkv, d in ((32, 8, 128), (8, 1, 128), (16, 2, 256), (32, 4, 64), (64, 8, 64)):
            groups.append(("fp8", Shape(1, ctx, 8, hq, hkv, d, "fragmented"), [PLAIN, *FP8], None))
    groups.append(("fp8", Shape(8, 65536, 8, 32, 8, 128, "fragmented"), [PLAIN, *FP8], None))
    for hq, hkv, d in ((8, 1, 64), (64, 8, 64), (32, 8, 128)):
        long = Shape(1, 65536, 8, hq, hkv, d, "fragmented")
        short = Shape(1, 256, 8, hq, hkv, d, "fragmented")
        groups.append(("window", short, [PLAIN], None))
        groups.append(("window", long, [WINDOW], short))
        groups.append(("window vs full", long, [PLAIN, WINDOW], None))
    each_shapes = [Shape(1, 65536, 8, 32, 8, 128, "fragmented"),
                   Shape(1, 65536, 16, 64, 8, 128, "fragmented")]
    if not quick:
        each_shapes += [Shape(1, 4096, 8, 32, 8, 128, "fragmented"),
                        Shape(1, 65536, 8, 8, 1, 128, "fragmented"),
                        Shape(8, 16384, 8, 32, 8, 128, "fragmented")]
    for shape in each_shapes:
        groups.append(("each option", shape, [PLAIN, *EACH], None))
    for hq, hkv in ((64, 8), (8, 1)):
        for ctx in (65536,) if quick else (4096, 65536):
            shape = Shape(1, ctx, 8, hq, hkv, 64, "fragmented")
            groups.append(("gpt-oss", shape, [PLAIN, GPT_OSS_SWA, GPT_OSS_FULL], None))
    return groups


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON with every row and the ceilings")
    parser.add_argument("--quick", action="store_true",
                        help="64k only, and two shapes for the single options")
    args = parser.parse_args(argv)
    if not verify_ops.has_cuda_kernel():
        raise SystemExit("options_bench needs a GPU and a CUDA build of verify_ops")
    copy_rate = copy_bandwidth_bytes_per_s(settle_s=0)
    matmul_rate = matmul_flops_per_s(settle_s=0)
    rows: list[Row] = []
    baselines: dict[tuple[str, str], float] = {}
    started = time.time()
    for group, shape, variants, baseline_shape in plan(args.quick):
        base_key = (baseline_shape or shape).label()
        for i, variant in enumerate(variants):
            row = time_variant(shape, variant, copy_rate, matmul_rate, group)
            if i == 0 and baseline_shape is None:
                baselines[(group, base_key)] = row.us
            if group == "window" and baseline_shape is None:
                baselines[("window", shape.label())] = row.us
            key = (group, base_key)
            if (i > 0 or baseline_shape is not None) and key in baselines:
                row.baseline_us = baselines[key]
                row.ratio = row.baseline_us / row.us
            rows.append(row)
            ratio = f"{row.ratio:.2f}x" if row.ratio else ""
            print(f"{group:14} {row.shape:30} {row.variant:20} {row.us:9.1f} us "
                  f"{100 * row.roofline_us / row.us:5.1f} % {ratio:>7} err {row.relative_error:.1e}",
                  flush=True)
    result = {
        "command": "python -m bench.options_bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "device": torch.cuda.get_device_name(), "host": platform.node(),
        "torch": torch.__version__, "seconds": time.time() - started,
        "copy_bytes_per_s": copy_rate, "matmul_flops_per_s": matmul_rate,
        "rows": [asdict(r) for r in rows],
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
