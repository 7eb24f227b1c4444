"""Where allocator code lies in a process: the ranges a running thread must
not be inside (PC) nor have return addresses in when the remote engine
borrows it (collectors.engine.remote's ``forbidden_ranges``), and the span of
an allocator linked into the executable.  Which global functions certainly
belong to an allocator is its home's ``anchor``."""

from __future__ import annotations

import os
from typing import Any

from collectors.allocators import registry
from collectors.binary.elf import STB_LOCAL, STT_FUNC, STT_GNU_IFUNC

# fewer anchors than this: the symbols do not delimit the allocator
MIN_ANCHORS = 3
# the C library and the loader: glibc's internal malloc code lies outside its
# exported symbols, so their whole text is forbidden
LIBC_AND_LOADER = ("libc.so", "libc.musl", "ld-linux", "ld-musl", "libpthread")


def static_allocator_ranges(obj: Any, kind: str, prefix: str | None
                            ) -> list[tuple[int, int, str]] | None:
    """Code ranges of an allocator of KIND linked into the executable OBJ.

    The linker lays each archive member's code out contiguously, but GCC
    splits it between .text, .text.unlikely (cold blocks) and .text.startup,
    so the allocator's code forms a few clusters.  Walking the functions in
    address order, a cluster is a maximal run that starts and ends with an
    anchor (a global function certainly the allocator's: its home's
    ``anchor``) and contains no foreign global function (such as main);
    static functions inside a run are the allocator's.  None when .symtab is
    missing (stripped) or names too few anchors: the caller then forbids the
    whole text."""
    home = registry.for_kind(kind)
    symtab = obj.elf.symtab(obj.opener.open) if obj.elf is not None else {}
    funcs = sorted((s for s in symtab.values() if s.type in (STT_FUNC, STT_GNU_IFUNC) and s.st_value),
                   key=lambda s: s.st_value)
    if obj.bias is None or sum(1 for s in funcs if home.anchor(prefix, s.name)) < MIN_ANCHORS:
        return None
    out = []
    start = end = None
    for s in funcs:
        if home.anchor(prefix, s.name):
            if start is None:
                start = s.st_value
            end = max(end or 0, s.st_value + max(s.st_size, 1))
        elif s.bind != STB_LOCAL and start is not None:      # a foreign global ends the run
            out.append((obj.bias + start, obj.bias + end, f"{kind} (static)"))
            start = end = None
    if start is not None:
        out.append((obj.bias + start, obj.bias + end, f"{kind} (static)"))
    return out


def forbidden_ranges(image: Any, detection: Any) -> list[tuple[int, int, str]]:
    """Executable ranges a borrowed thread must not be inside (PC) nor have
    return addresses in (near its stack top): the C library and the loader
    (glibc's internal malloc code lies outside its exported symbols), and
    the allocator's code.  For an allocator linked into the executable that
    is its own span (static_allocator_ranges), else the executable's whole
    text (then only threads parked in an idle wait from outside the
    executable qualify: conservative).  The non-libc entries are what the
    futex stack walk treats as allocator code."""
    return forbidden_parts(image, detection)[0]


def forbidden_parts(image: Any, detection: Any
                    ) -> tuple[list[tuple[int, int, str]], frozenset[str]]:
    """(forbidden_ranges, undelimited): the ranges, and the names of those
    that are an executable's whole text because the allocator linked into
    it could not be delimited (a frame there may be the program's own, so
    it proves no allocator code)."""
    serving = detection.serving
    out = []
    whole_exe = set()
    for obj in image.objects:
        base = os.path.basename(obj.path)
        whole = any(n in base for n in LIBC_AND_LOADER)
        if obj is serving:
            if obj is image.exe:
                alloc = detection.allocator
                spans = static_allocator_ranges(obj, alloc.kind, alloc.prefix)
                if spans is not None:
                    out.extend(spans)
                    continue
                whole_exe.add(base)
            whole = True
        if whole:
            for m in image.maps:
                if m.path == obj.path and "x" in m.perms:
                    out.append((m.start, m.end, base))
    return out, frozenset(whole_exe)
