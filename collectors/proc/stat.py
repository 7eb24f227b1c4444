"""/proc/PID/stat: the one reader of a process's start time, the key that
tells a process from a later one with the same pid (proc(5) field 22,
``starttime``, clock ticks since boot), and of its state and flags.

``comm`` (field 2) may hold spaces and parentheses: fields are counted after
the last ")" (fs/proc/array.c ``do_task_stat`` prints "(%s)" of the raw comm).
"""

import os
from typing import NamedTuple

from collectors.proc.readall import read_all

# Fields counted from field 3 (``state``), the first after "(comm)" (proc(5) numbering - 3)
STAT_STATE_AFTER_COMM = 0        # field 3
STAT_FLAGS_AFTER_COMM = 6        # field 9, task->flags
STAT_MINFLT_AFTER_COMM = 7       # field 10
STAT_MAJFLT_AFTER_COMM = 9       # field 12
STAT_UTIME_AFTER_COMM = 11       # field 14, clock ticks
STAT_STIME_AFTER_COMM = 12       # field 15, clock ticks
STAT_THREADS_AFTER_COMM = 17     # field 20
STAT_STARTTIME_AFTER_COMM = 19   # field 22
STAT_VSIZE_AFTER_COMM = 20       # field 23, bytes
STAT_RSS_AFTER_COMM = 21         # field 24, pages
# include/linux/sched.h: "I am a kernel thread" (task->flags, field 9)
PF_KTHREAD = 0x00200000
# The fields whose change means a process did something since it was last
# read: it ran (utime, stime), changed state, touched memory (minflt, majflt,
# rss), mapped or unmapped (vsize) or started a thread.  starttime tells a
# recycled pid from the process that had it.
ACTIVITY_FIELDS = (STAT_STATE_AFTER_COMM, STAT_MINFLT_AFTER_COMM, STAT_MAJFLT_AFTER_COMM,
                   STAT_UTIME_AFTER_COMM, STAT_STIME_AFTER_COMM, STAT_THREADS_AFTER_COMM,
                   STAT_STARTTIME_AFTER_COMM, STAT_VSIZE_AFTER_COMM, STAT_RSS_AFTER_COMM)
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
        return parse_start_time(read_all(f"{procfs}/{pid}/stat"))
    except OSError:
        return None


class StatLine(NamedTuple):
    """What the host scan takes from one /proc/PID/stat line."""

    state: bytes
    kernel_thread: bool
    cpu_ticks: int                  # utime + stime
    start_ticks: int                # starttime: clock ticks after boot
    activity: tuple[bytes, ...]     # ACTIVITY_FIELDS as printed: equal means idle since


def parse_stat_line(data: bytes) -> StatLine | None:
    """The host scan's fields of /proc/PID/stat bytes; None when malformed.
    The activity holds the comm too (a rename with prctl(PR_SET_NAME) may
    take less than a clock tick)."""
    head, sep, rest = data.rpartition(b")")
    fields = rest.split()
    if not sep:
        return None
    try:
        return StatLine(fields[STAT_STATE_AFTER_COMM],
                        bool(int(fields[STAT_FLAGS_AFTER_COMM]) & PF_KTHREAD),
                        int(fields[STAT_UTIME_AFTER_COMM]) + int(fields[STAT_STIME_AFTER_COMM]),
                        int(fields[STAT_STARTTIME_AFTER_COMM]),
                        (head,) + tuple(fields[i] for i in ACTIVITY_FIELDS))
    except (IndexError, ValueError):
        return None


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")      # the unit of utime, stime, starttime


def boot_time(procfs: str = "/proc") -> float | None:
    """The boot time (seconds since the epoch) from /proc/stat's ``btime``
    line, or None when it is unreadable: a start time in clock ticks after
    boot plus this is the process's create time."""
    try:
        with open(f"{procfs}/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return None
