"""What KV contiguity buys and what relocation costs, on the GPU.

    python -m bench.defrag_bench --out bench/results/defrag-h200.json

Three parts, each printed as a table and written to the JSON:

(a) kernel: verify.tree_attn per layer on fragmented vs contiguous slot layouts
    of the same shapes (bench/workload.py), timed as bench_tree_attn times it:
    one CUDA graph over N layers with their own KV buffers.
(b) relocation: verify.relocate_kv moving n fragmented slots of every layer
    into one run; its rate (bytes read + written per second) as % of the
    measured device copy bandwidth, next to per-layer torch indexing.
(c) churn: the churn simulation (bench/churn.py) over SGLang's
    real allocator classes, stock vs need_sort vs ours (vs ours with Tier 1
    relocation); the running batch's layout is snapshotted every few steps and
    verify.tree_attn timed on each snapshot, with the KV pool on the GPU.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import statistics
import sys

import torch

import verify_ops
from verify_ops.cases import make_tree_masks
from verify_ops.reference import relative_error, tree_attn_ref

from .timing import copy_bandwidth_bytes_per_s, median_event_us, time_per_layer_us
from .workload import Shape, make_workload

CHECK_TOL = 1e-2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="kernel,relocation,churn")
    p.add_argument("--shapes", default="1/16384/8/32/8/128,8/16384/16/32/8/128,"
                                       "1/65536/64/8/1/128,8/4096/8/64/8/128,1/65536/8/16/2/256",
                   help="kernel part: bs/context/D/Hq/Hkv/head_dim, comma separated")
    p.add_argument("--reloc-layers", type=int, default=32)
    p.add_argument("--reloc-pool", type=int, default=262144, help="slots per layer")
    p.add_argument("--reloc-kv", default="8/128", help="Hkv/head_dim of the relocated pool")
    p.add_argument("--reloc-slots", default="1024,16384,65536")
    p.add_argument("--churn-steps", type=int, default=1500)
    p.add_argument("--churn-snapshot-every", type=int, default=100)
    p.add_argument("--churn-layers", type=int, default=8)
    p.add_argument("--out", default=None, help="JSON results path")
    return p.parse_args(argv)


def free_gpu():
    gc.collect()
    torch.cuda.empty_cache()


# -- (a) kernel: fragmented vs contiguous --------------------------------------


def kernel_part(shapes: list[tuple[int, ...]]) -> list[dict]:
    rows = []
    for batch, ctx, drafts, hq, hkv, hd in shapes:
        row = {"shape": [batch, ctx, drafts, hq, hkv, hd]}
        for layout in ("fragmented", "contiguous"):
            w = make_workload(Shape(batch, ctx, drafts, hq, hkv, hd, layout))
            case = w.case(0)
            err = relative_error(verify_ops.tree_attn(*case.args()).float(),
                                 tree_attn_ref(*case.args()))
            calls = []
            for i in range(len(w.layers)):
                c, out = w.case(i), torch.empty_like(w.layers[i].q)
                calls.append(lambda c=c, out=out: verify_ops.tree_attn_out(*c.args(), out))
            row[layout] = {"us": time_per_layer_us(calls) if err < CHECK_TOL else None,
                           "rel_err": err, "num_layers": len(w.layers)}
            del w, calls
            free_gpu()
        frag, contig = row["fragmented"]["us"], row["contiguous"]["us"]
        row["contiguous_speedup"] = frag / contig if frag and contig else None
        rows.append(row)
        print(f"kernel {row['shape']}: fragmented {frag} us, contiguous {contig} us", flush=True)
    return rows


def kernel_table(rows: list[dict]) -> str:
    head = f"{'bs/ctx/D/Hq/Hkv/d':28} {'frag us':>9} {'contig us':>9} {'speedup':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        f, c, s = r["fragmented"]["us"], r["contiguous"]["us"], r["contiguous_speedup"]
        lines.append(f"{'/'.join(map(str, r['shape'])):28} {fmt(f, 9, 1)} {fmt(c, 9, 1)} "
                     f"{fmt(s, 8, 3)}")
    return "\n".join(lines)


def fmt(x, width, digits):
    return f"{x:>{width}.{digits}f}" if x is not None else f"{'WRONG':>{width}}"


# -- (b) relocation copy rate ----------------------------------------------------


def relocation_part(num_layers: int, pool: int, hkv: int, hd: int, counts: list[int],
                    copy_bytes_per_s: float) -> list[dict]:
    kv = (pool, hkv, hd)
    k = [torch.randn(kv, device="cuda", dtype=torch.bfloat16) for _ in range(num_layers)]
    v = [torch.randn(kv, device="cuda", dtype=torch.bfloat16) for _ in range(num_layers)]
    row_bytes = hkv * hd * 2
    rows = []
    for n in counts:
        # A fragmented request moving into one free run, as Tier 1 does.
        perm = torch.randperm(pool - n, device="cuda")[:n] + n
        src, dst = perm, torch.arange(n, device="cuda")
        moved_bytes = 2 * n * num_layers * 2 * row_bytes  # K and V, read and written
        us = median_event_us(lambda: verify_ops.relocate_kv(k, v, src, dst), 20, settle_s=0)

        def torch_indexing():
            for cache in (*k, *v):
                cache[dst] = cache[src]

        torch_us = median_event_us(torch_indexing, 20, settle_s=0)
        rate = moved_bytes / (us * 1e-6)
        rows.append({"slots": n, "layers": num_layers, "row_bytes": row_bytes,
                     "bytes": moved_bytes, "us": us, "bytes_per_s": rate,
                     "pct_copy_bandwidth": 100 * rate / copy_bytes_per_s,
                     "torch_index_us": torch_us})
        print(f"relocate {n} slots x {num_layers} layers: {us:.1f} us, "
              f"{100 * rate / copy_bytes_per_s:.1f}% of copy bandwidth", flush=True)
    return rows


def relocation_table(rows: list[dict]) -> str:
    head = (f"{'slots':>7} {'layers':>6} {'MB moved':>9} {'us':>9} {'TB/s':>6} {'%copy bw':>8} "
            f"{'torch idx us':>12}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['slots']:>7} {r['layers']:>6} {r['bytes'] / 1e6:>9.1f} {r['us']:>9.1f} "
                     f"{r['bytes_per_s'] / 1e12:>6.2f} {r['pct_copy_bandwidth']:>8.1f} "
                     f"{r['torch_index_us']:>12.1f}")
    return "\n".join(lines)


# -- (c) churn: verify time on the layouts each policy produces -----------------

CHURN_KV = (32, 8, 128)  # Hq, Hkv, head_dim (Llama-3-8B)
CHURN_DRAFTS = 8         # <= ChurnConfig.reserve: the drafts' slots are allocated


def churn_config(policy: str, relocate_every: int, steps: int, snapshot_every: int):
    from .churn import ChurnConfig

    return ChurnConfig(policy=policy, mode="spec", pool_tokens=262144, max_running=64,
                       steps=steps, arrival_rate=0.25, prompt_median=2048, output_median=512,
                       sigma=1.0, max_request_tokens=32768, relocate_every=relocate_every,
                       snapshot_every=snapshot_every, seed=0)


def churn_part(steps: int, snapshot_every: int, num_layers: int) -> list[dict]:
    from .churn import simulate

    rows = []
    for name, policy, relocate_every in (("stock", "stock", 0), ("need_sort", "need_sort", 0),
                                         ("ours", "ours", 0), ("ours+relocate", "ours", 16)):
        config = churn_config(policy, relocate_every, steps, snapshot_every)
        result = simulate(config)
        per_step = time_snapshots(result.snapshots, config.pool_tokens + config.page_size,
                                  num_layers)
        free_gpu()
        rows.append({"policy": name, "mean_runs": result.runs.mean_runs,
                     "p99_runs": result.runs.p99_runs, "finished": result.finished,
                     "relocated_requests": result.relocated_requests,
                     "snapshots": per_step,
                     "verify_us_per_layer": statistics.mean(s["us"] for s in per_step)
                     if per_step else None})
        print(f"churn {name}: runs/request {result.runs.mean_runs:.2f} "
              f"(p99 {result.runs.p99_runs:.0f}), verify {rows[-1]['verify_us_per_layer']} us",
              flush=True)
    return rows


def time_snapshots(snapshots, pool_slots: int, num_layers: int) -> list[dict]:
    """verify.tree_attn per layer on each snapshot's layout, over a GPU KV pool."""
    hq, hkv, hd = CHURN_KV
    k = [torch.randn(pool_slots, hkv, hd, device="cuda", dtype=torch.bfloat16)
         for _ in range(num_layers)]
    v = [torch.randn(pool_slots, hkv, hd, device="cuda", dtype=torch.bfloat16)
         for _ in range(num_layers)]
    gen = torch.Generator().manual_seed(0)
    per_step = []
    for snap in snapshots:
        bs = snap.seq_lens.shape[0]
        table = snap.req_to_token.cuda()
        rows = torch.arange(bs, device="cuda")
        lens = snap.seq_lens.cuda()
        mask = make_tree_masks(bs, CHURN_DRAFTS, "eagle", gen).cuda()
        qs = [torch.randn(bs * CHURN_DRAFTS, hq, hd, device="cuda", dtype=torch.bfloat16)
              for _ in range(num_layers)]
        outs = [torch.empty_like(q) for q in qs]
        calls = [lambda i=i: verify_ops.tree_attn_out(qs[i], k[i], v[i], table, rows, lens, mask,
                                                      hd ** -0.5, outs[i])
                 for i in range(num_layers)]
        per_step.append({"bs": bs, "tokens": int(lens.sum()), "us": time_per_layer_us(calls)})
    return per_step


def churn_table(rows: list[dict]) -> str:
    head = (f"{'policy':14} {'runs/req':>9} {'p99':>6} {'verify us/layer':>15} "
            f"{'vs stock':>8} {'relocated':>9}")
    lines = [head, "-" * len(head)]
    stock = rows[0]["verify_us_per_layer"]
    for r in rows:
        us = r["verify_us_per_layer"]
        lines.append(f"{r['policy']:14} {r['mean_runs']:>9.2f} {r['p99_runs']:>6.0f} "
                     f"{us:>15.1f} {stock / us:>8.3f} {r['relocated_requests']:>9}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    parts = set(args.parts.split(","))
    torch.manual_seed(0)
    copy_bw = copy_bandwidth_bytes_per_s()
    print(f"device {torch.cuda.get_device_name()}: copy {copy_bw / 1e12:.2f} TB/s", flush=True)
    results, tables = {}, []
    if "kernel" in parts:
        shapes = [tuple(int(x) for x in s.split("/")) for s in args.shapes.split(",") if s]
        results["kernel"] = kernel_part(shapes)
        tables.append("(a) verify.tree_attn per layer, fragmented vs contiguous slots\n"
                      + kernel_table(results["kernel"]))
    if "relocation" in parts:
        hkv, hd = (int(x) for x in args.reloc_kv.split("/"))
        counts = [int(x) for x in args.reloc_slots.split(",") if x]
        results["relocation"] = relocation_part(args.reloc_layers, args.reloc_pool, hkv, hd,
                                                counts, copy_bw)
        free_gpu()
        tables.append("(b) verify.relocate_kv, all layers' K and V in one launch\n"
                      + relocation_table(results["relocation"]))
    if "churn" in parts:
        try:
            results["churn"] = churn_part(args.churn_steps, args.churn_snapshot_every,
                                          args.churn_layers)
            tables.append("(c) churn simulation (spec steps, SGLang allocators): verify time "
                          f"per layer, {CHURN_KV} D={CHURN_DRAFTS}\n"
                          + churn_table(results["churn"]))
        except ImportError as exc:  # sglang missing on this machine: the other parts stand
            results["churn"] = {"error": f"ImportError: {exc}"}
            tables.append(f"(c) churn simulation skipped: {exc}")
    if args.out:
        meta = {"command": " ".join(["python -m bench.defrag_bench"] + (argv or sys.argv[1:])),
                "date": datetime.datetime.now().isoformat(timespec="seconds"),
                "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "python": platform.python_version(), "copy_bytes_per_s": copy_bw}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, **results}, f, indent=1)
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
