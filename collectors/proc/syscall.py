"""/proc/PID/task/TID/syscall: what a thread that is not running is doing,
read without stopping it (fs/proc/base.c ``proc_pid_syscall``).

Three shapes: ``nr a0 a1 a2 a3 a4 a5 sp pc`` for a thread blocked in a
system call (nr in decimal, the rest in hex), ``-1 sp pc`` for one blocked
outside a system call (stopped in user code), ``running`` for one on a CPU
(its registers are not readable then).
"""

from typing import NamedTuple

SYSCALL_LINE_FIELDS = 9           # nr, six arguments, sp, pc
SYSCALL_ARGS = slice(1, 7)
SP_FROM_END, PC_FROM_END = 2, 1   # in both shapes that have them
NOT_IN_SYSCALL = -1               # nr of "-1 sp pc" and of "running"


class Syscall(NamedTuple):
    nr: int                       # NOT_IN_SYSCALL outside a system call or running
    args: tuple[int, ...]         # the six arguments; () outside a system call
    sp: int | None                # None: running
    pc: int | None


RUNNING = Syscall(NOT_IN_SYSCALL, (), None, None)


def parse_syscall(data: bytes) -> Syscall:
    """The Syscall of DATA, a syscall file's bytes; RUNNING for "running"
    (or an empty or unrecognised line: nothing known of the thread).
    Raises ValueError for a field that is not a number."""
    fields = data.split()
    if len(fields) == SYSCALL_LINE_FIELDS:
        return Syscall(int(fields[0]), tuple(int(x, 16) for x in fields[SYSCALL_ARGS]),
                       int(fields[-SP_FROM_END], 16), int(fields[-PC_FROM_END], 16))
    if len(fields) == 3:
        return Syscall(int(fields[0]), (), int(fields[-SP_FROM_END], 16),
                       int(fields[-PC_FROM_END], 16))
    return RUNNING
