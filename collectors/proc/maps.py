"""/proc/PID/maps: the one parser of allocdiag (proc(5), fs/proc/task_mmu.c
``show_map_vma``: ``start-end perms offset dev inode path``)."""

import functools
from collections.abc import Iterable
from typing import NamedTuple

from diag.model.errors import MalformedData

DELETED_SUFFIX = b" (deleted)"    # fs/proc/task_mmu.c: a file unlinked while mapped
# the same as text: readlink(2) of /proc/PID/exe and map_files/ (fs/d_path.c) ends with it too
DELETED_TEXT = DELETED_SUFFIX.decode()
MAPS_FIELDS = 6                   # start-end perms offset dev inode [path]
PATH_FIELD = 5                    # index of the path: it may hold spaces
PERM_CHARS = frozenset(b"-rwxps")  # show_map_vma: r/w/x, then s (shared) or p (private)
PERMS_LEN = 4
UINT64_MAX = (1 << 64) - 1
_HEX = frozenset(b"0123456789abcdefABCDEF")
# The text encoding callers decode maps bytes with: paths are any bytes, and
# surrogateescape gives them back byte-exact (open() takes them as they are).
TEXT_ERRORS = "surrogateescape"


class Mapping(NamedTuple):
    """One line of /proc/PID/maps.  ``path`` is None for anonymous mappings and
    keeps pseudo names like "[heap]"; ``deleted`` marks "(deleted)" files."""

    start: int
    end: int
    perms: str
    offset: int
    dev: str
    inode: int
    path: str | None
    deleted: bool

    @property
    def maps_path(self) -> str:
        """The path as maps prints it: "" for anonymous memory, " (deleted)"
        kept (a heap profile's trailer keeps it so)."""
        if self.path is None:
            return ""
        return self.path + DELETED_TEXT if self.deleted else self.path


def _well_formed(addr: bytes, perms: bytes, offset: bytes, inode: bytes) -> bool:
    """What a lenient reader checks before taking a line (the shape pprof's
    and jeprof's maps regexes accept)."""
    start, sep, end = addr.partition(b"-")
    return (bool(sep) and bool(start) and bool(end) and set(start) <= _HEX
            and set(end) <= _HEX and bool(offset) and set(offset) <= _HEX
            and len(perms) == PERMS_LEN and set(perms) <= PERM_CHARS and inode.isdigit())


# Parsed maps kept by their bytes: one snapshot reads a process's maps up
# to three times (its build check, the thread chooser's stack bounds, the
# pages present outside stacks), mostly unchanged, and parsing costs ~0.1 ms
# for 120 lines, as much as the read.  A few entries: a host scan's
# processes pass through without holding memory.
PARSED_KEPT = 4


def parse_maps(data: bytes, *, strict: bool = True) -> list[Mapping]:
    """/proc/PID/maps bytes -> [Mapping]; a line that is not a mapping (a
    damaged capture) raises MalformedData naming it.  ``strict=False`` skips
    such lines, and empty or beyond-64-bit ranges, instead: what pprof and
    jeprof do with the maps trailer of a heap profile (a copy written by the
    program, possibly cut or edited)."""
    return list(_parsed(bytes(data), strict))


# What follows a line's address range ("perms offset dev inode path") is
# the same in every process that maps the same file, and in one process's
# successive reads: parsed once, kept by its bytes.  The maps of 210
# processes (200 copies of a C program under six preloads, 10 Pythons),
# ~9,400 lines, had 138 distinct tails; with them kept, a process's maps
# parse in ~60 us instead of ~120.  Bounded: cleared when full.
TAILS_KEPT = 4096
_tails: dict[bytes, tuple[str, int, str, int, str | None, bool]] = {}
_tuple_new = tuple.__new__       # Mapping's fields in order, without its Python-level __new__


@functools.lru_cache(maxsize=PARSED_KEPT)
def _parsed(data: bytes, strict: bool) -> tuple[Mapping, ...]:
    if strict:
        try:
            return _parsed_kernel_lines(data)
        except ValueError:      # a line not as the kernel writes it: the full parser names it
            pass
    return _parsed_any(data, strict)


def _parsed_kernel_lines(data: bytes) -> tuple[Mapping, ...]:
    """Lines as show_map_vma writes them ("start-end perms offset dev inode
    path", one space after the range); ValueError at anything else."""
    out = []
    tails = _tails
    for line in data.split(b"\n"):
        if not line:
            continue
        addr, _, tail = line.partition(b" ")
        rest = tails.get(tail)
        if rest is None:
            parts = tail.split(None, PATH_FIELD - 1)
            if len(parts) < PATH_FIELD - 1:
                raise ValueError("short line")
            perms, offset, dev, inode = parts[:PATH_FIELD - 1]
            path, deleted = _path(parts[PATH_FIELD - 1]) if len(parts) == MAPS_FIELDS - 1 \
                else (None, False)
            rest = (perms.decode(), int(offset, 16), dev.decode(), int(inode), path, deleted)
            if len(tails) >= TAILS_KEPT:
                tails.clear()
            tails[tail] = rest
        start, sep, end = addr.partition(b"-")
        if not sep:
            raise ValueError("no range")
        out.append(_tuple_new(Mapping, (int(start, 16), int(end, 16), *rest)))
    return tuple(out)


def _path(field: bytes) -> tuple[str | None, bool]:
    """A line's path field as (path, deleted): None for anonymous memory,
    " (deleted)" taken off and reported, decoded byte-exact (TEXT_ERRORS
    never fails)."""
    path = field.strip()
    deleted = path.endswith(DELETED_SUFFIX)
    path = path.removesuffix(DELETED_SUFFIX)
    return (path.decode(errors=TEXT_ERRORS) if path else None), deleted


def _parsed_any(data: bytes, strict: bool) -> tuple[Mapping, ...]:
    out = []
    for lineno, line in enumerate(data.split(b"\n"), 1):
        if not line:
            continue
        parts = line.split(None, PATH_FIELD)
        if len(parts) < PATH_FIELD:
            continue
        addr, perms, offset, dev, inode = parts[:PATH_FIELD]
        if not strict and not _well_formed(addr, perms, offset, inode):
            continue
        start, _, end = addr.partition(b"-")
        path, deleted = _path(parts[PATH_FIELD]) if len(parts) == MAPS_FIELDS else (None, False)
        try:
            m = Mapping(int(start, 16), int(end, 16), perms.decode(), int(offset, 16),
                        dev.decode(), int(inode), path, deleted)
        except ValueError:      # UnicodeDecodeError included
            if not strict:
                continue
            raise MalformedData(f"maps line {lineno}: not a mapping: {line[:100]!r}") from None
        if not strict and (m.start >= m.end or m.end > UINT64_MAX):
            continue
        out.append(m)
    return tuple(out)


def as_mappings(maps: str | bytes | Iterable[Mapping]) -> list[Mapping]:
    """MAPS as parsed mappings: maps text (decoded with TEXT_ERRORS), maps
    bytes, or mappings already parsed."""
    if isinstance(maps, str):
        return parse_maps(maps.encode(errors=TEXT_ERRORS))
    if isinstance(maps, (bytes, bytearray, memoryview)):
        return parse_maps(bytes(maps))
    return list(maps)


def executable_files(mappings: Iterable[Mapping]) -> list[Mapping]:
    """The executable file mappings: the objects whose code a stack can be in."""
    return [m for m in mappings
            if "x" in m.perms and m.path is not None and m.path.startswith("/")]
