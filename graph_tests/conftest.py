import pytest

import verify_ops

def pytest_collection_modifyitems(config, items):
    if verify_ops.has_cuda_kernel():
        return
    skip = pytest.mark.skip(reason="graph_tests need a GPU and a CUDA build of verify_ops")
    for item in items:
        if "graph_tests" in str(item.fspath):
            item.add_marker(skip)
