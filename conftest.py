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


@pytest.fixture(params=[False, True], ids=["default", "VERIFY_OPS_DEBUG=1"])
def debug(request, monkeypatch):
    """Runs a test with VERIFY_OPS_DEBUG unset and set to 1 (the CUDA kernels'
    value checks); the fixture's value says which."""
    if request.param:
        monkeypatch.setenv("VERIFY_OPS_DEBUG", "1")
    else:
        monkeypatch.delenv("VERIFY_OPS_DEBUG", raising=False)
    return request.param
