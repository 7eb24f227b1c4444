"""Resident pages of address ranges, from /proc/PID/pagemap (no stop).

Each virtual page has one 64-bit entry (Documentation/admin-guide/mm/
pagemap.rst): bit 63 "page present", bit 62 "page swapped", bit 61 "page is
a file-page or shared-anon", bits 0-54 the page frame number (PFN).  The
flags are readable with the same ptrace-read rights as /proc/PID/mem; the
PFN only with CAP_SYS_ADMIN (zero without it).  A transparent huge page
reports each of its 4 KiB subpages as present.

"Present" is not "resident" for a page that was only ever read: the fault
maps the kernel's shared zero page, and smaps' Rss and the RssAnon counter
do not count it (fs/proc/task_mmu.c: vm_normal_page() gives no page for it),
while pagemap shows it present.  Measured on 6.18: a 64 MiB private
anonymous mapping, each page read once, showed 16,384 present entries, all
of one PFN, and Rss 0 kB; with MADV_HUGEPAGE the huge zero page's entries
showed present with bit 61 set (it is no anonymous page).  So the pages
counted here are the present entries without bit 61 (the ranges asked
about are private anonymous memory, where only the huge zero page has it)
whose PFN is not the zero page's; that PFN is learnt from a page of this
process's own (zero_page_pfn) and is visible only with CAP_SYS_ADMIN:
without it a read-only page of the small zero page counts as resident
(``Pagemap.zero_page_known`` says which).

Where the kernel has it (Linux 6.7, fs/proc/task_mmu.c), the bytes of
present pages are asked with the PAGEMAP_SCAN ioctl on the same file
instead: the kernel walks the range and returns the runs of pages that are
present, not a file or shared page (PAGE_IS_FILE, bit 61's test) and not the
zero page (PAGE_IS_PFNZERO: the small one and, measured on 6.18, the huge
one), a few runs where the reads return 8 bytes a page to sum in Python.
It tells the zero page apart without CAP_SYS_ADMIN.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import mmap
import os
from collections.abc import Iterable, Iterator
from typing import Any

from collectors.proc import oserror

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# Documentation/admin-guide/mm/pagemap.rst
PM_ENTRY_BYTES = 8
PM_PRESENT = 1 << 63
PM_SWAPPED = 1 << 62
PM_FILE = 1 << 61                 # "page is a file-page or shared-anon"
PM_PFN_MASK = (1 << 55) - 1       # bits 0-54
# The flags live in an entry's last byte (little-endian): counted over that
# byte of every entry with bytes.translate, at C speed, not one Python step a
# page (a 570 MiB heap is 146,000 entries: ~11 ms that way).
_TOP_BYTE = PM_ENTRY_BYTES - 1
_TOP_PRESENT = PM_PRESENT >> 56                       # 0x80
_TOP_SWAPPED = PM_SWAPPED >> 56                       # 0x40
_TOP_FILE = PM_FILE >> 56                             # 0x20
# present without bit 61 (in private anonymous memory only the huge zero
# page has it)
_PRESENT_ANON_BYTES = bytes(b for b in range(256) if b & _TOP_PRESENT and not b & _TOP_FILE)
_SWAPPED_ONLY_BYTES = bytes(b for b in range(256) if b & _TOP_SWAPPED and not b & _TOP_PRESENT)


# PAGEMAP_SCAN (include/uapi/linux/fs.h)
class pm_scan_arg(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "size", "flags", "start", "end", "walk_end", "vec", "vec_len", "max_pages",
        "category_inverted", "category_mask", "category_anyof_mask", "return_mask")]


class page_region(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("end", ctypes.c_uint64),
                ("categories", ctypes.c_uint64)]


_IOC_READ, _IOC_WRITE = 2, 1                  # include/uapi/asm-generic/ioctl.h
PAGEMAP_SCAN = ((_IOC_READ | _IOC_WRITE) << 30) | (ctypes.sizeof(pm_scan_arg) << 16) | \
    (ord("f") << 8) | 16                      # _IOWR('f', 16, struct pm_scan_arg)
PAGE_IS_FILE = 1 << 2
PAGE_IS_PRESENT = 1 << 3
PAGE_IS_PFNZERO = 1 << 5
# Runs returned per ioctl; a range with more is scanned on from walk_end.
SCAN_REGIONS = 256
# Pages found per ioctl, the same: the kernel walks the range under the
# target's mmap read lock, released only between ioctls (a read of the
# entries releases it every 2 MiB).  A dense 512 MiB range took 10 ms in
# one ioctl on 6.18, so each stops after 2 MiB of pages found; untouched
# address space costs nothing (64 GiB reserved: 0.05 ms, 181 ms as reads).
SCAN_MAX_PAGES = (2 << 20) // PAGE_SIZE
# The ioctl's answers for a kernel (or a file: a fixture) without it.
_NO_SCAN = (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP)

# Entries read per pread: 1 MiB of them covers 512 MiB of address space, so
# a range of many GiB (reserved, never touched) costs no more memory.
CHUNK_ENTRIES = 1 << 17


@contextlib.contextmanager
def _own_page() -> Iterator[tuple[mmap.mmap, int]]:
    """(mapping, address) of a private anonymous page of this process's
    own, not touched yet; OSError when it cannot be mapped."""
    m = mmap.mmap(-1, PAGE_SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        view = ctypes.c_char.from_buffer(m)
        addr = ctypes.addressof(view)
        del view
        yield m, addr
    finally:
        m.close()


@functools.cache
def zero_page_pfn() -> int | None:
    """The PFN of the kernel's shared zero page, or None when this process
    cannot see PFNs (no CAP_SYS_ADMIN) or the page could not be mapped.
    Learnt once: a private anonymous page of our own, read and never
    written, maps it (x86-64 has one small zero page; architectures with
    coloured zero pages, MIPS and s390, would need each of them)."""
    try:
        with _own_page() as (m, addr):
            m[0]                                # the read fault: the zero page
            fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
            try:
                entry = int.from_bytes(os.pread(fd, PM_ENTRY_BYTES,
                                                addr // PAGE_SIZE * PM_ENTRY_BYTES), "little")
            finally:
                os.close(fd)
    except (OSError, ValueError):
        return None
    pfn = entry & PM_PFN_MASK
    return pfn if entry & PM_PRESENT and not entry & PM_FILE and pfn else None


def _lane_tables(value: int, mask: int) -> list[bytes]:
    """Per byte lane k of an entry: a translate table giving 1 where
    (byte & mask_k) == (value_k & mask_k), else 0."""
    out = []
    for k in range(PM_ENTRY_BYTES):
        mk, vk = (mask >> (8 * k)) & 0xFF, (value >> (8 * k)) & 0xFF & (mask >> (8 * k))
        out.append(bytes(1 if (b & mk) == vk else 0 for b in range(256)))
    return out


def count_entries(data: bytes, tables: list[bytes]) -> int:
    """How many 8-byte entries of DATA match in every lane (_lane_tables),
    at C speed: each lane translated to a 0/1 byte string, the strings
    ANDed as integers, the ones counted."""
    acc = -1
    for k in range(PM_ENTRY_BYTES):     # the PFN's low byte first: it rules out most
        acc &= int.from_bytes(data[k::PM_ENTRY_BYTES].translate(tables[k]), "little")
        if not acc:
            return 0
    return acc.bit_count()


@functools.cache
def scan_supported() -> bool:
    """True when this kernel answers PAGEMAP_SCAN (asked once, of a page
    of this process's own)."""
    try:
        with _own_page() as (m, addr):
            m[0:1] = b"x"
            with Pagemap(os.getpid()) as pm:
                return pm._scan_present(addr, addr + PAGE_SIZE) == 1
    except OSError:
        return False


def present_caveat() -> str:
    """What a figure made of present pages must add to its source when the
    small zero page cannot be told apart (no CAP_SYS_ADMIN, no PAGEMAP_SCAN):
    "" otherwise."""
    if _zero_page_tables() is not None or scan_supported():
        return ""
    return ("; pages only read (the kernel's shared zero page) count too: telling them "
            "apart needs CAP_SYS_ADMIN")


@functools.cache
def _zero_page_tables() -> list[bytes] | None:
    """The lane tables of a present entry of the small zero page (present,
    bit 61 clear, its PFN), made once; None when its PFN is not known."""
    zero = zero_page_pfn()
    if zero is None:
        return None
    return _lane_tables(PM_PRESENT | zero, PM_PRESENT | PM_FILE | PM_PFN_MASK)


class Pagemap:
    """An open /proc/PID/pagemap; use as a context manager."""

    def __init__(self, pid: int, procfs_root: str = "/proc", scan: bool = True) -> None:
        """SCAN false: resident_bytes() reads the entries, never PAGEMAP_SCAN
        (the two ways compared)."""
        self.pid = pid
        self._zero_tables = _zero_page_tables()
        # True when the small zero page can be told from a resident page
        # (pages(); resident_bytes() also tells it with PAGEMAP_SCAN)
        self.zero_page_known = self._zero_tables is not None
        # PAGEMAP_SCAN's argument and output, made at its first use, and
        # whether the file refused it (an older kernel, a fixture): the
        # entries are read from then on
        self._scan: tuple[pm_scan_arg, ctypes.Array[page_region]] | None = None
        self._scan_refused = not scan
        path = os.path.join(procfs_root, str(pid), "pagemap")
        self._fd: int | None = None
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise oserror.translate(exc, pid, f"reading {path}",
                                    procfs=procfs_root) from None

    def pages(self, start: int, end: int) -> tuple[int, int] | tuple[None, None]:
        """(present, swapped) page counts in [START, END), the zero pages
        not counted as present (module docstring); (None, None) when the
        range could not be read."""
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
            present += n - len(top.translate(None, _PRESENT_ANON_BYTES))
            if self._zero_tables is not None:
                present -= count_entries(data, self._zero_tables)
            swapped += n - len(top.translate(None, _SWAPPED_ONLY_BYTES))
        return present, swapped

    def resident_bytes(self, ranges: Iterable[tuple[int, int]]) -> int | None:
        """Σ present pages × page size over RANGES [(start, end)], or None
        when any range was unreadable.  PAGEMAP_SCAN where the kernel
        answers it (the zero page told apart with no capability), else the
        entries read (pages())."""
        total = 0
        for start, end in ranges:
            present = None if self._scan_refused else self._scan_present(start, end)
            if present is None and self._scan_refused:
                present, _ = self.pages(start, end)
            if present is None:
                return None
            total += present * PAGE_SIZE
        return total

    @property
    def zero_page_told_apart(self) -> bool:
        """True when resident_bytes() leaves the zero page out: this file
        answers PAGEMAP_SCAN (not refused so far), or the zero page's PFN is
        known."""
        return self.zero_page_known or not self._scan_refused

    def _scan_present(self, start: int, end: int) -> int | None:
        """Present pages in [START, END) that are neither a file or shared
        page nor the zero page, by PAGEMAP_SCAN; None when unreadable or
        refused (then ``_scan_refused``)."""
        assert self._fd is not None, "read after close()"
        if self._scan is None:
            vec = (page_region * SCAN_REGIONS)()
            arg = pm_scan_arg(size=ctypes.sizeof(pm_scan_arg), vec=ctypes.addressof(vec),
                              vec_len=SCAN_REGIONS, max_pages=SCAN_MAX_PAGES,
                              category_mask=PAGE_IS_PRESENT | PAGE_IS_FILE | PAGE_IS_PFNZERO,
                              category_inverted=PAGE_IS_FILE | PAGE_IS_PFNZERO,
                              return_mask=PAGE_IS_PRESENT)
            self._scan = (arg, vec)
        arg, vec = self._scan
        at, end = start // PAGE_SIZE * PAGE_SIZE, (end + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE
        pages = 0
        while at < end:
            arg.start, arg.end = at, end
            try:
                n = fcntl.ioctl(self._fd, PAGEMAP_SCAN, arg, True)
            except OSError as exc:
                self._scan_refused = exc.errno in _NO_SCAN
                return None
            for i in range(n):
                pages += (vec[i].end - vec[i].start) // PAGE_SIZE
            if arg.walk_end <= at:         # no progress: never loop for ever
                return None
            at = arg.walk_end
        return pages

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Pagemap:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
