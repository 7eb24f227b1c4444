"""Resident pages of address ranges, from /proc/PID/pagemap (no stop).

Each virtual page has one 64-bit entry (Documentation/admin-guide/mm/
pagemap.rst): bit 63 "page present", bit 62 "page swapped".  The present
and swapped bits are readable with the same ptrace-read rights as
/proc/PID/mem; only the PFN bits need CAP_SYS_ADMIN, and we do not use them.
A transparent huge page reports each of its 4 KiB subpages as present.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from collectors.proc import oserror

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# Documentation/admin-guide/mm/pagemap.rst
PM_ENTRY_BYTES = 8
PM_PRESENT = 1 << 63
PM_SWAPPED = 1 << 62
# Both flags live in an entry's last byte (little-endian): counted over that
# byte of every entry with bytes.translate, at C speed, not one Python step a
# page (a 570 MiB heap is 146,000 entries: ~11 ms that way).
_TOP_BYTE = PM_ENTRY_BYTES - 1
_TOP_PRESENT = PM_PRESENT >> 56                       # 0x80
_TOP_SWAPPED = PM_SWAPPED >> 56                       # 0x40
_PRESENT_BYTES = bytes(b for b in range(256) if b & _TOP_PRESENT)
_SWAPPED_ONLY_BYTES = bytes(b for b in range(256) if b & _TOP_SWAPPED and not b & _TOP_PRESENT)
# Entries read per pread: 1 MiB of them covers 512 MiB of address space, so
# a range of many GiB (reserved, never touched) costs no more memory.
CHUNK_ENTRIES = 1 << 17


class Pagemap:
    """An open /proc/PID/pagemap; use as a context manager."""

    def __init__(self, pid: int, procfs_root: str = "/proc") -> None:
        self.pid = pid
        path = os.path.join(procfs_root, str(pid), "pagemap")
        self._fd: int | None = None
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise oserror.translate(exc, pid, f"reading {path}",
                                    procfs=procfs_root) from None

    def pages(self, start: int, end: int) -> tuple[int, int] | tuple[None, None]:
        """(present, swapped) page counts in [START, END); (None, None)
        when the range could not be read."""
        first, last = start // PAGE_SIZE, (end + PAGE_SIZE - 1) // PAGE_SIZE
        present = swapped = 0
        assert self._fd is not None, "read after close()"
        for at in range(first, last, CHUNK_ENTRIES):
            n = min(CHUNK_ENTRIES, last - at)
            try:
                data = os.pread(self._fd, n * PM_ENTRY_BYTES, at * PM_ENTRY_BYTES)
            except OSError:
                return None, None
            if len(data) != n * PM_ENTRY_BYTES:
                return None, None
            top = data[_TOP_BYTE::PM_ENTRY_BYTES]
            present += n - len(top.translate(None, _PRESENT_BYTES))
            swapped += n - len(top.translate(None, _SWAPPED_ONLY_BYTES))
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
