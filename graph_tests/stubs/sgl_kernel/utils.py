"""The capability query SGLang's Triton backend makes at construction."""

import torch

from . import stub_getattr

__getattr__ = stub_getattr(__name__)


def is_arch_support_pdl() -> bool:
    """Programmatic dependent launch needs compute capability 9.0 or newer."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
