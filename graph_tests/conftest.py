import pytest

import verify_ops


def pytest_collection_modifyitems(config, items):
    """Every test here needs the CUDA kernel: skip them all, with the reason, without it."""
    if verify_ops.has_cuda_kernel():
        return
    skip = pytest.mark.skip(reason="graph_tests need a GPU and a CUDA build of verify_ops")
    for item in items:
        if item.path.is_relative_to(config.rootpath / "graph_tests"):
            item.add_marker(skip)
