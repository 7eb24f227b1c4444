"""A call into a thread under a seccomp filter never runs a syscall the filter
would answer by killing the target, raising SIGSYS or waking a supervisor
(collectors.engine.seccomp).

Measured before the engine judged them: ``allocdiag release`` of a glibc
process whose filter returns SECCOMP_RET_KILL_PROCESS for madvise killed it
(SIGSYS, audit: syscall=28).  The targets are tests/targets/seccomp_filter.c;
the filters are read back from the kernel, never written here.
"""

import json
import os
import signal
import struct
import subprocess
import sys

import pytest

from targets import build_c, start
from test_remote_engine import assert_released

from collectors import livestats
from collectors.binary.image import ProcessImage
from collectors.engine import abi, seccomp
from collectors.engine.arch_x86_64 import AUDIT_ARCH, NR
from collectors.engine.remote import RemoteProcess
from diag.model.errors import RemoteCallError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def target(action, allocator="glibc", syscall="madvise"):
    return start([build_c("seccomp_filter.c"), action, syscall], allocator=allocator)


def release(pid, allocdiag=(sys.executable, "-m", "diag")):
    """`allocdiag release --yes --json PID`, ALLOCDIAG the argv that runs
    allocdiag: (exit code, document or stderr)."""
    argv = [*allocdiag, "release", "--yes", "--json", str(pid)]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else r.stderr)


def madvise_filters(pid):
    """The filters of PID's main thread, read as the engine reads them (in
    a borrow: PTRACE_SECCOMP_GET_FILTER wants the thread ptrace-stopped)."""
    rp = RemoteProcess(pid)
    with rp.borrow(tid=pid) as c:
        filters = seccomp.read_filters(c.tid)
    assert_released(pid)
    return filters


@pytest.mark.parametrize("allocator", ["glibc", "jemalloc", "tcmalloc"])
def test_release_under_a_killing_filter_skips_madvise_and_the_target_lives(allocator):
    with target("kill", allocator) as t:
        rc, doc = release(t.pid)
        assert rc == 0, doc
        assert t.alive(), t.proc.returncode
        skipped = doc["skipped_syscalls"]
        assert skipped, "the release call made no madvise: nothing was at stake"
        assert {s["syscall"] for s in skipped} == {"madvise"}
        assert all(s["nr"] == NR["madvise"] for s in skipped)
        assert all("SECCOMP_RET_KILL_PROCESS" in s["why"] for s in skipped)
        # MallocExtension_ReleaseFreeMemory is void: no return value is shown
        assert (doc["return"] is None) == (allocator == "tcmalloc"), doc["return"]
        assert_released(t.pid)
        # and the process still serves: the thread came back to its read
        t.proc.stdin.write(b"x")
        t.proc.stdin.flush()
        assert t.alive()


def test_without_ptrace_get_syscall_info_the_registers_say_the_syscall(monkeypatch):
    """A kernel before 5.3 refuses PTRACE_GET_SYSCALL_INFO (EIO): the entry
    is read from the registers instead, and the killing madvise is still
    skipped (the refusal is injected; the process, filter and call are real)."""
    from collectors import actions
    from collectors.detect import detect
    from collectors.engine import ptrace

    def refused(tid, pid):
        raise RemoteCallError(f"PTRACE_GET_SYSCALL_INFO failed: EIO (tid {tid})", pid=pid)
    monkeypatch.setattr(ptrace, "get_syscall_info", refused)
    with target("kill") as t:
        image = ProcessImage(t.pid)
        _, _, _, skipped = actions.release(image, detect(image))
        assert t.alive()
        assert_released(t.pid)
    assert skipped and {s["syscall"] for s in skipped} == {"madvise"}
    assert all("SECCOMP_RET_KILL_PROCESS" in s["why"] for s in skipped)


def test_a_trapping_filter_raises_no_sigsys():
    with target("trap") as t:
        rc, doc = release(t.pid)
        assert rc == 0, doc
        assert t.alive()
        assert doc["skipped_syscalls"]
        assert all("SECCOMP_RET_TRAP" in s["why"] for s in doc["skipped_syscalls"])
        with open(f"/proc/{t.pid}/status") as f:
            pending = [ln for ln in f if ln.startswith(("SigPnd:", "ShdPnd:"))]
        assert all(int(ln.split()[1], 16) & (1 << (signal.SIGSYS - 1)) == 0 for ln in pending)


def test_a_buffer_mapping_the_filter_would_kill_for_fails_cleanly():
    """An output buffer larger than the thread's stack room is a mapping the
    borrowed thread makes with libc mmap (docs/target-writes.md row 4);
    under a filter that kills on mmap it is not made, the error says why,
    and the process lives."""
    with target("kill", syscall="mmap") as t:
        res = livestats.Resolver(ProcessImage(t.pid))
        rp = RemoteProcess(t.pid, mapper=(res.libc("mmap"), res.libc("munmap")))
        with pytest.raises(RemoteCallError) as err:
            with rp.borrow() as c:
                c.buffer(4 << 20)
        assert t.alive()
        assert_released(t.pid)
    assert "its mmap was not run: the thread's seccomp filter returns " \
           "SECCOMP_RET_KILL_PROCESS" in str(err.value), err.value
    assert [s["syscall"] for s in rp.skipped_syscalls] == ["mmap"]


@pytest.mark.parametrize("action", ["errno", "log"])
def test_harmless_answers_let_the_syscalls_run(action):
    """ERRNO fails the syscall, LOG lets it run: the call meets what the
    process itself would, and nothing is skipped.  Each madvise, stopped
    before it ran (PTRACE_SYSEMU), is made again: under LOG the ~58 MiB
    of freed blocks leave RSS; under ERRNO(EPERM) they stay."""
    with target(action) as t:
        rc, doc = release(t.pid)
        assert rc == 0, doc
        assert t.alive()
        assert doc["skipped_syscalls"] == []
    freed = doc["before"]["process"]["rss"] - doc["after"]["process"]["rss"]
    if action == "log":
        assert freed > 32 << 20, freed
    else:
        assert freed < 8 << 20, freed


def test_a_skipped_syscall_is_never_shown_to_the_filter():
    """A hand-written allowlist whose default kills (OpenSSH's sandbox
    shape) kills nr -1 too.  A syscall skipped by setting orig_rax to -1
    under PTRACE_SYSCALL still runs the filters, on nr -1, and killed such
    a process (audit: syscall=-1, SIGSYS); under PTRACE_SYSEMU the filters
    never run for it, and the process lives."""
    with target("allowlist") as t:
        filters = madvise_filters(t.pid)
        minus_one = seccomp.SyscallEntry(AUDIT_ARCH, 0, (1 << 64) - 1, (0,) * 6)
        assert seccomp.action(filters, minus_one.seccomp_data()) \
            == seccomp.SECCOMP_RET_KILL_PROCESS, "the filter lets nr -1 run: nothing at stake"
        rc, doc = release(t.pid)
        assert rc == 0, doc
        assert t.alive(), t.proc.returncode
        skipped = doc["skipped_syscalls"]
        assert skipped and {s["syscall"] for s in skipped} == {"madvise"}
        assert all("SECCOMP_RET_KILL_PROCESS" in s["why"] for s in skipped)
        assert_released(t.pid)
        t.proc.stdin.write(b"x")
        t.proc.stdin.flush()
        assert t.alive()


def test_the_filters_read_back_give_the_kernels_verdicts():
    """The oracle target called madvise with nine argument sets under two
    stacked filters and printed what the kernel answered; running the
    filters read back from it on the same seccomp_data gives the same
    answer for each (argument tests, both filters, the newest winning a
    tie, RET A, memory, X)."""
    with target("oracle") as t:
        addr = int(t.ready, 16)
        filters = madvise_filters(t.pid)
    assert len(filters) == 2 and all(len(f) % abi.SOCK_FILTER_SIZE == 0 for f in filters)
    seen = set()
    for line in t.lines:
        _, advice, length, err = line.split()
        entry = seccomp.SyscallEntry(AUDIT_ARCH, 0, NR["madvise"],
                                     (addr, int(length), int(advice), 0, 0, 0))
        ret = seccomp.action(filters, entry.seccomp_data())
        act = ret & seccomp.SECCOMP_RET_ACTION_FULL
        expected = ret & seccomp.SECCOMP_RET_DATA if act == seccomp.SECCOMP_RET_ERRNO else 0
        assert act in (seccomp.SECCOMP_RET_ERRNO, seccomp.SECCOMP_RET_ALLOW), line
        assert int(err) == expected, (line, seccomp.action_name(ret))
        seen.add(int(err))
    # every rule of both filters was reached
    assert seen == {0, 11, 22, 33, 44, 55}, seen


def test_an_unreadable_filter_skips_every_syscall():
    """allocdiag under a seccomp filter of its own (as in a container) may
    not read the target's (kernel/seccomp.c get_nth_filter: EACCES): then
    no syscall of the call can be shown harmless, and each is skipped."""
    allow_all = struct.pack("<HBBI", 0x06, 0, 0, seccomp.SECCOMP_RET_ALLOW)
    wrapper = (
        "import ctypes, runpy, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"prog = ctypes.create_string_buffer({allow_all!r})\n"
        "class fprog(ctypes.Structure):\n"
        "    _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]\n"
        "p = fprog(1, ctypes.addressof(prog))\n"
        "assert libc.prctl(38, 1, 0, 0, 0) == 0\n"            # PR_SET_NO_NEW_PRIVS
        "assert libc.prctl(22, 2, ctypes.byref(p), 0, 0) == 0\n"   # PR_SET_SECCOMP FILTER
        "sys.argv = ['allocdiag'] + sys.argv[1:]\n"
        "runpy.run_module('diag', run_name='__main__')\n")
    with target("kill") as t:
        rc, doc = release(t.pid, (sys.executable, "-c", wrapper))
        assert rc == 0, doc
        assert t.alive()
        skipped = doc["skipped_syscalls"]
        assert skipped and all("could not be read" in s["why"] and "EACCES" in s["why"]
                               for s in skipped), skipped


@pytest.mark.parametrize("nr, as_int", [(NR["madvise"], NR["madvise"]), ((1 << 64) - 1, -1),
                                        (1 << 32 | NR["madvise"], NR["madvise"]),
                                        (0x80000000, -(1 << 31))])
def test_seccomp_data_holds_nr_as_the_kernels_int(nr, as_int):
    # syscall_get_nr() gives the filters orig_rax as an int: its low 32 bits
    entry = seccomp.SyscallEntry(AUDIT_ARCH, 0, nr, (0,) * 6)
    assert seccomp.SECCOMP_DATA.unpack(entry.seccomp_data())[0] == as_int


@pytest.mark.parametrize("prog, words", [
    (b"\x06\x00\x00\x00\x00\x00\xff", "not a program"),                  # 7 bytes
    (struct.pack("<HBBI", 0x94, 0, 0, 3) + struct.pack("<HBBI", 0x06, 0, 0, 0),
     "ALU 0x94"),                                                        # BPF_MOD: refused by the kernel
    (struct.pack("<HBBI", 0x20, 0, 0, 64) + struct.pack("<HBBI", 0x06, 0, 0, 0),
     r"seccomp_data\+64"),                                                 # load past the struct
    (struct.pack("<HBBI", 0x15, 0, 0, 1), "past its end"),               # a jump off the end
])
def test_a_program_the_kernel_would_refuse_is_malformed(prog, words):
    entry = seccomp.SyscallEntry(AUDIT_ARCH, 0, NR["madvise"], (0,) * 6)
    with pytest.raises(seccomp.MalformedFilter, match=words):
        seccomp.run(prog, entry.seccomp_data())
    ok, why = seccomp.judge([prog], entry)
    assert not ok and "could not be run" in why
