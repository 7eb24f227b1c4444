"""/proc/PID/stat: the one reader of a process's start time, the key that
tells a process from a later one with the same pid (proc(5) field 22,
``starttime``, clock ticks since boot), and of its state and flags.

``comm`` (field 2) may hold spaces and parentheses: fields are counted after
the last ")" (fs/proc/array.c ``do_task_stat`` prints "(%s)" of the raw comm).
"""

from __future__ import annotations

# Fields counted from field 3 (``state``), the first after "(comm)" (proc(5) numbering - 3)
STAT_STATE_AFTER_COMM = 0        # field 3
STAT_FLAGS_AFTER_COMM = 6        # field 9, task->flags
STAT_STARTTIME_AFTER_COMM = 19   # field 22
# fs/proc/array.c task_state_array: a task that exited and awaits its parent's wait()
ZOMBIE_STATES = (b"Z", b"X")


def fields_after_comm(data: bytes) -> list[bytes]:
    """The fields of /proc/PID/stat bytes after "(comm)": index 0 is field 3
    ([] when there is no ")": not a stat line)."""
    _comm, sep, rest = data.rpartition(b")")
    return rest.split() if sep else []


def parse_state(data: bytes) -> bytes | None:
    """The one-letter state (b"R", b"S", b"Z" ...) in /proc/PID/stat bytes; None when malformed."""
    fields = fields_after_comm(data)
    return fields[STAT_STATE_AFTER_COMM] if fields else None


def parse_start_time(data: bytes) -> int | None:
    """The start time in /proc/PID/stat bytes; None when malformed.  ``comm``
    may hold spaces and parentheses, so fields are counted after the last ")"."""
    try:
        return int(fields_after_comm(data)[STAT_STARTTIME_AFTER_COMM])
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
