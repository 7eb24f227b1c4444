"""glibc malloc (ptmalloc2): what the rest of the code asks of it."""

from __future__ import annotations

from typing import Any
import ctypes
import os

from collectors.allocators.interface import Base, Release, Signature, Vocabulary
from collectors.allocators.glibc.knobs import Knobs

TRIM_PAD = 0                # malloc_trim(pad): keep nothing at the top (malloc/malloc.c)


def _trim(c: Any, fn: int) -> int:
    rv: int = c.call(fn, TRIM_PAD)
    return rv


class Glibc(Base):
    def signature(self, elf: Any, names: set[str], base: str, path: str,
                  where: str) -> Signature | None:
        defines_malloc = "malloc" in names
        # malloc_info lives in malloc/malloc.c with malloc itself (since
        # glibc 2.10): every glibc that defines __libc_malloc defines it.
        # __libc_malloc with only mallinfo is another allocator behind
        # glibc's names (Chromium's PartitionAlloc shim: other.Unknown).
        if "__libc_malloc" in names and "malloc_info" in names:
            return Signature("glibc", variant=None, evidence=[
                f"{base} defines __libc_malloc and malloc_info ({where})"], defines_malloc=defines_malloc)
        if base.startswith("libc_malloc_debug"):
            return Signature("glibc", variant="malloc-debug", evidence=[
                f"{base}: glibc's malloc debugging library"], defines_malloc=defines_malloc)
        return None

    def counters(self, reader: Any) -> dict[str, tuple[Any, str, str, str]]:
        # glibc keeps no lock or traffic counter: the arena count from the
        # malloc_info walk against the thread count is the hint.
        out: dict[str, tuple[Any, str, str, str]] = {}
        arenas = ((reader.native().get("malloc_info") or {}).get("arenas"))
        if isinstance(arenas, list):
            out["glibc.arenas"] = (len(arenas), "count", "gauge", "malloc_info <heap nr=...>")
        return out


    def in_process(self, lib: Any, path: str) -> Signature | None:
        base = os.path.basename(path or "")
        if base.startswith("libc.so") or base.startswith("libc-"):
            return Signature("glibc")
        return None

    def self_version(self, lib: Any) -> str | None:
        fn = ctypes.CDLL(None).gnu_get_libc_version
        fn.restype = ctypes.c_char_p
        v: str = fn().decode()
        return v


ALLOCATOR = Glibc(
    kind="glibc", name="glibc", banner="glibc",
    reader="collectors.allocators.glibc.reader",
    release=Release("malloc_trim(0)", "malloc_trim", _trim),
    knobs=Knobs(),
    vocabulary=Vocabulary(
        findings=("glibc-free-held", "glibc-arena-sprawl", "glibc-top-chunk",
                  "wall-arena-lock/glibc", "wall-mmap-churn"),
        # glibc: arena system bytes + mmapped chunks (an upper bound)
        held_fallback="mapped",
        held_fallback_label="glibc arenas and mmapped chunks, upper bound",
        always_loaded=True,
    ),
)
