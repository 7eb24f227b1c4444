"""google/tcmalloc (the Abseil-era TCMalloc): what the rest of the code asks of it."""

from __future__ import annotations

from typing import Any

from collectors.allocators.interface import has_symbol, Release, Signature, Vocabulary
from collectors.allocators.gperftools.home import Tcmalloc

SIZE_MAX = (1 << 64) - 1    # ReleaseMemoryToSystem(SIZE_MAX): everything it can (tcmalloc/malloc_extension.h)


def _release(c: Any, fn: int) -> None:
    c.call(fn, SIZE_MAX)        # void (tcmalloc/malloc_extension.cc)


class GoogleTcmalloc(Tcmalloc):
    def signature(self, elf: Any, names: set[str], base: str, path: str,
                  where: str) -> Signature | None:
        if "TCMalloc_Internal_GetStats" not in names and \
                "MallocExtension_Internal_GetNumericProperty" not in names:
            return None
        return Signature("tcmalloc-google", evidence=[
            f"{base} defines TCMalloc_Internal_GetStats/MallocExtension_Internal_GetNumericProperty ({where})"],
            defines_malloc="malloc" in names)

    def in_process(self, lib: Any, path: str) -> Signature | None:
        if has_symbol(lib, "MallocExtension_Internal_GetNumericProperty"):
            return Signature("tcmalloc-google")
        return None


ALLOCATOR = GoogleTcmalloc(
    kind="tcmalloc-google", name="google tcmalloc",
    reader="collectors.allocators.google_tcmalloc.reader",
    release=Release("MallocExtension_Internal_ReleaseMemoryToSystem(SIZE_MAX)",
                    "MallocExtension_Internal_ReleaseMemoryToSystem", _release),
    heap_profiler="collectors.allocators.google_tcmalloc.heapprof",
    vocabulary=Vocabulary(
        resident_caveat="physical_memory_used counts mapped spans never touched as physical",
    ),
)
