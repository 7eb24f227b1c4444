"""Exception family raised at the boundary between allocdiag and a target.

Every error a collector can raise about a target process is translated once,
where the OS call is made, into one of these classes.  Each carries the pid,
a one-line message and, where the user can do something about it, a
remediation text.  Each class carries its exit code from diag.model.exitcodes
(which, like diag.model, imports nothing of ours).
"""

from __future__ import annotations

from typing import Optional

from diag.model.exitcodes import ExitCode

PTRACE_HELP = (
    "Reading another process's memory or calling into it needs ptrace rights:\n"
    "  - run as root, or as the target's user with CAP_SYS_PTRACE "
    "(sudo setcap cap_sys_ptrace+ep $(readlink -f $(which python3)));\n"
    "  - /proc/sys/kernel/yama/ptrace_scope: 0 allows same-uid tracing, 1 only "
    "descendants (or CAP_SYS_PTRACE), 2 admin only, 3 nobody;\n"
    "  - in a container: run with --cap-add=SYS_PTRACE (Kubernetes: "
    "securityContext.capabilities.add: [SYS_PTRACE]) and share the PID namespace "
    "(docker run --pid=container:NAME, or shareProcessNamespace: true);\n"
    "  - a target that called prctl(PR_SET_DUMPABLE, 0) can only be read by root;\n"
    "  - refused as root: root without CAP_SYS_PTRACE (docker's default) cannot read a "
    "process holding capabilities it lacks (CapPrm in /proc/PID/status), and a security "
    "module (AppArmor, SELinux) can refuse ptrace even to root.\n"
    "Use --no-attach to keep to what /proc shows without ptrace."
)


class AllocdiagError(Exception):
    """Base class.  ``exit_code`` is the process exit code the CLI uses."""

    exit_code: int = ExitCode.INTERNAL

    def __init__(self, msg: str, pid: Optional[int] = None,
                 remediation: Optional[str] = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.pid = pid
        self.remediation = remediation

    def __str__(self) -> str:
        where = f"pid {self.pid}: " if self.pid is not None else ""
        return f"{where}{self.msg}"


class NoSuchProcess(AllocdiagError):
    """The process does not exist (or exited while we were reading it)."""

    exit_code = ExitCode.NO_PROCESS

    def __init__(self, pid: Optional[int], msg: str = "no such process") -> None:
        super().__init__(msg, pid=pid)


class AccessDenied(AllocdiagError):
    """The kernel refused a read or a ptrace request for this process."""

    exit_code = ExitCode.DENIED

    def __init__(self, pid: Optional[int], msg: str = "permission denied",
                 remediation: Optional[str] = PTRACE_HELP) -> None:
        super().__init__(msg, pid=pid, remediation=remediation)


class Unsupported(AllocdiagError):
    """Allocator not detected, or it cannot do what was asked (a kernel
    thread has none).  An input file of the wrong kind is BadInput."""

    exit_code = ExitCode.UNSUPPORTED


class BadPath(AllocdiagError):
    """A file or directory named on the command line cannot be used: it does
    not exist, is a directory where a file is wanted, or cannot be written.
    The user's to fix, like any other usage error."""

    exit_code = ExitCode.USAGE

    @classmethod
    def from_oserror(cls, exc: OSError, path: Optional[str] = None) -> BadPath:
        path = path if path is not None else exc.filename
        return cls(f"{path}: {exc.strerror or exc}")


class MalformedData(Unsupported):
    """Bytes that claim to be a known format but do not parse (a truncated ELF,
    broken malloc_info XML, a cut-off stats JSON).  Raised per object: the
    caller decides whether it is fatal."""


class BadInput(MalformedData):
    """A file named on the command line is not what the command reads (a
    truncated gzip, random bytes, an empty recording, stats text of no known
    allocator).  The message says what was expected.  The user's to fix, like
    a missing file: a usage error, not "allocator unsupported"."""

    exit_code = ExitCode.USAGE


class MissingExtra(AllocdiagError):
    """An optional Python package a command needs is not installed.  The
    message names the package and the pip line of the extra that brings it
    (setup.cfg [options.extras_require])."""

    exit_code = ExitCode.USAGE

    def __init__(self, what: str, package: str, extra: str) -> None:
        self.install = f"pip install 'allocdiag[{extra}]'"
        super().__init__(f"{what} needs the Python package {package}, which is not installed: "
                         f"{self.install}")


class RemoteCallError(AllocdiagError):
    """A call into the target could not be made safely, or failed."""

    exit_code = ExitCode.PARTIAL


class Quarantined(RemoteCallError):
    """An earlier call into this process timed out; no further calls are made
    to it, because its allocator may now hold a lock forever."""
