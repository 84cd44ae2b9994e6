"""Side-by-side per-layer timings of tree verify on SGLang-layout caches, with the roofline.

    python -m bench.bench_tree_attn        # every case; JSON and PNG in bench_out/

Each case is timed as a model runs it: one CUDA graph calls the kernel once per
layer for N layers, each with its own K/V buffers (N streams >= 4x the L2), and
the replay time is divided by N; the median of the replays is reported, after
0.3 s of replays that bring the GPU to its sustained (power-capped) clock.
Every method's layer-0 output is checked against the float64 reference first,
and so is its output on the same heads, drafts and layout at a 64-token context,
where the tree dominates; a method that fails either check is reported as WRONG
and not timed.

The roofline of a case is max(K+V bytes / copy bandwidth, FLOPs / bf16 matmul
rate), both ceilings measured in the same run as short bursts, before the
power cap lowers the clock (their sustained rates are recorded beside them).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import itertools
import json
import os
import platform
import sys

import torch

from verify_ops.reference import relative_error, tree_attn_ref

from .methods import METHODS
from .timing import copy_bandwidth_bytes_per_s, matmul_flops_per_s, time_per_layer_us
from .workload import Shape, make_workload

CHECK_TOL = 1e-2
# At long context the drafts carry little of the softmax weight: an output that
# drops them is within CHECK_TOL of the reference (5.9e-3 at 64k D8). So every
# method is also checked on the same heads, drafts and layout at this short
# context, where the tree dominates the output.
CHECK_SHORT_CONTEXT = 64


def short_check_shape(shape: Shape) -> Shape:
    """The tree-sensitive check case of ``shape``: same everything, a short prefix."""
    return Shape(shape.batch, min(shape.seq_len, CHECK_SHORT_CONTEXT), shape.num_drafts,
                 shape.num_q_heads, shape.num_kv_heads, shape.head_dim, shape.layout)


def check_method(name: str, w) -> float:
    """Largest relative error of method ``name`` over every layer of ``w`` (eager calls)."""
    calls = METHODS[name](w)
    worst = 0.0
    for i, call in enumerate(calls):
        worst = max(worst, relative_error(call().float(), tree_attn_ref(*w.case(i).args())))
    del calls
    return worst


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--contexts", default="4096,16384,65536")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--drafts", default="8,16,32,64")
    p.add_argument("--heads", default="8/1/128,32/8/128,64/8/128,16/2/256,32/4/64",
                   help="Hq/Hkv/head_dim triples")
    p.add_argument("--layouts", default="fragmented,contiguous")
    p.add_argument("--cases", default=None,
                   help="explicit cases batch/context/drafts/Hq/Hkv/head_dim/layout, comma-"
                        "separated, instead of the product of the five lists above")
    p.add_argument("--methods", default="verify_ops,triton,flex,sdpa")
    p.add_argument("--baseline-batches", default="1,8",
                   help="batches at which baselines run (they are slow); verify_ops runs at all")
    p.add_argument("--baseline-layouts", default="fragmented,contiguous")
    p.add_argument("--baseline-drafts", default="8,16,32,64")
    p.add_argument("--out", default="bench_out/tree_attn.json", help="JSON results path")
    p.add_argument("--plot", default="bench_out/tree_attn.png", help="PNG plot path")
    return p.parse_args(argv)


def ints(text):
    return [int(x) for x in text.split(",") if x]


def parse_case(text: str) -> Shape:
    """``batch/context/drafts/Hq/Hkv/head_dim/layout``, e.g. ``1/65536/16/64/8/128/fragmented``."""
    fields = text.split("/")
    if len(fields) != 7:
        raise ValueError(f"a case is batch/context/drafts/Hq/Hkv/head_dim/layout, got {text!r}")
    return Shape(*(int(x) for x in fields[:6]), fields[6])


def shapes_of(args) -> list[Shape]:
    if args.cases:
        return [parse_case(c) for c in args.cases.split(",") if c]
    heads = [tuple(int(x) for x in h.split("/")) for h in args.heads.split(",")]
    return [Shape(batch, ctx, d, hq, hkv, hd, layout)
            for batch, ctx, d, (hq, hkv, hd), layout in itertools.product(
                ints(args.batches), ints(args.contexts), ints(args.drafts), heads,
                args.layouts.split(","))]


def case_row(shape: Shape, num_layers: int, ceilings: dict) -> dict:
    """A result row's case fields: the shape, its bytes and FLOPs, and its roofline µs
    (the larger of its memory and math times) with the bound that sets it."""
    memory_s = shape.kv_bytes / ceilings["copy_bytes_per_s"]
    math_s = shape.flops / ceilings["matmul_flops_per_s"]
    return {"shape": shape.__dict__, "label": shape.label(), "num_layers": num_layers,
            "kv_bytes": shape.kv_bytes, "flops": shape.flops,
            "roofline_us": max(memory_s, math_s) * 1e6,
            "bound": "memory" if memory_s >= math_s else "math"}


def methods_for(shape: Shape, args, methods: list[str]) -> list[str]:
    """The methods timed on ``shape``: verify_ops always, the baselines where the
    --baseline-* lists hold the case."""
    with_baselines = (shape.batch in ints(args.baseline_batches)
                      and shape.layout in args.baseline_layouts.split(",")
                      and shape.num_drafts in ints(args.baseline_drafts))
    return [m for m in methods if m == "verify_ops" or with_baselines]


def run_case(shape: Shape, methods: list[str], ceilings: dict) -> dict:
    w = make_workload(shape)
    ref = tree_attn_ref(*w.case(0).args())
    short = make_workload(short_check_shape(shape), num_layers=1)
    row = {**case_row(shape, len(w.layers), ceilings), "methods": {}}
    for name in methods:
        result = {}
        try:
            result["rel_err_short"] = check_method(name, short)
            calls = METHODS[name](w)
            if hasattr(calls[0], "note"):  # how a baseline had to be set up for this shape
                result["note"] = calls[0].note
            err = relative_error(calls[0]().float(), ref)
            result["rel_err"] = err
            if err < CHECK_TOL and result["rel_err_short"] < CHECK_TOL:
                result["us"] = time_per_layer_us(calls)
                result["pct_roofline"] = 100 * row["roofline_us"] / result["us"]
            else:
                result["error"] = (f"WRONG: relative error {err:.3g}, "
                                   f"{result['rel_err_short']:.3g} at context {short.shape.seq_len}")
            del calls
        except Exception as exc:  # a baseline that cannot run this shape is reported, not fatal
            result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        row["methods"][name] = result
        gc.collect()
        torch.cuda.empty_cache()
    del w, short
    gc.collect()
    torch.cuda.empty_cache()
    return row


def _failure(result: dict) -> str:
    """What the table prints for a method without a time: a wrong output, or a failure."""
    return "WRONG" if result.get("error", "").startswith("WRONG") else "fail"


def format_table(rows: list[dict], methods: list[str]) -> str:
    head = f"{'case':34} {'N':>3} {'roof us':>8} {'ours us':>8} {'%roof':>6}"
    for m in methods[1:]:
        head += f" {m + ' us':>11} {'x':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ours = r["methods"].get(methods[0], {})
        ours_us = f"{ours['us']:>8.1f}" if "us" in ours else f"{_failure(ours):>8}"
        line = (f"{r['label']:34} {r['num_layers']:>3} {r['roofline_us']:>8.1f} "
                f"{ours_us} {ours.get('pct_roofline', float('nan')):>6.1f}")
        for m in methods[1:]:
            res = r["methods"].get(m)
            if res is None:
                line += f" {'-':>11} {'':>6}"
            elif "us" in res:
                ratio = res["us"] / ours["us"] if "us" in ours else float("nan")
                line += f" {res['us']:>11.1f} {ratio:>6.1f}"
            else:
                line += f" {_failure(res):>11} {'':>6}"
        lines.append(line)
    return "\n".join(lines)


def plot_panels(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """The plot's panels: (title, rows by context) for up to four head shapes at
    D8 or D64, fragmented, at the run's smallest batch (batch 1 where it has it)."""
    batch = min((r["shape"]["batch"] for r in rows), default=1)

    def key(r):
        s = r["shape"]
        return s["num_q_heads"], s["num_kv_heads"], s["head_dim"], s["num_drafts"]

    mine = [r for r in rows if r["shape"]["batch"] == batch
            and r["shape"]["layout"] == "fragmented"]
    picks = sorted({key(r) for r in mine})
    picks = [p for p in picks if p[3] in (8, 64)] or picks
    picks = sorted(picks, key=lambda p: (p[:3] != (32, 8, 128), p))[:4]  # Llama-3-8B first
    return [(f"bs{batch} D{d} Hq{hq}/Hkv{hkv}/d{hd}",
             sorted((r for r in mine if key(r) == (hq, hkv, hd, d)),
                    key=lambda r: r["shape"]["seq_len"]))
            for hq, hkv, hd, d in picks]


def plot(rows: list[dict], path: str, methods: list[str]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = plot_panels(rows)
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5 * max(1, len(panels)), 4),
                             squeeze=False)
    for ax, (title, sel) in zip(axes[0], panels):
        ctx = [r["shape"]["seq_len"] for r in sel]
        ax.plot(ctx, [r["roofline_us"] for r in sel], "k--", label="roofline")
        for m in methods:
            pts = [(c, r["methods"][m]["us"]) for c, r in zip(ctx, sel)
                   if "us" in r["methods"].get(m, {})]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=m)
        ax.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="µs per layer",
               title=title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def burst_ceilings() -> dict:
    """The roofline's ceilings: copy and bf16 matmul rates of a short burst, before
    the power cap lowers the clock (the higher rates: the stricter roofline)."""
    return {"copy_bytes_per_s": copy_bandwidth_bytes_per_s(settle_s=0),
            "matmul_flops_per_s": matmul_flops_per_s(settle_s=0)}


def save_rows(path: str | None, meta: dict, rows: list[dict]) -> None:
    """Writes the JSON results so far; called after every case, so that a run cut
    short still leaves its results."""
    if not path:
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


def main(argv=None):
    args = parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    if "verify_ops" in methods:  # the table's "ours" column and speedups are against methods[0]
        methods.remove("verify_ops")
        methods.insert(0, "verify_ops")
    torch.manual_seed(0)
    # The cases are timed sustained (bench/timing.py); the sustained ceilings
    # are recorded beside the burst ones the roofline takes.
    ceilings = burst_ceilings()
    sustained = {"copy_bytes_per_s_sustained": copy_bandwidth_bytes_per_s(),
                 "matmul_flops_per_s_sustained": matmul_flops_per_s()}
    print(f"device {torch.cuda.get_device_name()}: copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} "
          f"TB/s, bf16 matmul {ceilings['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s (sustained: "
          f"{sustained['copy_bytes_per_s_sustained'] / 1e12:.2f} TB/s, "
          f"{sustained['matmul_flops_per_s_sustained'] / 1e12:.0f} TFLOP/s)", flush=True)
    meta = {"command": " ".join(["python -m bench.bench_tree_attn"] + (argv or sys.argv[1:])),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "python": platform.python_version(), **ceilings, **sustained}
    rows = []
    for shape in shapes_of(args):
        row = run_case(shape, methods_for(shape, args, methods), ceilings)
        rows.append(row)
        brief = {m: (f"{r['us']:.1f}us" if "us" in r else r.get("error", "?"))
                 for m, r in row["methods"].items()}
        print(f"{shape.label():34} roof {row['roofline_us']:.1f}us {brief}", flush=True)
        save_rows(args.out, meta, rows)
    table = format_table(rows, methods)
    if args.plot:
        os.makedirs(os.path.dirname(args.plot) or ".", exist_ok=True)
        plot(rows, args.plot, methods)
    print(table)


if __name__ == "__main__":
    main()
