"""Builds verify_ops._C: the CPU op always, the CUDA kernels when possible.

VERIFY_OPS_BUILD_CUDA=0|1 forces the choice; otherwise CUDA is built when torch
is a CUDA build and a CUDA toolkit is found. TORCH_CUDA_ARCH_LIST overrides the
default targets sm_90a (H100/H200), sm_100a (B200) and sm_120a (RTX 50-series).
VERIFY_OPS_PTXAS_VERBOSE=1 prints ptxas' register and spill counts;
VERIFY_OPS_CTA_STAMPS=1 builds the kernels with per-CTA timestamps
(bench/probes/cta_stamps.py), for probing only.
"""

import glob
import os
import sys

import torch
from setuptools import setup
from torch.utils import cpp_extension

DEFAULT_CUDA_ARCHS = "9.0a;10.0a;12.0a"


def want_cuda() -> bool:
    forced = os.environ.get("VERIFY_OPS_BUILD_CUDA")
    if forced is not None:
        if forced not in ("0", "1"):
            raise SystemExit(f"VERIFY_OPS_BUILD_CUDA must be 0 or 1, got {forced!r}")
        if forced == "1" and (torch.version.cuda is None or cpp_extension.CUDA_HOME is None):
            raise SystemExit(
                "VERIFY_OPS_BUILD_CUDA=1 needs a CUDA build of torch and a CUDA toolkit "
                f"(torch.version.cuda={torch.version.cuda}, CUDA_HOME={cpp_extension.CUDA_HOME})"
            )
        return forced == "1"
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def sources(*patterns: str) -> list[str]:
    return sorted(path for pattern in patterns for path in glob.glob(pattern, recursive=True))


def extension():
    # Shared and CPU sources; each backend's folder holds its own kernels.
    cpu_sources = sources("csrc/*.cpp", "csrc/common/**/*.cpp", "csrc/cpu/**/*.cpp")
    include_dirs = [os.path.abspath("csrc")]
    # at::parallel_for is an OpenMP pragma compiled into the caller: without
    # -fopenmp it runs on one thread. The runtime is the libgomp torch loads.
    openmp = [] if sys.platform == "darwin" else ["-fopenmp"]
    cxx_flags = ["-O3"] + openmp
    if not want_cuda():
        print("verify_ops: building the CPU op only")
        return cpp_extension.CppExtension(
            "verify_ops._C",
            cpu_sources + ["csrc/cuda_unavailable/register.cpp"],
            include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx_flags},
            extra_link_args=openmp,
        )
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_CUDA_ARCHS)
    print(f"verify_ops: building CPU and CUDA ops for {os.environ['TORCH_CUDA_ARCH_LIST']}")
    nvcc_flags = ["-O3", "-lineinfo", "--use_fast_math"]
    # The producer-warpgroup kernel needs wgmma and setmaxnreg on every sm_90
    # target: launched only when all of them are 9.0a.
    sm90 = [a.split("+")[0] for a in os.environ["TORCH_CUDA_ARCH_LIST"].replace(" ", ";").split(";")
            if a.startswith("9.")]
    if sm90 and all(a == "9.0a" for a in sm90):
        nvcc_flags.append("-DVERIFY_OPS_SM90A=1")
    if os.environ.get("VERIFY_OPS_PTXAS_VERBOSE") == "1":
        nvcc_flags.append("-Xptxas=-v")
    # Per-CTA timestamps for bench/probes/cta_stamps.py; never in a build to ship.
    if os.environ.get("VERIFY_OPS_CTA_STAMPS") == "1":
        nvcc_flags.append("-DVERIFY_OPS_CTA_STAMPS=1")
    return cpp_extension.CUDAExtension(
        "verify_ops._C",
        cpu_sources + sources("csrc/cuda/**/*.cu"),
        include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx_flags + ["-DVERIFY_OPS_WITH_CUDA"], "nvcc": nvcc_flags},
        extra_link_args=openmp,
    )


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
)
