"""mimalloc's options read from its own option table, without a call.

mimalloc 2.0 keeps its options in a static array, src/options.c
``static mi_option_desc_t options[_mi_option_last]`` of::

    typedef struct mi_option_desc_s {
      long        value;   // the value
      mi_init_t   init;    // UNINIT (0), DEFAULTED (1), INITIALIZED (2)
      mi_option_t option;  // the option's index
      const char* name;    // without the "mimalloc_" prefix
      const char* legacy_name;  // its 1.x name, if it had another
    } mi_option_desc_t;

32 bytes an entry on x86-64 (measured on Debian 12's libmimalloc2.0 2.0.9:
26 entries, each ``option`` equal to its index).  ``mi_option_get`` returns
``value`` once ``init`` is not UNINIT, and mimalloc's load-time
``_mi_options_init`` gets every option, so in a running process ``value`` is
what 26 ``mi_option_get`` calls would return (``mi_option_set`` writes
``value`` and INITIALIZED).  One read of 832 bytes replaces 26 calls in the
stop (about 1 ms of it on the first snapshot).

The stripped library has no symbol for the array: ``locate`` finds it by its
shape, in the library's own writable mappings -- the entry whose name points
at "show_errors", then one entry per expected option whose ``option`` is its
index and whose name is that option's name.  Anything else (another layout,
other names) gives None, and the options are read with ``mi_option_get`` as
before.  An entry still UNINIT is read with ``mi_option_get`` too.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

# mimalloc 2.0.x option enum (include/mimalloc.h of 2.0.9, Debian's
# libmimalloc-dev); index = mi_option_t value.  2.1+ renamed the purge
# options, so names are only trusted for the version they were read from.
OPTIONS_2_0 = (
    "show_errors", "show_stats", "verbose", "eager_commit", "deprecated_eager_region_commit",
    "deprecated_reset_decommits", "large_os_pages", "reserve_huge_os_pages",
    "reserve_huge_os_pages_at", "reserve_os_memory", "deprecated_segment_cache", "page_reset",
    "abandoned_page_decommit", "deprecated_segment_reset", "eager_commit_delay",
    "decommit_delay", "use_numa_nodes", "limit_os_alloc", "os_tag", "max_errors",
    "max_warnings", "max_segment_reclaim", "allow_decommit", "segment_decommit_delay",
    "decommit_extend_delay", "destroy_on_exit",
)

# mi_option_desc_t on LP64: long, enum, enum, pointer, pointer
DESC = struct.Struct("<qiiQQ")
NAME_OFFSET = 16                 # offsetof(mi_option_desc_t, name)
UNINIT = 0                       # mi_init_t: not yet read from the environment
FIRST_NAME = b"show_errors"      # the name of option 0 (mi_option_show_errors)
NAME_MAX = 64                    # option names are short (mi_option_init's buffer is 64 + 1)
MAPPING_MAX = 16 << 20           # a mapping of the library larger than this is not read


def locate(read: Callable[[int, int], bytes | None],
           mappings: Sequence[tuple[int, int, str]], names: Sequence[str]) -> int | None:
    """Address of the option table, or None.  READ(addr, n) reads the
    target's memory (None when unmapped); MAPPINGS are the library's
    [(start, end, perms)]; NAMES the options in enum order."""
    if not names:
        return None
    data = {}
    for start, end, perms in mappings:
        if "x" in perms or end - start > MAPPING_MAX:
            continue
        got = read(start, end - start)
        if got is not None:
            data[start] = (perms, got)

    def cstring(addr: int) -> bytes | None:
        for start, (_, got) in data.items():
            if start <= addr < start + len(got):
                tail = got[addr - start: addr - start + NAME_MAX + 1]
                end = tail.find(b"\0")
                return tail[:end] if end >= 0 else None
        return None

    first = [start + i for start, (_, got) in data.items()
             for i in _find_all(got, FIRST_NAME + b"\0")]
    for start, (perms, got) in data.items():
        if "w" not in perms:
            continue
        for name_at in first:
            needle = struct.pack("<Q", name_at)
            for i in _find_all(got, needle):
                off = i - NAME_OFFSET
                if off >= 0 and _matches(got, off, names, cstring):
                    return start + off
    return None


def _find_all(hay: bytes, needle: bytes) -> list[int]:
    out, i = [], hay.find(needle)
    while i >= 0:
        out.append(i)
        i = hay.find(needle, i + 1)
    return out


def _matches(got: bytes, off: int, names: Sequence[str],
             cstring: Callable[[int], bytes | None]) -> bool:
    if off + DESC.size * len(names) > len(got):
        return False
    for index, name in enumerate(names):
        _, init, option, name_at, _ = DESC.unpack_from(got, off + index * DESC.size)
        if option != index or init not in (0, 1, 2) or cstring(name_at) != name.encode():
            return False
    return True


def values(raw: bytes, count: int) -> list[tuple[int, int]]:
    """[(value, init)] of COUNT entries read at the table."""
    return [(value, init) for value, init, _, _, _ in
            (DESC.unpack_from(raw, i * DESC.size) for i in range(count))]
