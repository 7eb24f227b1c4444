"""Memory for the engine's syscalls without a ctypes array type per size.

``ctypes.create_string_buffer(n)`` makes the type ``c_char * n`` the first
time a process asks for that size (ctypes then keeps it).  Measured on the
slow guest: 17-50 us for a new size, 1-4 us for a known one.  The remote
engine's frame writes and its reads of a call's output vary in size with
each call's data, so inside the stop every new size paid that: 64-80 us of
a 600 us jemalloc stop went to making two such types (the 17-19 byte frame
flush, the 16 KiB first read of the stats text).

- ``address(data)``: where an immutable ``bytes`` object's contents are, for
  a syscall that only reads them (process_vm_writev's local buffer,
  PTRACE_SETREGSET).  The caller keeps DATA alive for the syscall.
- ``reader(n)``: a writable buffer of at least N bytes and its address, for
  a syscall that fills it (process_vm_readv); ``take(addr, n)`` copies the
  N bytes out.  Up to ``READ_BYTES`` it is one buffer per thread, made once
  and reused (no allocation, no fresh pages inside a stop); a larger read
  gets a buffer of its own.
"""

from __future__ import annotations

import ctypes
import threading

__all__ = ["address", "reader", "take", "READ_BYTES"]

# The thread's reused read buffer: the engine's reads of a call's output
# are at most the 16 KiB first read of a stats text (collectors.allocators
# .common.text_at); larger reads are rare and outside the hot path.
READ_BYTES = 64 * 1024

_local = threading.local()


def address(data: bytes) -> int:
    """The address of DATA's bytes (DATA must stay alive while it is used)."""
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0


def _new(n: int) -> tuple[bytearray, int, ctypes.c_char]:
    buf = bytearray(n)
    view = ctypes.c_char.from_buffer(buf)       # holds the export: BUF never moves
    return buf, ctypes.addressof(view), view


def reader(n: int) -> tuple[object, int]:
    """(KEEP, ADDRESS) of at least N writable bytes; hold KEEP until the
    bytes are taken."""
    if n > READ_BYTES:
        buf, addr, view = _new(n)
        return (buf, view), addr
    mine = getattr(_local, "read", None)
    if mine is None:
        mine = _local.read = _new(READ_BYTES)
    return mine, mine[1]


def take(addr: int, n: int) -> bytes:
    """N bytes at ADDR (in allocdiag's own memory) as a new bytes object."""
    return ctypes.string_at(addr, n)
