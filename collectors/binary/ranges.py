"""Point lookup in sorted, non-overlapping half-open ranges of addresses
(mappings, symbol ranges, forbidden code): one bisect, shared."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any


class Ranges:
    """``[(start, end, value)]`` -> the value whose ``[start, end)`` holds an
    address, or None."""

    def __init__(self, ranges: Iterable[tuple[int, int, Any]]) -> None:
        self._r = sorted(ranges, key=lambda r: (r[0], r[1]))
        self._starts = [r[0] for r in self._r]
        self._bias = 0

    def __call__(self, addr: int) -> Any:
        addr -= self._bias
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self._r[i][1]:
            return self._r[i][2]
        return None

    def at(self, bias: int) -> Ranges:
        """The same ranges BIAS bytes higher (an object's ranges at its load
        address), sharing the sorted lists: no copy, no sort."""
        moved = object.__new__(Ranges)
        moved._r, moved._starts, moved._bias = self._r, self._starts, self._bias + bias
        return moved

    def __bool__(self) -> bool:
        return bool(self._r)
