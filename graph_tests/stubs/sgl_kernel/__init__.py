"""Import-only stand-in for ``sgl_kernel`` (sglang-kernel, a 1.2 GB wheel).

SGLang imports ``sgl_kernel`` at module level on CUDA, for ops the verify path
never calls (activations, norms, sampling, quantization). ``bench/device/env.sh``
puts this folder on ``PYTHONPATH`` only where the real package is missing, so
SGLang's modules import there. Every other name is a class that raises when
called (attributes of it are such classes too), so a use of the real package
cannot go unnoticed; ``sgl_kernel.utils`` answers the one capability query
SGLang's Triton backend makes.
"""

import importlib.abc
import importlib.machinery
import sys
import types

IS_STUB = True


class _MissingMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return missing(f"{cls._stub_name}.{name}")


def missing(qualified: str) -> type:
    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{qualified} called, but sgl_kernel is only a stub here "
                           "(graph_tests/stubs); install sglang-kernel to use it")
    return _MissingMeta(qualified.rsplit(".", 1)[-1], (),
                        {"__init__": __init__, "_stub_name": qualified})


def stub_getattr(module_name: str):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return missing(f"{module_name}.{name}")
    return __getattr__


__getattr__ = stub_getattr(__name__)


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any ``sgl_kernel.x.y`` without a file here imports as another stub module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = stub_getattr(spec.name)
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(_SubmoduleFinder())
