"""Kernel ABI numbers the remote-call engine uses: one named place each,
with the kernel header they come from.  Architecture-specific numbers
(syscall numbers, register layout, the red zone, code segments) are in the
arch module (``arch_x86_64``); errno and signal numbers the stdlib names are
used from ``errno`` and ``signal`` directly.
"""

from __future__ import annotations

import signal

# ---- ptrace requests (include/uapi/linux/ptrace.h; generic across arches) ----
PTRACE_CONT = 7
PTRACE_SYSCALL = 24          # resume, stopping at the next syscall entry or exit
PTRACE_SYSEMU = 31           # resume, stopping at the next syscall entry, which then does
                             # not run (x86 and arm64: asm/ptrace-abi.h, asm/ptrace.h)
PTRACE_GETREGS = 12          # x86 only (arch/x86/include/uapi/asm/ptrace-abi.h)
PTRACE_SETREGS = 13
PTRACE_DETACH = 17
PTRACE_GETSIGINFO = 0x4202
PTRACE_SETSIGINFO = 0x4203
PTRACE_GETREGSET = 0x4204
PTRACE_SETREGSET = 0x4205
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_GETSIGMASK = 0x420A
PTRACE_SETSIGMASK = 0x420B
PTRACE_SECCOMP_GET_FILTER = 0x420C   # needs CAP_SYS_ADMIN and a tracer not under seccomp
PTRACE_GET_SYSCALL_INFO = 0x420E     # Linux 5.3
PTRACE_GET_RSEQ_CONFIGURATION = 0x420F   # Linux 5.13

# PTRACE_SEIZE options: syscall stops report SIGTRAP | 0x80 (and so
# PTRACE_GET_SYSCALL_INFO can tell an entry from an exit)
PTRACE_O_TRACESYSGOOD = 1
SYSCALL_STOP_SIG = signal.SIGTRAP | 0x80
# struct ptrace_syscall_info.op
PTRACE_SYSCALL_INFO_NONE = 0
PTRACE_SYSCALL_INFO_ENTRY = 1
PTRACE_SYSCALL_INFO_EXIT = 2
PTRACE_SYSCALL_INFO_SECCOMP = 3
SOCK_FILTER_SIZE = 8         # struct sock_filter {u16 code; u8 jt, jf; u32 k} (linux/filter.h)

# status >> 16 of an interrupt-stop or (under SEIZE) a group-stop
PTRACE_EVENT_STOP = 128      # include/uapi/linux/ptrace.h
EVENT_SHIFT = 16             # kernel/ptrace.c: exit_code = signr | (event << 8), waitpid's status << 8
EVENT_MASK = 0xFFFF

# regset note types (include/uapi/linux/elf.h)
NT_PRSTATUS = 1
NT_PRFPREG = 2
NT_X86_XSTATE = 0x202

# waitpid options (include/uapi/linux/wait.h)
WNOHANG = 1
WALL = 0x40000000            # __WALL: wait for threads (clone children) too

# sizes (include/uapi/asm-generic/siginfo.h SI_MAX_SIZE; the kernel's
# sigset_t on 64-bit, include/uapi/asm-generic/signal.h _NSIG / 8)
SIGINFO_SIZE = 128
SIGSET_SIZE = 8
SIGSET_BITS = SIGSET_SIZE * 8

# siginfo_t field offsets on 64-bit (include/uapi/asm-generic/siginfo.h:
# si_signo, si_errno, si_code ints, then the union at 16, 8-aligned)
SI_SIGNO_FMT = "iii"         # si_signo, si_errno, si_code at 0
SI_PID_OFF = 16              # _kill._pid, _kill._uid
SI_ADDR_OFF = 16             # _sigfault._addr
SI_VALUE_OFF = 24            # _rt._sigval

# seccomp modes, as /proc/PID/task/TID/status prints them on its Seccomp:
# line (include/uapi/linux/seccomp.h)
SECCOMP_MODE_DISABLED = 0
SECCOMP_MODE_STRICT = 1
SECCOMP_MODE_FILTER = 2

# prctl (include/uapi/linux/prctl.h)
PR_SET_TIMERSLACK = 29
PR_GET_TIMERSLACK = 30

# the kernel's restart codes left in rax by an interrupted syscall
# (include/linux/errno.h: not visible to user space, seen at a ptrace stop)
ERESTARTSYS = 512
ERESTARTNOINTR = 513
ERESTARTNOHAND = 514
ERESTART_RESTARTBLOCK = 516

# mmap(2) for Call.buffer (include/uapi/asm-generic/mman-common.h, mman.h)
PROT_READ = 0x1
PROT_WRITE = 0x2
MAP_PRIVATE = 0x02
MAP_ANONYMOUS = 0x20
NO_FD = -1                   # mmap's fd for an anonymous mapping
PAGE_SIZE = 4096             # x86-64 base page (arch/x86/include/asm/page_types.h)
MAX_ERRNO = 4095             # include/linux/err.h: -4095..-1 are errors
U64_MASK = (1 << 64) - 1
U32_MASK = (1 << 32) - 1
U32_SIGN = 1 << 31
MAP_FAILED_MIN = (1 << 64) - PAGE_SIZE   # mmap returns -errno (as unsigned) on failure


def signed32(v: int) -> int:
    """The low 32 bits of V as a C int (a syscall argument register holding
    an int in its low half; seccomp_data.nr; a seccomp action compared as
    the kernel's s32)."""
    v &= U32_MASK
    return v - (1 << 32) if v & U32_SIGN else v

# ---- signals ------------------------------------------------------------------
# Signals synchronous to the thread's own execution (a fault it raised):
# never held back, they mean a crash (kernel/signal.c SYNCHRONOUS_MASK + SIGSYS).
SYNC_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL,
                signal.SIGTRAP, signal.SIGSYS)
# Signals whose delivery stops the process (a group-stop under SEIZE).
STOP_SIGNALS = frozenset({signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU})
# Signals to allocdiag deferred while a thread is stopped.
DEFERRED_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT})


def sigbit(sig: int) -> int:
    """The bit of SIG in a kernel sigset (signal 1 is bit 0)."""
    return 1 << (int(sig) - 1)


SYNC_BITS = sum(sigbit(s) for s in SYNC_SIGNALS)
ALL_BLOCKABLE = ((1 << SIGSET_BITS) - 1) & ~(sigbit(signal.SIGKILL) | sigbit(signal.SIGSTOP))

# tgkill(2) per machine (arch/x86/entry/syscalls/syscall_64.tbl;
# include/uapi/asm-generic/unistd.h for aarch64): ptrace.py needs it before
# any arch module is chosen.
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}

# ---- siginfo si_code names (include/uapi/asm-generic/siginfo.h) ----------------------
SYS_SECCOMP = 1
SYS_USER_DISPATCH = 2
SEGV_CPERR = 10
# for the messages of a call that crashed: (signo, si_code) -> name
SI_CODE_NAMES: dict[tuple[int, int], str] = {
    (signal.SIGSEGV, 1): "SEGV_MAPERR", (signal.SIGSEGV, 2): "SEGV_ACCERR",
    (signal.SIGSEGV, 3): "SEGV_BNDERR", (signal.SIGSEGV, 4): "SEGV_PKUERR",
    (signal.SIGSEGV, SEGV_CPERR): "SEGV_CPERR",
    (signal.SIGBUS, 1): "BUS_ADRALN", (signal.SIGBUS, 2): "BUS_ADRERR",
    (signal.SIGBUS, 3): "BUS_OBJERR", (signal.SIGBUS, 4): "BUS_MCEERR_AR",
    (signal.SIGBUS, 5): "BUS_MCEERR_AO",
    (signal.SIGILL, 1): "ILL_ILLOPC", (signal.SIGILL, 2): "ILL_ILLOPN",
    (signal.SIGILL, 3): "ILL_ILLADR", (signal.SIGILL, 4): "ILL_ILLTRP",
    (signal.SIGILL, 5): "ILL_PRVOPC", (signal.SIGILL, 6): "ILL_PRVREG",
    (signal.SIGILL, 7): "ILL_COPROC", (signal.SIGILL, 8): "ILL_BADSTK",
    (signal.SIGFPE, 1): "FPE_INTDIV", (signal.SIGFPE, 2): "FPE_INTOVF",
    (signal.SIGFPE, 3): "FPE_FLTDIV", (signal.SIGFPE, 4): "FPE_FLTOVF",
    (signal.SIGFPE, 5): "FPE_FLTUND", (signal.SIGFPE, 6): "FPE_FLTRES",
    (signal.SIGFPE, 7): "FPE_FLTINV", (signal.SIGFPE, 8): "FPE_FLTSUB",
    (signal.SIGSYS, SYS_SECCOMP): "SYS_SECCOMP",
    (signal.SIGSYS, SYS_USER_DISPATCH): "SYS_USER_DISPATCH",
}
