"""Resident pages of address ranges, from /proc/PID/pagemap (no stop).

Each virtual page has one 64-bit entry (Documentation/admin-guide/mm/
pagemap.rst): bit 63 "page present", bit 62 "page swapped".  The present
and swapped bits are readable with the same ptrace-read rights as
/proc/PID/mem; only the PFN bits need CAP_SYS_ADMIN, and we do not use them.
A transparent huge page reports each of its 4 KiB subpages as present.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from typing import Any

from collectors.proc import oserror

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# Documentation/admin-guide/mm/pagemap.rst
PM_ENTRY_BYTES = 8
PM_PRESENT = 1 << 63
PM_SWAPPED = 1 << 62


class Pagemap:
    """An open /proc/PID/pagemap; use as a context manager."""

    def __init__(self, pid: int, procfs_root: str = "/proc") -> None:
        self.pid = pid
        path = os.path.join(procfs_root, str(pid), "pagemap")
        self._fd: int | None = None
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise oserror.translate(exc, pid, f"reading /proc/{pid}/pagemap",
                                    procfs=procfs_root) from None

    def pages(self, start: int, end: int) -> tuple[int, int] | tuple[None, None]:
        """(present, swapped) page counts in [START, END); (None, None)
        when the range could not be read."""
        first, last = start // PAGE_SIZE, (end + PAGE_SIZE - 1) // PAGE_SIZE
        n = last - first
        if n <= 0:
            return 0, 0
        try:
            assert self._fd is not None, "read after close()"
            data = os.pread(self._fd, n * PM_ENTRY_BYTES, first * PM_ENTRY_BYTES)
        except OSError:
            return None, None
        if len(data) != n * PM_ENTRY_BYTES:
            return None, None
        present = swapped = 0
        for (e,) in struct.iter_unpack("<Q", data):
            if e & PM_PRESENT:
                present += 1
            elif e & PM_SWAPPED:
                swapped += 1
        return present, swapped

    def resident_bytes(self, ranges: Iterable[tuple[int, int]]) -> int | None:
        """Σ present pages × page size over RANGES [(start, end)], or None
        when any range was unreadable."""
        total = 0
        for start, end in ranges:
            present, _ = self.pages(start, end)
            if present is None:
                return None
            total += present * PAGE_SIZE
        return total

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Pagemap:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
