"""x86-64 specifics of the remote-call engine (the only arch-specific module).

The engine (``collectors.engine.remote``) talks to an ``Arch`` object with this small
interface; an ``arch_aarch64.py`` providing the same names is an addition, not
a rewrite (there: GETREGSET NT_PRSTATUS for ``user_pt_regs``, NT_PRFPREG +
NT_ARM_SVE for the vector state, NT_ARM_SYSTEM_CALL for the syscall number,
no red zone, return address in x30 instead of on the stack):

==========================================  ====================================
``get_regs(tid, pid) -> regs``               all general registers (a copyable object)
``set_regs(tid, pid, regs)``                 write them back exactly
``get_ext_state(tid, pid) -> bytes``         FPU/SSE/AVX/AVX-512 state (XSAVE layout)
``set_ext_state(tid, pid, blob)``            write it back exactly
``copy_regs(regs) -> regs``                  independent copy
``pc(regs)``, ``sp(regs)``                   program counter, stack pointer
``thread_pointer(regs)``                     the TLS thread pointer (glibc: the thread descriptor)
``syscall_state(regs) -> (nr, ret)``         syscall the stop interrupted (-1 if none), its rax
``prepare_call(regs, func, args, top)``      -> (new_regs, writes, lowest): call frame below TOP
``return_value(regs)``                       the function's integer return value
``is_return_trap(regs, siginfo)``            True for the SIGSEGV of "returned to address 0"
``syscall_args(regs)``                       the six syscall arguments (at a syscall stop)
``code_segment(regs)``                       cs (0x33: 64-bit code)
``set_syscall_arg(regs, i, value)``          change syscall argument I for a restart
``rerun_syscall(regs)``                      at a PTRACE_SYSEMU entry stop: make it again
``AUDIT_ARCH``                               seccomp_data.arch of the syscalls SYSCALL_NAMES names
``SYSCALL_NAMES``, ``RESTART_SYSCALL``       syscall names for messages; restart_syscall
``RED_ZONE``, ``STACK_ALIGN``, ``WORD``
==========================================  ====================================

Call frame (SysV AMD64 ABI): integer args in rdi, rsi, rdx, rcx, r8, r9; rsp is
moved below the 128-byte red zone and below any scratch the caller reserved,
aligned so that at function entry ``rsp % 16 == 8`` (as after a ``call``),
with a return address of 0 on the stack: the function's ``ret`` jumps to 0 and
the resulting SIGSEGV (si_addr 0, rip 0) is how the tracer learns it returned.
``orig_rax = -1`` so the kernel does not treat the injected state as an
interrupted syscall to restart; ``rax = 0`` (also "no vector args" for
varargs); the direction and trap flags are cleared.
"""

from __future__ import annotations

import ctypes
import signal
from typing import Any

from collectors.engine import abi, ptrace

NAME = "x86_64"
WORD = 8
RED_ZONE = 128
STACK_ALIGN = 16
MASK64 = (1 << 64) - 1

# The x86-64 syscall numbers the engine names (arch/x86/entry/syscalls/
# syscall_64.tbl): the one table; which waits are safe points is policy, in
# collectors.engine.safepoints, by these names.
NR = {
    "read": 0, "write": 1, "poll": 7, "mmap": 9, "mprotect": 10, "munmap": 11,
    "brk": 12, "rt_sigreturn": 15, "pread64": 17, "readv": 19, "select": 23,
    "sched_yield": 24, "mremap": 25, "madvise": 28, "pause": 34, "nanosleep": 35,
    "accept": 43, "recvfrom": 45, "recvmsg": 47, "clone": 56, "wait4": 61, "semop": 65,
    "rt_sigtimedwait": 128, "rt_sigsuspend": 130, "futex": 202,
    "restart_syscall": 219, "semtimedop": 220, "clock_nanosleep": 230,
    "epoll_wait": 232, "waitid": 247, "pselect6": 270, "ppoll": 271,
    "epoll_pwait": 281, "accept4": 288, "clone3": 435, "epoll_pwait2": 441,
    "futex_waitv": 449,
}
SYSCALL_NAMES = {nr: name for name, nr in NR.items()}   # for messages
# seccomp_data.arch of a syscall these numbers name (include/uapi/linux/audit.h)
AUDIT_ARCH = 0xC000003E      # AUDIT_ARCH_X86_64

# restart_syscall(2): what a thread runs when a sleep with a restart block
# (nanosleep, clock_nanosleep, poll) or a futex wait with a timeout was
# interrupted -- by an earlier stop, allocdiag's or anyone's -- and resumed.
# Judged like any other wait (collectors.engine.safepoints.classify_restart).
RESTART_SYSCALL = NR["restart_syscall"]

SIGSEGV = signal.SIGSEGV
# eflags bits (arch/x86/include/uapi/asm/processor-flags.h X86_EFLAGS_TF, _DF)
_EFLAGS_TF = 0x100
_EFLAGS_DF = 0x400
# __USER_CS (arch/x86/include/asm/segment.h): 64-bit user code
USER_CS_64 = 0x33
# the `syscall` instruction (Intel SDM vol. 2B)
SYSCALL_INSN = b"\x0f\x05"
# A signal handler's return address, the C library's rt_sigreturn
# trampoline: `mov $15,%rax; syscall` (48 c7 c0 0f 00 00 00 0f 05), glibc's
# __restore_rt (sysdeps/unix/sysv/linux/x86_64/libc_sigaction.c RESTORE)
# and musl's (src/signal/x86_64/restore.s) alike.
SIGRETURN_TRAMPOLINE = b"\x48\xc7\xc0" + NR["rt_sigreturn"].to_bytes(4, "little") + SYSCALL_INSN


REG_NAMES = (
    "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8",
    "rax", "rcx", "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags",
    "rsp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs")


class user_regs_struct(ctypes.Structure):
    """<sys/user.h> struct user_regs_struct (x86-64)."""

    _fields_ = [(n, ctypes.c_ulonglong) for n in REG_NAMES]
    # the fields as Python sees them (ctypes converts c_ulonglong to int)
    r15: int
    r14: int
    r13: int
    r12: int
    rbp: int
    rbx: int
    r11: int
    r10: int
    r9: int
    r8: int
    rax: int
    rcx: int
    rdx: int
    rsi: int
    rdi: int
    orig_rax: int
    rip: int
    cs: int
    eflags: int
    rsp: int
    ss: int
    fs_base: int
    gs_base: int
    ds: int
    es: int
    fs: int
    gs: int

    def __repr__(self) -> str:
        return "user_regs_struct(" + ", ".join(
            f"{n}={getattr(self, n):#x}" for n in REG_NAMES) + ")"


ARG_REGS = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")

# The XSAVE area's size depends on the CPU features the kernel enabled
# (AVX-512 makes it ~2.7 KiB, AMX ~11 KiB).  GETREGSET shrinks iov_len to the
# real size; SETREGSET must be given exactly that size.  Learnt once.
_XSTATE_PROBE = 1 << 16
_xstate_size: int | None = None


def _signed(v: int) -> int:
    return v - (1 << 64) if v & (1 << 63) else v


def get_regs(tid: int, pid: int) -> user_regs_struct:
    regs = user_regs_struct()
    ptrace.getregs(tid, pid, regs)
    return regs


def set_regs(tid: int, pid: int, regs: user_regs_struct) -> None:
    ptrace.setregs(tid, pid, regs)


def copy_regs(regs: user_regs_struct) -> user_regs_struct:
    new = user_regs_struct()
    ctypes.memmove(ctypes.addressof(new), ctypes.addressof(regs), ctypes.sizeof(regs))
    return new


def regs_equal(a: user_regs_struct, b: user_regs_struct) -> bool:
    return bytes(a) == bytes(b)


def get_ext_state(tid: int, pid: int) -> bytes:
    global _xstate_size
    data = ptrace.getregset(tid, pid, abi.NT_X86_XSTATE, _xstate_size or _XSTATE_PROBE)
    if _xstate_size is None:
        _xstate_size = len(data)
    return data


def set_ext_state(tid: int, pid: int, blob: bytes) -> None:
    ptrace.setregset(tid, pid, abi.NT_X86_XSTATE, blob)


def pc(regs: user_regs_struct) -> int:
    return regs.rip


def sp(regs: user_regs_struct) -> int:
    return regs.rsp


def thread_pointer(regs: user_regs_struct) -> int:
    """The thread pointer (fs_base): glibc's struct pthread of the thread."""
    return regs.fs_base


def syscall_state(regs: user_regs_struct) -> tuple[int, int]:
    """(syscall number or -1, signed rax).  At a stop inside a blocking syscall
    rax is -ERESTART*; at a stop just after one completed it is its result."""
    return _signed(regs.orig_rax), _signed(regs.rax)


# every x86 syscall instruction (syscall 0f 05, int $0x80 cd 80) is 2 bytes
SYSCALL_INSN_SIZE = 2


def rerun_syscall(regs: user_regs_struct) -> None:
    """At a PTRACE_SYSEMU entry stop (the syscall was not run): point the
    thread back at its syscall instruction with the number in rax, so it
    makes the same syscall again -- what the kernel's own restart does
    (arch/x86/kernel/signal.c: ax = orig_ax, ip -= 2)."""
    regs.rax = regs.orig_rax
    regs.rip = (regs.rip - SYSCALL_INSN_SIZE) & MASK64


def syscall_args(regs: user_regs_struct) -> tuple[int, ...]:
    """The six syscall arguments (rdi, rsi, rdx, r10, r8, r9): still in their
    registers at a stop inside the syscall (only rax, rcx, r11 change)."""
    return (regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9)


_SYSCALL_ARG_REGS = ("rdi", "rsi", "rdx", "r10", "r8", "r9")


def set_syscall_arg(regs: user_regs_struct, i: int, value: int) -> None:
    """Set syscall argument I (0-5) in REGS, for a restart."""
    setattr(regs, _SYSCALL_ARG_REGS[i], int(value) & MASK64)


def code_segment(regs: user_regs_struct) -> int:
    return regs.cs


MAX_ARGS = 12   # six in registers, the rest on the stack


def prepare_call(regs: user_regs_struct, func: int, args: tuple[int, ...], top: int
                 ) -> tuple[user_regs_struct, list[tuple[int, bytes]], int]:
    """Registers and memory writes for calling FUNC(*ARGS) with the frame
    entirely below address TOP (which the engine already put below the red
    zone and its scratch).  Returns (new_regs, [(addr, bytes)], lowest_addr)."""
    if len(args) > MAX_ARGS:
        raise ValueError(f"at most {MAX_ARGS} integer arguments on {NAME}")
    new = copy_regs(regs)
    # SysV: integer args 7.. go on the stack, the 7th at [rsp+8] at entry,
    # above the return address; the block is padded so rsp % 16 == 8 at entry.
    stack_args = [int(v) & MASK64 for v in args[len(ARG_REGS):]]
    block = WORD * len(stack_args)
    base = (top - block) & ~(STACK_ALIGN - 1)      # 16-aligned at the call
    sp_ = base - WORD                              # the return address slot
    for name, val in zip(ARG_REGS, args):
        setattr(new, name, int(val) & MASK64)
    new.rip = func & MASK64
    new.rsp = sp_
    new.rax = 0
    new.orig_rax = MASK64                          # -1: no syscall restart
    new.eflags &= ~(_EFLAGS_DF | _EFLAGS_TF)
    frame = b"\0" * WORD + b"".join(v.to_bytes(WORD, "little") for v in stack_args)
    return new, [(sp_, frame)], sp_


def return_value(regs: user_regs_struct) -> int:
    return regs.rax


def is_return_trap(regs: user_regs_struct, siginfo: Any) -> bool:
    """The function executed ``ret`` into our 0 return address: a kernel
    generated SIGSEGV (si_code > 0) for address 0 with rip 0."""
    return bool(siginfo.signo == SIGSEGV and siginfo.code > 0
                and siginfo.addr == 0 and regs.rip == 0)


def describe(regs: user_regs_struct) -> str:
    return f"rip={regs.rip:#x} rsp={regs.rsp:#x} orig_rax={_signed(regs.orig_rax)}"
