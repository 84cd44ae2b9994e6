"""The CPU table: verify_ops.tree_attn against SDPA on gathered KV and the fp32 matmul rate.

Each case is one tree verify (batch 1, an EAGLE tree, fragmented slots) on
the CPU. Timed in one process, with the same threads:

- op: ``verify_ops.tree_attn_out`` reading the pool in place;
- SDPA: ``torch.nn.functional.scaled_dot_product_attention`` on K/V already
  gathered into ``[1, H, L + D, d]`` with a boolean mask (the gather is not
  timed); the faster of ``enable_gqa=True`` on the KV heads and K/V expanded
  to the query heads beforehand;
- the matmul ceiling: ``torch.mm`` of two 2048 x 2048 matrices, fp32 and bf16
  (512 x 512 for a dtype this CPU has no fast GEMM for: ``matmul_sizes``).

The op's rate counts its QK and PV FLOPs, 4 d Hq D (L + D). Calls of the op
and of SDPA alternate, so that both see the same load; each time is the
median of ``--repeats`` calls (the JSON also keeps the least). ``--scaling``
also times 8/1/128 (one KV head) with 1 thread and with all of them. Prints a
table and writes JSON.

    python -m bench.cpu_bench --out bench/results/cpu-<date>.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable

import torch

import verify_ops
from verify_ops.cases import TreeAttnCase, make_case
from verify_ops.reference import relative_error

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
MATMUL_SIZE = 2048


def cpu_model() -> dict:
    """The CPU as lscpu (or /proc/cpuinfo) names it, and what torch sees."""
    info = {"machine": platform.machine(), "logical_cpus": os.cpu_count(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
        for key in ("Model name", "Vendor ID", "CPU family", "Model", "Stepping",
                    "Hypervisor vendor", "CPU(s)", "Thread(s) per core", "L1d cache",
                    "L2 cache", "L3 cache"):
            if key in fields:
                info[key] = fields[key].strip()
        flags = fields.get("Flags", "").split()
        info["vector_flags"] = [f for f in flags if f.startswith(("avx", "amx", "sve", "asimd"))]
    except (OSError, subprocess.CalledProcessError):
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        info["Model name"] = names[0] if names else "unknown"
    return info


def median_us(run: Callable[[], object], repeats: int) -> float:
    run()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


MATMUL_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# A dtype that this CPU has no fast GEMM for is timed at a quarter of the
# size: bf16 without AVX-512 BF16 or AMX ran 0.3 GFLOP/s on an AVX2 EPYC,
# where the 2048^3 calls alone took 12 of the run's 13 minutes.
SLOW_MATMUL_S = 1.0


def matmul_size(dtype: torch.dtype) -> int:
    """MATMUL_SIZE, or a quarter of it where one call there would take over SLOW_MATMUL_S."""
    small = MATMUL_SIZE // 4
    a = torch.randn(small, small).to(dtype)
    probe_s = median_us(lambda: torch.mm(a, a), 1) * 1e-6
    return MATMUL_SIZE if probe_s * 64 <= SLOW_MATMUL_S else small


def matmul_flops_per_s(dtype: torch.dtype, size: int, repeats: int = 5) -> float:
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    return 2 * size ** 3 / (median_us(lambda: torch.mm(a, b), repeats) * 1e-6)


def gathered_sdpa(case: TreeAttnCase, dtype: torch.dtype, expand_heads: bool):
    """A call of SDPA on the case's K/V gathered beforehand (in ``dtype``), and its
    output as ``[bs*D, Hq, d]``."""
    q_all, k_cache, v_cache, r2t, rpi, lens, mask, scale = case.args()
    assert len(lens) == 1, "one request per case"
    num_drafts, num_q_heads, head_dim = q_all.shape
    prefix = int(lens[0])
    slots = r2t[int(rpi[0]), : prefix + num_drafts].long()
    q = q_all.to(dtype).transpose(0, 1).unsqueeze(0).contiguous()      # [1, Hq, D, d]
    k = k_cache[slots].to(dtype).transpose(0, 1).unsqueeze(0).contiguous()  # [1, Hkv, L+D, d]
    v = v_cache[slots].to(dtype).transpose(0, 1).unsqueeze(0).contiguous()
    group = num_q_heads // k.shape[1]
    if expand_heads:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    visible = torch.cat([torch.ones(num_drafts, prefix, dtype=torch.bool), mask[0]], 1)[None, None]

    def call():
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=visible, scale=scale, enable_gqa=not expand_heads)

    def rows():
        return call()[0].transpose(0, 1)

    return call, rows


def time_case(seq_len: int, num_drafts: int, heads: tuple, dtype_name: str,
              repeats: int) -> dict:
    hq, hkv, head_dim = heads
    dtype = DTYPES[dtype_name]
    case = make_case([seq_len], num_drafts, hq, hkv, head_dim, dtype=dtype, tree="eagle",
                     layout="fragmented", seed=seq_len + num_drafts)
    out = torch.empty_like(case.q)

    def op():
        verify_ops.tree_attn_out(*case.args(), out)

    # The check: the op against SDPA in fp32 on the same inputs.
    op()
    _, check_rows = gathered_sdpa(case, torch.float32, expand_heads=True)
    err = relative_error(out, check_rows())
    limit = 1e-5 if dtype == torch.float32 else 1e-2
    if not err < limit:
        raise SystemExit(f"L={seq_len} D={num_drafts} {heads} {dtype_name}: relative error "
                         f"{err:.3g} against SDPA >= {limit}")
    sdpa_gqa, _ = gathered_sdpa(case, dtype, expand_heads=False)
    sdpa_expanded, _ = gathered_sdpa(case, dtype, expand_heads=True)
    samples = {"op": [], "sdpa_gqa": [], "sdpa_expanded": []}
    calls = {"op": op, "sdpa_gqa": sdpa_gqa, "sdpa_expanded": sdpa_expanded}
    for run in calls.values():
        run()
    for _ in range(repeats):
        for name, run in calls.items():
            start = time.perf_counter()
            run()
            samples[name].append((time.perf_counter() - start) * 1e6)
    us = {name: statistics.median(s) for name, s in samples.items()}
    least = {name: min(s) for name, s in samples.items()}
    flops = 4 * head_dim * hq * num_drafts * (seq_len + num_drafts)
    return {"seq_len": seq_len, "num_drafts": num_drafts, "heads": f"{hq}/{hkv}/{head_dim}",
            "dtype": dtype_name, "kv_bytes": case.kv_bytes, "flops": flops,
            "op_us": us["op"], "sdpa_gqa_us": us["sdpa_gqa"],
            "sdpa_expanded_us": us["sdpa_expanded"],
            "sdpa_us": min(us["sdpa_gqa"], us["sdpa_expanded"]),
            "op_min_us": least["op"], "sdpa_min_us": min(least["sdpa_gqa"], least["sdpa_expanded"]),
            "op_flops_per_s": flops / (us["op"] * 1e-6), "rel_err_vs_sdpa_fp32": err}


def time_scaling(seq_len: int, num_drafts: int, dtype_name: str, threads: int,
                 repeats: int) -> dict:
    """8/1/128 batch 1 (one KV head) with 1 thread and with ``threads``, alternating.

    After each switch of the thread count one call goes untimed: the timed one
    is a call right after another with the same threads, as in a model's
    forward pass, not one that first wakes the pool's sleeping threads."""
    case = make_case([seq_len], num_drafts, 8, 1, 128, dtype=DTYPES[dtype_name], tree="eagle",
                     seed=seq_len)
    out = torch.empty_like(case.q)
    samples = {1: [], threads: []}
    for _ in range(repeats):
        for count in samples:
            torch.set_num_threads(count)
            verify_ops.tree_attn_out(*case.args(), out)
            start = time.perf_counter()
            verify_ops.tree_attn_out(*case.args(), out)
            samples[count].append((time.perf_counter() - start) * 1e6)
    torch.set_num_threads(threads)
    one, many = statistics.median(samples[1]), statistics.median(samples[threads])
    return {"seq_len": seq_len, "num_drafts": num_drafts, "heads": "8/1/128",
            "dtype": dtype_name, "threads": threads, "us_1_thread": one,
            "us_all_threads": many, "ratio": many / one,
            "min_ratio": min(samples[threads]) / min(samples[1])}


def markdown_table(result: dict) -> str:
    """The README's summary of a run: per dtype, shape and D, the op and SDPA
    at the shortest and longest context, the least SDPA/op over all contexts,
    and the op's share of the fp32 matmul rate at the longest."""
    rows = result["rows"]
    contexts = sorted({r["seq_len"] for r in rows})
    lo, hi = contexts[0], contexts[-1]
    lines = [f"| dtype | Hq/Hkv/d | D | op ms {lo} | SDPA ms {lo} | op ms {hi} | SDPA ms {hi} "
             f"| least SDPA/op ({lo}-{hi}) | op % of fp32 mm at {hi} |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    groups = {}
    for r in rows:
        groups.setdefault((r["dtype"], r["heads"], r["num_drafts"]), {})[r["seq_len"]] = r
    for (dtype, heads, drafts), by_len in groups.items():
        least = min(r["sdpa_over_op"] for r in by_len.values())
        lines.append(f"| {dtype} | {heads} | {drafts} | {by_len[lo]['op_us'] / 1e3:.2f} "
                     f"| {by_len[lo]['sdpa_us'] / 1e3:.2f} | {by_len[hi]['op_us'] / 1e3:.2f} "
                     f"| {by_len[hi]['sdpa_us'] / 1e3:.2f} | {least:.2f} "
                     f"| {100 * by_len[hi]['op_fraction_of_fp32_matmul']:.0f} |")
    if result["scaling"]:
        lines += ["", "| dtype (8/1/128, batch 1) | D | context | 1 thread ms | 2 threads ms | ratio |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in result["scaling"]:
            lines.append(f"| {r['dtype']} | {r['num_drafts']} | {r['seq_len']} "
                         f"| {r['us_1_thread'] / 1e3:.2f} | {r['us_all_threads'] / 1e3:.2f} "
                         f"| {r['ratio']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", default="1024,2048,4096,8192,16384")
    parser.add_argument("--drafts", default="8,16")
    parser.add_argument("--heads", default="32/8/128,8/1/128")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-scaling", dest="scaling", action="store_false",
                        help="skip the 1-thread against all-threads timing of 8/1/128")
    parser.add_argument("--out", help="JSON output path")
    parser.add_argument("--markdown", action="store_true",
                        help="also print the README's summary table")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    contexts = [int(x) for x in args.contexts.split(",")]
    drafts = [int(x) for x in args.drafts.split(",")]
    heads = [tuple(int(x) for x in h.split("/")) for h in args.heads.split(",")]
    dtypes = args.dtypes.split(",")

    load_before = os.getloadavg()
    sizes = {name: matmul_size(dtype) for name, dtype in MATMUL_DTYPES.items()}
    matmul = {name: matmul_flops_per_s(dtype, sizes[name]) for name, dtype in MATMUL_DTYPES.items()}
    rows = [time_case(L, D, h, dt, args.repeats)
            for dt in dtypes for h in heads for D in drafts for L in contexts]
    scaling = ([time_scaling(L, D, dt, args.threads, args.repeats)
                for dt in dtypes for D in drafts for L in (contexts[0], contexts[-1])]
               if args.scaling and args.threads > 1 else [])
    matmul_after = {name: matmul_flops_per_s(dtype, sizes[name])
                    for name, dtype in MATMUL_DTYPES.items()}
    fp32_rate = max(matmul["fp32"], matmul_after["fp32"])
    for row in rows:
        row["op_fraction_of_fp32_matmul"] = row["op_flops_per_s"] / fp32_rate
        row["sdpa_over_op"] = row["sdpa_us"] / row["op_us"]

    print(f"CPU: {cpu_model().get('Model name')}, {args.threads} threads, "
          f"torch {torch.__version__}; load average before {load_before[0]:.2f}, "
          f"after {os.getloadavg()[0]:.2f}")
    print(f"torch.mm: fp32 {fp32_rate / 1e9:.1f} GFLOP/s at {sizes['fp32']}^3, bf16 "
          f"{max(matmul['bf16'], matmul_after['bf16']) / 1e9:.1f} GFLOP/s at {sizes['bf16']}^3")
    print(f"{'dtype':>5} {'heads':>9} {'D':>3} {'context':>7} {'op ms':>8} {'SDPA ms':>8} "
          f"{'SDPA/op':>8} {'GFLOP/s':>8} {'% fp32 mm':>9}")
    for r in rows:
        print(f"{r['dtype']:>5} {r['heads']:>9} {r['num_drafts']:>3} {r['seq_len']:>7} "
              f"{r['op_us'] / 1e3:>8.2f} {r['sdpa_us'] / 1e3:>8.2f} {r['sdpa_over_op']:>8.2f} "
              f"{r['op_flops_per_s'] / 1e9:>8.1f} {100 * r['op_fraction_of_fp32_matmul']:>9.1f}")
    for r in scaling:
        print(f"scaling {r['dtype']} 8/1/128 D{r['num_drafts']} L{r['seq_len']}: "
              f"1 thread {r['us_1_thread'] / 1e3:.2f} ms, {r['threads']} threads "
              f"{r['us_all_threads'] / 1e3:.2f} ms, ratio {r['ratio']:.2f}")

    result = {
        "meta": {"command": "python -m bench.cpu_bench " + " ".join(sys.argv[1:] if argv is None
                                                                    else argv),
                 "cpu": cpu_model(), "threads": args.threads, "torch": torch.__version__,
                 "load_average_before": load_before, "load_average_after": os.getloadavg(),
                 "matmul_sizes": sizes, "matmul_flops_per_s_before": matmul,
                 "matmul_flops_per_s_after": matmul_after, "repeats": args.repeats},
        "rows": rows, "scaling": scaling,
    }
    if args.markdown:
        print(markdown_table(result))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
