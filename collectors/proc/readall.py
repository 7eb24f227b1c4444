"""The one raw read of a whole kernel file (/proc, /sys): bytes to EOF.

``open(path, "rb").read()`` costs nine system calls on a /proc file (openat,
two fstat, the TCGETS ioctl of the tty check, two lseek, two reads, close);
this costs four (openat, the reads, close), ~3 us less a file, and a
snapshot reads ~40 of them.  Errors are the OSError ``open`` raises:
callers translate them as before.
"""

from __future__ import annotations

import os

# One read asks for this much: a status, stat or cgroup file, or the maps
# of a typical process, in one go (each read allocates it, then shrinks it).
READ_CHUNK = 1 << 16
_FLAGS = os.O_RDONLY | os.O_CLOEXEC


def read_all(path: str) -> bytes:
    """The bytes of PATH, read until read(2) returns 0: a short read is not
    the end for a seq_file (maps of a process with 20k mappings comes in
    pieces)."""
    fd = os.open(path, _FLAGS)
    try:
        chunks = []
        while chunk := os.read(fd, READ_CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)     # one chunk: returned as it is, not copied
    finally:
        os.close(fd)
