"""mimalloc's live bytes, from a walk of its segments out of process.

Debian's libmimalloc 2.0.9 is a release build (MI_STAT=0): it counts
reserved and committed memory but no allocated bytes, and it exports no
heap or segment-map symbols.  Its segments can still be read from outside
(pread of /proc/PID/mem, no stop):

* every segment is MI_SEGMENT_SIZE (32 MiB) aligned, so the candidates are
  the 32 MiB-aligned addresses inside anonymous mappings;
* a segment header is recognised by its cookie: ``segment->cookie ==
  _mi_ptr_cookie(segment) == segment ^ _mi_heap_main.cookie``, so every
  real segment gives the same ``cookie ^ address``; that key is confirmed
  against ``_mi_heap_main.cookie`` itself when a page of the main heap
  points at it, plus structural checks on every header and page;
* a page is a slice with ``slice_offset == 0`` and ``slice_count > 0``; its
  live blocks are ``used`` minus the blocks still waiting on its
  cross-thread free list (``xthread_free``) and on its heap's
  ``thread_delayed_free`` list (both are freed but not yet counted down).

allocated = Σ pages (used − pending) × block size.  The layout below is the
one of mimalloc v2.0.9 built as Debian builds it (x86-64, NDEBUG,
MI_SECURE 0, no MI_ENCODE_FREELIST, no MI_PADDING), pinned to the
library's build-id; any other build is reported unknown.
"""

from __future__ import annotations

from typing import Any

import struct
from collections import namedtuple

from diag.model.errors import AccessDenied, AllocdiagError, NoSuchProcess
from collectors.engine.memory import MemoryReader
from collectors.proc.pagemap import Pagemap

# Builds whose layout was checked (offsetof() against v2.0.9's
# include/mimalloc-types.h compiled with -DNDEBUG, and a live walk).
PINNED_BUILD_IDS = {
    "d07f4e7dc9a039fcbe7747f416476bd65cb48e8b": "2.0.9 (Debian libmimalloc2.0 2.0.9+ds-2, amd64)",
}

MI_SEGMENT_SLICE_SHIFT = 16                     # 64 KiB slices
MI_SEGMENT_SLICE_SIZE = 1 << MI_SEGMENT_SLICE_SHIFT
MI_SEGMENT_SHIFT = 9 + MI_SEGMENT_SLICE_SHIFT   # 32 MiB
MI_SEGMENT_SIZE = 1 << MI_SEGMENT_SHIFT
MI_SLICES_PER_SEGMENT = MI_SEGMENT_SIZE // MI_SEGMENT_SLICE_SIZE   # 512
MI_HUGE_BLOCK_SIZE = 2 << 30
MI_SEGMENT_NORMAL, MI_SEGMENT_HUGE = 0, 1

# mi_segment_t (v2.0.9): cookie, segment_slices, segment_info_slices, kind,
# slice_entries, thread_id, then slices[] at 264.
SEGMENT_COOKIE = 216
SEGMENT_HEADER = struct.Struct("<QQQI4xQQ")     # cookie .. thread_id
SEGMENT_SLICES = 264
# mi_page_t / mi_slice_t, 80 bytes: slice_count, slice_offset, (bits),
# capacity, reserved, flags, (bits), free, used, xblock_size, local_free,
# xthread_free, xheap, next, prev, padding.
SLICE = struct.Struct("<IIxxHHxxQIIQQQQQQ")
SLICE_SIZE = 80
# mi_heap_t: thread_delayed_free at 2840, thread_id 2848, cookie 2864.
HEAP_THREAD_DELAYED_FREE = 2840
HEAP_THREAD_ID = 2848
HEAP_COOKIE = 2864
MI_TF_PTR_MASK = ~3          # xthread_free's low 2 bits are mi_delayed_t flags

TRIES = 3
MAX_LIST = 1 << 24           # a free list longer than this is a torn read


class Invalid(Exception):
    """A structure failed a check (torn read, wrong layout)."""


# addr: the page's mi_page_t; area/area_size: the slices its blocks live in.
Page = namedtuple("Page", "addr used reserved capacity block_size xthread_free xheap "
                          "area area_size")
Segment = namedtuple("Segment", "addr kind slices thread_id pages")
# active: Σ over pages holding live blocks of capacity × block size (the
# blocks carved so far: live ones plus the free ones stuck beside them).
# spans: (start, end) of every segment walked (what pagemap measures);
# resident: bytes of those spans the kernel has present (None: not measured).
Walk = namedtuple("Walk", "allocated active segments abandoned huge pages pending_thread_free "
                          "pending_delayed key_checked spans resident")


def pinned_object(image: Any) -> Any:
    """(LoadedObject, description) of a mapped libmimalloc whose build-id is
    pinned; (LoadedObject, None) for another mimalloc build; None if no
    mimalloc is mapped."""
    other = None
    for obj in image.objects:
        if obj.elf is None:
            continue
        if obj.elf.build_id in PINNED_BUILD_IDS:
            return obj, PINNED_BUILD_IDS[obj.elf.build_id]
        if obj.elf.defines("mi_malloc") and other is None:
            other = obj
    return (other, None) if other is not None else None


def _header(read, addr):
    raw = read(addr + SEGMENT_COOKIE, SEGMENT_HEADER.size)
    if raw is None:
        return None
    cookie, seg_slices, info_slices, kind, entries, thread_id = SEGMENT_HEADER.unpack(raw)
    # Structural checks of mi_segment_init(): a normal segment has exactly
    # MI_SLICES_PER_SEGMENT slices; a huge one more or fewer, its entries
    # capped at MI_SLICES_PER_SEGMENT; the info slices come first.
    if kind == MI_SEGMENT_NORMAL:
        if seg_slices != MI_SLICES_PER_SEGMENT or entries != MI_SLICES_PER_SEGMENT:
            return None
    elif kind == MI_SEGMENT_HUGE:
        if not 0 < seg_slices < (1 << 32) or entries != min(seg_slices, MI_SLICES_PER_SEGMENT):
            return None
    else:
        return None
    if not 0 < info_slices < min(seg_slices, 16):
        return None
    return cookie ^ addr, seg_slices, info_slices, kind, entries, thread_id


def find_segments(read: Any, maps: Any) -> Any:
    """[(addr, header)] of segment headers in anonymous mappings, all with
    the same cookie key.  Raises Invalid when the keys disagree."""
    found = []
    for m in maps:
        if m.path not in (None, "") or m.inode or "r" not in m.perms:
            continue
        a = (m.start + MI_SEGMENT_SIZE - 1) & ~(MI_SEGMENT_SIZE - 1)
        while a < m.end:
            h = _header(read, a)
            if h is None:
                a += MI_SEGMENT_SIZE
                continue
            found.append((a, h))
            span = h[1] * MI_SEGMENT_SLICE_SIZE      # skip a huge segment's interior
            a += max(MI_SEGMENT_SIZE, (span + MI_SEGMENT_SIZE - 1) & ~(MI_SEGMENT_SIZE - 1))
    keys: dict[Any, list[Any]] = {}
    for a, h in found:
        keys.setdefault(h[0], []).append((a, h))
    if not keys:
        return None, []
    # mi_ptr_cookie: one key for the whole process.  A stray match by chance
    # has its own key; the real one is shared by the most headers.
    key, segs = max(keys.items(), key=lambda kv: len(kv[1]))
    if len(keys) > 1 and len(segs) == 1:
        raise Invalid(f"{len(keys)} segment cookie keys, none shared by two segments")
    return key, segs


def _pages(read, addr, entries, kind, seg_slices):
    raw = read(addr + SEGMENT_SLICES, entries * SLICE_SIZE)
    if raw is None:
        raise Invalid(f"slices of segment {addr:#x} not readable")
    slices = [SLICE.unpack_from(raw, i * SLICE_SIZE) for i in range(entries)]
    pages = []
    i = 0
    while i < entries:
        (count, offset, capacity, reserved, _free, used, xblock, _lf, xtf, xheap,
         _n, _p, _pad) = slices[i]
        if count == 0 or offset != 0:
            raise Invalid(f"segment {addr:#x} slice {i}: not a span start "
                          f"(slice_count={count} slice_offset={offset})")
        if xblock > 1 and used:
            bsize = xblock
            span = count * MI_SEGMENT_SLICE_SIZE
            if xblock >= MI_HUGE_BLOCK_SIZE and kind == MI_SEGMENT_HUGE:
                bsize = seg_slices * MI_SEGMENT_SLICE_SIZE    # a page of one block > 2 GiB
                span = bsize
            if used > reserved or capacity > reserved or reserved * bsize > span:
                raise Invalid(f"segment {addr:#x} page {i}: used={used} capacity={capacity} "
                              f"reserved={reserved} block={xblock} slices={count}")
            pages.append(Page(addr + SEGMENT_SLICES + i * SLICE_SIZE, used, reserved,
                              capacity, bsize, xtf & MI_TF_PTR_MASK, xheap,
                              addr + i * MI_SEGMENT_SLICE_SIZE, count * MI_SEGMENT_SLICE_SIZE))
        i += count
    return slices, pages


LOCAL_PAGE_MAX = 1 << 20     # pages up to this size are read whole to follow a list


def _list_len(read, head, limit, area=None):
    """Blocks on a free list starting at HEAD (plain pointers: no
    MI_ENCODE_FREELIST in this build); Invalid past LIMIT.  AREA: (start,
    bytes) of the page already read, so that links inside it cost no read."""
    n, p = 0, head
    start, buf = area if area is not None else (0, b"")
    end = start + len(buf)
    while p:
        n += 1
        if n > limit:
            raise Invalid(f"free list at {head:#x} longer than {limit} blocks")
        if start <= p and p + 8 <= end:
            p = struct.unpack_from("<Q", buf, p - start)[0]
            continue
        nxt = read(p, 8)
        if nxt is None:
            raise Invalid(f"free-list block {p:#x} not readable")
        p = struct.unpack("<Q", nxt)[0]
    return n


def _block_size(segs_by_addr, block):
    """Block size of the page that holds BLOCK (mi_ptr_page)."""
    seg = segs_by_addr.get(block & ~(MI_SEGMENT_SIZE - 1))
    if seg is None:
        raise Invalid(f"delayed-free block {block:#x} outside every segment")
    idx = (block - seg.addr) >> MI_SEGMENT_SLICE_SHIFT
    if idx >= len(seg.slices):
        idx = len(seg.slices) - 1
    s = seg.slices[idx]
    idx -= s[1] // SLICE_SIZE              # slice_offset back to the page's slice
    for p in seg.pages:
        if p.addr == seg.addr + SEGMENT_SLICES + idx * SLICE_SIZE:
            return p.block_size
    raise Invalid(f"delayed-free block {block:#x} is not in a used page")


def walk(read: Any, maps: Any, lib_ranges: Any) -> Any:
    """One walk.  LIB_RANGES: address ranges of libmimalloc (its
    _mi_heap_main lives there).  Raises Invalid."""
    key, heads = find_segments(read, maps)
    if not heads:
        raise Invalid("no mimalloc segment found in the anonymous mappings")
    segs = {}
    for a, (_k, seg_slices, _info, kind, entries, thread_id) in heads:
        slices, pages = _pages(read, a, entries, kind, seg_slices)
        segs[a] = Segment(a, kind, slices, thread_id, pages)
    allocated = active = pending_tf = pending_df = npages = 0
    heaps: dict[Any, Any] = {}
    for seg in segs.values():
        for p in seg.pages:
            npages += 1
            active += max(p.capacity, 1) * p.block_size
            n = p.used
            if p.xthread_free:
                area = None
                if p.area_size <= LOCAL_PAGE_MAX:
                    buf = read(p.area, p.area_size)
                    area = (p.area, buf) if buf is not None else None
                k = _list_len(read, p.xthread_free, p.used, area)
                pending_tf += k
                n -= k
            allocated += n * p.block_size
            if p.xheap:
                heaps.setdefault(p.xheap, seg.thread_id)
    key_checked = False
    for heap, tid in heaps.items():
        raw = read(heap + HEAP_THREAD_DELAYED_FREE, 32)
        if raw is None:
            raise Invalid(f"heap {heap:#x} not readable")
        tdf, heap_tid, _arena, cookie = struct.unpack("<QQQQ", raw)
        if tid and heap_tid != tid:
            raise Invalid(f"heap {heap:#x}: thread_id {heap_tid:#x} != its segment's {tid:#x}")
        if any(a <= heap < b for a, b in lib_ranges):     # _mi_heap_main
            if cookie != key:
                raise Invalid("segment cookies do not match _mi_heap_main.cookie")
            key_checked = True
        p, n = tdf, 0
        while p:
            n += 1
            if n > MAX_LIST:
                raise Invalid("thread_delayed_free list too long")
            allocated -= _block_size(segs, p)
            nxt = read(p, 8)
            if nxt is None:
                raise Invalid(f"delayed-free block {p:#x} not readable")
            p = struct.unpack("<Q", nxt)[0]
        pending_df += n
    if allocated < 0:
        raise Invalid("pending frees exceed used blocks")
    spans = tuple((a, a + h[1] * MI_SEGMENT_SLICE_SIZE) for a, h in heads)
    return Walk(allocated, active, len(segs), sum(1 for s in segs.values() if not s.thread_id),
                sum(1 for s in segs.values() if s.kind == MI_SEGMENT_HUGE), npages,
                pending_tf, pending_df, key_checked, spans, None)


def segments_resident(pid: Any, spans: Any, procfs_root: Any = '/proc') -> Any:
    """Bytes of SPANS the kernel has present (/proc/PID/pagemap): what of
    mimalloc's committed memory is really resident.  None when pagemap
    cannot be read."""
    try:
        with Pagemap(pid, procfs_root) as pm:
            return pm.resident_bytes(spans)
    except AccessDenied:
        return None


def collect(image: Any, procfs_root: Any = '/proc') -> Any:
    """(Walk, build description) for a process using a pinned mimalloc
    build, or (None, reason) when the walk cannot give a number.  Raises
    only NoSuchProcess."""
    found = pinned_object(image)
    if found is None:
        return None, "no mimalloc mapped"
    obj, desc = found
    if desc is None:
        return None, (f"mimalloc build-id {obj.elf.build_id} is not a pinned layout "
                      f"(pinned: {', '.join(PINNED_BUILD_IDS.values())})")
    try:
        mem = MemoryReader(image.pid, procfs_root)
    except AccessDenied as exc:
        return None, f"process memory not readable: {exc.msg}"
    last = None
    try:
        with mem:
            for _ in range(TRIES):
                # maps again on every try: segments come and go.
                maps = image.procfs.maps(image.pid)
                try:
                    w = walk(mem.read, maps, obj.ranges)
                    return w._replace(resident=segments_resident(image.pid, w.spans,
                                                                 procfs_root)), desc
                except Invalid as exc:
                    last = exc
    except NoSuchProcess:
        raise
    except AllocdiagError as exc:
        return None, str(exc.msg)
    return None, f"segment walk failed {TRIES} times: {last}"
