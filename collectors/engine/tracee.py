"""Thin ctypes layer over the Linux syscalls the remote-call engine needs.

ptrace (SEIZE, INTERRUPT, CONT, DETACH, GETREGS/SETREGS, GETREGSET/SETREGSET,
GETSIGINFO/SETSIGINFO, GETSIGMASK/SETSIGMASK), waitpid with ``__WALL`` and
tgkill.  Process memory is ``collectors.engine.memory`` (``read_memory`` /
``write_memory`` here delegate to it).

Nothing here knows about registers' meaning or call frames (that is the
``arch_*`` module) or about when it is safe to stop a thread (``remote``).

errno is translated exactly once, here, into the exception family of
``diag.model.errors`` (``translate_errno``); the /proc readers of ``remote``
use the same function so the whole engine speaks one language:

- ESRCH  -> NoSuchProcess when the process is gone, otherwise RemoteCallError
            (thread gone, or not in a ptrace-stop);
- EPERM/EACCES -> AccessDenied (with the ptrace remediation text);
- anything else -> RemoteCallError naming the operation and the errno.
"""

import ctypes
import errno
import os

from collectors.proc import oserror

_libc = ctypes.CDLL(None, use_errno=True)

PR_SET_TIMERSLACK = 29


def set_timerslack_ns(ns):
    """Timer slack of the calling thread (prctl PR_SET_TIMERSLACK): the
    tracer's short sleeps while it waits for a tracee should not be rounded
    up by the default 50 us.  Best effort."""
    _libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0)

# ---- request numbers (include/uapi/linux/ptrace.h; generic across arches) ----
PTRACE_CONT = 7
PTRACE_DETACH = 17
PTRACE_GETREGS = 12          # x86 only; aarch64 uses GETREGSET NT_PRSTATUS
PTRACE_SETREGS = 13
PTRACE_GETREGSET = 0x4204
PTRACE_SETREGSET = 0x4205
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_GETSIGINFO = 0x4202
PTRACE_SETSIGINFO = 0x4203
PTRACE_GETSIGMASK = 0x420A
PTRACE_SETSIGMASK = 0x420B

PTRACE_EVENT_STOP = 128      # status>>16 for interrupt-stop and (SEIZE) group-stop

NT_PRSTATUS = 1
NT_PRFPREG = 2
NT_X86_XSTATE = 0x202

WNOHANG = 1
WALL = 0x40000000            # __WALL: wait for threads (clone children) too

SIGINFO_SIZE = 128
SIGSET_SIZE = 8              # kernel sigset_t on 64-bit


class iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_ptrace = _libc.ptrace
_ptrace.restype = ctypes.c_long
_ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]

_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_SYS_tgkill = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine)


# --------------------------------------------------------------------------
# errno translation (the one place)

process_exists = oserror.process_exists


def translate_errno(err, pid, what, tid=None):
    """The allocdiag exception for errno ERR of ptrace/tgkill operation WHAT."""
    return oserror.translate(err, pid, what, tid=tid, traced=True)


def _check(ret, pid, what, tid=None):
    if ret == -1:
        raise translate_errno(ctypes.get_errno(), pid, what, tid)
    return ret


def _pt(req, tid, addr, data, pid, what):
    ctypes.set_errno(0)
    return _check(_ptrace(req, tid, addr, data), pid, what, tid)


# --------------------------------------------------------------------------
# ptrace requests.  ``pid`` is the thread-group id, used for error messages and
# to tell "process gone" from "thread gone"; ``tid`` is the tracee.

def seize(tid, pid, options=0):
    """PTRACE_SEIZE without stopping.  Never pass PTRACE_O_EXITKILL."""
    _pt(PTRACE_SEIZE, tid, None, options, pid, "PTRACE_SEIZE")


def interrupt(tid, pid):
    _pt(PTRACE_INTERRUPT, tid, None, None, pid, "PTRACE_INTERRUPT")


def cont(tid, pid, sig=0):
    _pt(PTRACE_CONT, tid, None, sig, pid, "PTRACE_CONT")


def detach(tid, pid, sig=0):
    _pt(PTRACE_DETACH, tid, None, sig, pid, "PTRACE_DETACH")


def getregs(tid, pid, regs):
    """PTRACE_GETREGS into the ctypes structure REGS (x86)."""
    _pt(PTRACE_GETREGS, tid, None, ctypes.addressof(regs), pid, "PTRACE_GETREGS")
    return regs


def setregs(tid, pid, regs):
    _pt(PTRACE_SETREGS, tid, None, ctypes.addressof(regs), pid, "PTRACE_SETREGS")


def getregset(tid, pid, nt, buf):
    """PTRACE_GETREGSET into the ctypes buffer BUF; returns the bytes the
    kernel filled (it shrinks iov_len to the regset's real size)."""
    iov = iovec(ctypes.addressof(buf), ctypes.sizeof(buf))
    _pt(PTRACE_GETREGSET, tid, nt, ctypes.addressof(iov), pid,
        f"PTRACE_GETREGSET({nt:#x})")
    return ctypes.string_at(ctypes.addressof(buf), iov.iov_len)


def setregset(tid, pid, nt, data):
    buf = ctypes.create_string_buffer(bytes(data), len(data))
    iov = iovec(ctypes.addressof(buf), len(data))
    _pt(PTRACE_SETREGSET, tid, nt, ctypes.addressof(iov), pid,
        f"PTRACE_SETREGSET({nt:#x})")


def getsiginfo(tid, pid):
    buf = ctypes.create_string_buffer(SIGINFO_SIZE)
    _pt(PTRACE_GETSIGINFO, tid, None, ctypes.addressof(buf), pid, "PTRACE_GETSIGINFO")
    return buf.raw


def setsiginfo(tid, pid, raw):
    buf = ctypes.create_string_buffer(bytes(raw), SIGINFO_SIZE)
    _pt(PTRACE_SETSIGINFO, tid, None, ctypes.addressof(buf), pid, "PTRACE_SETSIGINFO")


def getsigmask(tid, pid):
    v = ctypes.c_uint64()
    _pt(PTRACE_GETSIGMASK, tid, SIGSET_SIZE, ctypes.addressof(v), pid,
        "PTRACE_GETSIGMASK")
    return v.value


def setsigmask(tid, pid, mask):
    v = ctypes.c_uint64(mask)
    _pt(PTRACE_SETSIGMASK, tid, SIGSET_SIZE, ctypes.addressof(v), pid,
        "PTRACE_SETSIGMASK")


# --------------------------------------------------------------------------
# waitpid

def waitpid_nohang(tid, pid):
    """waitpid(tid, WNOHANG|__WALL).  Returns the raw status, or None when
    nothing is reportable yet.  ECHILD is translated (tracee gone/untraced)."""
    try:
        got, status = os.waitpid(tid, WNOHANG | WALL)
    except ChildProcessError:
        raise translate_errno(errno.ECHILD, pid, "waitpid", tid) from None
    except OSError as e:
        raise translate_errno(e.errno, pid, "waitpid", tid) from None
    if got == 0:
        return None
    return status


# --------------------------------------------------------------------------
# memory of another process: collectors.engine.memory is the one reader; these names
# stay for callers (raise MemoryFault, a RemoteCallError, when unmapped).

def read_memory(pid, addr, n):
    from collectors.engine import memory
    return memory.read(pid, addr, n)


def write_memory(pid, addr, data):
    from collectors.engine import memory
    memory.write(pid, addr, data)


def tgkill(pid, tid, sig):
    ctypes.set_errno(0)
    _check(_syscall(_SYS_tgkill, pid, tid, sig), pid, "tgkill", tid)


# --------------------------------------------------------------------------
# wait-status decoding (no syscalls)

def decode_status(status):
    """Return (kind, sig, event): kind one of 'exited', 'killed', 'stopped'."""
    if os.WIFEXITED(status):
        return "exited", os.WEXITSTATUS(status), 0
    if os.WIFSIGNALED(status):
        return "killed", os.WTERMSIG(status), 0
    if os.WIFSTOPPED(status):
        return "stopped", os.WSTOPSIG(status), (status >> 16) & 0xFFFF
    return "unknown", 0, 0
