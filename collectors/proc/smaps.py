"""/proc/PID/smaps_rollup and /proc/PID/smaps (fs/proc/task_mmu.c
``__show_smap``): "Key:   N kB" lines, one block per mapping (smaps) or one
for the whole process (smaps_rollup, Linux 4.14+)."""

from __future__ import annotations

from collectors.proc.status import KB, KB_SUFFIX


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
