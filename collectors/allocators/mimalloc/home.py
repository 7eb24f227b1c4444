"""mimalloc: what the rest of the code asks of it."""

from __future__ import annotations

from typing import Any
import ctypes

from collectors.engine.memory import MemoryReader
from collectors.proc.pagemap import present_caveat
from diag.model import Value
from diag.model.errors import AllocdiagError
from collectors.allocators.interface import Base, has_symbol, LazyFreeAdvice, Release, Signature, Vocabulary
from collectors.allocators.mimalloc.knobs import Knobs

ENDBR64 = b"\xf3\x0f\x1e\xfa"   # CET landing pad that may open a function (x86-64)
MOV_EAX_IMM32 = 0xB8            # mov $imm32, %eax
RET = 0xC3
FORCE = 1                       # mi_collect(bool force) (include/mimalloc.h)
# MI_MALLOC_VERSION encodings (include/mimalloc.h): 2.4+ major*10000+minor*100+patch,
# before that major*100+minor*10+patch (209 = 2.0.9).
VERSION_WIDE = 10000


def version_text(v: int) -> str:
    """MI_MALLOC_VERSION -> "major.minor.patch": 209 is 2.0.9, 20401 is 2.4.1."""
    if v >= VERSION_WIDE:
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    return f"{v // 100}.{v // 10 % 10}.{v % 10}"


def walk_segments(run: Any, image: Any, stats: dict[str, Any], native: dict[str, Any]) -> None:
    """A release mimalloc counts no allocated bytes: walk its segments
    (segments.py, no stop; RUN is the snapshot's collector runner) and, for a pinned build, make
    ``allocated`` a real number."""
    # imported here: detection imports every home, and only a mimalloc
    # snapshot walks segments (issue 23)
    from collectors.allocators.mimalloc import segments
    res = run("mimalloc_walk", lambda: segments.collect(image))
    if res is None:
        return
    w, desc = res
    if w is None:
        native["mimalloc_walk"] = {"ok": False, "reason": desc}
        return
    stats["allocated"] = Value.derived(
        w.allocated, f"segment walk of mimalloc {desc}: sum over pages of (used - blocks "
                     f"pending on xthread_free and thread_delayed_free) x block size")
    if stats.get("active") is None or stats["active"].value is None:
        stats["active"] = Value.derived(
            w.active, "segment walk: sum over pages holding live blocks of capacity x block size")
    if w.resident is not None:
        mib = sum(b - a for a, b in w.spans) >> 20
        stats["resident"] = Value.measured(
            w.resident, f"/proc/PID/pagemap: present pages of the {w.segments} mimalloc "
                        f"segments walked ({mib} MiB of address space)" + present_caveat())
    walk = w._asdict()
    del walk["spans"]
    native["mimalloc_walk"] = {"ok": True, "build": desc, **walk}
    _count_again_after_walk(image, stats, native)


def _count_again_after_walk(image: Any, stats: dict[str, Any], native: dict[str, Any]) -> None:
    """The committed and reserved counts are read before the stop, the walk
    after it.  A heap that grew in between shows the walk more present pages
    or carved blocks than the count said: measured on a 1.5 GiB burst, a
    snapshot that waited 1.5 s for the running thread to stop had counted 64
    MiB committed and walked 1.5 GiB resident, an order no instant had.
    Where the counts are read from memory (_mi_stats_main, its address
    checked), they are read again after the walk, and those are reported:
    true at a moment after every page the walk saw."""
    sm = native.get("stats_main")
    committed = stats.get("committed")
    if not sm or committed is None or committed.value is None:
        return
    walked = max((stats[k].value for k in ("resident", "active")
                  if stats.get(k) is not None and stats[k].value is not None), default=None)
    if walked is None or walked <= committed.value:
        return
    from collectors.allocators.mimalloc import statsmain
    try:
        with MemoryReader(image.pid, image.procfs.root) as mem:
            words = statsmain.read_os_counts(mem.read, int(sm["address"], 16))
    except AllocdiagError:
        return
    if not words:
        return
    counts = statsmain.os_counts(words)
    why = (f"; read again after the segment walk, which found {walked} bytes against "
           f"{committed.value} counted before the stop: the heap grew during the snapshot")
    # with the counts read from memory, committed and mapped both came from them
    # (mimalloc_stats.normalise_mimalloc)
    stats["committed"] = Value.measured(counts["committed"]["current"], committed.source + why)
    mapped = stats.get("mapped")
    if mapped is not None and mapped.value is not None:
        stats["mapped"] = Value.measured(counts["reserved"]["current"], mapped.source + why)


def _collect(c: Any, fn: int) -> None:
    c.call(fn, FORCE)           # void mi_collect(bool force) (include/mimalloc.h)


def _flatten(out: dict[str, tuple[Any, str, str, str]], prefix: str, node: Any, kind: str,
             source: str, depth: int = 0) -> None:
    if not isinstance(node, dict) or depth > 3:
        return
    for k, v in node.items():
        if isinstance(v, dict):
            _flatten(out, f"{prefix}.{k}", v, kind, source, depth + 1)
        elif isinstance(v, int) and not isinstance(v, bool):
            out[f"{prefix}.{k}"] = (v, "count", kind, source)


class Mimalloc(Base):
    def anchor(self, prefix: str | None, name: str) -> bool:
        # include/mimalloc.h (mi_*) and include/mimalloc/internal.h (_mi_*)
        return name.startswith(("mi_", "_mi_"))

    def signature(self, elf: Any, names: set[str], base: str, path: str,
                  where: str) -> Signature | None:
        if "mi_version" not in names and "mi_malloc" not in names:
            return None
        return Signature("mimalloc", evidence=[f"{base} defines mi_version ({where})"],
                         defines_malloc="malloc" in names)

    def version(self, obj: Any) -> str | None:
        """mi_version() is ``return MI_MALLOC_VERSION;``: on x86-64 that compiles
        to ``mov $imm32, %eax; ret`` (after an optional endbr64).  Decode the
        immediate (major*100+minor*10+patch in 1.x/2.x, e.g. 209 = 2.0.9)."""
        if obj.elf is None:
            return None
        sym = obj.elf.lookup("mi_version", obj.opener.open)
        if sym is None:
            return None
        code = obj.elf.text_bytes(sym.st_value, 16, obj.opener.open) or b""
        if code.startswith(ENDBR64):
            code = code[len(ENDBR64):]
        if len(code) >= 6 and code[0] == MOV_EAX_IMM32 and code[5] == RET:
            return version_text(int.from_bytes(code[1:5], "little"))
        return None

    def counters(self, reader: Any) -> dict[str, tuple[Any, str, str, str]]:
        # the numbers of its stats output: process_info, and the stats
        # rows/counters when the build keeps them
        out: dict[str, tuple[Any, str, str, str]] = {}
        native = reader.native()
        for k, v in (native.get("process_info") or {}).items():
            if isinstance(v, int) and not isinstance(v, bool):
                kind = "delta" if k in ("page_faults", "user_msecs", "system_msecs") \
                    else "gauge"
                out[f"mimalloc.process_info.{k}"] = (v, "count", kind,
                                                     f"mi_process_info {k}")
        for count in ("reserved", "committed"):
            for k, v in ((native.get("stats_main") or {}).get(count) or {}).items():
                if k in ("peak", "current"):
                    out[f"mimalloc.stats_main.{count}.{k}"] = (
                        v, "bytes", "gauge", f"_mi_stats_main.{count}.{k} (read from memory)")
        _flatten(out, "mimalloc.stats", (native.get("stats") or {}).get("counters"),
                 "delta", "mi_stats_print counters")
        return out


    def in_process(self, lib: Any, path: str) -> Signature | None:
        return Signature("mimalloc") if has_symbol(lib, "mi_version") else None

    def self_version(self, lib: Any) -> str | None:
        if not has_symbol(lib, "mi_version"):
            return None
        lib.mi_version.restype = ctypes.c_int
        return version_text(lib.mi_version())


ALLOCATOR = Mimalloc(
    kind="mimalloc", name="mimalloc",
    reader="collectors.allocators.mimalloc.reader",
    release=Release("mi_collect(true)", "mi_collect", _collect),
    knobs=Knobs(),
    memory_walk=walk_segments,
    vocabulary=Vocabulary(
        findings=("mimalloc-decommit-delay",),
        # Not page_reset=0: measured, it turns the LazyFree pages into
        # ordinary resident ones (RSS unchanged); decommit_delay=0 decommits
        # freed pages at once with MADV_DONTNEED, and RSS falls
        # (tests/test_knob_effects.py).
        lazyfree=LazyFreeAdvice(
            cause="mimalloc page/segment reset (MADV_FREE)",
            knob="decommit_delay", suggested="0",
            how=("MIMALLOC_DECOMMIT_DELAY=0 (purge_delay in 2.1+) at start: freed pages are "
                 "decommitted (MADV_DONTNEED) at once and leave RSS; MIMALLOC_PAGE_RESET=0 "
                 "alone would only keep them as ordinary resident pages")),
        library_word="mimalloc",
    ),
)
