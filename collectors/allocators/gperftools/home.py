"""gperftools tcmalloc (libtcmalloc.so.4, libtcmalloc_minimal.so.4): what
the rest of the code asks of it."""

from __future__ import annotations

from typing import Any
import ctypes
import os

from collectors.allocators.interface import Base, has_symbol, Release, Signature, Vocabulary
from collectors.allocators.gperftools.knobs import Knobs


def _release(c: Any, fn: int) -> None:
    # void MallocExtension_ReleaseFreeMemory(void) (malloc_extension_c.h):
    # rax after it is whatever the function left there, not a result
    c.call(fn)


class Tcmalloc(Base):
    """What both tcmallocs share: their own global functions as anchors, and
    GetStats' figures as contention counters."""

    def anchor(self, prefix: str | None, name: str) -> bool:
        # gperftools' tc_* (src/gperftools/tcmalloc.h.in) and MallocExtension*,
        # google's TCMalloc_* and MallocExtension_Internal_*, anything named tcmalloc
        return name.startswith(("tc_", "MallocExtension", "TCMalloc")) or "tcmalloc" in name

    def counters(self, reader: Any) -> dict[str, tuple[Any, str, str, str]]:
        """GetStats' layers (page heap, central, transfer, thread caches, spans,
        thread heaps) -- levels: tcmalloc has no lock or traffic counter -- and
        the *_count properties."""
        native = reader.native()
        out: dict[str, tuple[Any, str, str, str]] = {}
        summary = ((native.get("getstats") or {}).get("summary")) or {}
        for k, v in summary.items():
            if isinstance(v, int) and not isinstance(v, bool):
                unit = "count" if k in ("spans_in_use", "thread_heaps_in_use") else "bytes"
                out[f"tcmalloc.{k}"] = (v, unit, "gauge", f"MallocExtension::GetStats {k}")
        for k, v in (native.get("properties") or {}).items():
            if isinstance(v, int) and k.endswith("_count"):
                out[f"tcmalloc.{k}"] = (v, "count", "delta", f"GetNumericProperty {k}")
        return out


class Gperftools(Tcmalloc):
    def signature(self, elf: Any, names: set[str], base: str, path: str,
                  where: str) -> Signature | None:
        if "MallocExtension_GetNumericProperty" not in names and "tc_malloc" not in names:
            return None
        variant = "full" if "HeapProfilerStart" in names else "minimal"
        if "debug" in base:
            variant += "+debug"
        return Signature("tcmalloc", variant=variant, evidence=[
            f"{base} defines MallocExtension_GetNumericProperty ({where}); "
            f"{'HeapProfilerStart present: full' if variant.startswith('full') else 'no HeapProfilerStart: minimal'} library"],
            defines_malloc="malloc" in names)

    def in_process(self, lib: Any, path: str) -> Signature | None:
        if not has_symbol(lib, "MallocExtension_GetNumericProperty"):
            return None
        base = os.path.basename(path or "")
        return Signature("tcmalloc", variant="minimal" if "minimal" in base else None)

    def self_version(self, lib: Any) -> str | None:
        if not has_symbol(lib, "tc_version"):
            return None
        tv = lib.tc_version
        tv.argtypes = (ctypes.POINTER(ctypes.c_int),) * 2 + (ctypes.POINTER(ctypes.c_char_p),)
        tv.restype = ctypes.c_char_p
        v: str = tv(None, None, None).decode()
        return v


ALLOCATOR = Gperftools(
    kind="tcmalloc", name="gperftools tcmalloc", banner="gperftools",
    reader="collectors.allocators.gperftools.reader",
    release=Release("MallocExtension_ReleaseFreeMemory()", "MallocExtension_ReleaseFreeMemory",
                    _release),
    knobs=Knobs(),
    heap_profiler="collectors.allocators.gperftools.heapprof",
    vocabulary=Vocabulary(
        findings=("tcmalloc-pageheap-free", "tcmalloc-thread-caches"),
        resident_caveat=("total_physical_bytes counts the whole page heap that is not released as "
                         "physical, spans mapped but never touched included"),
        heap_profile_cost=("gperftools records every allocation and its stack (no sampling): "
                           "malloc-heavy code runs markedly slower while it is on "
                           "(bench/heapprof_cost.py measures it)."),
        library_word="tcmalloc",
        program_starts_profiler=True,
    ),
)
