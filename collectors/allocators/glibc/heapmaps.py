"""Resident bytes of glibc's heaps, attributed from /proc/PID/pagemap (or smaps).

glibc does not say how much of what it maps is resident.  Its heaps are
recognisable in the address space, so the kernel can:

- the main arena grows the ``[heap]`` mapping (brk); when brk fails it
  falls back to mmap'd regions that look like any other mapping (not
  attributed here);
- every other arena lives in heaps mmap'd at a HEAP_MAX_SIZE-aligned
  address (64 MiB on 64-bit: 2 * DEFAULT_MMAP_THRESHOLD_MAX, malloc/arena.c
  new_heap), anonymous, the used part rw-p and the rest of the 64 MiB
  reserved ---p right after it.

Chunks above the mmap threshold are separate anonymous mappings
(malloc.c sysmalloc_mmap): the chunk starts at the mapping's first byte
(``prev_size`` = the alignment correction, 0 for malloc's own page-aligned
mmaps) and its ``size`` field is the mapping's length with IS_MMAPPED set.
``mmapped_chunks`` finds them by that header (read through /proc/PID/mem,
ptrace read rights), also where the kernel merged adjacent ones into one
mapping, and their present pages come from /proc/PID/pagemap.
"""

from __future__ import annotations

from typing import Any

import bisect
import os
import struct

from diag.model.errors import AccessDenied, AllocdiagError
from collectors.engine.memory import MemoryReader
from collectors.proc.pagemap import PAGE_SIZE, Pagemap, present_caveat
from collectors.proc.maps import parse_maps
from collectors.proc.smaps import rss_by_mapping
from collectors.proc.syscall import parse_syscall
from diag.model import Value

HEAP_MAX_SIZE = 64 << 20
# malloc/malloc.c: the low bits of a chunk's size field.
PREV_INUSE, IS_MMAPPED, NON_MAIN_ARENA = 0x1, 0x2, 0x4
SIZE_BITS = PREV_INUSE | IS_MMAPPED | NON_MAIN_ARENA
CHUNK_HEADER = struct.Struct("<QQ")     # prev_size (mchunk_prev_size), size (mchunk_size)
MAX_CHUNKS = 1 << 16                    # bound on the walk (a process has mp_.n_mmaps of them)


def _chunks_in(read, start, end):
    """[(start, end)] of mmapped chunks laid end to end from START in the
    anonymous mapping [START, END): the kernel merges adjacent mmaps with the
    same protections into one mapping."""
    out = []
    addr = start
    while addr < end and len(out) < MAX_CHUNKS:
        raw = read(addr, CHUNK_HEADER.size)
        if raw is None:
            break
        prev_size, size = CHUNK_HEADER.unpack(raw)
        length = prev_size + (size & ~SIZE_BITS)
        # sysmalloc_mmap: size | IS_MMAPPED, never PREV_INUSE or NON_MAIN_ARENA;
        # the mapping is whole pages and prev_size (the correction) is small.
        if (size & SIZE_BITS) != IS_MMAPPED or prev_size >= PAGE_SIZE or prev_size % 16 \
                or length % PAGE_SIZE or not length or addr + length > end:
            break
        out.append((addr, addr + length))
        addr += length
    return out


def mmapped_chunks(pid: Any, maps: Any, procfs_root: Any = '/proc') -> Any:
    """(count, bytes, resident bytes) of glibc's mmapped chunks among MAPS,
    or None when process memory or pagemap cannot be read."""
    try:
        with MemoryReader(pid, procfs_root) as mem:
            spans = []
            for m in maps:
                if m.path is None and not m.inode and m.perms.startswith("rw") \
                        and m.start % HEAP_MAX_SIZE:
                    spans += _chunks_in(mem.read, m.start, m.end)
        with Pagemap(pid, procfs_root) as pm:
            resident = pm.resident_bytes(spans)
    except AccessDenied:
        return None
    if resident is None:
        return None
    return len(spans), sum(b - a for a, b in spans), resident


def glibc_heap_resident(procfs: Any, pid: Any) -> Any:
    """(resident bytes of [heap] + arena heaps, number of arena heaps,
    maps), or (None, 0, None) when smaps cannot be read."""
    try:
        data = procfs.read(pid, "smaps")
        rows = rss_by_mapping(data)
    except Exception:        # noqa: BLE001 - any read failure: not attributable
        return None, 0, None
    maps = [m for m, _ in rows]
    spans, heaps = heap_spans(maps)
    rss = {(m.start, m.end): r for m, r in rows}
    return sum(rss[span] for span in spans), heaps, maps


def heap_resident_by_pagemap(procfs: Any, pid: Any) -> Any:
    """What glibc_heap_resident gives, from /proc/PID/maps and the heaps'
    present pages (pagemap), not from smaps: the same count, since both
    leave out the zero page, but only where pagemap tells the zero page
    apart (PAGEMAP_SCAN, or the zero page's PFN with CAP_SYS_ADMIN); else
    (None, 0, None), as when it cannot be read.  smaps formats ~25 lines of
    every mapping, which no one reads here: ~1.3 ms of a small glibc
    process's snapshot, against ~0.4 ms for maps and the scan."""
    if present_caveat():
        return None, 0, None
    try:
        maps = parse_maps(procfs.read(pid, "maps"))
        spans, heaps = heap_spans(maps)
        with Pagemap(pid, procfs.root) as pm:
            total = pm.resident_bytes(spans)
            if not pm.zero_page_told_apart:
                total = None    # this file refused the scan (a captured one): smaps
    except (OSError, AllocdiagError):
        return None, 0, None
    return (total, heaps, maps) if total is not None else (None, 0, None)


def heap_spans(maps: Any) -> tuple[list[tuple[int, int]], int]:
    """([(start, end)] of the [heap] mapping and of each run of arena heaps'
    rw part, number of arena heaps) among MAPS."""
    spans, heaps = [], 0
    for i, m in enumerate(maps):
        if m.path == "[heap]":
            spans.append((m.start, m.end))
        elif m.path is None and m.perms.startswith("rw") and m.start % HEAP_MAX_SIZE == 0:
            # A glibc heap: its reserved tail (---p) follows, and the two
            # together span at most HEAP_MAX_SIZE.
            end = m.end
            j = i + 1
            while j < len(maps) and maps[j].start == end and maps[j].path is None \
                    and maps[j].perms.startswith("---"):
                end = maps[j].end
                j += 1
            # Consecutive heaps of one arena (new_heap tries the next 64 MiB
            # slot) are adjacent: the kernel merges their rw-p parts into one
            # mapping, so a run of k heaps spans exactly k x HEAP_MAX_SIZE.
            if (end - m.start) % HEAP_MAX_SIZE == 0:
                spans.append((m.start, m.end))
                heaps += (end - m.start) // HEAP_MAX_SIZE
    return spans, heaps


def _thread_sps(procfs, pid):
    """Stack pointers of the threads that are not running (a running
    thread's is not readable)."""
    sps = []
    try:
        tids = os.listdir(procfs.path(pid, "task"))
    except OSError:
        return sps
    for tid in tids:
        try:
            sp = parse_syscall(procfs.read(pid, f"task/{tid}/syscall")).sp
        except (OSError, AllocdiagError, ValueError):
            continue
        if sp is not None:
            sps.append(sp)
    return sps


def anon_present_outside_stacks(procfs: Any, pid: Any, known_sps: Any = None) -> Any:
    """(bytes, stacks left out) of the pages present (/proc/PID/pagemap) in
    the private anonymous mappings that hold no thread stack: where an
    allocator's memory can be.  A running thread's stack is not recognised
    and stays in, so this is an upper bound.  None when unreadable.
    KNOWN_SPS(maps bytes): the threads' stack pointers when already known
    for exactly these mappings (the engine's look at every thread, made
    for the same snapshot or, in a recording, an earlier one with the same
    mappings), else None: then each thread's syscall file is read (a
    216-thread varnishd: ~5 ms of every snapshot)."""
    try:
        raw = procfs.read(pid, "maps")
    except (OSError, AllocdiagError):
        return None
    maps = parse_maps(raw)
    known = known_sps(raw) if known_sps is not None else None
    sps = sorted(known if known is not None else _thread_sps(procfs, pid))
    spans, stacks = [], 0
    for m in maps:
        # the first stack pointer at or above the start lies below the end
        i = bisect.bisect_left(sps, m.start)
        if m.path == "[stack]" or (i < len(sps) and sps[i] < m.end):
            stacks += 1
            continue
        anon = not m.inode and (m.path is None or m.path == "[heap]"
                                or m.path.startswith("[anon:"))
        if anon and m.perms.startswith("rw"):
            spans.append((m.start, m.end))
    try:
        with Pagemap(pid, procfs.root) as pm:
            present = pm.resident_bytes(spans)
    except AccessDenied:
        return None
    return (present, stacks) if present is not None else None


def resident(image: Any, native: Any, stats: Any) -> Any:
    """glibc's resident: its heaps' present pages (pagemap; smaps Rss where
    pagemap cannot tell the zero page apart) plus the present pages of
    its mmapped chunks, found by their headers (collectors.allocators.glibc.heapmaps).  The
    chunks found are checked against malloc_info's / mallinfo2's own count
    and bytes (hblks, hblkhd): when they disagree the figure says so."""
    res, heaps, maps = heap_resident_by_pagemap(image.procfs, image.pid)
    formula = "pagemap present pages of [heap] + the 64 MiB-aligned arena heaps"
    if res is None:
        res, heaps, maps = glibc_heap_resident(image.procfs, image.pid)
        formula = "smaps Rss of [heap] + the 64 MiB-aligned arena heaps"
    if res is None:
        return
    native["heap_resident"] = {"bytes": res, "arena_heaps": heaps}
    chunks = mmapped_chunks(image.pid, maps, image.procfs.root)
    mi = native.get("mallinfo2") or {}
    if chunks is not None:
        n, size, chunk_res = chunks
        native["heap_resident"]["mmapped_chunks"] = {"count": n, "bytes": size,
                                                     "resident": chunk_res}
        res += chunk_res
        formula += (f" + pagemap present pages of the {n} mmapped chunks found by their "
                    f"headers ({size} bytes mapped")
        if mi.get("hblks") is not None and (mi["hblks"], mi["hblkhd"]) != (n, size):
            formula += (f"; glibc counts {mi['hblks']} chunks, {mi['hblkhd']} bytes: the "
                        "rest not found, a lower bound")
        formula += ")" + present_caveat()
    else:
        formula += " (mmapped chunks not readable: a lower bound)"
    stats["resident"] = Value.derived(res, formula)
