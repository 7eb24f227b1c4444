"""The Go runtime's heap: an allocator allocdiag recognises but does not
call (the Go runtime manages its heap itself, not malloc)."""

from __future__ import annotations

from typing import Any

from collectors.allocators.interface import Base, LazyFreeAdvice, Signature, Vocabulary

WHOSE_HEAP = "the Go runtime manages this heap; allocdiag reads no Go runtime statistics yet"
NO_STATS = WHOSE_HEAP + " (the kernel's and the cgroup's figures above are complete)"


class GoRuntime(Base):
    def signature(self, elf: Any, names: set[str], base: str, path: str,
                  where: str) -> Signature | None:
        if not elf.is_go:
            return None
        return Signature("go", evidence=[f"{base}: Go binary (.go.buildinfo/.gopclntab sections)"],
                         defines_malloc="malloc" in names)

    def version(self, obj: Any) -> str | None:
        if obj.elf is None:
            return None
        v: str | None = obj.elf.go_version or obj.elf.rodata_version("go", obj.opener.open)
        return v


ALLOCATOR = GoRuntime(
    kind="go", name="the Go runtime", banner="go",
    vocabulary=Vocabulary(
        lazyfree=LazyFreeAdvice(
            cause="the Go runtime (MADV_FREE before Go 1.16, or GODEBUG=madvdontneed=0)"),
        no_stats=NO_STATS,
        whose_heap="a Go program ({allocator}): " + WHOSE_HEAP,
        own_heap_note=("the Go runtime manages the Go heap itself (not malloc); allocdiag reads "
                       "no Go runtime statistics yet"),
    ),
)
