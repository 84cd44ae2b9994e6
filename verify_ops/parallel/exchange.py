"""All-gathers over the ranks of a group, as one collective on a byte buffer.

Every exchange here takes an ``all_gather`` callable: it maps this rank's
1-D uint8 buffer to the ``[world * n]`` concatenation of every rank's buffer,
in rank order. :func:`torch_all_gather` makes one from a ``torch.distributed``
group (NCCL or gloo); SGLang's ``GroupCoordinator.all_gather(buf, dim=0)`` is
one too, and works under its CUDA-graph capture. Packing several tensors into
one buffer costs one collective launch instead of one per tensor, which is
what a decode step's latency pays for.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

AllGather = Callable[[torch.Tensor], torch.Tensor]

_ALIGN = 16  # bytes: every packed tensor starts aligned for any dtype view


def torch_all_gather(group: Optional[dist.ProcessGroup] = None) -> AllGather:
    """An ``all_gather`` over ``group`` (default: the world) through ``torch.distributed``."""
    world = dist.get_world_size(group)

    def all_gather(buffer: torch.Tensor) -> torch.Tensor:
        gathered = buffer.new_empty(world * buffer.numel())
        # Into views of one buffer: torch 2.11 (SGLang 0.5.17's) has no all_gather_single.
        dist.all_gather(list(gathered.chunk(world)), buffer, group=group)
        return gathered

    return all_gather


def _padded(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def all_gather_tensors(tensors: Sequence[torch.Tensor], all_gather: AllGather,
                       world_size: int) -> list[torch.Tensor]:
    """Every rank's copy of each tensor, stacked: ``[world_size, *t.shape]`` per tensor.

    The tensors may differ in dtype and shape (each the same on every rank)
    and must share a device. One collective carries them all.
    """
    sizes = [t.numel() * t.element_size() for t in tensors]
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + _padded(size))
    buffer = torch.empty(offsets[-1], dtype=torch.uint8, device=tensors[0].device)
    for t, offset, size in zip(tensors, offsets, sizes):
        buffer[offset:offset + size].copy_(t.contiguous().view(-1).view(torch.uint8))
    gathered = all_gather(buffer)
    if gathered.numel() != world_size * offsets[-1]:
        raise RuntimeError(f"all_gather returned {gathered.numel()} bytes, expected "
                           f"world_size * {offsets[-1]} = {world_size * offsets[-1]}")
    gathered = gathered.view(world_size, offsets[-1])
    return [gathered[:, offset:offset + size].view(t.dtype).view(world_size, *t.shape)
            for t, offset, size in zip(tensors, offsets, sizes)]


def gather_heads(t: torch.Tensor, all_gather: AllGather, world_size: int) -> torch.Tensor:
    """Concatenate every rank's ``[rows, heads, ...]`` along dim 1, in rank order
    (tensor-parallel outputs, or query heads gathered for decode context parallelism)."""
    (stacked,) = all_gather_tensors([t], all_gather, world_size)
    return stacked.movedim(0, 1).reshape(t.shape[0], world_size * t.shape[1], *t.shape[2:])
