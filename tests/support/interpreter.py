"""Running SGLang's Triton kernels on the CPU, under ``TRITON_INTERPRET=1``.

Triton picks its interpreter per process when SGLang defines its kernels, so a
test file whose tests need it runs them in a child process (unless this one
already runs interpreted), and GPU tests sharing this session keep compiled
Triton. In such a file::

    test_in_interpreter_child = interpreter_child_test(__file__)

    @in_child
    def test_something(): ...
"""

import os
import subprocess
import sys

import pytest
import triton

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
in_child = pytest.mark.skipif(not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 child")
_TRITON = tuple(int(x) for x in triton.__version__.split(".")[:2])


def interpreter_child_test(test_file: str):
    """A test that runs ``test_file``'s tests in a ``TRITON_INTERPRET=1`` child."""

    @pytest.mark.skipif(INTERPRETED, reason="this process already runs Triton interpreted")
    @pytest.mark.skipif(
        _TRITON < (3, 8),
        reason=f"SGLang's Triton kernels fail in Triton {triton.__version__}'s interpreter "
               "(seen with 3.6: 'only 0-dimensional arrays can be converted to Python "
               "scalars'); passes with 3.8. On a GPU, graph_tests/test_sglang_graph.py "
               "covers the backend")
    def test_in_triton_interpreter_child():
        child = subprocess.run(
            [sys.executable, "-m", "pytest", test_file, "-q", "-s", "-p", "no:cacheprovider",
             "-p", "no:warnings"],
            env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
            timeout=900)
        print(child.stdout[-6000:])
        assert child.returncode == 0, child.stdout[-20000:] + child.stderr[-5000:]
        assert " passed" in child.stdout and " failed" not in child.stdout

    return test_in_triton_interpreter_child
