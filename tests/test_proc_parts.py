"""collectors.proc's one maps parser, one stat reader and one OS-error
translation: on bytes captured from this kernel (tests/targets/capture_proc.py)
and on errors of real failing calls."""

import ctypes
import errno
import os
import subprocess
import time

import pytest

import unpriv
from targets import has_cap_sys_admin, zero_page_pfn_or_skip

from collectors.binary.unwind import Unwinder
from collectors.heapprofile import parse as parse_heap
from collectors.proc import oserror
from collectors.proc.maps import executable_files, parse_maps
from collectors.proc.pagemap import Pagemap
from collectors.proc.procfs import ProcFS
from collectors.proc.stat import (boot_time, fields_after_comm, parse_start_time, parse_stat_line,
                                  parse_state, start_time)
from diag.model.errors import MalformedData, NoSuchProcess, RemoteCallError

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
COMM = "a) (b c"        # tests/targets/capture_proc.py NAME


def fixture(name):
    with open(os.path.join(FIXTURES, name), "rb") as f:
        return f.read()


MAPS = fixture("proc-maps-deleted-spaces.txt")
STAT = fixture("proc-stat-comm-parens.txt")


# -- maps ----------------------------------------------------------------------

def test_captured_maps_every_line_parsed():
    maps = parse_maps(MAPS)
    assert len(maps) == len(MAPS.strip().split(b"\n"))
    exe = maps[0]
    # the executable's path holds ") (" and spaces, then the kernel's suffix
    assert exe.path.endswith("/" + COMM) and exe.deleted
    assert exe.maps_path == exe.path + " (deleted)"
    assert (exe.perms, exe.offset, exe.dev) == ("r--p", 0, "fe:00")
    assert [m.path for m in maps if m.path and m.path.startswith("[")] == \
        ["[heap]", "[vvar]", "[vvar_vclock]", "[vdso]", "[stack]", "[vsyscall]"]
    anon = [m for m in maps if m.path is None]
    assert anon and all(m.inode == 0 and m.maps_path == "" for m in anon)


def test_executable_files_are_the_code_a_stack_can_be_in():
    files = executable_files(parse_maps(MAPS))
    assert [os.path.basename(m.path) for m in files] == \
        [COMM, "libc.so.6", "ld-linux-x86-64.so.2"]      # not [vdso], not [vsyscall]


def test_kernel_lines_parse_as_the_full_parser_does():
    """The quick path (each line's tail parsed once and kept) gives what the
    full parser gives, on this host's processes and on the captured maps;
    a line the kernel would not write falls back to the full parser."""
    from collectors.proc import maps as maps_mod
    seen = [MAPS]
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/maps", "rb") as f:
                    seen.append(f.read())
            except OSError:
                pass
    for data in seen:
        for _ in range(2):                      # the tails new, then kept
            assert maps_mod._parsed_kernel_lines(data) == maps_mod._parsed_any(data, True)
    two_spaces = MAPS.replace(b" ", b"  ", 1)
    with pytest.raises(ValueError):
        maps_mod._parsed_kernel_lines(b"zz-10 r-xp 00000000 fe:00 1 /bin/x\n")
    assert parse_maps(two_spaces) == parse_maps(MAPS)


def test_damaged_line_strict_raises_lenient_skips():
    lines = MAPS.split(b"\n")
    damaged = b"\n".join(lines[:3] + [b"zz-10 r-xp 00000000 fe:00 1 /bin/x"] + lines[3:])
    with pytest.raises(MalformedData, match="maps line 4"):
        parse_maps(damaged)
    assert parse_maps(damaged, strict=False) == parse_maps(MAPS)


def test_heap_profile_trailer_uses_the_maps_parser():
    """A heap profile's trailer is /proc/self/maps as the program copied it:
    every mapping comes back with the path as maps printed it (" (deleted)"
    kept, "" for anonymous memory), damaged and empty ranges skipped."""
    head = fixture("heap-tcmalloc-python.heap").split(b"MAPPED_LIBRARIES:")[0]
    trailer = MAPS + b"not a mapping at all\n7f00-7f00 r-xp 00000000 fe:00 1 /empty\n"
    prof = parse_heap(head + b"MAPPED_LIBRARIES:\n" + trailer)
    want = parse_maps(MAPS)
    assert [(m.start, m.end, m.perms, m.offset, m.path) for m in prof.mappings] == \
        [(m.start, m.end, m.perms, m.offset, m.maps_path) for m in want]
    assert prof.mappings[0].path.endswith(COMM + " (deleted)")


def test_unwinder_takes_text_bytes_or_mappings():
    starts = [m.start for m in executable_files(parse_maps(MAPS))]
    for maps in (MAPS, MAPS.decode("utf-8", "surrogateescape"), parse_maps(MAPS)):
        assert Unwinder(1, maps, lambda a, n: None).object_starts() == starts


# -- stat ----------------------------------------------------------------------

def test_captured_smaps_rss_of_each_mapping():
    """smaps of a glibc process with two arena heaps (a real capture): one
    (mapping, Rss) per block, the same total as summing every Rss line, and
    glibc's heap resident from it ([heap] 8 KiB + the two heaps' rw parts)."""
    from collectors.allocators.glibc.heapmaps import glibc_heap_resident
    from collectors.proc.smaps import rss_by_mapping, sum_kb_lines
    with open(os.path.join(FIXTURES, "smaps-glibc-two-arenas.txt"), "rb") as f:
        data = f.read()
    rows = rss_by_mapping(data)
    assert len(rows) == 33 and sum(r for _, r in rows) == sum_kb_lines(data)[b"Rss"]
    heap = next(r for m, r in rows if m.path == "[heap]")
    arenas = [r for m, r in rows if m.start in (0x7f3ba0000000, 0x7f3ba8000000)]

    class Captured:
        def read(self, pid, name):
            return data

    total, heaps, maps = glibc_heap_resident(Captured(), 0)
    assert (heap, heaps, total) == (8 * 1024, 2, heap + sum(arenas)) and len(maps) == 33
    assert arenas[0] == 1836 * 1024
    with pytest.raises(MalformedData, match="33 mappings but 32 Rss lines"):
        rss_by_mapping(data.replace(b"Rss:                1836 kB\n", b"", 1))


def test_captured_stat_with_parens_in_comm():
    assert parse_state(STAT) == b"S"
    assert parse_start_time(STAT) == 2310259
    # counting fields from the start would be thrown off by the comm's spaces
    assert int(STAT.split()[21]) != 2310259
    assert fields_after_comm(STAT)[0] == b"S"
    assert parse_start_time(b"no comm here") is None and parse_state(b"") is None


def test_stat_line_of_the_host_scan():
    line = parse_stat_line(STAT)
    assert line.state == b"S" and line.start_ticks == 2310259 and not line.kernel_thread
    assert line.cpu_ticks == 0 and len(line.activity) == 10 and line.activity[0].endswith(COMM.encode())
    assert parse_stat_line(b"1 (x) S") is None and parse_stat_line(b"") is None


def test_stat_line_cpu_ticks_move_for_a_busy_process():
    p = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    read = lambda: parse_stat_line(ProcFS().read(p.pid, "stat"))
    try:
        first = read()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            later = read()
            if later.cpu_ticks > first.cpu_ticks:
                break
            time.sleep(0.05)
    finally:
        p.kill()
        p.wait()
    assert later.cpu_ticks > first.cpu_ticks and later.activity != first.activity
    assert later.start_ticks == first.start_ticks
    assert boot_time() < time.time()


# /proc/PID/task/TID/syscall as read on this kernel (6.18): redis-server's
# event loop in epoll_wait (232), one of its threads in futex (202), a busy
# python, the same python after SIGSTOP
CAPTURED_SYSCALL = {
    b"232 0x5 0x7f7549b6fa00 0x2790 0x64 0x2 0x0 0x7ffc31015b30 0x7f754a326f36\n":
        (232, (0x5, 0x7f7549b6fa00, 0x2790, 0x64, 0x2, 0x0), 0x7ffc31015b30, 0x7f754a326f36),
    b"202 0x556030cf8be8 0x189 0x0 0x0 0x0 0xffffffff 0x7f75495fe200 0x7f754a2a3f16\n":
        (202, (0x556030cf8be8, 0x189, 0, 0, 0, 0xffffffff), 0x7f75495fe200, 0x7f754a2a3f16),
    b"running\n": (-1, (), None, None),
    b"-1 0x7fff57a59b30 0x7f02e00fe1cc\n": (-1, (), 0x7fff57a59b30, 0x7f02e00fe1cc),
}


def test_captured_syscall_lines_of_each_shape():
    from collectors.proc.syscall import NOT_IN_SYSCALL, RUNNING, parse_syscall
    for data, want in CAPTURED_SYSCALL.items():
        assert tuple(parse_syscall(data)) == want, data
    assert parse_syscall(b"") == RUNNING and RUNNING.nr == NOT_IN_SYSCALL
    with pytest.raises(ValueError):
        parse_syscall(b"-1 0xzz 0x1\n")


def test_syscall_file_of_a_live_waiting_thread():
    from collectors.proc.syscall import parse_syscall
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        for _ in range(500):
            # (the child shows execve, 59, until its exec is done)
            sc = parse_syscall(open(f"/proc/{sleeper.pid}/syscall", "rb").read())
            if sc.nr == 230:
                break
            time.sleep(0.01)
        assert sc.nr == 230 and len(sc.args) == 6      # clock_nanosleep (x86-64)
        maps = parse_maps(open(f"/proc/{sleeper.pid}/maps", "rb").read())
        assert any(m.path == "[stack]" and m.start <= sc.sp < m.end for m in maps)
        assert any("x" in m.perms and m.start <= sc.pc < m.end for m in maps)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_start_time_of_a_live_process_named_with_parens(tmp_path):
    exe = tmp_path / COMM
    exe.write_bytes(open("/bin/sleep", "rb").read())
    exe.chmod(0o755)
    p = subprocess.Popen([str(exe), "30"])
    try:
        with open(f"/proc/{p.pid}/stat", "rb") as f:
            data = f.read()
        assert data.startswith(f"{p.pid} (".encode())
        st = start_time(p.pid)
        assert st is not None and st == parse_start_time(data)
        with open("/proc/self/stat", "rb") as f:
            assert st >= parse_start_time(f.read())          # started after us
    finally:
        p.kill()
        p.wait()
    assert start_time(p.pid) is None                         # gone


# -- OS errors from real failing calls -----------------------------------------

def _reaped_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_errors_name_the_procfs_root_they_read(tmp_path):
    """`allocdiag --proc DIR` (a container's procfs): a failed read names the
    file under DIR, not under /proc."""
    with pytest.raises(NoSuchProcess, match=f"reading {tmp_path}/1/status"):
        ProcFS(str(tmp_path)).status(1)


def test_vanished_pid_is_no_such_process():
    pid = _reaped_pid()
    with pytest.raises(FileNotFoundError) as info:
        open(f"/proc/{pid}/maps", "rb")
    err = oserror.translate(info.value, pid, f"reading /proc/{pid}/maps")
    assert isinstance(err, NoSuchProcess) and err.pid == pid
    with pytest.raises(NoSuchProcess):
        ProcFS().read(pid, "maps")
    with pytest.raises(NoSuchProcess):
        Pagemap(pid)
    # /proc/PID of a process exiting meanwhile may answer EACCES: gone is gone
    assert isinstance(oserror.translate(errno.EACCES, pid, "reading"), NoSuchProcess)


_libc = ctypes.CDLL(None, use_errno=True)
PTRACE_GETREGS = 12          # arch/x86/include/uapi/asm/ptrace-abi.h


def test_ptrace_of_an_untraced_thread_is_not_a_vanished_process():
    """ESRCH from ptrace on a live process we do not trace: with TRACED, the
    thread left (or never was in) a ptrace-stop; the process is there."""
    p = subprocess.Popen(["sleep", "30"])
    try:
        regs = ctypes.create_string_buffer(27 * 8)     # struct user_regs_struct
        ctypes.set_errno(0)
        assert _libc.ptrace(PTRACE_GETREGS, p.pid, None, regs) == -1
        err_no = ctypes.get_errno()
        assert err_no == errno.ESRCH
        err = oserror.translate(err_no, p.pid, "PTRACE_GETREGS", tid=p.pid, traced=True)
        assert isinstance(err, RemoteCallError) and "not in a ptrace-stop" in str(err)
    finally:
        p.kill()
        p.wait()
    err = oserror.translate(errno.ESRCH, p.pid, "PTRACE_GETREGS", traced=True)
    assert isinstance(err, NoSuchProcess)                  # now it is gone


def test_waitpid_of_a_non_child_is_no_longer_traced():
    with pytest.raises(ChildProcessError) as info:
        os.waitpid(1, os.WNOHANG)
    err = oserror.translate(info.value, 1, "waitpid", traced=True)
    assert isinstance(err, RemoteCallError) and "no longer traced by us" in str(err)


def test_other_errors_stay_os_errors_unless_traced():
    with pytest.raises(IsADirectoryError) as info:
        open("/proc/self/task", "rb")
    assert oserror.translate(info.value, os.getpid(), "reading") is info.value
    r, w = os.pipe()
    try:
        ctypes.set_errno(0)
        assert _libc.lseek(r, 0, os.SEEK_SET) == -1
        err = oserror.translate(ctypes.get_errno(), os.getpid(), "lseek")
    finally:
        os.close(r)
        os.close(w)
    assert isinstance(err, RemoteCallError) and "ESPIPE" in str(err)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop privileges")
def test_permission_denied_from_an_unprivileged_process():
    """As nobody: /proc/1/mem (ptrace access mode check: EACCES), kill(2) of
    pid 1 (EPERM), pagemap, and the sampler's maps read are refused:
    AccessDenied, exit code 4, with the sampler's advice for the sampler."""
    code = """
import errno
import os
from collectors.proc import oserror
from collectors.proc.pagemap import Pagemap
from collectors.sampler import perf
from collectors.sampler.session import Session
from diag.model.errors import AccessDenied
try:
    open("/proc/1/mem", "rb")
except PermissionError as exc:
    e = oserror.translate(exc, 1, "reading /proc/1/mem")
    print("MEM", exc.errno == errno.EACCES, type(e).__name__, e.exit_code, e.msg)
try:
    os.kill(1, 0)
except PermissionError as exc:
    e = oserror.translate(exc, 1, "signal 0 to pid 1")
    print("KILL", exc.errno == errno.EPERM, type(e).__name__, e.msg)
try:
    Pagemap(1)
except AccessDenied as e:
    print("PAGEMAP", e.msg)
try:
    Session(1).start()
except AccessDenied as e:
    print("SESSION", e.msg, e.remediation == perf.PERMISSION_FIX)
"""
    out = unpriv.run(["-c", code])
    assert "MEM True AccessDenied 4 permission denied: reading /proc/1/mem" in out.stdout, \
        out.stderr
    assert "KILL True AccessDenied permission denied: signal 0 to pid 1" in out.stdout, out.stderr
    assert "PAGEMAP permission denied: reading /proc/1/pagemap" in out.stdout, out.stderr
    assert "SESSION permission denied: reading /proc/1/maps True" in out.stdout, out.stderr


def test_pagemap_does_not_count_the_zero_pages_or_shared_memory():
    """Pages only read map the kernel's shared zero page (the huge one under
    MADV_HUGEPAGE): pagemap shows them present, smaps' Rss does not count
    them, and neither does Pagemap.  A shared anonymous mapping's pages are
    shmem, not anonymous memory (RssShmem): not counted either."""
    import mmap as mmap_mod
    from collectors.proc import pagemap
    from collectors.proc.smaps import rss_by_mapping
    zero_page_pfn_or_skip()
    huge = 2 << 20
    size = 4 * huge
    page = pagemap.PAGE_SIZE
    # a read-only page each side: a mapping of other flags, so the kernel
    # cannot merge the range with a neighbouring anonymous mapping whose
    # pages smaps' Rss of the merged mapping would then count (seen in CI)
    private = mmap_mod.mmap(-1, page + size + page,
                            flags=mmap_mod.MAP_PRIVATE | mmap_mod.MAP_ANONYMOUS)
    shared = mmap_mod.mmap(-1, 8 * page)
    views = [ctypes.c_char.from_buffer(private), ctypes.c_char.from_buffer(shared)]
    base, shared_at = (ctypes.addressof(v) for v in views)
    del views
    _libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for guard in (base, base + page + size):
        assert _libc.mprotect(guard, page, mmap_mod.PROT_READ) == 0, ctypes.get_errno()
    start = base + page
    try:
        aligned = (start + huge - 1) // huge * huge          # 2 MiB for the huge zero page
        # the written pages (below) lie outside the MADV_HUGEPAGE range: a
        # write to the huge zero page makes a whole huge page (6.18)
        hp_from = aligned if aligned - start >= page else aligned + huge
        private.madvise(mmap_mod.MADV_HUGEPAGE, hp_from - base, huge)
        for off in range(0, size, page):
            private[page + off]                            # read, never written
        for off in (0, size - page):
            private[page + off] = 1                        # two pages written
        for off in range(0, 8 * page, page):
            shared[off] = 1
        # the madvise split the mapping in up to three: their Rss, summed
        counted = [(m, r) for m, r in rss_by_mapping(open("/proc/self/smaps", "rb").read())
                   if start <= m.start < start + size]
        assert all(m.end <= start + size for m, _ in counted), counted
        rss = sum(r for _, r in counted)
        # the same with the entries read and with PAGEMAP_SCAN (where the
        # kernel has it: both ways on this one)
        for scan in (False, True) if pagemap.scan_supported() else (False,):
            with pagemap.Pagemap(os.getpid(), scan=scan) as pm:
                assert pm.zero_page_known
                assert pm.resident_bytes([(start, start + size)]) == rss == \
                    2 * pagemap.PAGE_SIZE, scan
                assert pm.resident_bytes([(shared_at, shared_at + 8 * page)]) == 0, scan
                assert pm.pages(shared_at, shared_at + 8 * pagemap.PAGE_SIZE) == (0, 0)
    finally:
        private.close()
        shared.close()


def test_without_cap_sys_admin_pages_only_read_count_only_without_pagemap_scan():
    """As nobody the PFNs read 0: in the entries read, the small zero page
    cannot be told from a resident page; such pages count, and
    present_caveat() is what the figures built on them add to their source.
    PAGEMAP_SCAN (Linux 6.7) tells the zero page apart with no capability:
    where the kernel has it, resident_bytes() counts none of them and there
    is nothing to add."""
    code = """
import ctypes, mmap, os
from collectors.proc import pagemap
m = mmap.mmap(-1, 4 * pagemap.PAGE_SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
v = ctypes.c_char.from_buffer(m); at = ctypes.addressof(v); del v
for off in range(0, 4 * pagemap.PAGE_SIZE, pagemap.PAGE_SIZE):
    m[off]
span = [(at, at + 4 * pagemap.PAGE_SIZE)]
with pagemap.Pagemap(os.getpid()) as pm, pagemap.Pagemap(os.getpid(), scan=False) as read:
    print("PFN", pagemap.zero_page_pfn(), pm.zero_page_known,
          pm.pages(*span[0])[0], read.resident_bytes(span) // pagemap.PAGE_SIZE)
    print("SCAN", pagemap.scan_supported(), pm.resident_bytes(span))
print("CAVEAT", repr(pagemap.present_caveat()))
pagemap.scan_supported = lambda: False              # a kernel without it
print("WITHOUT", pagemap.present_caveat())
"""
    out = unpriv.run(["-c", code])
    assert "PFN None False 4 4" in out.stdout, out.stdout + out.stderr
    assert "WITHOUT ; pages only read" in out.stdout and "CAP_SYS_ADMIN" in out.stdout
    from collectors.proc import pagemap
    if pagemap.scan_supported():                    # 6.7 or later: this kernel
        assert "SCAN True 0" in out.stdout and "CAVEAT ''" in out.stdout, out.stdout
    else:
        assert "SCAN False 16384" in out.stdout and "CAVEAT '; pages only" in out.stdout
    if has_cap_sys_admin():                         # as root here: the PFN is learnt
        assert zero_page_pfn_or_skip() and pagemap.present_caveat() == ""


def test_pagemap_counts_present_pages_across_read_chunks(monkeypatch):
    # the counts come from each entry's top byte (bit 63 present, bit 62
    # swapped), read CHUNK_ENTRIES entries at a time: a small chunk makes a
    # 64-page mapping span ten reads, one of them partial
    import mmap as mmap_mod
    from collectors.proc import pagemap
    n = 64
    # private, as the allocators' memory is (mmap's default is MAP_SHARED: shmem)
    m = mmap_mod.mmap(-1, n * pagemap.PAGE_SIZE,
                      flags=mmap_mod.MAP_PRIVATE | mmap_mod.MAP_ANONYMOUS)
    touched = [0, 1, 5, 6, 7, 31, 32, 33, 62, 63]
    for page in touched:
        m[page * pagemap.PAGE_SIZE] = 1
    start = ctypes.addressof(ctypes.c_char.from_buffer(m))
    try:
        for chunk in (7, pagemap.CHUNK_ENTRIES):
            monkeypatch.setattr(pagemap, "CHUNK_ENTRIES", chunk)
            with pagemap.Pagemap(os.getpid(), scan=False) as pm:
                assert pm.pages(start, start + n * pagemap.PAGE_SIZE) == (len(touched), 0)
                assert pm.pages(start + 2 * pagemap.PAGE_SIZE,
                                start + 40 * pagemap.PAGE_SIZE) == (6, 0)
                assert pm.resident_bytes([(start, start + 8 * pagemap.PAGE_SIZE)]) == \
                    5 * pagemap.PAGE_SIZE
        if pagemap.scan_supported():
            # PAGEMAP_SCAN returns the four runs of touched pages; two at a
            # time, or three pages at a time, the scan goes on from where
            # the kernel stopped
            for regions, most in ((2, pagemap.SCAN_MAX_PAGES), (pagemap.SCAN_REGIONS, 3),
                                  (pagemap.SCAN_REGIONS, pagemap.SCAN_MAX_PAGES)):
                monkeypatch.setattr(pagemap, "SCAN_REGIONS", regions)
                monkeypatch.setattr(pagemap, "SCAN_MAX_PAGES", most)
                with pagemap.Pagemap(os.getpid()) as pm:
                    assert pm.resident_bytes([(start, start + n * pagemap.PAGE_SIZE)]) == \
                        len(touched) * pagemap.PAGE_SIZE
                    assert pm.resident_bytes([(start + 2 * pagemap.PAGE_SIZE,
                                               start + 40 * pagemap.PAGE_SIZE)]) == \
                        6 * pagemap.PAGE_SIZE
                    assert not pm._scan_refused
    finally:
        m.close()


def test_a_captured_pagemap_file_is_read_as_entries(tmp_path):
    """A pagemap that is a plain file (a capture under an injected procfs
    root) refuses PAGEMAP_SCAN (ENOTTY): its entries are read instead, and
    the file is not asked again."""
    from collectors.proc import pagemap
    present = pagemap.PM_PRESENT | 0x1234
    entries = [present, 0, present, present, pagemap.PM_SWAPPED, present | pagemap.PM_FILE]
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "pagemap").write_bytes(b"".join(e.to_bytes(8, "little")
                                                       for e in entries))
    page = pagemap.PAGE_SIZE
    with pagemap.Pagemap(77, str(tmp_path)) as pm:
        assert pm.resident_bytes([(0, 2 * page), (2 * page, 6 * page)]) == 3 * page
        assert pm._scan_refused
    # a refused scan: the zero page is told apart only by its PFN
    assert pm.zero_page_told_apart is pm.zero_page_known


def test_glibc_heaps_from_a_pagemap_that_cannot_tell_the_zero_page_fall_back_to_smaps(
        tmp_path, monkeypatch):
    """glibc's heaps' resident comes from pagemap only where it leaves the
    zero page out, as smaps Rss does: a captured pagemap (a plain file, no
    scan) read without the zero page's PFN gives way to smaps."""
    from collectors.allocators.glibc import heapmaps
    from collectors.proc import pagemap
    start, page = 0x55D0C0000000, pagemap.PAGE_SIZE
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "maps").write_text(f"{start:x}-{start + 4 * page:x} rw-p 00000000 "
                                          "00:00 0                          [heap]\n")
    with open(tmp_path / "77" / "pagemap", "wb") as f:
        f.seek(start // page * pagemap.PM_ENTRY_BYTES)
        f.write((pagemap.PM_PRESENT | 0x1234).to_bytes(8, "little") * 4)
    procfs = ProcFS(str(tmp_path))

    class NoZeroPFN(Pagemap):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.zero_page_known = False

    with Pagemap(77, str(tmp_path)) as pm:
        pfn_known = pm.zero_page_known      # CAP_SYS_ADMIN shows PFNs
    # with the PFN the entries leave the zero page out and are counted; without
    # it (an unprivileged run) they already give way, as below
    assert heapmaps.heap_resident_by_pagemap(procfs, 77)[:2] == \
        ((4 * page, 0) if pfn_known else (None, 0))
    monkeypatch.setattr(heapmaps, "Pagemap", NoZeroPFN)
    assert heapmaps.heap_resident_by_pagemap(procfs, 77) == (None, 0, None)
