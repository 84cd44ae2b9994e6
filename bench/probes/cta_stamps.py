"""Per-CTA timestamps of the attention kernel, for timelines (probing builds only).

    VERIFY_OPS_CTA_STAMPS=1 TORCH_CUDA_ARCH_LIST=9.0a pip install --no-build-isolation -e .
    python -m bench.probes.cta_stamps --cases 8/65536/16/64/8/128/fragmented --out stamps.json

Each case is built and captured as ``bench_tree_attn`` times it (N layers,
each with its own KV). Once the graph is timed (and so warm), the stamps are
reset and it is replayed once more, so they hold its last layer's CTAs
(csrc/cta_stamps.cuh).
Per case it prints how fast each SM streamed (ns per KV tile), the SMs more
than 10 % faster than the median, when the CTAs ended, and how long they spent
after their KV loop; the JSON also holds every stamped CTA's row. Never time
a probing build for the table: the stamps cost a few instructions per CTA.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Sequence

import torch

from ..methods import prepare_verify_ops
from ..timing import capture_graph, median_replay_us_per_layer
from ..workload import Shape, make_workload, parse_case

# The slots of a CTA's row, as csrc/cta_stamps.cuh defines them.
ENTRY, WAITED, LOOP_END, END, SM_AND_TILES = range(5)
SLOTS = 10
FAST = 0.9  # an SM is fast below this fraction of the median ns per tile


def summarize(rows: Sequence[Sequence[int]]) -> dict:
    """Per-SM rates, CTA ends and tails of one layer's stamp rows (ns).

    Rows without a loop-end or end stamp (CTAs that had no KV, or were not
    stamped) are left out. Times are from the first CTA past its wait."""
    ctas = [r for r in rows if r[WAITED] and r[LOOP_END] and r[END]]
    if not ctas:
        raise ValueError("no CTA has loop-end and end stamps: is this a VERIFY_OPS_CTA_STAMPS build?")
    t0 = min(r[WAITED] for r in ctas)
    per_sm: dict[int, list[float]] = {}
    for r in ctas:
        sm, tiles = r[SM_AND_TILES] >> 32, r[SM_AND_TILES] & 0xFFFFFFFF
        if tiles:
            per_sm.setdefault(sm, []).append((r[LOOP_END] - r[WAITED]) / tiles)
    rate = {sm: statistics.mean(v) for sm, v in per_sm.items()}
    median = statistics.median(rate.values())
    ends = [(r[END] - t0) / 1e3 for r in ctas]
    tails = [(r[END] - r[LOOP_END]) / 1e3 for r in ctas]
    return {
        "ctas": len(ctas),
        "sms": len(rate),
        "ns_per_tile_min_median_max": [min(rate.values()), median, max(rate.values())],
        "fast_sms": sorted(sm for sm, ns in rate.items() if ns < FAST * median),
        "end_us_min_mean_max": [min(ends), statistics.mean(ends), max(ends)],
        "after_loop_us_median_max": [statistics.median(tails), max(tails)],
    }


def require_stamp_build() -> None:
    try:
        torch.ops.verify_stamps.read
    except (AttributeError, RuntimeError):
        raise SystemExit("bench.probes.cta_stamps needs verify_ops built with VERIFY_OPS_CTA_STAMPS=1 "
                         "(see setup.py) and a GPU") from None


def stamp_case(shape: Shape) -> tuple[float, list[list[int]]]:
    """µs per layer as the bench times it, and the last layer's stamp rows:
    one graph is captured, timed, then replayed once with fresh stamps."""
    w = make_workload(shape)
    calls = prepare_verify_ops(w)

    def step():
        for call in calls:
            call()

    graph = capture_graph(step)
    us = median_replay_us_per_layer(graph, len(calls))
    like = w.layers[0].q
    torch.ops.verify_stamps.reset(like)
    graph.replay()
    rows = torch.ops.verify_stamps.read(like)
    torch.cuda.synchronize()
    stamped = rows[rows[:, WAITED] != 0].tolist()
    return us, stamped


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", required=True, help="comma-separated batch/context/drafts/Hq/Hkv/d/layout")
    p.add_argument("--out", help="JSON with every case's summary and stamp rows")
    args = p.parse_args(argv)
    require_stamp_build()
    results = []
    for text in args.cases.split(","):
        shape = parse_case(text)
        us, rows = stamp_case(shape)
        summary = summarize(rows)
        results.append({"label": shape.label(), "us_per_layer": us, **summary, "rows": rows})
        lo, med, hi = summary["ns_per_tile_min_median_max"]
        first, mean, last = summary["end_us_min_mean_max"]
        tail, tail_max = summary["after_loop_us_median_max"]
        print(f"{shape.label():32s} {us:8.1f} us/layer  {summary['ctas']} CTAs on {summary['sms']} SMs"
              f"  ns/tile {lo:.0f}/{med:.0f}/{hi:.0f}  fast SMs {len(summary['fast_sms'])}"
              f"  ends {first:.1f}/{mean:.1f}/{last:.1f} us  after loop {tail:.2f} (max {tail_max:.2f}) us",
              flush=True)
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
