"""Read words out of a live process without stopping it.

Uses pread(2) on /proc/PID/mem.  The kernel checks PTRACE_MODE_ATTACH for
this (the same check as ptrace attach and process_vm_readv), so Yama's
ptrace_scope and CAP_SYS_PTRACE apply, but the target is never stopped.
"""

import os
import struct

from collectors.errors import AccessDenied, NoSuchProcess


class MemoryReader:
    """An open handle on one process's memory; use as a context manager."""

    def __init__(self, pid, procfs_root="/proc"):
        self.pid = pid
        path = os.path.join(procfs_root, str(pid), "mem")
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NoSuchProcess(pid) from None
        except PermissionError:
            raise AccessDenied(pid, "permission denied reading process memory "
                                    "(/proc/PID/mem needs ptrace rights)") from None

    def read(self, addr, size):
        """SIZE bytes at ADDR, or None when that address is not mapped."""
        try:
            data = os.pread(self._fd, size, addr)
        except OSError:
            # EIO: unmapped; ESRCH after the process exited.
            if not os.path.exists(f"/proc/{self.pid}"):
                raise NoSuchProcess(self.pid) from None
            return None
        return data if len(data) == size else None

    def read_u64(self, addr):
        data = self.read(addr, 8)
        return struct.unpack("<Q", data)[0] if data else None

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
