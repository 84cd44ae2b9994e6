"""How bench/ times things on a GPU: CUDA graphs over many layers, and the two ceilings."""

from __future__ import annotations

import statistics
from typing import Callable, Sequence

import torch


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
                               replays: int = 15, warmup: int = 3) -> float:
    """Median µs of one replay of ``graph`` divided by the ``num_layers`` layers it runs."""
    for _ in range(warmup):
        graph.replay()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / num_layers)
    return statistics.median(samples)


def time_per_layer_us(layer_calls: Sequence[Callable[[], object]], replays: int = 15,
                      warmup: int = 3) -> float:
    """Median µs per layer: one CUDA graph calls every layer once, as a model's step does.

    Each layer owns its KV buffers, so L2 stays cold across layers, and the
    graph launch is amortized over ``len(layer_calls)`` layers.
    """
    def step():
        for call in layer_calls:
            call()

    graph = capture_graph(step)
    us = median_replay_us_per_layer(graph, len(layer_calls), replays, warmup)
    del graph
    return us


def copy_bandwidth_bytes_per_s(nbytes: int = 4 << 30, replays: int = 10) -> float:
    """Device-to-device copy rate, counting bytes read plus bytes written."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return 2 * nbytes / statistics.median(samples)


def matmul_flops_per_s(n: int = 8192, replays: int = 10) -> float:
    """Dense bf16 matmul rate on random data."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return 2 * n**3 / statistics.median(samples)
