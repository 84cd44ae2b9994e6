"""Running one test function as the ranks of a ``torch.distributed`` group.

gloo runs the ranks as CPU processes, NCCL as one process per GPU with
NVLink multicast off (NCCL_NVLS_ENABLE=0, as the GPU machines require).
The processes come from a fork server that imports torch and verify_ops once
per session, so each later group starts in a fraction of a second; forking
the test process itself instead can deadlock in a child when earlier tests
left thread-pool locks held (seen: an einsum that never returned).

A failing rank raises in the caller with its traceback, and the other ranks
are terminated, so a rank stuck in a collective cannot hang the test.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from typing import Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import verify_ops

TIMEOUT = datetime.timedelta(seconds=120)

NEEDS_2_GPUS = pytest.mark.skipif(
    torch.cuda.device_count() < 2 or not verify_ops.has_cuda_kernel(),
    reason="needs 2 GPUs and a CUDA build of verify_ops")
# (backend, world_size) for pytest.mark.parametrize: gloo groups of 2 and 4, NCCL of 2.
GROUPS = [("gloo", 2), ("gloo", 4), pytest.param("nccl", 2, marks=NEEDS_2_GPUS)]


def _process_main(rank, world_size, backend, rendezvous, fn, args):
    if backend == "nccl":
        os.environ["NCCL_NVLS_ENABLE"] = "0"
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        torch.set_num_threads(1)  # the ranks share this machine's cores
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world_size, timeout=TIMEOUT)
    try:
        fn(rank, world_size, device, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_processes(fn: Callable, world_size: int, backend: str, *args) -> None:
    """``fn(rank, world_size, device, *args)`` in ``world_size`` processes joined in one
    group; ``fn`` and ``args`` must pickle (a module-level function)."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["torch", "verify_ops", "parallel_harness"])
    with tempfile.TemporaryDirectory() as tmp:
        rendezvous = os.path.join(tmp, "rendezvous")
        mp.start_processes(_process_main, args=(world_size, backend, rendezvous, fn, args),
                           nprocs=world_size, join=True, start_method="forkserver")
