"""/proc/PID/auxv: the auxiliary vector the kernel gave the program at exec
(getauxval(3); 64-bit little endian pairs of a_type, a_val)."""

from __future__ import annotations

import struct

# include/uapi/linux/auxvec.h
AT_NULL = 0          # the end of the vector
AT_BASE = 7          # the interpreter's (ld.so's) load address
AT_SECURE = 23       # secure-execution mode (setuid, setgid, capabilities)
_AUXV_ENTRY = struct.Struct("<QQ")     # Elf64_auxv_t: a_type, a_val


def parse_auxv(data: bytes) -> dict[int, int]:
    """The auxiliary vector as {a_type: a_val}, up to AT_NULL."""
    out = {}
    usable = len(data) // _AUXV_ENTRY.size * _AUXV_ENTRY.size
    for a_type, a_val in _AUXV_ENTRY.iter_unpack(data[:usable]):
        if a_type == AT_NULL:
            break
        out[a_type] = a_val
    return out
