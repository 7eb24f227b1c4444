"""/proc/PID/stat: the one reader of a process's start time, the key that
tells a process from a later one with the same pid (proc(5) field 22,
``starttime``, clock ticks since boot)."""

from __future__ import annotations

STAT_STARTTIME_AFTER_COMM = 19   # field 22 counted from field 3, the first after "(comm)"


def parse_start_time(data: bytes) -> int | None:
    """The start time in /proc/PID/stat bytes; None when malformed.  ``comm``
    may hold spaces and parentheses, so fields are counted after the last ")"."""
    try:
        return int(data.rsplit(b")", 1)[1].split()[STAT_STARTTIME_AFTER_COMM])
    except (IndexError, ValueError):
        return None


def start_time(pid: int, procfs: str = "/proc") -> int | None:
    """PID's start time (clock ticks since boot), or None when it is gone or
    unreadable."""
    try:
        with open(f"{procfs}/{pid}/stat", "rb") as f:
            return parse_start_time(f.read())
    except OSError:
        return None
