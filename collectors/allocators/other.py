"""Allocators allocdiag recognises but cannot read: musl's mallocng, and
"unknown" (an object that defines malloc and matches nothing known)."""

from __future__ import annotations

from typing import Any

from collectors.allocators.interface import Base, Signature


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
            return Signature("unknown", evidence=[f"{base} defines malloc but matches no known allocator"],
                             defines_malloc=True)
        return None


MUSL = Musl(kind="musl", name="musl")
UNKNOWN = Unknown(kind="unknown", name="unknown")
