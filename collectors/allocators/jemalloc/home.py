"""jemalloc: what the rest of the code asks of it."""

from __future__ import annotations

from typing import Any
import ctypes

from collectors import lazylog
from collectors.allocators.interface import Base, has_symbol, LazyFreeAdvice, Release, Signature, Vocabulary
from collectors.allocators.jemalloc.knobs import Knobs
from collectors.allocators import common

log = lazylog.getLogger("collectors.allocators")

# Symbol prefixes seen in the field: none (Debian's libjemalloc2), je_
# (--with-jemalloc-prefix=je_), _rjem_ (Rust's tikv-jemallocator).
PREFIXES = ("", "je_", "_rjem_")
MALLCTL_ARENAS_ALL = 4096                       # include/jemalloc/jemalloc_macros.h.in
PURGE = f"arena.{MALLCTL_ARENAS_ALL}.purge"     # jemalloc src/ctl.c arena_i_purge_ctl


def prefix_of(names: set[str]) -> str | None:
    """The prefix P for which both P+mallctl and P+malloc_stats_print exist."""
    for name in names:
        prefix = name.removesuffix("mallctl")
        if prefix != name and prefix + "malloc_stats_print" in names:
            return prefix
    return None


def _purge(c: Any, mallctl: int) -> int:
    name = c.scratch(32)
    c.write(name, PURGE.encode() + b"\0")
    rv: int = c.call(mallctl, name, 0, 0, 0, 0) & common.INT_RETURN
    return rv


# jemalloc's public API (include/jemalloc/jemalloc_macros.h.in, jemalloc.h's
# JEMALLOC_ALIASES); the internals are in the je_ namespace (private_namespace.h)
PUBLIC = frozenset((
    "aligned_alloc", "calloc", "dallocx", "free", "mallctl", "mallctlbymib", "mallctlnametomib",
    "malloc", "malloc_stats_print", "malloc_usable_size", "mallocx", "memalign", "nallocx",
    "posix_memalign", "rallocx", "realloc", "sallocx", "sdallocx", "valloc", "xallocx"))
PRIVATE_NAMESPACE = "je_"


class Jemalloc(Base):
    def anchor(self, prefix: str | None, name: str) -> bool:
        prefix = prefix or ""
        return name.startswith(PRIVATE_NAMESPACE) or (
            name.startswith(prefix) and name[len(prefix):] in PUBLIC)

    def signature(self, elf: Any, names: set[str], base: str, path: str,
                  where: str) -> Signature | None:
        prefix = prefix_of(names)
        if prefix is None:
            return None
        ev = f"{base} defines {prefix}mallctl and {prefix}malloc_stats_print ({where})"
        return Signature("jemalloc", prefix=prefix, evidence=[ev], defines_malloc="malloc" in names)

    def counters(self, reader: Any) -> dict[str, tuple[Any, str, str, str]]:
        from collectors.allocators.jemalloc import reader as jemalloc
        from collectors.allocators.jemalloc import counters as jemalloc_counters
        from diag.model.errors import Unsupported
        a = jemalloc.plan(reader.resolver(), reader.det.serving, reader.det.allocator, {})
        if not a.get("print"):
            raise Unsupported("this jemalloc build has no usable malloc_stats_print "
                              "(version other than 5.2/5.3)", pid=reader.pid)
        # the same print call as the snapshot reader: its measured stack need,
        # the output buffer from Call.buffer (never the borrowed stack)
        rp = reader.session(jemalloc.STACK_NEED)
        with rp.borrow() as c:
            raw = jemalloc_counters.gather(c, a)
        reader.pause_us.extend(rp.pause_us)
        out: dict[str, tuple[Any, str, str, str]] = jemalloc_counters.parse(raw)
        return out


    def in_process(self, lib: Any, path: str) -> Signature | None:
        return Signature("jemalloc") if has_symbol(lib, "mallctl") else None

    def self_version(self, lib: Any) -> str | None:
        cell, size = ctypes.c_char_p(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_char_p))
        lib.mallctl.argtypes = (ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                ctypes.c_void_p, ctypes.c_size_t)
        if lib.mallctl(b"version", ctypes.byref(cell), ctypes.byref(size), None, 0) == 0 \
                and cell.value is not None:
            return cell.value.decode()
        return None


ALLOCATOR = Jemalloc(
    kind="jemalloc", name="jemalloc", banner="jemalloc",
    reader="collectors.allocators.jemalloc.reader",
    release=Release('mallctl("arena.4096.purge")', "mallctl", _purge),
    knobs=Knobs(),
    heap_profiler="collectors.allocators.jemalloc.heapprof",
    vocabulary=Vocabulary(
        findings=("jemalloc-dirty-pages", "jemalloc-background-thread-off", "jemalloc-muzzy-pages",
                  "jemalloc-fragmentation", "jemalloc-too-many-arenas",
                  "wall-arena-lock/jemalloc", "wall-madvise-churn"),
        lazyfree=LazyFreeAdvice(
            cause=("jemalloc muzzy decay (muzzy_decay_ms={current}, {source}): dirty pages "
                   "are first purged with MADV_FREE"),
            knob="muzzy_decay_ms", suggested="0",
            how=("set muzzy_decay_ms:0 so purged pages are MADV_DONTNEED'd (leave RSS at once), "
                 "or a short finite value so the kernel view catches up quickly")),
        resident_caveat=("stats.resident is a maximum: it counts every active and dirty page as "
                         "resident, pages handed out but never touched included"),
        heap_profile_cost=("jemalloc samples about one allocation per 2^lg_prof_sample bytes: a "
                           "small cost while prof.active is on (bench/heapprof_cost.py measures it)."),
        library_word="jemalloc",
    ),
)
