"""Thin ctypes layer over the Linux syscalls the remote-call engine needs.

ptrace (SEIZE, INTERRUPT, CONT, DETACH, GETREGS/SETREGS, GETREGSET/SETREGSET,
GETSIGINFO/SETSIGINFO, GETSIGMASK/SETSIGMASK), waitpid with ``__WALL``,
tgkill and prctl.  Numbers come from ``collectors.engine.abi``.

Nothing here knows about registers' meaning or call frames (the ``arch_*``
module), about stops (``tracee``) or about when it is safe to stop a thread
(``safepoints``).  Process memory is ``collectors.engine.memory``.

errno is translated by ``collectors.proc.oserror.translate`` (traced=True):

- ESRCH  -> NoSuchProcess when the process is gone, otherwise RemoteCallError
            (thread gone, or not in a ptrace-stop);
- EPERM/EACCES -> AccessDenied (with the ptrace remediation text);
- anything else -> RemoteCallError naming the operation and the errno.
"""

from __future__ import annotations

import ctypes
import errno
import os

from collectors.engine import abi, cbytes
from collectors.proc import oserror
from diag.model.errors import AllocdiagError

_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.restype = ctypes.c_long      # PR_GET_TIMERSLACK returns the slack itself


def set_timerslack_ns(ns: int) -> int | None:
    """Timer slack of the calling thread (prctl PR_SET_TIMERSLACK): the
    tracer's short sleeps while it waits for a tracee should not be rounded
    up by the default 50 us.  Returns the slack it replaced, to be set back
    (children started later by this thread inherit its slack: a 1 us slack
    left behind made a test target's 1 us nanosleep loop never sleep), or
    None.  Best effort."""
    old = _prctl(abi.PR_GET_TIMERSLACK, 0, 0, 0, 0)
    _prctl(abi.PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0)
    return old if old > 0 else None


class iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_ptrace = _libc.ptrace
_ptrace.restype = ctypes.c_long
_ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]

_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_SYS_tgkill = abi.SYS_TGKILL.get(os.uname().machine)


# --------------------------------------------------------------------------
# errno translation: collectors.proc.oserror is the one place

process_exists = oserror.process_exists


def translate_errno(err: int, pid: int, what: str, tid: int | None = None
                    ) -> AllocdiagError | OSError:
    """The allocdiag exception for errno ERR of ptrace/tgkill operation WHAT."""
    return oserror.translate(err, pid, what, tid=tid, traced=True)


def _check(ret: int, pid: int, what: str, tid: int | None = None) -> int:
    if ret == -1:
        raise translate_errno(ctypes.get_errno(), pid, what, tid)
    return ret


def _pt(req: int, tid: int, addr: int | None, data: int | None, pid: int, what: str) -> int:
    ctypes.set_errno(0)
    ret: int = _ptrace(req, tid, addr, data)
    return _check(ret, pid, what, tid)


# --------------------------------------------------------------------------
# ptrace requests.  ``pid`` is the thread-group id, used for error messages and
# to tell "process gone" from "thread gone"; ``tid`` is the tracee.

def seize(tid: int, pid: int, options: int = 0) -> None:
    """PTRACE_SEIZE without stopping.  Never pass PTRACE_O_EXITKILL."""
    _pt(abi.PTRACE_SEIZE, tid, None, options, pid, "PTRACE_SEIZE")


def interrupt(tid: int, pid: int) -> None:
    _pt(abi.PTRACE_INTERRUPT, tid, None, None, pid, "PTRACE_INTERRUPT")


def cont(tid: int, pid: int, sig: int = 0) -> None:
    _pt(abi.PTRACE_CONT, tid, None, sig, pid, "PTRACE_CONT")


def syscall(tid: int, pid: int, sig: int = 0) -> None:
    """PTRACE_SYSCALL: resume, stopping at the next syscall entry or exit."""
    _pt(abi.PTRACE_SYSCALL, tid, None, sig, pid, "PTRACE_SYSCALL")


def sysemu(tid: int, pid: int, sig: int = 0) -> None:
    """PTRACE_SYSEMU: resume, stopping at the next syscall entry; that
    syscall is then not run, and no seccomp filter sees it."""
    _pt(abi.PTRACE_SYSEMU, tid, None, sig, pid, "PTRACE_SYSEMU")


def detach(tid: int, pid: int, sig: int = 0) -> None:
    _pt(abi.PTRACE_DETACH, tid, None, sig, pid, "PTRACE_DETACH")


def getregs(tid: int, pid: int, regs: ctypes.Structure) -> None:
    """PTRACE_GETREGS into the ctypes structure REGS (x86)."""
    _pt(abi.PTRACE_GETREGS, tid, None, ctypes.addressof(regs), pid, "PTRACE_GETREGS")


def setregs(tid: int, pid: int, regs: ctypes.Structure) -> None:
    _pt(abi.PTRACE_SETREGS, tid, None, ctypes.addressof(regs), pid, "PTRACE_SETREGS")


def getregset(tid: int, pid: int, nt: int, size: int) -> bytes:
    """PTRACE_GETREGSET of at most SIZE bytes; returns the bytes the kernel
    filled (it shrinks iov_len to the regset's real size)."""
    keep, at = cbytes.reader(size)
    iov = iovec(at, size)
    _pt(abi.PTRACE_GETREGSET, tid, nt, ctypes.addressof(iov), pid,
        f"PTRACE_GETREGSET({nt:#x})")
    return cbytes.take(at, iov.iov_len)


def setregset(tid: int, pid: int, nt: int, data: bytes) -> None:
    data = bytes(data)
    iov = iovec(cbytes.address(data), len(data))
    _pt(abi.PTRACE_SETREGSET, tid, nt, ctypes.addressof(iov), pid,
        f"PTRACE_SETREGSET({nt:#x})")


def getsiginfo(tid: int, pid: int) -> bytes:
    keep, at = cbytes.reader(abi.SIGINFO_SIZE)
    _pt(abi.PTRACE_GETSIGINFO, tid, None, at, pid, "PTRACE_GETSIGINFO")
    return cbytes.take(at, abi.SIGINFO_SIZE)


def setsiginfo(tid: int, pid: int, raw: bytes) -> None:
    raw = bytes(raw).ljust(abi.SIGINFO_SIZE, b"\0")
    _pt(abi.PTRACE_SETSIGINFO, tid, None, cbytes.address(raw), pid, "PTRACE_SETSIGINFO")


def getsigmask(tid: int, pid: int) -> int:
    v = ctypes.c_uint64()
    _pt(abi.PTRACE_GETSIGMASK, tid, abi.SIGSET_SIZE, ctypes.addressof(v), pid,
        "PTRACE_GETSIGMASK")
    return v.value


def setsigmask(tid: int, pid: int, mask: int) -> None:
    v = ctypes.c_uint64(mask)
    _pt(abi.PTRACE_SETSIGMASK, tid, abi.SIGSET_SIZE, ctypes.addressof(v), pid,
        "PTRACE_SETSIGMASK")


SYSCALL_INFO_SIZE = 88     # sizeof(struct ptrace_syscall_info), include/uapi/linux/ptrace.h


def get_syscall_info(tid: int, pid: int) -> bytes:
    """PTRACE_GET_SYSCALL_INFO: the raw struct ptrace_syscall_info of the
    syscall stop TID is in (collectors.engine.seccomp decodes it)."""
    keep, at = cbytes.reader(SYSCALL_INFO_SIZE)
    n = _pt(abi.PTRACE_GET_SYSCALL_INFO, tid, SYSCALL_INFO_SIZE, at, pid,
            "PTRACE_GET_SYSCALL_INFO")
    return cbytes.take(at, min(n, SYSCALL_INFO_SIZE))


RSEQ_CONFIGURATION_SIZE = 24   # sizeof(struct ptrace_rseq_configuration), linux/ptrace.h


def get_rseq_configuration(tid: int, pid: int) -> bytes:
    """PTRACE_GET_RSEQ_CONFIGURATION: the raw struct
    ptrace_rseq_configuration of ptrace-stopped TID (collectors.engine.rseq
    decodes it).  A kernel before 5.13 refuses it (EIO): RemoteCallError."""
    keep, at = cbytes.reader(RSEQ_CONFIGURATION_SIZE)
    n = _pt(abi.PTRACE_GET_RSEQ_CONFIGURATION, tid, RSEQ_CONFIGURATION_SIZE, at, pid,
            "PTRACE_GET_RSEQ_CONFIGURATION")
    return cbytes.take(at, min(n, RSEQ_CONFIGURATION_SIZE))


def seccomp_filter(tid: int, index: int) -> bytes | None:
    """PTRACE_SECCOMP_GET_FILTER: the cBPF program (8-byte sock_filter
    instructions) of the INDEX-th filter of ptrace-stopped TID (0: the
    first installed), or None past the newest.  Raises OSError as the
    kernel refuses it (EACCES: not CAP_SYS_ADMIN, or allocdiag itself under
    seccomp; EINVAL: the thread has no filter; EIO: a kernel without
    CONFIG_CHECKPOINT_RESTORE).  Not translated: every refusal means the
    same to the caller."""
    ctypes.set_errno(0)
    n = _ptrace(abi.PTRACE_SECCOMP_GET_FILTER, tid, index, None)
    if n >= 0:
        buf = ctypes.create_string_buffer(max(1, n) * abi.SOCK_FILTER_SIZE)
        n = _ptrace(abi.PTRACE_SECCOMP_GET_FILTER, tid, index, ctypes.addressof(buf))
        if n >= 0:
            return buf.raw[:n * abi.SOCK_FILTER_SIZE]
    err = ctypes.get_errno()
    if err == errno.ENOENT:
        return None
    raise OSError(err, os.strerror(err))


# --------------------------------------------------------------------------
# waitpid

def waitpid_nohang(tid: int, pid: int) -> int | None:
    """waitpid(tid, WNOHANG|__WALL).  Returns the raw status, or None when
    nothing is reportable yet.  ECHILD is translated (tracee gone/untraced)."""
    try:
        got, status = os.waitpid(tid, abi.WNOHANG | abi.WALL)
    except ChildProcessError:
        raise translate_errno(errno.ECHILD, pid, "waitpid", tid) from None
    except OSError as e:
        raise translate_errno(e.errno or 0, pid, "waitpid", tid) from None
    if got == 0:
        return None
    return status


def tgkill(pid: int, tid: int, sig: int) -> None:
    ctypes.set_errno(0)
    ret: int = _syscall(_SYS_tgkill, pid, tid, sig)
    _check(ret, pid, "tgkill", tid)
