"""Synthetic x86-64 code laid out at virtual addresses, read back the way
``ElfObject.text_bytes`` reads a file: for the tests of the finders that
take an address from a library's code (mimalloc statsmain, gperftools
decommit)."""

import struct


def rel32(target, end):
    """The rel32 of an instruction ending at END that reaches TARGET."""
    return struct.pack("<i", target - end)


def code_at(segments):
    """A CODE_AT(vaddr, n) over SEGMENTS ({start vaddr: bytes}): the bytes
    from VADDR on (fewer at a segment's end), None outside every segment."""
    def read(v, n):
        for start, data in segments.items():
            if start <= v < start + len(data):
                return data[v - start: v - start + n]
        return None
    return read


def library(path):
    """(the ElfObject of the library file PATH, a CODE_AT over its file,
    the opener its lazy parts need)."""
    from collectors.binary import elf as elfmod

    class Opener:
        display_path = path

        def open(self):
            return open(path, "rb")
    op = Opener()
    obj = elfmod.load(op)
    return obj, lambda v, n: obj.text_bytes(v, n, op.open), op.open
