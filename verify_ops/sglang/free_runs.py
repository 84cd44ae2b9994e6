"""Maximal runs of free pages in a host-side free mask, carved as pages are handed out."""

from __future__ import annotations

from typing import Collection

import torch


class FreeRuns:
    """The free runs of ``is_free`` (a CPU bool mask over page ids), built once per
    allocation call and kept in step with the pages :meth:`carve` hands out."""

    def __init__(self, is_free: torch.Tensor):
        edge = torch.zeros(1, dtype=torch.int8)
        steps = torch.diff(is_free.to(torch.int8), prepend=edge, append=edge)
        self.starts = (steps == 1).nonzero().flatten()
        self.lens = (steps == -1).nonzero().flatten() - self.starts

    def largest(self) -> int:
        return int(self.lens.max()) if self.lens.numel() else 0

    def carve(self, count: int, room: int, live_tails: Collection[int]) -> torch.Tensor:
        """``count`` pages, from one run when any run is long enough.

        The run is the shortest one of at least ``room`` pages (room to grow
        after this allocation), else the longest. Pages come from the run's
        start, unless the page before it is some request's last page: then
        from its middle, so that request keeps room to grow too. Without a run
        of ``count`` pages, the longest runs are used up in turn.
        """
        if count > self.largest():
            return self._spill(count)
        fits = self.lens >= room
        if bool(fits.any()):
            i = int(torch.where(fits, self.lens, self.lens.new_tensor(2**62)).argmin())
        else:
            i = int(self.lens.argmax())
        start, length = int(self.starts[i]), int(self.lens[i])
        offset = (length - count) // 2 if start - 1 in live_tails else 0
        rest = length - offset - count
        self.lens[i] = offset
        if rest > 0:
            self.starts = torch.cat([self.starts, self.starts.new_tensor([start + offset + count])])
            self.lens = torch.cat([self.lens, self.lens.new_tensor([rest])])
        return torch.arange(start + offset, start + offset + count)

    def _spill(self, count: int) -> torch.Tensor:
        pieces = []
        while count > 0:
            i = int(self.lens.argmax())
            start, take = int(self.starts[i]), min(int(self.lens[i]), count)
            assert take > 0, "FreeRuns: fewer free pages than requested"
            pieces.append(torch.arange(start, start + take))
            self.starts[i] += take
            self.lens[i] -= take
            count -= take
        return torch.cat(pieces)
