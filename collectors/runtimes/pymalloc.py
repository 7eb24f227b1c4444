"""CPython's small-object allocator (pymalloc), read out of a live process.

Objects of 512 bytes or less come from pymalloc arenas that CPython maps
with ``mmap`` itself, so malloc's statistics never see them.  This module
finds the main interpreter's obmalloc state in the target and walks it
from outside: the ``arenas`` vector (``allarenas`` in 3.12+), then the
header of every carved pool in every arena, exactly as
``_PyObject_DebugMallocStats`` does in Objects/obmalloc.c.  Every read is a
``pread`` of /proc/PID/mem (collectors.engine.memory) and /proc/PID/pagemap: no
thread is stopped, nothing runs in the target.

Why not call ``_PyObject_DebugMallocStats`` / ``_Py_GetAllocatedBlocks`` in
the target: without the GIL they crash 3.12+ (get_state dereferences the
thread state: SIGSEGV measured on 3.12.1 and 3.13.0) and race on 3.11;
taking the GIL from a borrowed thread deadlocks when the GIL holder is the
stopped thread, blocks behind C code that holds the GIL, and mallocs a new
thread state.

Where the state is (names as in obmalloc.c / pycore_obmalloc.h):

* 3.10, 3.11: static globals of obmalloc.c (``arenas``, ``maxarenas``,
  ``narenas_currently_allocated``, ``narenas_highwater``,
  ``ntimes_arena_allocated``, ``usedpools``).  With ``.symtab`` (pyenv,
  source builds) by name; stripped (Debian's /usr/bin/python3.11) from the
  code of two exported functions: ``_Py_GetAllocatedBlocks`` loads
  ``maxarenas`` (32-bit) and ``arenas`` (64-bit, then dereferenced) with
  RIP-relative moves, and ``_PyObject_DebugMallocStats`` loads
  ``narenas_highwater`` / ``ntimes_arena_allocated`` into the third argument
  next to the reference of their label string.  Each candidate is checked
  against the live structures; no candidate or two candidates -> unknown.
* 3.12, 3.13: ``struct _obmalloc_state`` (pools.used first, then mgmt), in
  ``_PyRuntime._main_interpreter`` (3.12) or the static
  ``obmalloc_state_main`` (3.13).  By symbol when present, else by a
  validated signature scan of ``usedpools`` (pools.used) inside
  ``_PyRuntime`` (3.12) or the object's writable segment (3.13).

What the numbers do not cover (listed in ``Runtime.missed``): arenas of
sub-interpreters with their own obmalloc state (3.12+), debug hooks (their
pads are counted as allocated), the free-threaded build (its vendored
mimalloc has no arenas of this kind), and ``PYTHONMALLOC=malloc`` (no
pymalloc at all: the allocator layer then sees every object).
"""

import struct
from collections import namedtuple

from diag.model.errors import AccessDenied, AllocdiagError, NoSuchProcess
from collectors.engine.memory import MemoryReader
from collectors.proc.pagemap import Pagemap, present_caveat
from diag.model import Runtime, Value
from collectors.runtimes.interpreter import find_python, u32

# -- layout ---------------------------------------------------------------
# 64-bit builds only: ALIGNMENT 16 (blocks come in 32 classes of 16..512 B).
ALIGNMENT = 16
SMALL_REQUEST_THRESHOLD = 512
NB_SMALL_SIZE_CLASSES = SMALL_REQUEST_THRESHOLD // ALIGNMENT
# struct arena_object: address, pool_address, nfreepools, ntotalpools,
# freepools, nextarena, prevarena (48 bytes; identical 3.10-3.13).
ARENA_OBJECT = struct.Struct("<QQIIQQQ")
# struct pool_header: ref.count (a uint inside a pointer-sized union),
# freeblock, nextpool, prevpool, arenaindex, szidx, nextoffset, maxnextoffset.
POOL_HEADER = struct.Struct("<I4xQQQIIII")
POOL_OVERHEAD = 48      # _Py_SIZE_ROUND_UP(sizeof(struct pool_header), ALIGNMENT)

# struct _obmalloc_state (3.12, 3.13): offsets checked against the DWARF of
# pyenv's 3.12.1 and 3.13.0 builds.
STATE_USED = 0x000                       # pools.used[64]
STATE_ARENAS = 0x200                     # mgmt.arenas
STATE_MAXARENAS = 0x208                  # mgmt.maxarenas (uint)
STATE_NARENAS_CURRENTLY_ALLOCATED = 0x428
STATE_NTIMES_ARENA_ALLOCATED = 0x430
STATE_NARENAS_HIGHWATER = 0x438

# Layout per CPython version (major, minor).  ``state``: "globals" (static
# variables of obmalloc.c) or "struct" (struct _obmalloc_state).  Arena and
# pool sizes: USE_LARGE_ARENAS / USE_LARGE_POOLS on 64-bit with the radix
# tree, which 3.10 introduced (1 MiB arenas, 16 KiB pools; 3.9 and older had
# 256 KiB / 4 KiB).  Also visible in the code: Debian's 3.11.2 aligns pools
# with `add $0x3fff` and prints `$0x100000` bytes/arena.
Layout = namedtuple("Layout", "arena_size pool_size state")
LAYOUTS = {
    (3, 10): Layout(1 << 20, 1 << 14, "globals"),
    (3, 11): Layout(1 << 20, 1 << 14, "globals"),
    (3, 12): Layout(1 << 20, 1 << 14, "struct"),
    (3, 13): Layout(1 << 20, 1 << 14, "struct"),
}

# A maxarenas beyond this (2^24 arena objects = 16 TiB of arenas) is not a
# real count: the read was torn or the address is wrong.
MAXARENAS_SANE = 1 << 24
INITIAL_ARENA_OBJECTS = 16
TRIES = 3                     # walks attempted before a torn read is final

MISSED = (
    "sub-interpreters with their own obmalloc state (3.12+): only the main interpreter is read",
    "debug hooks (PYTHONMALLOC=debug, -X dev): their pads count as allocated",
    "free-threaded build (3.13t): objects come from its vendored mimalloc, not from arenas",
)

Anchors = namedtuple("Anchors", "arenas maxarenas narenas_current highwater ntimes "
                                "usedpools located_by")


class Invalid(Exception):
    """The target's structures failed a sanity check (torn read, wrong
    address or layout)."""


def numblocks(pool_size, szidx):
    """NUMBLOCKS(I): blocks in one pool of size class SZIDX."""
    return (pool_size - POOL_OVERHEAD) // ((szidx + 1) * ALIGNMENT)


def _u64(data):
    return struct.unpack("<Q", data)[0] if data and len(data) == 8 else None


# -- locating the state -------------------------------------------------------

def _writable_ranges(elf):
    """Unrelocated [start, end) of .data/.bss-like sections."""
    out = []
    for name in (".data", ".bss", ".data.rel.ro", ".data.rel.local"):
        sec = elf.sections.get(name)
        if sec:
            out.append((sec[0], sec[0] + sec[2]))
    return out


def _in(ranges, addr):
    return any(a <= addr < b for a, b in ranges)


# x86-64 encodings the byte scans below look for (Intel SDM vol. 2, "MOV",
# "MOVSXD", "LEA", "CALL", "JMP", and 2.1.3 ModR/M, 2.2.1 REX).
REX_FIRST, REX_LAST = 0x40, 0x4F     # REX prefixes
REX_W, REX_R = 8, 4                  # 64-bit operand size; ModR/M reg extension
OP_MOV_LOAD = 0x8B                   # MOV r, r/m
OP_MOVSXD = 0x63                     # MOVSXD r64, r/m32 (with REX.W)
MODRM_RM_MASK = 0xC7                 # mod and r/m bits of a ModR/M byte
MODRM_RIP = 0x05                     # mod 00, r/m 101: [rip + disp32]
MODRM_SIB = 0x04                     # mod 00, r/m 100: a SIB byte follows
SIB_DISP32 = 0x25                    # SIB with no base, no index: [disp32]
OP_MOV_ESI_IMM32 = 0xBE              # MOV esi, imm32
LEA_RSI_RIP = b"\x48\x8d\x35"         # LEA rsi, [rip + disp32]
OP_CALL_REL32, OP_JMP_REL32 = 0xE8, 0xE9


def rip_loads(code, vaddr):
    """Loads from a fixed address in x86-64 CODE at VADDR: ``mov r, [rip+d]``,
    ``movslq r, [rip+d]`` and their absolute ``[d32]`` forms.

    Returns [(offset, reg, size, target)].  This is a byte scan, not a full
    decoder: a hit at a wrong instruction boundary yields a wrong target,
    which callers reject by requiring targets in the object's data sections
    and by validating the live value."""
    out = []
    n = len(code)
    for i in range(n - 6):
        j, rex = i, 0
        if i and REX_FIRST <= code[i - 1] <= REX_LAST:
            continue        # the REX-prefixed form at i - 1 is the instruction
        if REX_FIRST <= code[j] <= REX_LAST:
            rex = code[j]
            j += 1
        if j + 6 > n:
            break
        op = code[j]
        if op != OP_MOV_LOAD and not (op == OP_MOVSXD and rex & REX_W):
            continue
        modrm = code[j + 1]
        reg = ((modrm >> 3) & 7) | ((rex & REX_R) << 1)
        if modrm & MODRM_RM_MASK == MODRM_RIP:                      # [rip + disp32]
            end = j + 6
            target = vaddr + end + int.from_bytes(code[j + 2:end], "little", signed=True)
        elif modrm & MODRM_RM_MASK == MODRM_SIB and j + 7 <= n and code[j + 2] == SIB_DISP32:  # [disp32]
            target = int.from_bytes(code[j + 3:j + 7], "little", signed=True) & (2**64 - 1)
        else:
            continue
        size = 8 if (rex & REX_W and op == OP_MOV_LOAD) else 4
        out.append((i, reg, size, target))
    return out


def _string_refs(code, vaddr, str_addr):
    """Offsets in CODE of ``mov esi, imm32`` / ``lea rsi, [rip+d]`` that
    load STR_ADDR (the second argument of printone())."""
    out = []
    imm = struct.pack("<I", str_addr) if str_addr < 2**32 else None
    for i in range(len(code) - 7):
        if imm is not None and code[i] == OP_MOV_ESI_IMM32 and code[i + 1:i + 5] == imm:
            out.append(i)
        elif code[i:i + 3] == LEA_RSI_RIP:
            if vaddr + i + 7 + int.from_bytes(code[i + 3:i + 7], "little", signed=True) == str_addr:
                out.append(i)
    return out


def _rodata_string(elf, opener, text):
    """Unrelocated address of the NUL-terminated TEXT in the object's
    read-only data, or None."""
    needle = text + b"\0"
    with opener() as f:
        for name in (".rodata", ".rodata.str1.1", ".rodata.str1.8"):
            sec = elf.sections.get(name)
            if not sec or sec[3] == "SHT_NOBITS":
                continue
            f.seek(sec[1])
            data = f.read(sec[2])
            k = data.find(needle)
            while k > 0 and data[k - 1] != 0:      # whole string, not a tail
                k = data.find(needle, k + 1)
            if k >= 0:
                return sec[0] + k
    return None


RDX = 2     # third integer argument: printone(out, msg, value)


def _printed_counter(elf, opener, func_code, func_vaddr, label, data_ranges):
    """Address of the global that _PyObject_DebugMallocStats prints after
    LABEL: the 64-bit load into rdx next to the string reference."""
    s = _rodata_string(elf, opener, label)
    if s is None:
        return None
    loads = [ld for ld in rip_loads(func_code, func_vaddr)
             if ld[1] == RDX and ld[2] == 8 and _in(data_ranges, ld[3])]
    hits = set()
    for ref in _string_refs(func_code, func_vaddr, s):
        near = [ld for ld in loads if abs(ld[0] - ref) <= 24]
        if near:
            hits.add(min(near, key=lambda ld: abs(ld[0] - ref))[3])
    return hits.pop() if len(hits) == 1 else None


CALLEE_BYTES = 0x1000     # how much of a called function's code is scanned


def _with_callees(elf, vaddr, size, opener):
    """[(vaddr, code)] of a function and of the functions it calls or jumps
    to directly (``call/jmp rel32`` into .text), one level deep."""
    code = elf.text_bytes(vaddr, size, opener)
    out = [(vaddr, code)]
    text = elf.sections.get(".text")
    if not code or not text:
        return out
    seen = set()
    for i in range(len(code) - 4):
        if code[i] in (OP_CALL_REL32, OP_JMP_REL32):
            t = vaddr + i + 5 + int.from_bytes(code[i + 1:i + 5], "little", signed=True)
            if text[0] <= t < text[0] + text[2] and not vaddr <= t < vaddr + size and t not in seen:
                seen.add(t)
                callee = elf.text_bytes(t, CALLEE_BYTES, opener)
                if callee:
                    out.append((t, callee))
    return out


def _symbols_globals(obj):
    """3.10/3.11 with .symtab: the obmalloc.c statics by name."""
    tab = obj.elf.symtab(obj.opener.open)
    want = {"arenas": 8, "maxarenas": 4, "narenas_currently_allocated": 8,
            "narenas_highwater": 8, "ntimes_arena_allocated": 8, "usedpools": 512}
    got = {}
    for name, size in want.items():
        s = tab.get(name)
        if s is None or s.st_size != size:
            return None
        got[name] = obj.bias + s.st_value
    return Anchors(got["arenas"], got["maxarenas"], got["narenas_currently_allocated"],
                   got["narenas_highwater"], got["ntimes_arena_allocated"], got["usedpools"],
                   ".symtab")


def _code_globals(obj, read, layout):
    """3.10/3.11 stripped: the statics from the code of exported functions."""
    elf, opener = obj.elf, obj.opener.open
    data_ranges = _writable_ranges(elf)
    gab = elf.dynamic("_Py_GetAllocatedBlocks")
    if gab is None or not gab.defined or not gab.st_size:
        raise Invalid("_Py_GetAllocatedBlocks is not exported: cannot locate arenas")
    code = elf.text_bytes(gab.st_value, gab.st_size, opener)
    loads = [ld for ld in rip_loads(code, gab.st_value) if _in(data_ranges, ld[3])]
    u32s = sorted({ld[3] for ld in loads if ld[2] == 4})
    u64s = sorted({ld[3] for ld in loads if ld[2] == 8})
    found = []
    for m_addr in u32s:
        for a_addr in u64s:
            try:
                _read_arena_table(read, obj.bias + a_addr, obj.bias + m_addr, layout)
            except Invalid:
                continue
            found.append((a_addr, m_addr))
    if len(found) != 1:
        raise Invalid(f"_Py_GetAllocatedBlocks: {len(found)} (maxarenas, arenas) candidates "
                      f"pass the checks (need exactly one)")
    a_addr, m_addr = found[0]
    highwater = ntimes = None
    dms = elf.dynamic("_PyObject_DebugMallocStats")
    if dms is not None and dms.defined and dms.st_size:
        # GCC may split the body into a local "_PyObject_DebugMallocStats.part.0"
        # that the exported function calls: look there too.
        for fvaddr, fcode in _with_callees(elf, dms.st_value, dms.st_size, opener):
            highwater = highwater or _printed_counter(
                elf, opener, fcode, fvaddr, b"# arenas highwater mark", data_ranges)
            ntimes = ntimes or _printed_counter(
                elf, opener, fcode, fvaddr, b"# arenas allocated total", data_ranges)
    rel = lambda a: obj.bias + a if a is not None else None
    return Anchors(rel(a_addr), rel(m_addr), None, rel(highwater), rel(ntimes), None,
                   "code of _Py_GetAllocatedBlocks and _PyObject_DebugMallocStats")


def _struct_anchors(state, how):
    return Anchors(state + STATE_ARENAS, state + STATE_MAXARENAS,
                   state + STATE_NARENAS_CURRENTLY_ALLOCATED,
                   state + STATE_NARENAS_HIGHWATER, state + STATE_NTIMES_ARENA_ALLOCATED,
                   state + STATE_USED, how)


def usedpools_heads_ok(words, base, pool_size, read=None):
    """True when the 64 words at address BASE look like ``usedpools``: every
    size class's list head (at BASE + 16*i, seen as a pool_header at
    BASE + 16*i - 16) is empty (nextpool == prevpool == the header itself)
    or points at pool-aligned pools.  With READ, the first pool of each
    non-empty list is read and must have that size class and link back."""
    nonempty = 0
    for i in range(NB_SMALL_SIZE_CLASSES):
        first, last = words[2 * i], words[2 * i + 1]
        header = base + 16 * i - 16
        if first == header and last == header:
            continue
        if first == header or last == header or first % pool_size or last % pool_size or not first:
            return False
        nonempty += 1
        if read is not None:
            raw = read(first, POOL_HEADER.size)
            if raw is None:
                return False
            count, _fb, _next, prev, _ai, szidx, _no, _mno = POOL_HEADER.unpack(raw)
            if szidx != i or prev != header or count == 0:
                return False
    # An all-empty table matches any run of self-pointers; a live interpreter
    # always has partly used pools.
    return nonempty > 0


def scan_usedpools(read, start, end, pool_size):
    """Addresses in [START, END) where a validated ``usedpools`` table
    starts.  Reads the range once; a table is 32 consecutive list heads,
    each a pair of words that either both point at the head itself - 16
    (empty list) or both hold pool-aligned addresses.  Runs of 32 such
    pairs are then checked against the pools they point at."""
    data = read(start, end - start)
    if data is None:
        return []
    nwords = len(data) // 8
    words = struct.unpack(f"<{nwords}Q", data[:nwords * 8])
    mask = pool_size - 1
    # ok[j]: the pair (words[j], words[j+1]) can be one list head.
    ok = [False] * nwords
    for j in range(nwords - 1):
        a, b = words[j], words[j + 1]
        if a == b == start + 8 * j - 16 or (a and b and not a & mask and not b & mask):
            ok[j] = True
    out = []
    for parity in (0, 1):
        run = 0
        for j in range(parity, nwords - 1, 2):
            run = run + 1 if ok[j] else 0
            if run >= NB_SMALL_SIZE_CLASSES:
                s = start + 8 * (j - 2 * (NB_SMALL_SIZE_CLASSES - 1))
                if _heads_ok_now(read, s, pool_size):
                    out.append(s)
    return sorted(out)


def _heads_ok_now(read, s, pool_size, tries=5):
    """usedpools_heads_ok on a fresh read of the table at S: a running
    program relinks its pools between our read of a head and of the pool it
    points at, so a failure is retried right away a few times."""
    for _ in range(tries):
        w = _words(read, s, 2 * NB_SMALL_SIZE_CLASSES)
        if w is None:
            return False
        if not usedpools_heads_ok(w, s, pool_size):
            return False            # not even the shape: no table here
        if usedpools_heads_ok(w, s, pool_size, read):
            return True
    return False


def locate(obj, mm, read, layout, prefer_symbols=True):
    """Anchors of the main interpreter's obmalloc state.  Raises Invalid."""
    elf = obj.elf
    if layout.state == "globals":
        anchors = _symbols_globals(obj) if prefer_symbols else None
        return anchors or _code_globals(obj, read, layout)
    # struct _obmalloc_state
    if prefer_symbols:
        sym = elf.symtab(obj.opener.open).get("obmalloc_state_main")
        if sym is not None and mm >= (3, 13):
            state = obj.bias + sym.st_value
            if _heads_ok_now(read, state, layout.pool_size):
                return _struct_anchors(state, ".symtab obmalloc_state_main")
            raise Invalid("obmalloc_state_main does not hold a valid usedpools table")
    if mm == (3, 12):
        rt = elf.dynamic("_PyRuntime")
        start = obj.bias + rt.st_value
        ranges = [(start, start + rt.st_size)]
        where = "_PyRuntime"
    else:
        # 3.13: obmalloc_state_main is a static in .data/.bss.
        ranges = [(obj.bias + a, obj.bias + b) for a, b in _writable_ranges(elf)]
        where = "the interpreter's data segment"
    hits = []
    for a, b in ranges:
        hits += scan_usedpools(read, a, b, layout.pool_size)
    if len(hits) != 1:
        raise Invalid(f"usedpools signature: {len(hits)} matches in {where} (need exactly one)")
    return _struct_anchors(hits[0], f"usedpools signature scan in {where}")


def _words(read, addr, n):
    data = read(addr, 8 * n)
    return struct.unpack(f"<{n}Q", data) if data else None


# -- the walk ---------------------------------------------------------------

Walk = namedtuple("Walk", "arenas arena_ranges used_pools allocated free_in_pools "
                          "unused_pools_bytes blocks")


def _read_arena_table(read, arenas_addr, maxarenas_addr, layout):
    """(maxarenas, address of the vector, [(index, arena_object tuple)] of
    the arenas in use).  Raises Invalid."""
    maxarenas = u32(read(maxarenas_addr, 4))
    table_ptr = _u64(read(arenas_addr, 8))
    if maxarenas is None or table_ptr is None:
        raise Invalid("maxarenas/arenas not readable")
    # new_arena() grows the vector from INITIAL_ARENA_OBJECTS (16) by doubling.
    if maxarenas < INITIAL_ARENA_OBJECTS or maxarenas > MAXARENAS_SANE \
            or maxarenas & (maxarenas - 1) or not table_ptr or table_ptr % 8:
        raise Invalid(f"implausible arenas vector: maxarenas={maxarenas} arenas={table_ptr:#x}")
    raw = read(table_ptr, maxarenas * ARENA_OBJECT.size)
    if raw is None:
        raise Invalid(f"arenas vector at {table_ptr:#x} ({maxarenas} entries) not readable")
    max_pools = layout.arena_size // layout.pool_size
    used = []
    for idx, ao in enumerate(ARENA_OBJECT.iter_unpack(raw)):
        address, pool_address, nfreepools, ntotalpools = ao[:4]
        if address == 0:
            continue
        # An arena whose mmap is not pool-aligned loses one pool.
        if ntotalpools not in (max_pools, max_pools - 1) or nfreepools > ntotalpools \
                or not address <= pool_address <= address + layout.arena_size:
            raise Invalid(f"arenas[{idx}] fails the checks: address={address:#x} "
                          f"pool_address={pool_address:#x} nfreepools={nfreepools} "
                          f"ntotalpools={ntotalpools}")
        used.append((idx, ao))
    if not used:
        raise Invalid("no arena in use")
    return maxarenas, table_ptr, used


ARENA_TRIES = 5     # re-reads of one arena that changed while we read it


def _walk_arena(read, table_ptr, idx, layout):
    """(arena_object, pools in use, blocks, allocated, free) of arenas[IDX],
    read so that the arena did not change in between: its arena_object is
    read before and after its pool headers and must be the same, and every
    pool must be either in use or counted in nfreepools.  None when the arena
    was freed meanwhile.  Raises Invalid."""
    psize = layout.pool_size
    last = None
    for _ in range(ARENA_TRIES):
        raw = read(table_ptr + idx * ARENA_OBJECT.size, ARENA_OBJECT.size)
        if raw is None:
            raise Invalid(f"arenas[{idx}] not readable")
        ao = ARENA_OBJECT.unpack(raw)
        address, pool_address, nfreepools, ntotalpools = ao[:4]
        if address == 0:
            return None
        base = (address + psize - 1) & ~(psize - 1)
        in_use = blocks = allocated = free = 0
        try:
            for p in range(base, pool_address, psize):
                hdr = read(p, POOL_HEADER.size)
                if hdr is None:
                    raise Invalid(f"pool {p:#x} of arenas[{idx}] not readable")
                count, _fb, _n, _p, arenaindex, szidx = POOL_HEADER.unpack(hdr)[:6]
                if count == 0:          # a free pool, linked on the arena's freepools
                    continue
                if szidx >= NB_SMALL_SIZE_CLASSES or count > numblocks(psize, szidx) \
                        or arenaindex != idx:
                    raise Invalid(f"pool {p:#x} fails the checks: count={count} szidx={szidx} "
                                  f"arenaindex={arenaindex} (arena {idx})")
                size = (szidx + 1) * ALIGNMENT
                in_use += 1
                blocks += count
                allocated += count * size
                free += (numblocks(psize, szidx) - count) * size
            # Every pool of an arena is either in use (count > 0) or counted
            # in nfreepools (on freepools, or not carved yet).
            if in_use + nfreepools != ntotalpools:
                raise Invalid(f"arenas[{idx}]: {in_use} pools in use + nfreepools {nfreepools} "
                              f"!= ntotalpools {ntotalpools}")
        except Invalid as exc:
            last = exc
            continue
        if read(table_ptr + idx * ARENA_OBJECT.size, ARENA_OBJECT.size) != raw:
            last = Invalid(f"arenas[{idx}] changed during its walk")
            continue
        return ao, in_use, blocks, allocated, free
    raise last


def walk(read, anchors, layout):
    """One pass over every carved pool of every arena.  Raises Invalid."""
    maxarenas, table_ptr, used = _read_arena_table(read, anchors.arenas, anchors.maxarenas, layout)
    psize = layout.pool_size
    allocated = free = unused = blocks = used_pools = 0
    ranges = []
    for idx, _first in used:
        got = _walk_arena(read, table_ptr, idx, layout)
        if got is None:
            continue                # freed since we read the vector
        ao, in_use, b, a, f = got
        unused += ao[2] * psize
        ranges.append((ao[0], ao[0] + layout.arena_size))
        used_pools += in_use
        blocks += b
        allocated += a
        free += f
    # The target runs on: if the vector moved or grew while we read it, the
    # walk mixed two states.
    if u32(read(anchors.maxarenas, 4)) != maxarenas or _u64(read(anchors.arenas, 8)) != table_ptr:
        raise Invalid("arenas vector changed during the walk")
    if not ranges:
        raise Invalid("no arena in use")
    return Walk(len(ranges), ranges, used_pools, allocated, free, unused, blocks)


# -- the collector ----------------------------------------------------------

_LOCATED: dict[tuple, object] = {}     # (pid, object, load address, ...) -> Anchors


def _env_pymalloc(image):
    env = image.environ or {}
    v = env.get("PYTHONMALLOC") if isinstance(env, dict) else None
    if isinstance(v, bytes):
        v = v.decode(errors="replace")
    return v


def collect(image, prefer_symbols=True, procfs_root="/proc"):
    """The ``Runtime`` of a CPython process, or None when the process holds
    no CPython interpreter.  Never raises for a malformed or unknown
    target: the Runtime then has unknown values and a ``reason``."""
    found = find_python(image)
    if found is None:
        return None
    obj, mm, version, free_threaded = found
    base = dict(version=version, path=obj.path, missed=MISSED)
    unknown = lambda why: Runtime(kind="cpython-pymalloc", values=_unknown_values(),
                                  reason=why, **base)
    pymalloc_env = _env_pymalloc(image)
    if pymalloc_env in ("malloc", "malloc_debug"):
        return Runtime(kind="cpython-malloc", values={}, located_by="environment",
                       reason=f"PYTHONMALLOC={pymalloc_env}: no pymalloc; every Python "
                              f"object is a malloc allocation, counted by the allocator layer",
                       **base)
    if free_threaded:
        return unknown("free-threaded build: objects live in its vendored mimalloc, not pymalloc arenas")
    layout = LAYOUTS.get(mm)
    if layout is None:
        return unknown(f"CPython {version}: no verified obmalloc layout for this version")
    try:
        mem = MemoryReader(image.pid, procfs_root)
    except AccessDenied as exc:
        return unknown(f"process memory not readable: {exc.msg}")
    # The state never moves in a process's life: remember where it was.
    key = (image.pid, obj.path, obj.start, obj.bias, prefer_symbols,
           image.status.get(b"PPid"))
    try:
        with mem:
            anchors = _LOCATED.get(key)
            if anchors is None:
                err = None
                for _ in range(TRIES):
                    try:
                        anchors = locate(obj, mm, mem.read, layout, prefer_symbols)
                        break
                    except Invalid as exc:
                        err = exc
                else:
                    return unknown(f"obmalloc state not found: {err}")
                if len(_LOCATED) > 256:
                    _LOCATED.clear()
                _LOCATED[key] = anchors
            last = None
            for attempt in range(TRIES):
                try:
                    w = walk(mem.read, anchors, layout)
                except Invalid as exc:
                    last = exc
                    continue
                # narenas_currently_allocated is a cross-check for a quiet
                # process; a busy one may change between the two reads, and
                # each arena was already checked on its own.
                current = _u64(mem.read(anchors.narenas_current, 8)) if anchors.narenas_current else None
                if current is not None and current != w.arenas and attempt < TRIES - 1:
                    last = Invalid(f"narenas_currently_allocated {current} != {w.arenas} arenas walked")
                    continue
                break
            else:
                _LOCATED.pop(key, None)      # located again next time
                return unknown(f"walk failed {TRIES} times: {last}")
            highwater = _u64(mem.read(anchors.highwater, 8)) if anchors.highwater else None
            if highwater is not None and highwater < w.arenas:
                highwater = None    # a counter that contradicts the walk is not used
    except NoSuchProcess:
        raise
    except AllocdiagError as exc:
        return unknown(str(exc.msg))
    resident, rsrc = None, None
    try:
        with Pagemap(image.pid, procfs_root) as pm:
            resident = pm.resident_bytes(w.arena_ranges)
            rsrc = "/proc/PID/pagemap: present pages of the arenas" + present_caveat()
    except AccessDenied:
        pass
    values = {
        "arenas": Value.measured(w.arenas, "arenas[] entries with address != 0"),
        "arenas_highwater": Value.measured(highwater, "narenas_highwater"),
        "mapped": Value.derived(w.arenas * layout.arena_size,
                                f"arenas x ARENA_SIZE ({layout.arena_size})"),
        "resident": Value.measured(resident, rsrc),
        "allocated": Value.derived(w.allocated, "sum over used pools of ref.count x (szidx+1) x 16"),
        "free_in_pools": Value.derived(w.free_in_pools,
                                       "sum over used pools of (NUMBLOCKS - ref.count) x block size"),
        "unused_pools": Value.derived(w.unused_pools_bytes, "sum of nfreepools x POOL_SIZE"),
        "pools": Value.measured(w.used_pools, "pools with ref.count > 0"),
        "blocks": Value.measured(w.blocks, "sum of ref.count"),
    }
    kind_note = None
    if pymalloc_env in ("debug", "pymalloc_debug"):
        kind_note = f"PYTHONMALLOC={pymalloc_env}: debug hooks pad every block; allocated includes the pads"
    return Runtime(kind="cpython-pymalloc", values=values, located_by=anchors.located_by,
                   reason=kind_note, **base)


RUNTIME_VALUE_NAMES = ("arenas", "arenas_highwater", "mapped", "resident", "allocated",
                       "free_in_pools", "unused_pools", "pools", "blocks")


def _unknown_values():
    return {name: Value() for name in RUNTIME_VALUE_NAMES}
