"""Regular expressions compiled the first time they are used.

A module-level ``re.compile`` runs in every process that imports the
module: 0.1-0.3 ms a pattern on the slow guest (issue 23), paid by a warm
``inspect`` for patterns that only a first run (the version banners of an
ELF file being parsed) or a rare target (the loader's $LIB-style tokens in
LD_PRELOAD) uses.
Such patterns are declared with ``lazy()``; patterns every run uses stay
plain ``re.compile``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, AnyStr, Generic


class LazyPattern(Generic[AnyStr]):
    """``re.compile(pattern, flags)``, made on the first search."""

    __slots__ = ("_pattern", "_flags", "_compiled")

    def __init__(self, pattern: AnyStr, flags: int = 0) -> None:
        self._pattern: AnyStr = pattern
        self._flags = flags
        self._compiled: re.Pattern[AnyStr] | None = None

    @property
    def compiled(self) -> re.Pattern[AnyStr]:
        if self._compiled is None:
            self._compiled = re.compile(self._pattern, self._flags)
        return self._compiled

    def search(self, string: AnyStr, *pos: int) -> re.Match[AnyStr] | None:
        return self.compiled.search(string, *pos)

    def findall(self, string: AnyStr, *pos: int) -> list[Any]:
        return self.compiled.findall(string, *pos)

    def finditer(self, string: AnyStr, *pos: int) -> Iterator[re.Match[AnyStr]]:
        return self.compiled.finditer(string, *pos)

    def __repr__(self) -> str:
        return f"lazy({self._pattern!r})"


def lazy(pattern: AnyStr, flags: int = 0) -> LazyPattern[AnyStr]:
    return LazyPattern(pattern, flags)
