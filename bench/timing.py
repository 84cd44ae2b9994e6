"""How bench/ times things on a GPU: CUDA graphs over many layers, and the two ceilings."""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch

# Under sustained load the H200's power cap lowers its SM clock within about
# 50 ms: a tensor-core-heavy case ran at 1.68 GHz for its first replays, then
# at 1.45-1.53, and an 8192^3 matmul went from 790 to 684 TFLOP/s
# (history/NOTES.md, "What picked the bimodal mode"). So a timing first runs its
# load for SETTLE_S, and samples the sustained state a model's steady decoding
# runs in, not whichever state the GPU happened to be in.
SETTLE_S = 0.3


def settle(run: Callable[[], object], min_runs: int = 3, seconds: float = SETTLE_S) -> None:
    """Runs ``run`` (synchronizing after each, so that wall time is GPU time)
    ``min_runs`` times and for at least ``seconds``."""
    start, runs = time.perf_counter(), 0
    while runs < min_runs or time.perf_counter() - start < seconds:
        run()
        torch.cuda.synchronize()
        runs += 1


def median_event_us(run: Callable[[], object], replays: int, warmup: int = 3,
                    settle_s: float = SETTLE_S) -> float:
    """Median µs of one ``run`` between CUDA events, after ``settle`` (at least
    ``warmup`` runs and ``settle_s`` seconds of them)."""
    settle(run, warmup, settle_s)
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def capture_graph(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """One warm-up run on a side stream (compiles, allocator pools settle), then
    the capture of ``fn`` into a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def median_replay_us_per_layer(graph: torch.cuda.CUDAGraph, num_layers: int,
                               replays: int = 15, warmup: int = 3,
                               settle_s: float = SETTLE_S) -> float:
    """Median µs of one replay of ``graph`` divided by the ``num_layers`` layers
    it runs, after at least ``warmup`` replays and ``settle_s`` seconds of them."""
    return median_event_us(graph.replay, replays, warmup, settle_s) / num_layers


def time_per_layer_us(layer_calls: Sequence[Callable[[], object]], replays: int = 15,
                      warmup: int = 3, settle_s: float = SETTLE_S) -> float:
    """Median µs per layer: one CUDA graph calls every layer once, as a model's step does.

    Each layer owns its KV buffers, so L2 stays cold across layers, and the
    graph launch is amortized over ``len(layer_calls)`` layers.
    """
    def step():
        for call in layer_calls:
            call()

    graph = capture_graph(step)
    us = median_replay_us_per_layer(graph, len(layer_calls), replays, warmup, settle_s)
    del graph
    return us


def copy_bandwidth_bytes_per_s(nbytes: int = 4 << 30, replays: int = 10,
                               settle_s: float = SETTLE_S) -> float:
    """Device-to-device copy rate, counting bytes read plus bytes written."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    us = median_event_us(lambda: dst.copy_(src), replays, settle_s=settle_s)
    return 2 * nbytes / (us / 1e6)


def matmul_flops_per_s(n: int = 8192, replays: int = 10, settle_s: float = SETTLE_S) -> float:
    """Dense bf16 matmul rate on random data (``settle_s=0``: the rate of a
    short burst, before the power cap lowers the clock)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    us = median_event_us(lambda: a @ b, replays, settle_s=settle_s)
    return 2 * n**3 / (us / 1e6)


def burst_ceilings() -> dict:
    """The roofline's ceilings: copy and bf16 matmul rates of a short burst, before
    the power cap lowers the clock (the higher rates: the stricter roofline)."""
    return {"copy_bytes_per_s": copy_bandwidth_bytes_per_s(settle_s=0),
            "matmul_flops_per_s": matmul_flops_per_s(settle_s=0)}


def sustained_ceilings() -> dict:
    """The same two rates after SETTLE_S of load: the state the cases are timed in."""
    return {"copy_bytes_per_s_sustained": copy_bandwidth_bytes_per_s(),
            "matmul_flops_per_s_sustained": matmul_flops_per_s()}


def describe_ceilings(ceilings: dict) -> str:
    """One line of the device and its ceilings, burst (and sustained where measured)."""
    line = (f"device {torch.cuda.get_device_name()}: copy "
            f"{ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul "
            f"{ceilings['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s")
    if "copy_bytes_per_s_sustained" in ceilings:
        line += (f" (sustained: {ceilings['copy_bytes_per_s_sustained'] / 1e12:.2f} TB/s, "
                 f"{ceilings['matmul_flops_per_s_sustained'] / 1e12:.0f} TFLOP/s)")
    return line
