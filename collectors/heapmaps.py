"""Resident bytes of glibc's heaps, attributed from /proc/PID/smaps.

glibc does not say how much of what it maps is resident.  Its heaps are
recognisable in the address space, so the kernel can:

- the main arena grows the ``[heap]`` mapping (brk); when brk fails it
  falls back to mmap'd regions that look like any other mapping (not
  attributed here);
- every other arena lives in heaps mmap'd at a HEAP_MAX_SIZE-aligned
  address (64 MiB on 64-bit: 2 * DEFAULT_MMAP_THRESHOLD_MAX, malloc/arena.c
  new_heap), anonymous, the used part rw-p and the rest of the 64 MiB
  reserved ---p right after it.

Chunks above the mmap threshold are separate anonymous mappings that cannot
be told apart from other mmaps: they are left out, so the result is a lower
bound of glibc's resident memory (and says so).
"""

from collectors.procfs import parse_maps

HEAP_MAX_SIZE = 64 << 20


def glibc_heap_resident(procfs, pid):
    """(resident bytes of [heap] + arena heaps, number of arena heaps), or
    (None, 0) when smaps cannot be read."""
    try:
        data = procfs.read(pid, "smaps")
    except Exception:        # noqa: BLE001 - any read failure: not attributable
        return None, 0
    total, heaps = 0, 0
    maps = []
    rss_of = {}
    current = None
    for line in data.split(b"\n"):
        if not line:
            continue
        head = line.split(None, 1)[0]
        if b"-" in head and not head.endswith(b":"):
            m = parse_maps(line + b"\n")
            if m:
                current = m[0]
                maps.append(current)
            continue
        if current is not None and line.startswith(b"Rss:"):
            rss_of[current.start] = int(line.split()[1]) * 1024
    for i, m in enumerate(maps):
        if m.path == "[heap]":
            total += rss_of.get(m.start, 0)
        elif m.path is None and m.perms.startswith("rw") and m.start % HEAP_MAX_SIZE == 0:
            # A glibc heap: its reserved tail (---p) follows, and the two
            # together span at most HEAP_MAX_SIZE.
            end = m.end
            j = i + 1
            while j < len(maps) and maps[j].start == end and maps[j].path is None \
                    and maps[j].perms.startswith("---"):
                end = maps[j].end
                j += 1
            if end - m.start == HEAP_MAX_SIZE or (end > m.end and end - m.start <= HEAP_MAX_SIZE):
                total += rss_of.get(m.start, 0)
                heaps += 1
    return total, heaps
