"""Allocators allocdiag recognises but cannot read: musl's mallocng, and
"unknown" (an object that defines malloc and matches nothing known)."""

from __future__ import annotations

from typing import Any

from collectors.allocators.interface import Base, Signature, Vocabulary


class Musl(Base):
    def signature(self, elf: Any, names: set[str], base: str, path: str,
                  where: str) -> Signature | None:
        # musl: its malloc internals (mallocng) in a static binary's .symtab, or
        # a libc whose path says musl (Debian /usr/lib/x86_64-linux-musl/libc.so,
        # Alpine /lib/ld-musl-x86_64.so.1) and which defines malloc.
        defines_malloc = "malloc" in names
        if "__libc_malloc_impl" in names or "__malloc_donate" in names or \
                (defines_malloc and "musl" in path):
            return Signature("musl", evidence=[f"{base}: musl libc "
                                               f"({'mallocng symbols' if '__libc_malloc_impl' in names else 'path'})"],
                             defines_malloc=defines_malloc)
        return None


class Unknown(Base):
    def signature(self, elf: Any, names: set[str], base: str, path: str,
                  where: str) -> Signature | None:
        if "malloc" in names:
            glibc_names = sorted(n for n in GLIBC_ENTRY_NAMES if n in names)
            also = (f"; it also defines glibc's {', '.join(glibc_names)} but not malloc_info: "
                    "another allocator behind glibc's names") if glibc_names else ""
            return Signature("unknown", evidence=[
                f"{base} defines malloc but matches no known allocator{also}"], defines_malloc=True)
        return None


# glibc-only entry points an allocator shim may define to take glibc's place
GLIBC_ENTRY_NAMES = ("__libc_malloc", "mallinfo", "mallinfo2", "__malloc_hook")

MUSL = Musl(kind="musl", name="musl")
UNKNOWN = Unknown(kind="unknown", name="unknown", vocabulary=Vocabulary(
    no_stats="no live stats: the allocator serving malloc is not one allocdiag knows "
             "(the evidence says what was found)"))
