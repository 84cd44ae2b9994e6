"""Running SGLang's Triton kernels on the CPU, under ``TRITON_INTERPRET=1``.

Passes with Triton 3.8 (SGLang 0.5.23) and 3.6 (SGLang 0.5.17), except where
Triton 3.6 meets NumPy 2.4 (the H200 box): that interpreter cannot run SGLang's
kernels, and the child test skips, saying so. Triton picks
its interpreter per process when SGLang defines its kernels, so a
test file whose tests need it runs them in a child process (unless this one
already runs interpreted), and GPU tests sharing this session keep compiled
Triton. In such a file::

    test_in_interpreter_child = interpreter_child_test(__file__)

    @in_child
    def test_something(): ...
"""

import functools
import os
import subprocess
import sys

import pytest

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
in_child = pytest.mark.skipif(not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 child")


# A loop bounded by a loaded value, as SGLang's attention kernels have. Triton 3.6's
# interpreter turns the bound into an int by int(array), which NumPy 2.4 refuses
# for 1-element arrays (triton-lang/triton#9171).
_LOADED_BOUND_PROBE = """
import torch, triton, triton.language as tl
@triton.jit
def count(n_ptr, out_ptr):
    acc = 0.0
    for _ in range(0, tl.load(n_ptr)):
        acc += 1.0
    tl.store(out_ptr, acc)
out = torch.zeros(1)
count[(1,)](torch.tensor([3], dtype=torch.int32), out)
assert out.item() == 3.0, out
"""


@functools.lru_cache(maxsize=None)
def interpreter_unusable_reason() -> str | None:
    """Why this Triton's interpreter cannot run SGLang's kernels here, or None."""
    probe = subprocess.run([sys.executable, "-c", _LOADED_BOUND_PROBE],
                           env={**os.environ, "TRITON_INTERPRET": "1"},
                           capture_output=True, text=True, timeout=300)
    if probe.returncode == 0:
        return None
    if "only 0-dimensional arrays" not in probe.stderr:  # not that bug: let the tests show it
        return None
    import numpy
    import triton
    last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
    return (f"Triton {triton.__version__}'s interpreter fails on a loop bounded by a loaded "
            f"value under NumPy {numpy.__version__} (triton-lang/triton#9171): {last}")


def interpreter_child_test(test_file: str):
    """A test that runs ``test_file``'s tests in a ``TRITON_INTERPRET=1`` child."""

    @pytest.mark.skipif(INTERPRETED, reason="this process already runs Triton interpreted")
    def test_in_triton_interpreter_child():
        reason = interpreter_unusable_reason()
        if reason:
            pytest.skip(reason)
        child = subprocess.run(
            [sys.executable, "-m", "pytest", test_file, "-q", "-s", "-p", "no:cacheprovider",
             "-p", "no:warnings"],
            env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
            timeout=900)
        print(child.stdout[-6000:])
        assert child.returncode == 0, child.stdout[-20000:] + child.stderr[-5000:]
        assert " passed" in child.stdout and " failed" not in child.stdout

    return test_in_triton_interpreter_child
