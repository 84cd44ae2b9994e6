"""`make demo`: a tree verify on a synthetic SGLang-layout cache, on the best device present.

Checks each context length against the float64 reference, prints a timing
table and writes latency_vs_context.png. On a GPU each point is timed as a
CUDA graph over 8 layers with their own KV buffers (see bench/timing.py); on
a CPU it is the median wall time of a few calls, beside SDPA on K/V gathered
beforehand (bench/cpu_bench.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import verify_ops
from verify_ops.cases import make_case
from verify_ops.reference import relative_error, tree_attn_ref

NUM_DRAFTS, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = 16, 32, 8, 128  # Llama-3-8B, EAGLE tree


def cpu_time_us(run, repeats=3) -> float:
    run()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def gpu_time_us(seq_len: int) -> float:
    from bench.methods import prepare_verify_ops
    from bench.timing import time_per_layer_us
    from bench.workload import Shape, make_workload

    shape = Shape(1, seq_len, NUM_DRAFTS, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, "fragmented")
    return time_per_layer_us(prepare_verify_ops(make_workload(shape, num_layers=8)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="demo_out", help="folder for the plot")
    args = parser.parse_args(argv)
    on_gpu = verify_ops.has_cuda_kernel()
    device = "cuda" if on_gpu else "cpu"
    contexts = [4096, 16384, 65536, 131072] if on_gpu else [256, 1024, 4096, 16384]
    name = torch.cuda.get_device_name() if on_gpu else f"CPU ({os.cpu_count()} cores)"
    print(f"verify-ops demo on {name}: batch 1, D={NUM_DRAFTS} (EAGLE tree), "
          f"Hq={NUM_Q_HEADS}, Hkv={NUM_KV_HEADS}, d={HEAD_DIM}, bf16, fragmented slots")

    rows = []
    for seq_len in contexts:
        case = make_case([seq_len], NUM_DRAFTS, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM,
                         device=device, tree="eagle", seed=seq_len)
        err = relative_error(verify_ops.tree_attn(*case.args()), tree_attn_ref(*case.args()))
        if err >= 1e-2:
            raise SystemExit(f"context {seq_len}: relative error {err:.3g} >= 1e-2")
        if on_gpu:
            us, sdpa_us = gpu_time_us(seq_len), None
        else:
            from bench.cpu_bench import gathered_sdpa

            out = torch.empty_like(case.q)
            us = cpu_time_us(lambda: verify_ops.tree_attn_out(*case.args(), out))
            sdpa_us = cpu_time_us(gathered_sdpa(case, case.q.dtype, expand_heads=False)[0])
        rows.append((seq_len, case.kv_bytes, us, err, sdpa_us))

    print(f"{'context':>8} {'K+V MB':>8} {'us/layer':>10} {'GB/s':>8} {'rel err':>9}"
          + ("" if on_gpu else f" {'SDPA us':>10}"))
    for seq_len, kv_bytes, us, err, sdpa_us in rows:
        print(f"{seq_len:>8} {kv_bytes / 1e6:>8.1f} {us:>10.1f} {kv_bytes / us / 1e3:>8.1f} "
              f"{err:>9.2e}" + ("" if on_gpu else f" {sdpa_us:>10.1f}"))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(args.out, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot([r[0] for r in rows], [r[2] for r in rows], marker="o", label="verify_ops.tree_attn")
    if not on_gpu:
        ax.plot([r[0] for r in rows], [r[4] for r in rows], marker="s",
                label="SDPA on gathered K/V (gather not timed)")
    ax.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="µs per layer",
           title=f"tree verify on {name}")
    ax.legend()
    fig.tight_layout()
    path = os.path.join(args.out, "latency_vs_context.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
