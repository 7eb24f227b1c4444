"""The .eh_frame CFI unwinder (collectors/binary/unwind.py) on real processes: a
walk from a stopped thread's registers names the real call chain, tables are
parsed once per file identity, and anything not understood is an error."""

import os
import time

import pytest
from elftools.elf.elffile import ELFFile

from targets import build_c, start

from collectors.engine import arch_x86_64 as arch

from collectors.engine import memory

from collectors.engine import tracee as ptrace

from collectors.binary import unwind


def sp_bin():
    return build_c("sp_waits.c", "-pthread")


def ready(t):
    return {k: v for k, _, v in (w.partition("=") for w in t.ready.split())}


def symbols(path):
    with open(path, "rb") as f:
        ef = ELFFile(f)
        sec = ef.get_section_by_name(".symtab") or ef.get_section_by_name(".dynsym")
        return [(s["st_value"], s["st_size"], s.name) for s in sec.iter_symbols()
                if s["st_info"]["type"] == "STT_FUNC" and s["st_value"]]


def name_of(frame, syms):
    for v, n, name in syms:
        if v <= frame.vaddr < v + max(n, 1):
            return name
    return None


def stopped_regs(pid, tid):
    ptrace.seize(tid, pid)
    ptrace.interrupt(tid, pid)
    while ptrace.waitpid_nohang(tid, pid) is None:
        time.sleep(0.0005)
    return arch.get_regs(tid, pid)


def test_walk_names_the_call_chain():
    """A condvar wait: libc's futex helper -> pthread_cond_wait ->
    fake_allocator_wait (the target's) -> ... -> start_thread -> clone3, where
    the walk ends on clone3's undefined return address."""
    with start([sp_bin(), "fakealloc"]) as t:
        tid = int(ready(t)["tid"])
        time.sleep(0.1)
        maps = open(f"/proc/{t.pid}/maps").read()
        uw = unwind.Unwinder(t.pid, maps, lambda a, n: memory.try_read(t.pid, a, n))
        sc = open(f"/proc/{t.pid}/task/{tid}/syscall").read().split()
        uw.prepare(int(sc[-1], 16), int(sc[-2], 16))          # parse before the stop
        regs = stopped_regs(t.pid, tid)
        try:
            t0 = time.thread_time()         # CPU time: immune to preemption
            frames = uw.walk(unwind.regs_from_user(regs), parse=False)
            walk_ms = (time.thread_time() - t0) * 1e3
            w = uw.walk(unwind.regs_from_user(regs), parse=False, tolerant=True)
        finally:
            ptrace.detach(tid, t.pid)
        # the end is clone3's own CFI rule (what the running-thread judge
        # takes as proof), not a zero word read from the stack ...
        assert w.complete and w.end == unwind.END_RULE and len(w.frames) == len(frames)

        class Zeros:                        # ... which a walk gone astray may meet
            def word(self, addr):
                return 0
        z = uw.walk(unwind.regs_from_user(regs), parse=False, tolerant=True, memory=Zeros())
        assert z.complete and z.end == unwind.END_ZERO, (z.frames, z.error)
        exe = [f for f in frames if os.path.basename(f.path) == os.path.basename(sp_bin())]
        names = [name_of(f, symbols(sp_bin())) for f in exe]
        assert names[0] == "fake_allocator_wait", names
        libc = [f for f in frames if "libc.so" in f.path]
        libc_syms = symbols(libc[0].path)
        assert "pthread_cond_wait" in [name_of(f, libc_syms) for f in libc]
        assert frames[-1].path == libc[0].path                 # clone3, outermost
        assert walk_ms < 50
        print(f"{len(frames)} frames in {walk_ms:.2f} ms")


def test_tables_parsed_once_per_file_identity():
    unwind.clear_cache()
    libc = "/lib/x86_64-linux-gnu/libc.so.6"

    class Opener:
        display_path = libc
        opens = 0

        def stat(self):
            return os.stat(libc)

        def open(self):
            Opener.opens += 1
            return open(libc, "rb")

    t0 = time.perf_counter()
    a = unwind.cfi_table(Opener())
    parse_s = time.perf_counter() - t0
    b = unwind.cfi_table(Opener())
    assert a is b and Opener.opens == 1
    assert len(a) > 2000                                        # libc has ~3,700 FDEs
    assert unwind.cached_table(Opener()) is a
    print(f"libc .eh_frame: {len(a)} FDEs parsed in {parse_s:.2f} s")


def test_walk_refuses_what_it_cannot_prove():
    with start([sp_bin(), "condwait"]) as t:
        maps = open(f"/proc/{t.pid}/maps").read()
        uw = unwind.Unwinder(t.pid, maps, lambda a, n: memory.try_read(t.pid, a, n))
        with pytest.raises(unwind.UnwindError, match="not in a mapped file"):
            uw.walk({unwind.RA: 0x1000, unwind.RSP: 0x7fff0000}, parse=True)
        unwind.clear_cache()
        libc = next(line.split()[0] for line in maps.splitlines()
                    if "libc.so" in line and "r-xp" in line)
        pc = int(libc.split("-")[0], 16) + 0x100
        with pytest.raises(unwind.NeedsParse):                 # never parses while stopped
            uw.walk({unwind.RA: pc, unwind.RSP: 0x7fff0000}, parse=False)


def test_cfi_load_failure_is_logged(caplog, tmp_path):
    """A file without .eh_frame (not even ELF) fails to load, once, with a
    debug line on the collectors.binary logger naming it and why."""
    from collectors.binary.elf import ObjectFile
    path = tmp_path / "not-elf"
    path.write_bytes(b"#!/bin/sh\nexit 0\n" * 8)
    unwind.clear_cache()
    with caplog.at_level("DEBUG", logger="collectors.binary"):
        with pytest.raises(unwind.UnwindError):
            unwind.cfi_table(ObjectFile("/proc", None, 0, 1, str(path)))
    lines = [r.getMessage() for r in caplog.records if r.name == "collectors.binary"]
    assert any(str(path) in m and "not loaded" in m for m in lines), lines


def test_a_walk_that_may_not_decode_names_the_fde_it_needs():
    """decode=False (a walk in a stop) never decodes: the first FDE not
    decoded yet is named (NeedsDecode: its table and index); once
    table.decode(index) has run, the same walk gets past it with the rows
    a decoding walk finds."""
    unwind.clear_cache()
    maps = open("/proc/self/maps").read()
    u = unwind.Unwinder(os.getpid(), maps, read=lambda addr, n: None)
    libc = next(m for m in u._maps if os.path.basename(m.path).startswith("libc.so"))
    table = unwind.cfi_table(libc.opener)
    vaddr = table._starts[len(table) // 2]
    with pytest.raises(unwind.NeedsDecode) as e:
        table.row(vaddr, decode=False)
    assert e.value.table is table and table._starts[e.value.index] == vaddr
    assert e.value.where.startswith("libc.so") and e.value.where.endswith(f"+{vaddr:#x}")
    table.decode(e.value.index)
    assert table.row(vaddr, decode=False) == table.row(vaddr)
    (cfa_reg, _offset, expr), rules = table.row(vaddr)
    assert cfa_reg == unwind.RSP and not expr          # at a function's first byte
    assert (unwind.RA, unwind.OFFSET, -8) in rules      # the return address on top


def test_a_short_read_of_a_stack_page_is_unreadable_not_a_crash():
    """A page read that comes back short (a process that exits during a
    wall window's walk gave b"" once: struct.error escaped `allocdiag wall`
    in a pristine-chroot run) makes the words past its end unreadable:
    UnwindError, which a tolerant walk turns into an early end."""
    page = unwind.PAGE
    full = bytes(range(256)) * (page // 256)
    reads = {0x10000: b"", 0x20000: full[:100], 0x30000: full}
    mem = unwind.PagedMemory(lambda addr, n: reads.get(addr))
    with pytest.raises(unwind.UnwindError, match="gave 0 bytes"):
        mem.word(0x10000 + 3128)
    with pytest.raises(unwind.UnwindError, match="gave 0 bytes"):
        mem.word(0x10000 + 3128)            # cached: the same answer
    assert mem.word(0x20000 + 8) == int.from_bytes(full[8:16], "little")
    with pytest.raises(unwind.UnwindError, match="gave 100 bytes"):
        mem.word(0x20000 + 96)
    with pytest.raises(unwind.UnwindError, match="gave 100 bytes"):
        mem.word(0x20000 + page - 4)       # across the page boundary
    assert mem.word(0x30000 + page - 8) == int.from_bytes(full[-8:], "little")
    with pytest.raises(unwind.UnwindError, match="unreadable"):
        mem.word(0x40000)                   # a failed read (None)

