"""Side-by-side per-layer timings of tree verify on SGLang-layout caches, with the roofline.

    python -m bench.bench_tree_attn        # every case; JSON and PNG in bench_out/

The cases: batch 1 and 8; contexts 4k to 256k; D = 4 as a chain (SGLang's
default top-1 speculation), D = 8 to 64 as EAGLE trees; five head shapes; a
fragmented page_size-1 pool. verify_ops, FlashInfer and FA3 (each as SGLang's
flashinfer and fa3 backends call them) run on every case, SGLang's Triton
verify, SDPA and FlexAttention on the cases the --baseline-* lists name. A
method whose package is missing here is skipped, with the reason in its rows.

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
import gc
import itertools
import os
import sys
import time

import torch

from verify_ops.reference import relative_error

from .methods import METHODS, MethodUnavailable
from .oracle import CHECK_TOL, check_method, reference, short_check_shape
from .report import run_meta, save_rows
from .timing import burst_ceilings, describe_ceilings, sustained_ceilings, time_per_layer_us
from .workload import Shape, make_workload, parse_case

# Methods timed on every case; the others only where the --baseline-* lists hold it.
EVERY_CASE_METHODS = "verify_ops,flashinfer,fa3"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--contexts", default="4096,16384,65536,131072,262144")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--drafts", default="4,8,16,32,64")
    p.add_argument("--chain-drafts", default="4",
                   help="draft counts run as a chain (SGLang's default 3 steps, top-1, 4 "
                        "tokens); the others as EAGLE trees")
    p.add_argument("--heads", default="8/1/128,32/8/128,64/8/128,16/2/256,32/4/64",
                   help="Hq/Hkv/head_dim triples")
    p.add_argument("--layouts", default="fragmented",
                   help="fragmented and/or contiguous slots (contiguous was within -3.8 to "
                        "+1.9 %% of fragmented over 240 cases, history/NOTES.md v15)")
    p.add_argument("--cases", default=None,
                   help="explicit cases batch/context/drafts/Hq/Hkv/head_dim/layout[/tree], "
                        "comma-separated, instead of the product of the lists above")
    p.add_argument("--methods", default="verify_ops,flashinfer,fa3,triton,flex,sdpa")
    p.add_argument("--every-case-methods", default=EVERY_CASE_METHODS,
                   help="methods timed on every case; the others on the --baseline-* cases")
    p.add_argument("--baseline-batches", default="1,8",
                   help="batches at which the other baselines run (they are slow)")
    p.add_argument("--baseline-layouts", default="fragmented,contiguous")
    p.add_argument("--baseline-drafts", default="4,8,16,32,64")
    p.add_argument("--baseline-contexts", default="4096,16384,65536",
                   help="SDPA and Flex gather each layer's K+V beforehand (twice the case's "
                        "memory) and Triton takes about 20 ms a layer at 256k")
    p.add_argument("--out", default="bench_out/tree_attn.json", help="JSON results path")
    p.add_argument("--plot", default="bench_out/tree_attn.png", help="PNG plot path")
    return p.parse_args(argv)


def ints(text):
    return [int(x) for x in text.split(",") if x]


def shapes_of(args) -> list[Shape]:
    if args.cases:
        return [parse_case(c) for c in args.cases.split(",") if c]
    heads = [tuple(int(x) for x in h.split("/")) for h in args.heads.split(",")]
    chains = ints(args.chain_drafts)
    return [Shape(batch, ctx, d, hq, hkv, hd, layout, "chain" if d in chains else "eagle")
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
    """The methods timed on ``shape``: the --every-case-methods always, the other
    baselines where the --baseline-* lists hold the case."""
    every = args.every_case_methods.split(",")
    with_baselines = (shape.batch in ints(args.baseline_batches)
                      and shape.layout in args.baseline_layouts.split(",")
                      and shape.num_drafts in ints(args.baseline_drafts)
                      and shape.seq_len in ints(args.baseline_contexts))
    return [m for m in methods if m in every or with_baselines]


def run_method(name: str, w, short, ref: torch.Tensor, roofline_us: float) -> dict:
    """One method on one case: both checks, then the timing if they pass."""
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
            result["pct_roofline"] = 100 * roofline_us / result["us"]
        else:
            result["error"] = (f"WRONG: relative error {err:.3g}, "
                               f"{result['rel_err_short']:.3g} at context {short.shape.seq_len}")
        del calls
    except MethodUnavailable as exc:
        result = {"skipped": str(exc)}
    except Exception as exc:  # a baseline that cannot run this shape is reported, not fatal
        result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return result


def run_case(shape: Shape, methods: list[str], ceilings: dict) -> dict:
    start = time.perf_counter()
    w = make_workload(shape)
    ref = reference(w.case(0))
    short = make_workload(short_check_shape(shape), num_layers=1)
    row = {**case_row(shape, len(w.layers), ceilings), "methods": {}}
    for name in methods:
        row["methods"][name] = run_method(name, w, short, ref, row["roofline_us"])
        gc.collect()
        torch.cuda.empty_cache()
    del w, short, ref
    gc.collect()
    torch.cuda.empty_cache()
    row["elapsed_s"] = time.perf_counter() - start  # for sizing full_run's parts
    return row


def _failure(result: dict) -> str:
    """What the table prints for a method without a time: skipped, wrong, or failed."""
    if "skipped" in result:
        return "skip"
    return "WRONG" if result.get("error", "").startswith("WRONG") else "fail"


def format_table(rows: list[dict], methods: list[str]) -> str:
    """One line per case: the roofline, the first method's µs and % of it, and each
    other method's µs with its ratio to the first (>1: the first is faster). A method
    skipped on every row gets no column, only its reason under the table."""
    skipped = {m: res["skipped"] for r in rows for m, res in r["methods"].items()
               if "skipped" in res}
    shown = [m for m in methods[1:] if m not in skipped or any(
        "skipped" not in r["methods"].get(m, {"skipped": ""}) for r in rows)]
    head = f"{'case':40} {'N':>3} {'roof us':>8} {'ours us':>8} {'%roof':>6}"
    for m in shown:
        head += f" {m[:6] + ' us':>9} {'x':>5}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ours = r["methods"].get(methods[0], {})
        ours_us = f"{ours['us']:>8.1f}" if "us" in ours else f"{_failure(ours):>8}"
        line = (f"{r['label']:40} {r['num_layers']:>3} {r['roofline_us']:>8.1f} "
                f"{ours_us} {ours.get('pct_roofline', float('nan')):>6.1f}")
        for m in shown:
            res = r["methods"].get(m)
            if res is None:
                line += f" {'-':>9} {'':>5}"
            elif "us" in res:
                ratio = res["us"] / ours["us"] if "us" in ours else float("nan")
                line += f" {res['us']:>9.1f} {ratio:>5.2f}"
            else:
                line += f" {_failure(res):>9} {'':>5}"
        lines.append(line)
    lines += [f"{m} skipped: {why}" for m, why in skipped.items()]
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
    sustained = sustained_ceilings()
    print(describe_ceilings({**ceilings, **sustained}), flush=True)
    meta = run_meta("bench.bench_tree_attn", argv if argv is not None else sys.argv[1:],
                    **ceilings, **sustained)
    rows = []
    for shape in shapes_of(args):
        row = run_case(shape, methods_for(shape, args, methods), ceilings)
        rows.append(row)
        brief = {m: (f"{r['us']:.1f}us" if "us" in r else _failure(r))
                 for m, r in row["methods"].items()}
        print(f"{shape.label():40} roof {row['roofline_us']:.1f}us {brief} "
              f"({row['elapsed_s']:.1f} s)", flush=True)
        save_rows(args.out, meta, rows)
    table = format_table(rows, methods)
    if args.plot:
        os.makedirs(os.path.dirname(args.plot) or ".", exist_ok=True)
        plot(rows, args.plot, methods)
    print(table)


if __name__ == "__main__":
    main()
