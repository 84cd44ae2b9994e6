"""Running SGLang's Triton kernels on the CPU, under ``TRITON_INTERPRET=1``.

Passes with Triton 3.8 (SGLang 0.5.23) and 3.6 (SGLang 0.5.17). Triton picks
its interpreter per process when SGLang defines its kernels, so a
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

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
in_child = pytest.mark.skipif(not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 child")


def interpreter_child_test(test_file: str):
    """A test that runs ``test_file``'s tests in a ``TRITON_INTERPRET=1`` child."""

    @pytest.mark.skipif(INTERPRETED, reason="this process already runs Triton interpreted")
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
