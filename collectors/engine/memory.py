"""Read (and, for the remote engine, write) another process's memory
without stopping it: the one process-memory reader of allocdiag.

Two kernel paths, with different semantics, chosen explicitly:

- ``process_vm_readv``/``process_vm_writev`` (default): honours page
  protections, so a stack guard page or a PROT_NONE reservation is
  *unreadable*, and process_vm_writev never grows a stack mapping (the
  remote engine's writes fail cleanly outside a mapping; their bounds come
  from collectors.engine.stackbounds, never from readability).
- ``/proc/PID/mem`` (``force=True``): FOLL_FORCE access, which also reads
  PROT_NONE pages of a mapping (as zeros when never touched).  Heap walkers
  (pymalloc, mimalloc segments) and detection read this way.

Both need PTRACE_MODE_ATTACH rights (Yama's ptrace_scope, CAP_SYS_PTRACE);
neither stops the target.

Error semantics, per call:

- ``read(addr, n)`` raises ``MemoryFault`` (a RemoteCallError) when any of
  the N bytes is not mapped or not accessible; NoSuchProcess /
  AccessDenied as translated by ``collectors.proc.oserror.translate``.
- ``try_read(addr, n)`` returns None instead of raising MemoryFault (the
  process being gone still raises NoSuchProcess).
- ``MemoryReader`` (the historical class name) reads through /proc/PID/mem
  and its ``read`` is ``try_read``: its callers treat None as "not mapped".
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from types import TracebackType
from typing import Callable, Sequence

from collectors.engine import cbytes
from collectors.proc import oserror
from diag.model.errors import AccessDenied, NoSuchProcess, RemoteCallError

__all__ = ["MemoryFault", "ProcessMemory", "MemoryReader", "read", "try_read", "write",
           "write_many"]


class MemoryFault(RemoteCallError):
    """Some of the bytes asked for are not mapped or not accessible."""


class _iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_pvr = _libc.process_vm_readv
_pvw = _libc.process_vm_writev
for _f in (_pvr, _pvw):
    _f.restype = ctypes.c_ssize_t
    _f.argtypes = [ctypes.c_int, ctypes.POINTER(_iovec), ctypes.c_ulong,
                   ctypes.POINTER(_iovec), ctypes.c_ulong, ctypes.c_ulong]


def _vm(fn: Callable[..., int], pid: int, addr: int, local_addr: int, n: int, what: str
        ) -> int:
    local = _iovec(local_addr, n)
    remote = _iovec(addr, n)
    ctypes.set_errno(0)
    got: int = fn(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return _transferred(got, n, pid, what, f"{n} bytes at {addr:#x}")


def _transferred(got: int, n: int, pid: int, what: str, where: str) -> int:
    """GOT, what process_vm_readv/writev returned for N bytes (WHERE names
    them), when it is all of them; else the error: MemoryFault when not all
    bytes were accessible, the translated errno otherwise."""
    if got == -1:
        err = ctypes.get_errno()
        if err == errno.EFAULT:
            raise MemoryFault(f"{what} {where}: address not mapped "
                              "or not accessible in the target", pid=pid)
        raise oserror.translate(err, pid, what, traced=True)
    if got != n:
        raise MemoryFault(f"{what} {where}: only {got} bytes accessible", pid=pid)
    return got


def read(pid: int, addr: int, n: int) -> bytes:
    """N bytes at ADDR in PID (process_vm_readv); raises MemoryFault."""
    if n == 0:
        return b""
    keep, at = cbytes.reader(n)
    _vm(_pvr, pid, addr, at, n, "process_vm_readv")
    data = cbytes.take(at, n)
    del keep
    return data


def try_read(pid: int, addr: int, n: int) -> bytes | None:
    """Like ``read`` but None when the bytes are not all accessible."""
    try:
        return read(pid, addr, n)
    except MemoryFault:
        return None


def write(pid: int, addr: int, data: bytes) -> None:
    """Write DATA at ADDR in PID (process_vm_writev); raises MemoryFault."""
    data = bytes(data)
    if not data:
        return
    _vm(_pvw, pid, addr, cbytes.address(data), len(data), "process_vm_writev")


# Ranges one write_many call passes to the kernel (IOV_MAX is 1024); the
# array type is made once here: making one per call costs tens of
# microseconds the first time in a process, inside the stop.
WRITE_MANY_MAX = 32
_RemoteIovecs = _iovec * WRITE_MANY_MAX


def write_many(pid: int, writes: Sequence[tuple[int, bytes]]) -> None:
    """Every (ADDR, DATA) of WRITES in PID with one process_vm_writev (one
    local buffer, one remote iovec each, in order): the remote engine's
    frame and the scratch a call reads cost one syscall, not one each
    (~3-10 us apiece inside a stop).  Raises MemoryFault when not all
    bytes were written (the kernel stops at the first inaccessible one)."""
    writes = [(int(a), bytes(d)) for a, d in writes if d]
    if not writes:
        return
    if len(writes) == 1:
        write(pid, *writes[0])
        return
    if len(writes) > WRITE_MANY_MAX:          # in order, a batch at a time
        write_many(pid, writes[:WRITE_MANY_MAX])
        write_many(pid, writes[WRITE_MANY_MAX:])
        return
    data = b"".join(d for _, d in writes)
    local = _iovec(cbytes.address(data), len(data))
    remote = _RemoteIovecs()
    for i, (a, d) in enumerate(writes):
        remote[i].iov_base, remote[i].iov_len = a, len(d)
    ctypes.set_errno(0)
    got: int = _pvw(pid, ctypes.byref(local), 1, remote, len(writes), 0)
    _transferred(got, len(data), pid, "process_vm_writev",
                 f"{len(data)} bytes in {len(writes)} ranges from {writes[0][0]:#x}")


class ProcessMemory:
    """One process's memory.  ``force=False``: process_vm_readv/writev
    (page protections honoured); ``force=True``: /proc/PID/mem (FOLL_FORCE
    reads).  Use as a context manager when ``force`` (it holds an fd)."""

    def __init__(self, pid: int, procfs_root: str = "/proc", force: bool = False) -> None:
        self.pid = pid
        self._procfs = procfs_root
        self._fd: int | None = None
        if force:
            path = os.path.join(procfs_root, str(pid), "mem")
            try:
                self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except (FileNotFoundError, ProcessLookupError):
                # ESRCH: the process exited (a zombie has no memory to open)
                raise NoSuchProcess(pid) from None
            except PermissionError:
                raise AccessDenied(pid, "permission denied reading process memory "
                                        "(/proc/PID/mem needs ptrace rights)") from None

    def try_read(self, addr: int, size: int) -> bytes | None:
        """SIZE bytes at ADDR, or None when not all of them are readable."""
        if self._fd is None:
            return try_read(self.pid, addr, size)
        try:
            data = os.pread(self._fd, size, addr)
        except OSError:
            # EIO: unmapped; ESRCH after the process exited.
            if not os.path.exists(f"{self._procfs}/{self.pid}"):
                raise NoSuchProcess(self.pid) from None
            return None
        return data if len(data) == size else None

    def read(self, addr: int, size: int) -> bytes:
        """SIZE bytes at ADDR; raises MemoryFault when not all readable."""
        data = self.try_read(addr, size)
        if data is None:
            raise MemoryFault(f"read {size} bytes at {addr:#x}: address not mapped "
                              "or not accessible in the target", pid=self.pid)
        return data

    def write(self, addr: int, data: bytes) -> None:
        write(self.pid, addr, data)

    def read_u64(self, addr: int) -> int | None:
        """The little-endian u64 at ADDR, or None when unreadable."""
        data = self.try_read(addr, 8)
        if not data:
            return None
        value: int = struct.unpack("<Q", data)[0]
        return value

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ProcessMemory:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class MemoryReader(ProcessMemory):
    """/proc/PID/mem reader whose ``read`` returns None for unmapped bytes
    (the semantics detection and the heap walkers are written for)."""

    def __init__(self, pid: int, procfs_root: str = "/proc") -> None:
        super().__init__(pid, procfs_root, force=True)

    def read(self, addr: int, size: int) -> bytes | None:  # type: ignore[override]  # historical: None for unmapped
        return self.try_read(addr, size)
