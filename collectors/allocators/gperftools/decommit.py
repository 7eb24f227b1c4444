"""Where gperftools keeps its aggressive-decommit switch, so the knob is
read from memory instead of asked for with a ``GetNumericProperty`` call
inside the stop (~80 us of a new allocdiag process's stop on the guest
this was built on, bench/pause.py --snapshots).

gperftools 2.x, src/tcmalloc.cc, ``TCMallocImplementation::GetNumericProperty``::

    if (strcmp(name, "tcmalloc.aggressive_memory_decommit") == 0) {
      SpinLockHolder l(Static::pageheap_lock());
      *value = size_t(Static::pageheap()->GetAggressiveDecommit());
      return true;
    }

``GetAggressiveDecommit`` returns ``PageHeap::aggressive_decommit_``
(src/page_heap.h), a bool of the one static PageHeap, set at start-up from
TCMALLOC_AGGRESSIVE_DECOMMIT (src/static_vars.cc) and changed only by
``SetNumericProperty`` of the same name.  ``Static::pageheap_`` is hidden,
so the address is taken from the code.  Compiled, the comparison is
``lea NAME(%rip),%rsi; mov ..,%rdi; call strcmp; test %eax,%eax; je
BRANCH``, and BRANCH, once it holds the lock, loads the byte with ``movzbl
disp32(%rip),%eax``.  Debian 12's 2.10 (libtcmalloc.so.4.5.10,
GetNumericProperty at 0x1a410): ``lea 0x212a5(%rip),%rsi`` at 0x1a5e4 (the
name at 0x3b890), ``je 0x1ad56``, ``movzbl 0x1b9a5a(%rip),%eax`` at 0x1ad6b
-> 0x1d47cc in .bss; libtcmalloc_minimal, _debug and _and_profiler the same.
``locate`` finds that pattern; anything else gives None.  What it finds is
used only after a snapshot checked it (the same stop makes the call and
reads the byte: collectors.allocators.checked).

The byte is read without the lock: the lock orders nothing else here (the
byte is written at start-up and by SetNumericProperty only), so the read
returns what the getter would.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

NAME = b"tcmalloc.aggressive_memory_decommit\0"
# the function whose code holds the pattern (.dynsym of Debian's builds)
ENTRY = "_ZN22TCMallocImplementation18GetNumericPropertyEPKcPm"

# x86-64 encodings used by the pattern
REX_W = 0x48
REX_R = 0x04
LEA = 0x8D
MODRM_RIP = 0x05                        # mod 00, r/m 101: disp32(%rip)
MODRM_RIP_MASK = 0xC7                   # mod and r/m bits
LEA_LEN = 7                             # REX, 8d, ModRM, disp32
CALL_REL32 = 0xE8
CALL_LEN = 5
TEST_EAX_EAX = b"\x85\xc0"
JE_REL32, JNE_REL32 = b"\x0f\x84", b"\x0f\x85"
JE_REL8, JNE_REL8 = 0x74, 0x75
TWO_BYTE = 0x0F
MOVZX_BYTE = 0xB6                       # 0f b6 /r: movzbl r/m8, r32
REX_MIN, REX_MAX = 0x40, 0x4F
FUNCTION_SCAN = 4096                    # bytes of GetNumericProperty searched for the lea
CALL_WINDOW = 16                        # bytes after the lea searched for the strcmp call
BRANCH_SCAN = 64                        # bytes of the branch searched for the load


def _rel32(code: bytes, at: int) -> int:
    value: int = struct.unpack_from("<i", code, at)[0]
    return value


def branch_after_compare(code: bytes, vaddr: int, start: int) -> int | None:
    """Where the code goes when the ``strcmp`` after a lea ending at START
    returned 0: the target of ``je``, or the instruction after ``jne``
    (CODE begins at VADDR).  None when no ``call; test %eax,%eax; j(n)e``
    follows within CALL_WINDOW bytes."""
    for k in range(start, min(start + CALL_WINDOW, len(code) - CALL_LEN - 4)):
        if code[k] != CALL_REL32 or code[k + CALL_LEN:k + CALL_LEN + 2] != TEST_EAX_EAX:
            continue
        j = k + CALL_LEN + 2
        op = code[j:j + 2]
        if op in (JE_REL32, JNE_REL32) and j + 6 <= len(code):
            end = j + 6
            return vaddr + (end + _rel32(code, j + 2) if op == JE_REL32 else end)
        if code[j] in (JE_REL8, JNE_REL8) and j + 2 <= len(code):
            end = j + 2
            rel8 = code[j + 1] - 256 if code[j + 1] > 127 else code[j + 1]
            return vaddr + (end + rel8 if code[j] == JE_REL8 else end)
    return None


def byte_load(code: bytes, vaddr: int) -> int | None:
    """Target of the first ``movzbl disp32(%rip), %r32`` in CODE (at VADDR)."""
    for i in range(len(code) - 6):
        at = i + 1 if REX_MIN <= code[i] <= REX_MAX else i
        if code[at] != TWO_BYTE or at + 7 > len(code) or code[at + 1] != MOVZX_BYTE or \
                code[at + 2] & MODRM_RIP_MASK != MODRM_RIP:
            continue
        end = at + 7
        return vaddr + end + _rel32(code, at + 3)
    return None


def locate(code_at: Callable[[int, int], bytes | None], entry: int,
           writable: Callable[[int], bool]) -> int | None:
    """Virtual address of ``PageHeap::aggressive_decommit_`` from the code
    of GetNumericProperty at ENTRY, or None.  CODE_AT(vaddr, n) reads the
    file; WRITABLE says whether a vaddr lies in a writable PT_LOAD."""
    code = code_at(entry, FUNCTION_SCAN) or b""
    for i in range(len(code) - LEA_LEN + 1):
        rex, op, modrm = code[i], code[i + 1], code[i + 2]
        if rex & ~REX_R & 0xFF != REX_W or op != LEA or modrm & MODRM_RIP_MASK != MODRM_RIP:
            continue
        branch = branch_after_compare(code, entry, i + LEA_LEN)
        if branch is None:
            continue
        if code_at(entry + i + LEA_LEN + _rel32(code, i + 3), len(NAME)) != NAME:
            continue
        target = byte_load(code_at(branch, BRANCH_SCAN) or b"", branch)
        return target if target is not None and writable(target) else None
    return None
