"""Where mimalloc 2.0 keeps ``_mi_stats_main``, so its committed-bytes
counter is read from memory instead of calling ``mi_process_info``.

mimalloc 2.0's ``mi_process_info`` (src/stats.c) returns, as
``current_commit`` and ``peak_commit``, ``_mi_stats_main.committed.current``
and ``.peak``: a relaxed atomic load each.  The OS layer (src/os.c) counts
every commit and decommit straight into ``_mi_stats_main``, never into a
thread's own statistics, so those two words are the live values.  Reading
them saves a call, ~45-75 us of a new allocdiag process's stop.

Debian's libmimalloc.so.2.0 is stripped and does not export
``_mi_stats_main``.  Its address is in the code: ``mi_process_info`` calls
an internal function that takes it with a RIP-relative ``lea`` and loads
``committed.peak`` and ``committed.current`` from it at +0x70 and +0x78
(measured on Debian 12's 2.0.9, build-id d07f4e7d...: ``lea 0x5ad10(%rip),
%rax`` -> 0x61c40, then ``mov 0x70(%rax),%rdx`` and ``mov 0x78(%rax),%rax``).
``locate`` finds that pattern; anything else gives None.  What it finds is
used only after one snapshot checked it: the same stop calls
``mi_process_info`` and reads the two words, and they must be equal
(collectors.allocators.mimalloc.reader: the check is kept per file, in memory and in
the detection cache).

mi_stats_t in 2.0 (include/mimalloc-types.h) begins with mi_stat_count_t
``segments, pages, reserved, committed``, each ``{int64 allocated, freed,
peak, current}``.  ``reserved`` (address space taken from the OS) is the
count just before ``committed`` and is counted by the OS layer the same way,
so it is read with it: the text prints it rounded to 0.1 of a unit.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

COUNT = struct.Struct("<qqqq")          # mi_stat_count_t: allocated, freed, peak, current
COUNT_FIELDS = ("allocated", "freed", "peak", "current")
RESERVED = 2 * COUNT.size               # offsetof(mi_stats_t, reserved) in 2.0
COMMITTED = 3 * COUNT.size              # offsetof(mi_stats_t, committed) in 2.0
PEAK, CURRENT = 16, 24                  # offsetof(mi_stat_count_t, peak / current)
OS_COUNTS = struct.Struct("<8q")        # reserved and committed, read together
CHECKED = struct.Struct("<qq")          # committed.peak, committed.current: what is compared
CHECKED_OFFSET = COMMITTED + PEAK       # where those two words begin
SYMBOL = "_mi_stats_main"               # unstripped builds name it


def read_os_counts(read: Callable[[int, int], bytes | None], address: int
                   ) -> tuple[int, ...] | None:
    """The OS_COUNTS words of the ``_mi_stats_main`` at ADDRESS, through
    READ(addr, n) (a MemoryReader's), or None when they could not be read."""
    got = read(address + RESERVED, OS_COUNTS.size)
    return OS_COUNTS.unpack(got) if got else None


def os_counts(words: tuple[int, ...]) -> dict[str, dict[str, int]]:
    """OS_COUNTS WORDS as {"reserved": {...}, "committed": {...}}, each keyed
    by COUNT_FIELDS (what the native document holds)."""
    n = len(COUNT_FIELDS)
    return {"reserved": dict(zip(COUNT_FIELDS, words[:n])),
            "committed": dict(zip(COUNT_FIELDS, words[n:]))}

# x86-64 encodings used by the pattern
CALL_REL32 = 0xE8
LEA = 0x8D
MOV_LOAD = 0x8B
REX_W = 0x48
REX_R = 0x04
REX_B = 0x01
MODRM_RIP = 0x05                        # mod 00, r/m 101: disp32(%rip)
MOD_DISP8 = 0x40                        # mod 01: disp8(reg)
RM_SIB = 0x04                           # r/m 100 needs a SIB byte: not matched
LEA_LEN = 7                             # REX, 8d, ModRM, disp32
CALLER_SCAN = 256                       # bytes of mi_process_info searched for calls
CALLEE_SCAN = 1024                      # bytes of each callee searched for the lea
LOADS_SCAN = 32                         # bytes after the lea searched for the two loads


def _rel32(code: bytes, at: int) -> int:
    value: int = struct.unpack_from("<i", code, at)[0]
    return value


def _loads_from(code: bytes, start: int, reg: int) -> set[int]:
    """disp8 of the 64-bit loads ``mov disp8(REG), %r64`` in CODE[start:start+LOADS_SCAN]."""
    out = set()
    end = min(len(code) - 3, start + LOADS_SCAN)
    for i in range(start, end):
        rex, op, modrm = code[i], code[i + 1], code[i + 2]
        if rex & 0xF8 != REX_W or op != MOV_LOAD or modrm & 0xC0 != MOD_DISP8:
            continue
        rm = modrm & 0x07
        if rm == RM_SIB or rm | (8 if rex & REX_B else 0) != reg:
            continue
        out.add(code[i + 3])
    return out


def find_in_callee(code: bytes, vaddr: int, writable: Callable[[int], bool]) -> int | None:
    """In CODE (at VADDR), the target of the first ``lea disp32(%rip), %r64``
    that lies in writable data and is followed by loads at the committed
    counter's peak and current offsets from the same register."""
    for i in range(len(code) - LEA_LEN + 1):
        rex, op, modrm = code[i], code[i + 1], code[i + 2]
        if rex & 0xFA != REX_W or op != LEA or modrm & 0xC7 != MODRM_RIP:
            continue
        target = vaddr + i + LEA_LEN + _rel32(code, i + 3)
        if not writable(target):
            continue
        reg = (modrm >> 3) & 0x07 | (8 if rex & REX_R else 0)
        loads = _loads_from(code, i + LEA_LEN, reg)
        if {COMMITTED + PEAK, COMMITTED + CURRENT} <= loads:
            return target
    return None


def locate(code_at: Callable[[int, int], bytes | None], entry: int,
           executable: Callable[[int], bool], writable: Callable[[int], bool]) -> int | None:
    """Virtual address of ``_mi_stats_main`` from the code of
    ``mi_process_info`` at ENTRY, or None.  CODE_AT(vaddr, n) reads the
    file; EXECUTABLE/WRITABLE say whether a vaddr lies in such a PT_LOAD.
    Each ``call rel32`` of the first CALLER_SCAN bytes whose target is code
    is followed, in order."""
    caller = code_at(entry, CALLER_SCAN) or b""
    seen = set()
    for i in range(len(caller) - 4):
        if caller[i] != CALL_REL32:
            continue
        callee = entry + i + 5 + _rel32(caller, i + 1)
        if callee in seen or not executable(callee):
            continue
        seen.add(callee)
        found = find_in_callee(code_at(callee, CALLEE_SCAN) or b"", callee, writable)
        if found is not None:
            return found
    return None
