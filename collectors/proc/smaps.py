"""/proc/PID/smaps_rollup and /proc/PID/smaps (fs/proc/task_mmu.c
``__show_smap``): "Key:   N kB" lines, one block per mapping (smaps) or one
for the whole process (smaps_rollup, Linux 4.14+)."""

from __future__ import annotations

import re

from collectors.proc.maps import Mapping, parse_maps
from collectors.proc.status import KB, KB_SUFFIX
from diag.model.errors import MalformedData

# A mapping's header line ("start-end perms offset dev inode [path]", the
# maps format) and its one "Rss:" line; every other line of a block starts
# with a field name.  Found at C speed: a glibc churn process's smaps (858
# lines) took ~0.75 ms of Python line by line, a recording paid it each
# snapshot.
_HEADER_RE = re.compile(rb"^[0-9a-f]+-[0-9a-f]+ .*$", re.M)
_RSS_RE = re.compile(rb"^Rss:\s+(\d+) kB$", re.M)


def sum_kb_lines(data: bytes) -> dict[bytes, int]:
    """Sum every ``Key:   N kB`` line, in bytes (one block for rollup, many for smaps)."""
    out: dict[bytes, int] = {}
    for line in data.split(b"\n"):
        if not line.endswith(KB_SUFFIX):
            continue
        key, sep, rest = line.partition(b":")
        if not sep:
            continue
        try:
            value = int(rest.removesuffix(KB_SUFFIX)) * KB
        except ValueError:
            continue
        out[key] = out.get(key, 0) + value
    return out


def sum_present(d: dict[bytes, int], *keys: bytes) -> int | None:
    """The sum of the KEYS present in D; None when none is."""
    vals = [d[k] for k in keys if k in d]
    return sum(vals) if vals else None


def rss_by_mapping(data: bytes) -> list[tuple[Mapping, int]]:
    """[(Mapping, Rss in bytes)] of a whole /proc/PID/smaps, in its order.
    Raises MalformedData on a damaged header (parse_maps) or when the
    blocks do not each have one Rss line."""
    maps = parse_maps(b"\n".join(_HEADER_RE.findall(data)) + b"\n") if data else []
    rss = _RSS_RE.findall(data)
    if len(rss) != len(maps):
        raise MalformedData(f"smaps: {len(maps)} mappings but {len(rss)} Rss lines")
    return [(m, int(kb) * KB) for m, kb in zip(maps, rss)]
