"""In-process calls with the interface of a remote ``Call``.

Self mode (collectors.selfstats) and the in-process baseline of
``bench/pause.py`` run the very gather code the live path runs
(collectors.allocators.*.gather) against the calling process: ``InProcess``
has ``Call``'s methods (``call``, ``read``, ``write``, ``scratch``,
``cstring``, ``max_args``) and ``SelfResolver`` the resolver's
(``address``, ``libc``, ``process_key``).

Scratch memory is one buffer allocated when the object is made, carved
downward like the borrowed thread's stack, so the gather code allocates
nothing in this process while it calls the allocator.
"""

from __future__ import annotations

import ctypes
import os
import threading

from collectors.engine import abi
from diag.model.errors import RemoteCallError

SCRATCH_BYTES = 64 * 1024     # scratch + buffers: jemalloc's 56 KiB stats buffer fits
_ALIGN = 16

_libc = ctypes.CDLL(None)
_strnlen = _libc.strnlen
_strnlen.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_strnlen.restype = ctypes.c_size_t


class InProcess:
    """Calls into this process's own code; a ``Call`` look-alike."""

    kind = "self"
    syscall = None
    max_args = 16

    def __init__(self, scratch_bytes: int = SCRATCH_BYTES) -> None:
        self._buf = ctypes.create_string_buffer(scratch_bytes)
        self._base = ctypes.addressof(self._buf)
        self._low = self._top = self._base + scratch_bytes
        self.tid = threading.get_native_id()
        self._protos: dict[int, type[ctypes._CFunctionType]] = {}

    def call(self, func_addr: int, *args: int, timeout_s: float | None = None) -> int:
        """FUNC_ADDR(*ARGS) with integer arguments; returns rax as an unsigned int."""
        n = len(args)
        proto = self._protos.get(n)
        if proto is None:
            proto = self._protos[n] = ctypes.CFUNCTYPE(ctypes.c_uint64, *(ctypes.c_uint64,) * n)
        ret: int = proto(int(func_addr))(*(int(a) & abi.U64_MASK for a in args))
        return ret

    def read(self, addr: int, n: int) -> bytes:
        return ctypes.string_at(addr, n)

    def write(self, addr: int, data: bytes) -> None:
        ctypes.memmove(addr, bytes(data), len(data))

    def scratch(self, n: int) -> int:
        low = (self._low - int(n)) & ~(_ALIGN - 1)
        if low < self._base:
            raise RemoteCallError(f"scratch limit {self._top - self._base} bytes exceeded")
        self._low = low
        return low

    def buffer(self, n: int) -> int:
        """N zeroed bytes (the remote engine's buffer starts with a NUL;
        here it comes from the same preallocated buffer as scratch)."""
        at = self.scratch(n)
        ctypes.memset(at, 0, n)
        return at

    def mapped(self, addr: int) -> None:
        """Call.mapped's answer here: None, since a buffer is this
        process's own memory, neither a mapping made for it nor a thread's
        stack."""
        return None

    def cstring(self, addr: int, limit: int = 1 << 20) -> bytes:
        return ctypes.string_at(addr, _strnlen(addr, limit))


def symbol(lib: ctypes.CDLL, name: str) -> int | None:
    """Address of NAME in ctypes library LIB, or None."""
    try:
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    except AttributeError:
        return None


class SelfResolver:
    """Addresses in this process, for an allocator module's ``plan``: the
    allocator's functions from LIB (the object that defines malloc) only."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib

    def address(self, obj: object, name: str) -> int | None:
        return symbol(self.lib, name)

    def libc(self, name: str) -> int | None:
        return symbol(_libc, name)

    def libc_ifunc(self, name: str) -> bool:
        return False          # dlsym already returned the implementation

    def libc_impl(self, name: str) -> int | None:
        return self.libc(name)

    def process_key(self, obj: object) -> tuple[int, str]:
        return (os.getpid(), "self")
