"""Shared pytest fixtures: `device` runs a test on the CPU and, where present, the GPU."""

import pytest
import torch

import verify_ops

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(
        not verify_ops.has_cuda_kernel(),
        reason="needs a GPU and a CUDA build of verify_ops")),
]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param
