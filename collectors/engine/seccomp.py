"""A target's seccomp filters, judged for the syscalls a remote call makes.

A call into a thread under a seccomp filter (``Seccomp: 2``: Docker's
default profile, systemd's ``SystemCallFilter=``, browser sandboxes) runs
its syscalls under that filter: ``malloc_trim``'s ``madvise``, a buffer's
``mmap``, a jemalloc purge.  A filter that kills on one of them kills the
target, with no ptrace stop to undo (measured: ``allocdiag release`` of a
glibc process whose filter returns ``SECCOMP_RET_KILL_PROCESS`` for
``madvise`` killed it with SIGSYS).

So such a call is resumed with PTRACE_SYSEMU.  The kernel reports each
syscall-entry stop *before* it runs the filter (kernel/entry/common.c
``syscall_trace_enter``: ptrace first, "Do seccomp after ptrace, to catch
any tracer changes"), and under SYSEMU returns right after that stop: the
syscall does not run and no filter sees it.  There the engine runs the
thread's filters itself on the same ``struct seccomp_data`` (this module).
A syscall the filters would let run or fail harmlessly is made again
(``callframe.Caller.syscall_stop``: rip back over the syscall instruction,
under PTRACE_SYSCALL); any other is left unmade, and the call sees the
-ENOSYS the entry code put in rax.

Skipping by ``orig_rax = -1`` at a PTRACE_SYSCALL stop, the usual ptrace
way, is not safe here: the filters then run on nr -1, and one that kills
what it does not know (a hand-written allowlist, as OpenSSH's sandbox)
killed the target (measured: audit ``syscall=-1``, SIGSYS).  libseccomp's
filters let -1 through for this reason; not every filter is libseccomp's.

The filters are the classic BPF programs the kernel kept
(PTRACE_SECCOMP_GET_FILTER, newest first); the instructions are the ones
kernel/seccomp.c ``seccomp_check_filter`` accepts, their names those of
include/uapi/linux/bpf_common.h and filter.h.
"""

from __future__ import annotations

import errno
import struct

from diag.model.records import record
from collectors.engine import abi, ptrace

# ---- actions (include/uapi/linux/seccomp.h) ------------------------------------------
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_KILL_THREAD = 0x00000000
SECCOMP_RET_TRAP = 0x00030000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_USER_NOTIF = 0x7FC00000
SECCOMP_RET_TRACE = 0x7FF00000
SECCOMP_RET_LOG = 0x7FFC0000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ACTION_FULL = 0xFFFF0000
SECCOMP_RET_DATA = 0x0000FFFF

ACTION_NAMES = {
    SECCOMP_RET_KILL_PROCESS: "SECCOMP_RET_KILL_PROCESS",
    SECCOMP_RET_KILL_THREAD: "SECCOMP_RET_KILL_THREAD",
    SECCOMP_RET_TRAP: "SECCOMP_RET_TRAP",
    SECCOMP_RET_ERRNO: "SECCOMP_RET_ERRNO",
    SECCOMP_RET_USER_NOTIF: "SECCOMP_RET_USER_NOTIF",
    SECCOMP_RET_TRACE: "SECCOMP_RET_TRACE",
    SECCOMP_RET_LOG: "SECCOMP_RET_LOG",
    SECCOMP_RET_ALLOW: "SECCOMP_RET_ALLOW",
}

# What the kernel does with these is harmless to the target: the syscall
# runs (ALLOW, LOG), or fails with the filter's errno (ERRNO), or with
# ENOSYS because its tracer -- allocdiag, which does not set
# PTRACE_O_TRACESECCOMP -- does not take the event (TRACE).  Every other
# action kills, raises SIGSYS, or hands the syscall to a supervisor process
# (USER_NOTIF); an unknown one kills (kernel/seccomp.c __seccomp_filter).
RUNS = frozenset({SECCOMP_RET_ALLOW, SECCOMP_RET_LOG, SECCOMP_RET_ERRNO, SECCOMP_RET_TRACE})

# ---- classic BPF (include/uapi/linux/bpf_common.h, filter.h) -------------------------
BPF_LD, BPF_LDX, BPF_ST, BPF_STX, BPF_ALU, BPF_JMP, BPF_RET, BPF_MISC = range(8)
BPF_W = 0x00
BPF_IMM, BPF_ABS, BPF_MEM, BPF_LEN = 0x00, 0x20, 0x60, 0x80
BPF_ADD, BPF_SUB, BPF_MUL, BPF_DIV, BPF_OR, BPF_AND, BPF_LSH, BPF_RSH, BPF_NEG = (
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80)
BPF_JA, BPF_JEQ, BPF_JGT, BPF_JGE, BPF_JSET = 0x00, 0x10, 0x20, 0x30, 0x40
BPF_XOR = 0xA0
BPF_K, BPF_X = 0x00, 0x08
BPF_A = 0x10                 # BPF_RET | BPF_A
BPF_TAX, BPF_TXA = 0x00, 0x80
BPF_MEMWORDS = 16
BPF_MAXINSNS = 4096


# struct seccomp_data {int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6];}
SECCOMP_DATA = struct.Struct("<iIQ6Q")

# struct ptrace_syscall_info: op, pad[3], arch, instruction_pointer,
# stack_pointer, then the union (entry: nr, args[6])
SYSCALL_INFO_HEAD = struct.Struct("<B3xIQQ")
SYSCALL_INFO_ENTRY = struct.Struct("<Q6Q")

_ALU = {
    BPF_ADD: lambda a, b: a + b,
    BPF_SUB: lambda a, b: a - b,
    BPF_MUL: lambda a, b: a * b,
    BPF_OR: lambda a, b: a | b,
    BPF_AND: lambda a, b: a & b,
    BPF_XOR: lambda a, b: a ^ b,
    BPF_LSH: lambda a, b: a << (b & 31),
    BPF_RSH: lambda a, b: a >> (b & 31),
}
_JUMP = {
    BPF_JEQ: lambda a, b: a == b,
    BPF_JGT: lambda a, b: a > b,
    BPF_JGE: lambda a, b: a >= b,
    BPF_JSET: lambda a, b: a & b != 0,
}


class MalformedFilter(ValueError):
    """A program this interpreter (and so the kernel) would not run."""


@record(frozen=True)
class SyscallEntry:
    """A syscall-entry stop, as PTRACE_GET_SYSCALL_INFO reports it."""

    arch: int
    instruction_pointer: int
    nr: int
    args: tuple[int, ...]

    def seccomp_data(self) -> bytes:
        """The struct seccomp_data the kernel gives the filters for it (its
        nr an int: syscall_get_nr() truncates orig_rax to 32 bits)."""
        return SECCOMP_DATA.pack(abi.signed32(self.nr), self.arch & abi.U32_MASK,
                                 self.instruction_pointer & abi.U64_MASK,
                                 *(a & abi.U64_MASK for a in self.args))


def syscall_entry(raw: bytes) -> SyscallEntry | None:
    """The entry a raw struct ptrace_syscall_info describes, or None for
    another kind of stop (an exit, or not a syscall stop)."""
    if len(raw) < SYSCALL_INFO_HEAD.size + SYSCALL_INFO_ENTRY.size:
        return None
    op, arch, ip, _sp = SYSCALL_INFO_HEAD.unpack_from(raw)
    if op != abi.PTRACE_SYSCALL_INFO_ENTRY:
        return None
    nr, *args = SYSCALL_INFO_ENTRY.unpack_from(raw, SYSCALL_INFO_HEAD.size)
    return SyscallEntry(arch, ip, nr, tuple(args))


def run(prog: bytes, data: bytes) -> int:
    """The 32-bit value classic-BPF program PROG returns for seccomp_data
    DATA, run as the kernel runs a seccomp filter.  MalformedFilter for a
    program the kernel would not have accepted."""
    n, rest = divmod(len(prog), abi.SOCK_FILTER_SIZE)
    if rest or not 0 < n <= BPF_MAXINSNS:
        raise MalformedFilter(f"{len(prog)} bytes is not a program of 1..{BPF_MAXINSNS} "
                              "instructions")
    insns: list[tuple[int, int, int, int]] = list(struct.iter_unpack("<HBBI", prog))
    a = x = 0
    mem = [0] * BPF_MEMWORDS
    pc = 0
    while 0 <= pc < n:
        code, jt, jf, k = insns[pc]
        pc += 1
        cls = code & 0x07
        if cls == BPF_RET:
            if code == BPF_RET | BPF_K:
                return k
            if code == BPF_RET | BPF_A:
                return a
            raise MalformedFilter(f"return {code:#x} at {pc - 1}")
        elif cls in (BPF_LD, BPF_LDX):
            mode = code & 0xE0
            if code & 0x18 != BPF_W:
                raise MalformedFilter(f"load size {code:#x} at {pc - 1}")
            if mode == BPF_ABS and cls == BPF_LD:
                if k % 4 or k + 4 > SECCOMP_DATA.size:
                    raise MalformedFilter(f"load of seccomp_data+{k} at {pc - 1}")
                value = int.from_bytes(data[k:k + 4], "little")
            elif mode == BPF_LEN:
                value = SECCOMP_DATA.size
            elif mode == BPF_IMM:
                value = k
            elif mode == BPF_MEM and k < BPF_MEMWORDS:
                value = mem[k]
            else:
                raise MalformedFilter(f"load {code:#x} at {pc - 1}")
            if cls == BPF_LD:
                a = value
            else:
                x = value
        elif cls in (BPF_ST, BPF_STX):
            if k >= BPF_MEMWORDS:
                raise MalformedFilter(f"store to M[{k}] at {pc - 1}")
            mem[k] = a if cls == BPF_ST else x
        elif cls == BPF_ALU:
            op = code & 0xF0
            if op == BPF_NEG:
                a = -a & abi.U32_MASK
                continue
            b = x if code & BPF_X else k
            if op == BPF_DIV:
                if b == 0:
                    return 0        # classic BPF: division by zero ends the program with 0
                a = a // b
            elif op in _ALU:
                a = _ALU[op](a, b) & abi.U32_MASK
            else:
                raise MalformedFilter(f"ALU {code:#x} at {pc - 1}")
        elif cls == BPF_JMP:
            op = code & 0xF0
            if op == BPF_JA:
                pc += k
            elif op in _JUMP:
                pc += jt if _JUMP[op](a, x if code & BPF_X else k) else jf
            else:
                raise MalformedFilter(f"jump {code:#x} at {pc - 1}")
            continue
        elif cls == BPF_MISC:
            if code & 0xF8 == BPF_TAX:          # BPF_MISCOP(code)
                x = a
            elif code & 0xF8 == BPF_TXA:
                a = x
            else:
                raise MalformedFilter(f"misc {code:#x} at {pc - 1}")
            continue
        else:
            raise MalformedFilter(f"instruction {code:#x} at {pc - 1}")
    raise MalformedFilter("the program runs past its end")


def action(filters: list[bytes], data: bytes) -> int:
    """The value the kernel acts on for DATA under FILTERS (every filter
    runs; the lowest action, compared as a signed 32-bit number, wins:
    kernel/seccomp.c seccomp_run_filters).  ALLOW with no filter."""
    ret = SECCOMP_RET_ALLOW
    for prog in filters:
        cur = run(prog, data)
        if abi.signed32(cur & SECCOMP_RET_ACTION_FULL) < abi.signed32(ret & SECCOMP_RET_ACTION_FULL):
            ret = cur
    return ret


def runs(ret: int) -> bool:
    """Whether letting the kernel act on RET is harmless to the target."""
    return ret & SECCOMP_RET_ACTION_FULL in RUNS


def action_name(ret: int) -> str:
    act = ret & SECCOMP_RET_ACTION_FULL
    name = ACTION_NAMES.get(act, f"unknown action {act:#x}")
    if act == SECCOMP_RET_ERRNO:
        name += f"({ret & SECCOMP_RET_DATA})"
    return name


# ---- the thread's filters, and the verdict on one syscall ------------------------------

# What reading the filters needs, for the message of a syscall skipped
# because they could not be read (kernel/seccomp.c get_nth_filter).
READ_NEEDS = "reading them needs CAP_SYS_ADMIN, and allocdiag not itself under seccomp"


def read_filters(tid: int) -> list[bytes] | str:
    """The filters of ptrace-stopped TID, newest first, as the kernel runs
    them ([] when it is in no filter mode), or why they cannot be read.
    (PTRACE_SECCOMP_GET_FILTER's index 0 is the oldest: get_nth_filter
    counts back from the newest to the total minus the index.)"""
    filters: list[bytes] = []
    while True:
        try:
            prog = ptrace.seccomp_filter(tid, len(filters))
        except OSError as e:
            if e.errno == errno.EINVAL and not filters:
                return []       # get_nth_filter: "not in SECCOMP_MODE_FILTER"
            name = errno.errorcode.get(e.errno or 0, str(e.errno))
            return f"PTRACE_SECCOMP_GET_FILTER failed with {name}: {READ_NEEDS}"
        if prog is None:
            return filters[::-1]
        filters.append(prog)


def tally(skipped: list[dict[str, object]]) -> list[tuple[object, object, int]]:
    """(syscall, why, count) of a borrow's skipped syscalls
    (RemoteProcess.skipped_syscalls), in the order first skipped."""
    counts: dict[tuple[object, object], int] = {}
    for s in skipped:
        key = (s["syscall"], s["why"])
        counts[key] = counts.get(key, 0) + 1
    return [(name, why, n) for (name, why), n in counts.items()]


def judge(filters: list[bytes] | str, entry: SyscallEntry) -> tuple[bool, str]:
    """(whether ENTRY may run, why) under FILTERS (read_filters' answer)."""
    if isinstance(filters, str):
        return False, f"the thread's seccomp filter could not be read ({filters})"
    try:
        ret = action(filters, entry.seccomp_data())
    except MalformedFilter as e:
        return False, f"the thread's seccomp filter could not be run ({e})"
    return runs(ret), f"the thread's seccomp filter returns {action_name(ret)} for it"
