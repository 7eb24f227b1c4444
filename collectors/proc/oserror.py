"""The one place an OS error about a target becomes the project's error
(diag.model.errors): a failed read of /proc/PID/..., /proc/PID/mem or
process_vm_readv, a failed ptrace request, a failed perf_event_open.

Callers pass either the ``OSError`` they caught or the errno a ctypes call
left (``ctypes.get_errno()``).  Errno names are errno(3)'s.
"""

from __future__ import annotations

import errno
import os

from collectors import lazylog
from diag.model.errors import AccessDenied, AllocdiagError, NoSuchProcess, RemoteCallError

# The process (or the thread) is gone: kill(2)/ptrace(2) say ESRCH, a /proc
# file of an exited process ENOENT.
GONE = frozenset({errno.ESRCH, errno.ENOENT})
# Not ours to read or trace (ptrace access mode checks, file modes, yama),
# or, for a pid whose /proc entry is gone, the process exited meanwhile.
DENIED = frozenset({errno.EPERM, errno.EACCES})

log = lazylog.getLogger("collectors.proc")


def process_exists(pid: int, procfs: str = "/proc") -> bool:
    """True while /proc/PID exists (a zombie's too, until it is reaped)."""
    return os.path.exists(f"{procfs}/{pid}")


def errno_of(exc: OSError | int) -> int:
    """The errno of EXC (0 for an OSError that carries none)."""
    return exc if isinstance(exc, int) else (exc.errno or 0)


def translate(exc: OSError | int, pid: int, what: str, *, tid: int | None = None,
              traced: bool = False, procfs: str = "/proc",
              remediation: str | None = None) -> AllocdiagError | OSError:
    """The allocdiag exception for EXC (an OSError or an errno) raised while
    doing WHAT to PID.  TRACED: the operation needs a ptrace-stopped thread, so
    a live process answering ESRCH means *that thread* left the stop, not that
    the process exited.  An OSError of no known meaning for a target is
    returned unchanged when not TRACED (the caller re-raises it: an I/O error
    reading /proc is not the target's doing).  REMEDIATION replaces the
    default advice of an AccessDenied (e.g. the sampler's perf settings)."""
    err = errno_of(exc)
    log.debug("pid %d%s: %s failed: %s", pid, f" tid {tid}" if tid is not None else "",
              what, errno.errorcode.get(err, err))
    who = f"thread {tid}" if tid is not None and tid != pid else "process"
    if err in GONE:
        if not traced or not process_exists(pid, procfs):
            return NoSuchProcess(pid, f"no such process ({what})")
        return RemoteCallError(f"{what}: {who} vanished or is not in a ptrace-stop "
                               f"({errno.errorcode.get(err, err)})", pid=pid)
    if err in DENIED:
        # /proc/PID of a process that exited meanwhile can answer EACCES
        if not process_exists(pid, procfs):
            return NoSuchProcess(pid, f"no such process ({what})")
        if remediation is not None:
            return AccessDenied(pid, f"permission denied: {what}", remediation=remediation)
        return AccessDenied(pid, f"permission denied: {what}")
    if err == errno.ECHILD and traced:
        return RemoteCallError(f"{what}: {who} is no longer traced by us", pid=pid)
    if traced or isinstance(exc, int):
        return RemoteCallError(f"{what} failed: {errno.errorcode.get(err, err)} "
                               f"({os.strerror(err)})", pid=pid)
    return exc
