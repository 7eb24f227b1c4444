"""Which CPython a process runs, if any: asked of every snapshot, so kept
apart from ``collectors.runtimes.pymalloc``, which is imported only to read
the heap of a process that has one (its import costs a run ~1.5 ms)."""

import os
import re
import struct

_NAME_VERSION = re.compile(r"python(\d)\.(\d+)(t?)(?:\b|[^0-9])")


def u32(data):
    """DATA, 4 bytes read from the target, as a little-endian uint32; None
    for a short or failed read."""
    return struct.unpack("<I", data)[0] if data and len(data) == 4 else None


def find_python(image):
    """(LoadedObject, (major, minor), version string, free_threaded) of the
    object that holds the interpreter (defines ``_PyRuntime``), or None."""
    for obj in image.objects:
        if obj.elf is None or obj.bias is None or not obj.elf.defines("_PyRuntime"):
            continue
        names = [obj.elf.soname or "", os.path.basename(obj.path), image.exe_path or ""]
        mm, ft = None, False
        for n in names:
            m = _NAME_VERSION.search(n)
            if m:
                mm, ft = (int(m.group(1)), int(m.group(2))), m.group(3) == "t"
                break
        version = None
        # const unsigned long, 3.11+: PY_VERSION_HEX in its low 32 bits
        sym = obj.elf.dynamic("Py_Version")
        if sym is not None and sym.defined:
            hexv = u32(obj.elf.text_bytes(sym.st_value, 4, obj.opener.open))
            if hexv:
                major, minor, micro = hexv >> 24, (hexv >> 16) & 0xFF, (hexv >> 8) & 0xFF
                mm = (major, minor)
                version = f"{major}.{minor}.{micro}"
        if mm is None:
            continue
        return obj, mm, version or f"{mm[0]}.{mm[1]}", ft
    return None
