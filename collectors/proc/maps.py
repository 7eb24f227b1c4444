"""/proc/PID/maps: the one parser of allocdiag (proc(5), fs/proc/task_mmu.c
``show_map_vma``: ``start-end perms offset dev inode path``)."""

from __future__ import annotations

from typing import NamedTuple

from diag.model.errors import MalformedData

DELETED_SUFFIX = b" (deleted)"    # fs/proc/task_mmu.c: a file unlinked while mapped


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


def parse_maps(data: bytes) -> list[Mapping]:
    """/proc/PID/maps bytes -> [Mapping]; a line that is not a mapping (a
    damaged capture) raises MalformedData naming it."""
    out = []
    for lineno, line in enumerate(data.split(b"\n"), 1):
        if not line:
            continue
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        addr, perms, offset, dev, inode = parts[:5]
        start, _, end = addr.partition(b"-")
        path = parts[5].strip() if len(parts) > 5 else b""
        deleted = path.endswith(DELETED_SUFFIX)
        if deleted:
            path = path[:-len(DELETED_SUFFIX)]
        try:
            out.append(Mapping(int(start, 16), int(end, 16), perms.decode(), int(offset, 16),
                               dev.decode(), int(inode),
                               path.decode(errors="surrogateescape") if path else None, deleted))
        except ValueError:      # UnicodeDecodeError included
            raise MalformedData(f"maps line {lineno}: not a mapping: {line[:100]!r}") from None
    return out
