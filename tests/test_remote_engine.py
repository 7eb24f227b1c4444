"""The remote-call engine (collectors/engine/remote.py) against real processes.

Every safety rule of DESIGN.md "Remote calls" has a test here that fails
without it; a few tests switch one protection off (``_unsafe=``) to show the
test would catch its absence.  Targets: tests/targets/remote_waits.c (one
worker thread in a chosen wait, counters readable without stopping anything)
and tests/targets/remote_churn.c (threads churning malloc/free).
"""

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from targets import build_c, start, wait_for

from collectors.engine import tracee as ptrace
from diag.model.errors import (NoSuchProcess, Quarantined,
                               RemoteCallError)
from collectors.engine.remote import RemoteProcess, is_quarantined, text_ranges

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# struct stats offsets in remote_waits.c
ITERS, BAD, LAST_RET, LAST_ERRNO, BYTES, SUM, USR1, RT, SIG_SUM, BAD_INFO, \
    SEGV_HANDLER_OK, SEGV_BLOCKED_OK, USR2, SENDER, WRONG_THREAD, DONE = range(16)

LIBC_NAMES = ("libc.so", "ld-linux", "libjemalloc", "libtcmalloc", "libmimalloc")


def waits_bin():
    return build_c("remote_waits.c", "-pthread")


def churn_bin():
    return build_c("remote_churn.c", "-pthread", "-ldl")


def parse_ready(ready):
    out = {}
    for word in ready.split():
        k, _, v = word.partition("=")
        if v.startswith("0x"):
            out[k] = int(v, 16)
        elif v.isdigit():
            out[k] = int(v)
        elif v == "(nil)":
            out[k] = 0
        else:
            out[k] = v
    return out


def stat(t, a, field):
    raw = ptrace.read_memory(t.pid, a["stats"] + 8 * field, 8)
    return int.from_bytes(raw, "little", signed=True)


def set_stat(t, a, field, value):
    ptrace.write_memory(t.pid, a["stats"] + 8 * field, value.to_bytes(8, "little", signed=True))


def proc_status(pid, tid=None):
    path = f"/proc/{pid}/status" if tid is None else f"/proc/{pid}/task/{tid}/status"
    out = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def assert_released(pid):
    """No thread of PID is traced or left in a tracing stop."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        st = proc_status(pid, tid)
        assert st["TracerPid"] == "0", (tid, st["TracerPid"])
        assert not st["State"].startswith("t"), (tid, st["State"])


def progressing(t, a, field=ITERS, n=2, timeout=3.0):
    v0 = stat(t, a, field)
    wait_for(lambda: stat(t, a, field) >= v0 + n, timeout, "target progress")


@pytest.fixture
def waits():
    """start(mode) -> (target, addresses)"""
    stack = []

    def _start(mode, **kw):
        cm = start([waits_bin(), mode], **kw)
        t = cm.__enter__()
        stack.append(cm)
        return t, parse_ready(t.ready)

    yield _start
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


# ---------------------------------------------------------------------------
# basics, permissions


def test_no_such_process():
    with pytest.raises(NoSuchProcess):
        RemoteProcess(2 ** 22 + 12345)


def test_call_args_alignment_and_pause(waits):
    t, a = waits("nanosleep")
    rp = RemoteProcess(t.pid)
    for _ in range(20):
        t0 = time.monotonic()
        with rp.borrow(tid=a["tid"]) as c:
            assert c.call(a["add6"], 1, 2, 3, 4, 5, 6) == 1 + 4 + 9 + 16 + 25 + 36
            assert c.call(a["add6"], -1, 0, 0, 0, 0, 0) == (1 << 64) - 1
            assert c.call(a["check_align"]) == 8          # rsp % 16 == 8 at entry
            assert c.call(a["getpid"]) == t.pid
        wall_us = (time.monotonic() - t0) * 1e6
        assert len(rp.pause_us) == 1 and 0 < rp.pause_us[0] <= wall_us
        assert (rp.last["syscall"] == "nanosleep" or "resumed by restart_syscall" in
                rp.last["syscall"]) and rp.last["calls"] == 4
    assert_released(t.pid)
    progressing(t, a)
    assert stat(t, a, BAD) == 0


def test_only_the_borrowed_thread_stops():
    with start([churn_bin(), "4", "1"]) as t:
        a = parse_ready(t.ready)
        ops = lambda: sum(int.from_bytes(ptrace.read_memory(t.pid, a["ops"] + 8 * i, 8),
                                         "little") for i in range(1, 5))
        rp = RemoteProcess(t.pid)
        with rp.borrow() as c:
            assert c.tid == a["main"] and c.syscall == "read"
            before = ops()
            time.sleep(0.2)
            assert ops() > before + 1000       # the other threads kept running
            states = {int(tid): proc_status(t.pid, tid)
                      for tid in os.listdir(f"/proc/{t.pid}/task")}
            assert states[c.tid]["State"].startswith("t")
            assert int(states[c.tid]["TracerPid"]) == os.getpid()
            for tid, st in states.items():
                if tid != c.tid:
                    assert st["TracerPid"] == "0" and not st["State"].startswith("t")
        assert_released(t.pid)


def test_access_denied_for_unprivileged_user(waits):
    t, a = waits("nanosleep")
    import unpriv
    code = (
        "import sys\n"
        "from collectors.engine.remote import RemoteProcess\n"
        "from diag.model.errors import AccessDenied\n"
        "try:\n"
        f"    with RemoteProcess({t.pid}).borrow() as c: pass\n"
        "except AccessDenied as e:\n"
        "    print('DENIED', e.exit_code); print(e.remediation); sys.exit(0)\n"
        "print('NOT DENIED'); sys.exit(1)\n")
    res = unpriv.run(["-c", code], timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "DENIED 4" in res.stdout and "CAP_SYS_PTRACE" in res.stdout
    assert_released(t.pid)


# ---------------------------------------------------------------------------
# safe points: which waits are borrowed, and that they restart cleanly

ALLOWED = ["nanosleep", "clock_nanosleep", "poll", "ppoll", "select", "pselect6"]


@pytest.mark.parametrize("mode", ALLOWED)
def test_idle_wait_restarts_cleanly(waits, mode):
    """Stopped inside the wait, called into, restored: the program sees no
    EINTR and a correct result from every wait (bad == 0)."""
    t, a = waits(mode)
    rp = RemoteProcess(t.pid)
    interrupted = 0
    for _ in range(15):
        with rp.borrow(tid=a["tid"]) as c:
            # after the first stop a sleep resumes through restart_syscall,
            # named by the libc function the walk finds (here syscall())
            assert c.kind == "idle" and (c.syscall.split(" ")[0] == mode or
                                         "resumed by restart_syscall" in c.syscall)
            c.call(a["clobber_vectors"])
        interrupted += not rp.last["boundary"]
        time.sleep(0.003)
    assert interrupted > 0          # really stopped inside the wait
    progressing(t, a, n=3)
    assert stat(t, a, BAD) == 0, (stat(t, a, LAST_RET), stat(t, a, LAST_ERRNO))
    assert_released(t.pid)


def test_idle_read_gets_its_data(waits):
    t, a = waits("read")
    rp = RemoteProcess(t.pid)
    for _ in range(20):
        with rp.borrow(tid=a["tid"]) as c:
            assert c.syscall == "read"
            c.call(a["clobber_vectors"])
    data = bytes(range(1, 200))
    t.proc.stdin.write(data)
    t.proc.stdin.flush()
    wait_for(lambda: stat(t, a, BYTES) == len(data), what="data read")
    assert stat(t, a, SUM) == sum(data)
    assert stat(t, a, BAD) == 0
    assert_released(t.pid)


def test_idle_pause_restarts_cleanly(waits):
    t, a = waits("pause")
    rp = RemoteProcess(t.pid)
    for _ in range(20):
        with rp.borrow(tid=a["tid"]) as c:
            assert c.syscall == "pause"
            c.call(a["add6"], 1, 1, 1, 1, 1, 1)
    assert stat(t, a, ITERS) == 0          # pause never returned spuriously
    ptrace.tgkill(t.pid, a["tid"], signal.SIGUSR2)
    wait_for(lambda: stat(t, a, ITERS) == 1, what="pause to return")
    assert stat(t, a, USR2) == 1 and stat(t, a, BAD) == 0


def test_boundary_stop_just_after_a_wait(waits):
    """A 1 µs nanosleep loop: many stops land just after the syscall returned
    (orig_rax set, rax = 0).  Restoring registers exactly hands the program its
    result: no wrong return value, no repeated or skipped sleep."""
    t, a = waits("nanosleep_short")
    rp = RemoteProcess(t.pid, deadline_s=5)
    for _ in range(300):
        with rp.borrow(tid=a["tid"]) as c:
            c.call(a["getpid"])
    progressing(t, a, n=100)
    assert stat(t, a, BAD) == 0, (stat(t, a, LAST_RET), stat(t, a, LAST_ERRNO))
    print("boundary stops:", rp.stats["boundary_stops"], "of", rp.stats["borrows"])
    assert_released(t.pid)


@pytest.mark.parametrize("mode", ["semop", "futex"])
def test_unsafe_waits_are_never_borrowed(waits, mode):
    t, a = waits(mode)
    rp = RemoteProcess(t.pid, deadline_s=0.3)
    entered = False
    with pytest.raises(RemoteCallError) as ei:
        with rp.borrow(tid=a["tid"]):
            entered = True
    assert not entered
    assert "never at a safe point" in str(ei.value)
    time.sleep(0.1)
    assert stat(t, a, BAD) == 0            # we never even stopped it
    assert_released(t.pid)


@pytest.mark.parametrize("mode,breaks", [("epoll_wait", True), ("sigtimedwait", True),
                                         ("semop", True), ("nanosleep", False)])
def test_why_those_waits_are_refused(waits, mode, breaks):
    """Evidence for the rule: a bare ptrace stop + detach (no call at all)
    makes epoll_wait/sigtimedwait/semop return a spurious EINTR; nanosleep
    restarts."""
    t, a = waits(mode)
    tid = a["tid"]
    for _ in range(20):
        for _ in range(200):
            with open(f"/proc/{t.pid}/task/{tid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "S":
                    break
            time.sleep(0.001)
        ptrace.seize(tid, t.pid)
        ptrace.interrupt(tid, t.pid)
        while ptrace.waitpid_nohang(tid, t.pid) is None:
            time.sleep(0.0005)
        ptrace.detach(tid, t.pid)
        time.sleep(0.005)
    time.sleep(0.1)
    assert (stat(t, a, BAD) > 0) == breaks, (stat(t, a, LAST_RET), stat(t, a, LAST_ERRNO))


def test_running_thread_outside_forbidden_text(waits):
    """A thread spinning in application code with deep application frames is
    borrowed by the PC/stack rule; its registers are intact afterwards."""
    t, a = waits("running")
    libc = text_ranges(t.pid, LIBC_NAMES)
    rp = RemoteProcess(t.pid, forbidden_ranges=libc)
    for _ in range(20):
        with rp.borrow(tid=a["tid"]) as c:
            assert c.kind == "running"
            assert c.call(a["add6"], 1, 0, 0, 0, 0, 0) == 1
            c.call(a["clobber_vectors"])
    progressing(t, a, n=3)
    assert stat(t, a, BAD) == 0
    # the same thread is refused once its own code counts as forbidden
    exe = text_ranges(t.pid, (os.path.basename(waits_bin()),))
    rp2 = RemoteProcess(t.pid, forbidden_ranges=libc + exe, deadline_s=0.3)
    with pytest.raises(RemoteCallError, match="inside remote_waits"):
        with rp2.borrow(tid=a["tid"]):
            pass
    assert_released(t.pid)


# ---------------------------------------------------------------------------
# machine state: vector registers, signal mask, SIGSEGV handler

@pytest.mark.parametrize("unsafe", [(), ("xstate",)], ids=["restored", "not-restored"])
def test_vector_state_is_restored(waits, unsafe):
    t, a = waits("vector")
    rp = RemoteProcess(t.pid, _unsafe=unsafe)
    for _ in range(15):
        with rp.borrow(tid=a["tid"]) as c:
            assert c.call(a["clobber_vectors"]) == (1 << 20) - 1
        time.sleep(0.002)
    progressing(t, a, n=3)
    if unsafe:
        assert stat(t, a, BAD) > 0     # the test sees ymm clobbering
    else:
        assert stat(t, a, BAD) == 0


def test_sigsegv_blocked_thread_keeps_mask_and_handler(waits):
    t, a = waits("segv")
    tid = a["tid"]
    segv = 1 << (signal.SIGSEGV - 1)
    assert int(proc_status(t.pid, tid)["SigBlk"], 16) & segv
    rp = RemoteProcess(t.pid)
    for _ in range(10):
        with rp.borrow(tid=tid) as c:
            c.call(a["add6"], 0, 0, 0, 0, 0, 0)
    assert int(proc_status(t.pid, tid)["SigBlk"], 16) & segv       # mask restored
    assert int(proc_status(t.pid)["SigCgt"], 16) & segv            # handler kept
    progressing(t, a, n=2)
    assert stat(t, a, SEGV_HANDLER_OK) == 1 and stat(t, a, SEGV_BLOCKED_OK) == 1
    assert stat(t, a, BAD) == 0


def test_sigsegv_blocked_without_unblocking_loses_the_handler(waits):
    """What the test above guards against: the kernel resets the handler."""
    t, a = waits("segv")
    rp = RemoteProcess(t.pid, _unsafe=("sigsegv_unblock",))
    with rp.borrow(tid=a["tid"]) as c:
        c.call(a["add6"], 0, 0, 0, 0, 0, 0)
    assert not int(proc_status(t.pid)["SigCgt"], 16) & (1 << (signal.SIGSEGV - 1))


def test_target_ignoring_sigsegv_is_refused(waits):
    t, a = waits("ignsegv")
    with pytest.raises(RemoteCallError, match="ignores SIGSEGV"):
        RemoteProcess(t.pid)
    assert_released(t.pid)


# ---------------------------------------------------------------------------
# signals to the target during calls

_libc = ctypes.CDLL(None, use_errno=True)
_libc.sigqueue.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long]


@pytest.mark.parametrize("block_signals", [True, False], ids=["masked", "held"])
def test_signals_during_calls_are_delivered_once(waits, block_signals):
    """Another thread queues SIGUSR1 and SIGRTMIN (with a value) to the
    process, each only after the previous one was handled, while the only
    thread that accepts them is borrowed again and again.  Every signal is
    handled exactly once, by that thread, with its original siginfo
    (SI_QUEUE, sender pid, value)."""
    t, a = waits("signals")
    set_stat(t, a, SENDER, os.getpid())
    rp = RemoteProcess(t.pid, block_signals=block_signals)
    n = 60
    sent = []
    stop = threading.Event()
    err = []

    def sender():
        try:
            for i in range(n):
                sig = signal.SIGUSR1 if i % 2 == 0 else signal.SIGRTMIN
                # aim at an open window (the worker is traced by the engine)
                wait_for(lambda: proc_status(t.pid, a["tid"])["TracerPid"] != "0", 2.0,
                         "a borrow window")
                if _libc.sigqueue(t.pid, sig, i + 1) != 0:
                    raise OSError(ctypes.get_errno(), "sigqueue")
                sent.append(i + 1)
                wait_for(lambda: stat(t, a, USR1) + stat(t, a, RT) == i + 1, 5.0,
                         f"signal {i} handled")
        except BaseException as e:       # reported by the main thread
            err.append(e)
        finally:
            stop.set()

    th = threading.Thread(target=sender)
    th.start()
    held = 0
    try:
        while not stop.is_set():
            with rp.borrow(tid=a["tid"]) as c:
                c.call(a["slow_fn"], 2)
                c.call(a["add6"], 1, 2, 3, 4, 5, 6)
            held += len(rp.held_signals)
    finally:
        th.join()
    assert not err, err
    assert stat(t, a, USR1) == n // 2 and stat(t, a, RT) == n // 2
    assert stat(t, a, SIG_SUM) == sum(sent)
    assert stat(t, a, BAD_INFO) == 0 and stat(t, a, WRONG_THREAD) == 0
    if not block_signals:
        assert held >= n // 4, f"only {held} signal-delivery-stops were exercised"
    print("held and re-delivered:", held)
    assert_released(t.pid)


@pytest.mark.parametrize("block_signals", [True, False], ids=["masked", "held"])
def test_several_signals_in_one_window(waits, block_signals):
    """SIGUSR1, SIGRTMIN, SIGRTMIN arrive during one call, 30 ms apart: all
    three are handled afterwards (the two real-time ones are queued, not
    merged), each with its own value and SI_QUEUE siginfo.  The call lasts
    400 ms for the 90 ms of sending: room for a loaded CI's scheduling."""
    t, a = waits("signals")
    set_stat(t, a, SENDER, os.getpid())
    rp = RemoteProcess(t.pid, block_signals=block_signals)

    def send():
        for sig, val in ((signal.SIGUSR1, 100), (signal.SIGRTMIN, 20),
                         (signal.SIGRTMIN, 3)):
            time.sleep(0.03)
            assert _libc.sigqueue(t.pid, sig, val) == 0

    th = threading.Thread(target=send)
    with rp.borrow(tid=a["tid"]) as c:
        th.start()
        assert c.call(a["slow_fn"], 400) == 400
        th.join()
    if not block_signals:
        assert len(rp.held_signals) == 3, rp.held_signals
    wait_for(lambda: stat(t, a, USR1) + stat(t, a, RT) == 3, 3.0, "3 signals handled")
    time.sleep(0.05)
    assert stat(t, a, USR1) == 1 and stat(t, a, RT) == 2
    assert stat(t, a, SIG_SUM) == 123
    assert stat(t, a, BAD_INFO) == 0 and stat(t, a, WRONG_THREAD) == 0
    assert_released(t.pid)


def _engine_loop_code(pid, tid, func):
    return (
        "import sys\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        "from collectors.engine.remote import RemoteProcess\n"
        f"rp = RemoteProcess({pid})\n"
        "print('LOOPING', flush=True)\n"
        "while True:\n"
        f"    with rp.borrow(tid={tid}) as c:\n"
        f"        c.call({func}, 30)\n"
        f"        c.call({func}, 30)\n")


def _default_dispositions():
    """In the child before exec: the signals the test sends at their default
    action, as in a shell a user started allocdiag from.  A suite run under
    nohup (or as a background job) passes them on ignored: SIGHUP was then
    discarded, and the tool lived on (a dev CI run, /proc: SigIgn had
    SIGHUP)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _where_is(pid):
    """What /proc says of a process that should have exited: its state and
    signal masks, each thread's wait channel, syscall and kernel stack."""
    out = []
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/status") as f:
            out += [line.strip() for line in f if line.split(":")[0] in (
                "State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt", "TracerPid")]
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            for leaf in ("wchan", "syscall", "stack"):
                with contextlib.suppress(OSError):
                    with open(f"/proc/{pid}/task/{tid}/{leaf}") as f:
                        out.append(f"{tid} {leaf}: {f.read().strip()}")
    return "; ".join(out)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_to_allocdiag_during_a_call(waits, sig):
    """SIGINT/TERM/HUP to the tool mid-call: the restore finishes first, the
    tool then dies, the target is left running and untraced."""
    t, a = waits("nanosleep")
    for delay in (0.013, 0.031, 0.047):
        p = subprocess.Popen([sys.executable, "-c",
                              _engine_loop_code(t.pid, a["tid"], a["slow_fn"])],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=_default_dispositions)
        try:
            assert p.stdout.readline().strip() == b"LOOPING"
            time.sleep(0.1 + delay)
            # aim mid-window: the worker is traced by the engine (running our call)
            wait_for(lambda: int(proc_status(t.pid, a["tid"])["TracerPid"]) == p.pid,
                     2.0, "engine mid-window")
            p.send_signal(sig)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pytest.fail(f"allocdiag still alive 10 s after {sig.name}: "
                            f"{_where_is(p.pid)}")
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode != 0
        assert t.alive()
        assert_released(t.pid)
        progressing(t, a, n=2)
        assert stat(t, a, BAD) == 0


# ---------------------------------------------------------------------------
# memory left behind

def test_maps_unchanged_after_many_borrows(waits):
    t, a = waits("nanosleep")
    with open(f"/proc/{t.pid}/maps") as f:
        before = f.read()
    rp = RemoteProcess(t.pid)
    for _ in range(50):
        with rp.borrow(tid=a["tid"]) as c:
            buf = c.scratch(128)
            assert c.call(a["mallinfo2"], buf) == buf     # struct returned via rdi
            arena = int.from_bytes(c.read(buf, 8), "little")
            assert arena > 0
            s = c.scratch(16)
            c.write(s, b"hello\0")
            assert c.cstring(s) == b"hello"
            assert c.call(a["strlen"], s) == 5
    with open(f"/proc/{t.pid}/maps") as f:
        assert f.read() == before


# ---------------------------------------------------------------------------
# the target goes away, execs, stops; calls that time out or crash

def _call_in_background(rp, tid, func, arg, box):
    """FUNC(ARG) on thread TID from a thread of this process; returns once
    the call runs (slow_fn spins: the thread is traced and running), so
    what the test does next lands inside the call, however long the borrow
    took to begin (a process's first borrow is preceded by the rehearsal
    and the warm-up; under a loaded CI, 0.1 s was once not enough)."""
    def run():
        try:
            with rp.borrow(tid=tid) as c:
                box["value"] = c.call(func, arg, timeout_s=5)
        except BaseException as e:
            box["error"] = e
    th = threading.Thread(target=run)
    th.start()

    def in_call():
        st = proc_status(rp.pid, tid)
        return (int(st["TracerPid"]) != 0 and st["State"].startswith("R")) or \
            not th.is_alive()
    wait_for(in_call, 10.0, "the call to start")
    assert th.is_alive(), box
    return th


def test_exit_mid_call_is_a_clean_error(waits):
    t, a = waits("nanosleep")
    rp = RemoteProcess(t.pid)
    box = {}
    # ptrace calls must come from one thread: run the whole borrow in one
    th = _call_in_background(rp, a["tid"], a["slow_fn"], 500, box)
    time.sleep(0.05)
    t.proc.stdin.write(b"x")
    t.proc.stdin.flush()
    th.join(10)
    assert not th.is_alive()
    assert isinstance(box.get("error"), NoSuchProcess), box


def test_kill_mid_call_is_a_clean_error(waits):
    t, a = waits("nanosleep")
    rp = RemoteProcess(t.pid)
    box = {}
    th = _call_in_background(rp, a["tid"], a["slow_fn"], 500, box)
    time.sleep(0.05)
    os.kill(t.pid, signal.SIGKILL)
    th.join(10)
    assert not th.is_alive()
    assert isinstance(box.get("error"), NoSuchProcess), box


def test_exit_before_borrow(waits):
    t, a = waits("nanosleep")
    rp = RemoteProcess(t.pid)
    t.proc.kill()
    t.proc.wait()
    with pytest.raises(NoSuchProcess):
        with rp.borrow():
            pass


def test_exec_mid_call_and_before_borrow(waits):
    t, a = waits("nanosleep")
    rp = RemoteProcess(t.pid)
    box = {}
    th = _call_in_background(rp, a["tid"], a["slow_fn"], 500, box)
    time.sleep(0.05)
    t.proc.stdin.write(b"e")
    t.proc.stdin.flush()
    th.join(10)
    assert not th.is_alive()
    err = box.get("error")
    assert isinstance(err, RemoteCallError) and "new program" in str(err), box
    with pytest.raises(RemoteCallError, match="new program"):
        with rp.borrow():
            pass
    assert_released(t.pid)


def test_group_stopped_target_is_refused(waits):
    t, a = waits("nanosleep")
    rp = RemoteProcess(t.pid)
    os.kill(t.pid, signal.SIGSTOP)
    wait_for(lambda: proc_status(t.pid)["State"].startswith("T"), what="stop")
    t0 = time.monotonic()
    with pytest.raises(RemoteCallError, match="stopped"):
        with rp.borrow(tid=a["tid"]):
            pass
    assert time.monotonic() - t0 < 1.0
    assert proc_status(t.pid)["State"].startswith("T")      # still stopped
    os.kill(t.pid, signal.SIGCONT)
    progressing(t, a)
    assert stat(t, a, BAD) == 0


def test_sigstop_mid_call(waits):
    """SIGSTOP during a call: the call finishes, the thread is restored, and
    the process ends up stopped as the sender asked; SIGCONT resumes it."""
    t, a = waits("nanosleep")
    rp = RemoteProcess(t.pid)
    box = {}
    th = _call_in_background(rp, a["tid"], a["slow_fn"], 300, box)
    time.sleep(0.05)
    os.kill(t.pid, signal.SIGSTOP)
    th.join(10)
    assert box.get("value") == 300, box
    wait_for(lambda: all(proc_status(t.pid, tid)["State"].startswith("T")
                         for tid in os.listdir(f"/proc/{t.pid}/task")), 2.0, "group stop")
    assert_released(t.pid)
    os.kill(t.pid, signal.SIGCONT)
    progressing(t, a)
    assert stat(t, a, BAD) == 0


def test_call_timeout_restores_and_quarantines(waits):
    t, a = waits("nanosleep")
    rp = RemoteProcess(t.pid)
    t0 = time.monotonic()
    with pytest.raises(RemoteCallError, match="did not return within 0.3 s"):
        with rp.borrow(tid=a["tid"]) as c:
            c.call(a["hang_fn"], timeout_s=0.3)
    assert time.monotonic() - t0 < 3
    assert is_quarantined(t.pid)
    assert_released(t.pid)
    progressing(t, a)                       # registers restored: loop goes on
    assert stat(t, a, BAD) == 0
    with pytest.raises(Quarantined, match="did not return"):
        with rp.borrow():
            pass
    with pytest.raises(Quarantined):
        RemoteProcess(t.pid)


def test_the_checks_before_a_stop_read_the_process_stat_once(waits, monkeypatch):
    """The checks before a borrow (not quarantined, the same process) read
    /proc/PID/stat once, and only for the pid reuse check while nothing is
    quarantined; a quarantined process is still refused."""
    t, a = waits("nanosleep")
    rp = RemoteProcess(t.pid)
    reads = []
    real = ptrace.start_time
    monkeypatch.setattr(ptrace, "start_time",
                        lambda pid, *args: pid == t.pid and reads.append(pid) or real(pid, *args))
    with rp.borrow(tid=a["tid"]):
        pass
    assert reads == [t.pid]
    ptrace.quarantine(t.pid, real(t.pid), "a test")
    try:
        with pytest.raises(Quarantined, match="a test"):
            with rp.borrow():
                pass
    finally:
        ptrace.REGISTRY.reset()
    assert stat(t, a, BAD) == 0


def test_crashing_call_is_contained(waits):
    t, a = waits("nanosleep")
    rp = RemoteProcess(t.pid)
    with pytest.raises(RemoteCallError, match="crashed with SIGSEGV"):
        with rp.borrow(tid=a["tid"]) as c:
            c.call(a["crash_fn"])
    assert t.alive()
    assert_released(t.pid)
    progressing(t, a)
    assert stat(t, a, BAD) == 0
    assert is_quarantined(t.pid)


# ---------------------------------------------------------------------------
# allocator churn

def _stats_call(alloc, a, c):
    """One stats call through the allocator that serves malloc.  Generous
    timeouts: on 2 cores with 8 churning threads glibc's mallinfo2 waits for
    its arena locks for ~0.8 s median even when called in-process."""
    if alloc == "jemalloc" and a.get("mallctl"):
        name = c.scratch(32)
        c.write(name, b"stats.allocated\0")
        old, oldlen = c.scratch(8), c.scratch(8)
        c.write(oldlen, (8).to_bytes(8, "little"))
        assert c.call(a["mallctl"], name, old, oldlen, 0, 0, timeout_s=20) == 0
        return int.from_bytes(c.read(old, 8), "little")
    if alloc.startswith("tcmalloc") and a.get("tc_numeric"):
        name, out = c.scratch(48), c.scratch(8)
        c.write(name, b"generic.current_allocated_bytes\0")
        assert c.call(a["tc_numeric"], name, out, timeout_s=20) == 1
        return int.from_bytes(c.read(out, 8), "little")
    buf = c.scratch(80)
    assert c.call(a["mallinfo2"], buf, timeout_s=20) == buf
    arena = int.from_bytes(c.read(buf, 8), "little")
    # under mimalloc glibc's own arena may be empty: the call itself is the test
    return arena if alloc == "glibc" else 1


def _churn_run(alloc, borrows, threads=8):
    with start([churn_bin(), str(threads), "1"], allocator=alloc) as t:
        a = parse_ready(t.ready)
        ops = lambda: sum(int.from_bytes(ptrace.read_memory(t.pid, a["ops"] + 8 * i, 8),
                                         "little") for i in range(1, threads + 1))
        rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
        pauses = []
        kinds = {}
        for _ in range(borrows):
            with rp.borrow() as c:
                # main (in read) or a churn thread interrupted in its own loop
                assert c.kind in ("idle", "running")
                kinds[c.kind] = kinds.get(c.kind, 0) + 1
                assert _stats_call(alloc, a, c) > 0
            pauses.extend(rp.pause_us)
        o = ops()
        wait_for(lambda: ops() > o + 1000, 5, "churn progress")
        assert t.alive()
        assert_released(t.pid)
        pauses.sort()
        print(f"{alloc}: {borrows} borrows {kinds}, pause median "
              f"{pauses[len(pauses) // 2]} us, max {pauses[-1]} us")


@pytest.mark.parametrize("alloc,borrows", [("glibc", 12), ("jemalloc", 60),
                                           ("tcmalloc", 60), ("mimalloc", 60)])
def test_churning_target_many_borrows(alloc, borrows):
    _churn_run(alloc, borrows)


@pytest.mark.soak
@pytest.mark.parametrize("alloc,borrows", [("glibc", 400), ("jemalloc", 2000),
                                           ("tcmalloc", 2000), ("mimalloc", 2000)])
def test_churning_target_soak(alloc, borrows):
    _churn_run(alloc, borrows)


def busy_ranges(pid):
    """Forbidden ranges under which no churn thread is ever safe: libc, the
    allocator and the churn program's own text, counted as allocator code (as
    a static allocator's whole executable is when its allocator cannot be
    delimited).  With libc and the allocator alone, a thread stopped in its
    loop between two calls is at a safe point: the CFI walk proves its stack."""
    return text_ranges(pid, LIBC_NAMES + (os.path.basename(churn_bin()),))


@pytest.mark.parametrize("alloc", ["glibc", "jemalloc"])
def test_all_threads_busy_is_refused(alloc):
    with start([churn_bin(), "3", "0"], allocator=alloc) as t:
        rp = RemoteProcess(t.pid, forbidden_ranges=busy_ranges(t.pid), deadline_s=0.5)
        entered = False
        t0 = time.monotonic()
        with pytest.raises(RemoteCallError) as ei:
            with rp.borrow():
                entered = True
        assert not entered                                   # never a call
        assert 0.5 <= time.monotonic() - t0 < 3
        assert "every thread was busy inside the allocator or libc for 0.5 s" \
            in str(ei.value)
        assert rp.stats["calls"] == 0
        assert t.alive()
        assert_released(t.pid)


def test_busy_threads_are_stopped_for_nothing_within_a_budget():
    """Threads that run inside the allocator are stopped, judged and let go
    with no call; over a 2 s wait that was hundreds of stops (1.35 s of
    them).  A borrow stops running threads for nothing for
    RUNNING_STOPS_BUDGET_US (plus the stop that crossed it), then at most
    once every RUNNING_STOPS_PACE_S, and says so."""
    budget, pace = RemoteProcess.RUNNING_STOPS_BUDGET_US, RemoteProcess.RUNNING_STOPS_PACE_S
    deadline_s = 2.0
    with start([churn_bin(), "3", "0"], allocator="glibc") as t:
        rp = RemoteProcess(t.pid, forbidden_ranges=busy_ranges(t.pid), deadline_s=deadline_s)
        with pytest.raises(RemoteCallError) as ei:
            with rp.borrow():
                pass
        assert t.alive()
        assert_released(t.pid)
    assert rp.stats["calls"] == 0 and rp.stats["rejected_stops"] == len(rp.pause_us) > 0
    paced = int(deadline_s / pace) + 1
    assert budget <= sum(rp.pause_us) <= budget + max(rp.pause_us) * (1 + paced), rp.pause_us
    assert len(rp.pause_us) <= budget / min(rp.pause_us) + 1 + paced, rp.pause_us
    assert f"past {budget // 1000} ms, a bound" in str(ei.value)
    # a thread skipped for the budget is said by why it was refused when last
    # stopped, not by an older round's reason (a moment in uninterruptible
    # sleep, a page fault, read as "not busy")
    assert "every thread was busy inside the allocator or libc for 2 s" in str(ei.value)


def test_stack_arguments_beyond_six(waits):
    # snprintf(buf, n, fmt, a, b, c, d, e): 8 arguments, two on the stack
    # (SysV: the 7th at [rsp+8] at entry).  The string it writes proves each.
    t, a = waits("read")
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
    with rp.borrow() as c:
        buf, fmt = c.scratch(128), c.scratch(64)
        c.write(fmt, b"%ld,%ld,%ld,%ld,%ld\0")
        n = c.call(a["snprintf"], buf, 128, fmt, 11, 22, 33, 44, 55)
        out = c.cstring(buf)
    assert out == b"11,22,33,44,55" and n == len(out)
    assert t.alive()


@pytest.mark.parametrize("mode", ["nanosleep", "clock_nanosleep"])
def test_restarted_sleep_is_borrowed_again_without_waiting(waits, mode):
    """After our stop, an interrupted sleep resumes through restart_syscall.
    Borrowing it again must not wait for the sleep to end (a 4 s sleep
    here: ten borrows, the first one a process's first, take well under
    3 s even on a loaded CI), and the sleep must still end on time and
    return 0."""
    t, a = waits(mode, env={"WAITS_SLEEP_MS": "4000"})
    rp = RemoteProcess(t.pid)
    t0 = time.monotonic()
    seen = []
    for _ in range(10):
        with rp.borrow(tid=a["tid"]) as c:
            seen.append(c.syscall)
            assert c.call(a["add6"], 1, 2, 3, 4, 5, 6) == 91      # sum of i * i
    assert time.monotonic() - t0 < 3.0                 # never waited for the sleep
    assert any("resumed by restart_syscall" in s for s in seen), seen
    it0 = stat(t, a, ITERS)
    wait_for(lambda: stat(t, a, ITERS) > it0, 6.0, "sleep completes on time")
    assert stat(t, a, BAD) == 0
    assert_released(t.pid)


def test_restart_syscall_of_a_futex_is_not_borrowed(waits):
    """A futex wait with a timeout, interrupted by SIGSTOP/SIGCONT (not by
    allocdiag), resumes through restart_syscall.  It is judged as the futex
    it is: its wait channel says futex, its argument registers a plain
    FUTEX_WAIT (not a condition variable): refused, like before the stop."""
    import signal as sig
    t, a = waits("futex", env={"WAITS_SLEEP_MS": "10000"})
    wait_for(lambda: open(f"/proc/{t.pid}/task/{a['tid']}/syscall").read().split()[0] == "202",
             5.0, "the worker in its futex wait")
    os.kill(t.pid, sig.SIGSTOP)
    wait_for(lambda: proc_status(t.pid, a["tid"])["State"].startswith("T"), 5.0,
             "the futex waiter in the group stop")
    os.kill(t.pid, sig.SIGCONT)
    wait_for(lambda: open(f"/proc/{t.pid}/task/{a['tid']}/syscall").read().split()[0] == "219",
             2, "futex wait resumed through restart_syscall")
    rp = RemoteProcess(t.pid, deadline_s=0.3)
    assert "futex" in open(f"/proc/{t.pid}/task/{a['tid']}/wchan").read()
    with pytest.raises(RemoteCallError, match="plain futex wait .*resumed by restart_syscall"):
        with rp.borrow(tid=a["tid"]):
            pass


@pytest.mark.parametrize("runnable, spins_long", [(1, True), (64, False)])
def test_spin_budget_follows_free_cpus(tmp_path, runnable, spins_long):
    """The waiter spins long only when a CPU is free for the tracee (spinning
    then costs it nothing); on a busy box it sleeps early so it does not take
    the CPU the tracee needs.  The runnable count comes from loadavg."""
    p = subprocess.Popen(["sleep", "30"])
    try:
        # Popen returns once the vfork()ed child's exec has swapped its mm,
        # before the kernel wrote the new auxv: opened then, the process
        # reads as having exec'd since (seen once in CI).  Asleep, it is done.
        wait_for(lambda: open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "S",
                 what="sleep to finish its exec")
        procfs = tmp_path / "proc"
        procfs.mkdir()
        os.symlink(f"/proc/{p.pid}", procfs / str(p.pid))
        (procfs / "loadavg").write_text(f"0.10 0.20 0.30 {runnable}/300 4242\n")
        rp = RemoteProcess(p.pid, procfs=str(procfs))
        cpus = len(os.sched_getaffinity(0))
        want = RemoteProcess.SPIN_FREE_CPU_S if runnable < cpus else RemoteProcess.SPIN_S
        assert rp._spin_budget() == want
        assert (want == RemoteProcess.SPIN_FREE_CPU_S) == (spins_long and cpus > 1)
        (procfs / "loadavg").write_text("garbage\n")
        assert rp._spin_budget() == RemoteProcess.SPIN_S
    finally:
        p.kill()
        p.wait()


def test_the_tracers_timer_slack_is_given_back(waits):
    """The tracer waits with a 1 us timer slack, for the borrow only: a
    thread's slack is inherited by the children it starts later (compare's
    workloads), and a 1 us slack left behind turned a later target's 1 us
    nanosleep loop into a busy loop that never slept."""
    libc = ctypes.CDLL(None)
    PR_SET_TIMERSLACK, PR_GET_TIMERSLACK = 29, 30
    libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(50_000), 0, 0, 0)
    t, a = waits("read")
    # without SCHED_FIFO: leaving it resets the slack to the default (50 us)
    # and would hide a slack left behind
    rp = RemoteProcess(t.pid, boost=False)
    with rp.borrow(tid=a["tid"]):
        assert libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == 1000
    assert libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == 50_000
    with pytest.raises(RemoteCallError):
        RemoteProcess(t.pid, deadline_s=0.2, boost=False).borrow(tid=999_999_999).__enter__()
    assert libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == 50_000


def test_writes_go_with_the_next_call_in_one_syscall(waits, monkeypatch):
    """Call.write bytes are made with the next call's frame, in one
    process_vm_writev, or before the next read of them: the stop makes one
    syscall per call for its scratch, not one per value."""
    from collectors.engine import memory
    t, a = waits("read")
    rp = RemoteProcess(t.pid)
    writes = []
    real = memory._pvw
    monkeypatch.setattr(memory, "_pvw", lambda *args: (writes.append(args[4]), real(*args))[1])
    with rp.borrow(tid=a["tid"]) as c:
        writes.clear()                    # the rehearsal's, before the stop
        first, second = c.scratch(16), c.scratch(16)
        c.write(first, b"abc\0")
        c.write(second, b"wxyz\0")
        assert writes == []
        assert c.call(a["strlen"], first) == 3 and c.call(a["strlen"], second) == 4
        assert writes == [3, 1]           # scratch + frame together, then the frame alone
        c.write(first, b"hello\0")
        assert c.read(first, 6) == b"hello\0"
        assert writes == [3, 1, 1]
    assert stat(t, a, BAD) == 0
    assert_released(t.pid)


def test_no_cyclic_collection_while_a_thread_may_be_stopped(waits):
    """The collector is off for the borrow (its stops, refused ones
    included) and back as it was after it, also when the borrow fails."""
    import gc
    t, a = waits("read")
    rp = RemoteProcess(t.pid)
    assert gc.isenabled()
    with rp.borrow(tid=a["tid"]) as c:
        assert not gc.isenabled()
        at = c.scratch(16)
        c.write(at, b"\0")
        assert c.call(a["strlen"], at) == 0
    assert gc.isenabled()
    with pytest.raises(RemoteCallError):
        RemoteProcess(t.pid, deadline_s=0.2).borrow(tid=999_999_999).__enter__()
    assert gc.isenabled()
    gc.disable()
    try:
        with rp.borrow(tid=a["tid"]):
            pass
        assert not gc.isenabled()       # left as the caller had it
    finally:
        gc.enable()
    assert_released(t.pid)


def test_a_stop_makes_no_ctypes_buffer_per_size(waits, monkeypatch):
    """The frame writes, the reads of a call's output and the restore of the
    XSAVE area use the bytes objects themselves and one reused read buffer
    (collectors.engine.cbytes): ctypes.create_string_buffer makes a new
    array type for each size it has not seen, 17-50 us inside the stop."""
    t, a = waits("read")
    rp = RemoteProcess(t.pid)
    made = []
    real = ctypes.create_string_buffer
    with rp.borrow(tid=a["tid"]) as c:
        monkeypatch.setattr(ctypes, "create_string_buffer",
                            lambda *args: (made.append(args), real(*args))[1])
        at = c.scratch(64)
        for text in (b"seventeen bytes.\0", b"nineteen bytes....\0", b"x" * 37 + b"\0"):
            c.write(at, text)
            assert c.call(a["strlen"], at) == len(text) - 1
            assert c.read(at, len(text)) == text
        out = c.buffer(40_000)
        c.write(out, b"y" * 39_999 + b"\0")
        assert c.call(a["strlen"], out) == 39_999
        assert c.read(out, 40_000) == b"y" * 39_999 + b"\0"
    assert made == []           # the release (registers, XSAVE area, siginfo) included
    assert stat(t, a, BAD) == 0
    assert_released(t.pid)


def test_cbytes_addresses_and_the_reused_read_buffer():
    from collectors.engine import cbytes
    data = b"the bytes themselves\0"
    assert ctypes.string_at(cbytes.address(data), len(data)) == data
    keep, at = cbytes.reader(100)
    keep2, at2 = cbytes.reader(cbytes.READ_BYTES)
    assert at == at2                              # one per thread, reused
    ctypes.memmove(at, b"abc", 3)
    assert cbytes.take(at, 3) == b"abc"
    big, big_at = cbytes.reader(cbytes.READ_BYTES + 1)
    assert big_at != at                           # a larger read gets its own
    got = []
    th = threading.Thread(target=lambda: got.append(cbytes.reader(10)[1]))
    th.start()
    th.join()
    assert got and got[0] != at                   # and each thread its own


def test_the_pause_counts_from_the_interrupt(waits, monkeypatch):
    """From PTRACE_INTERRUPT on the thread runs none of its own code, so
    its pause starts there, not when the tracer first sees the stop (a
    tracee queued behind the tracer's CPU once took 2 ms to get there)."""
    from collectors.engine import ptrace as requests
    t, a = waits("read")
    rp = RemoteProcess(t.pid)
    real = requests.interrupt

    def slow_interrupt(tid, pid):
        real(tid, pid)
        if tid == a["tid"]:
            time.sleep(0.02)        # the stop is reached, the tracer looks later

    monkeypatch.setattr(requests, "interrupt", slow_interrupt)
    with rp.borrow(tid=a["tid"]):
        pass
    assert rp.pause_us[0] >= 20_000
    assert_released(t.pid)


def _hold_traced(pid, hold_s):
    """A process of its own that PTRACE_SEIZEs PID's main thread (it keeps
    running) and exits after HOLD_S, which detaches it: another tracer."""
    # os._exit: no interpreter finalisation, so the detach (at exit) comes
    # right after HOLD_S even on a loaded CI
    code = ("import os, sys, time\n"
            "from collectors.engine import ptrace\n"
            f"ptrace.seize({pid}, {pid})\n"
            "print('seized', flush=True)\n"
            f"time.sleep({hold_s})\n"
            "os._exit(0)\n")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"seized\n"
    return p


def test_another_allocdiag_s_short_stop_is_waited_for_a_debugger_is_not():
    # Another allocdiag (an exporter, a recording) holds a thread of the
    # same process for its stop, under a millisecond: a snapshot that meets
    # it waits; a tracer that stays (a debugger) is said after 50 ms.
    from diag import snapshot
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        helper = _hold_traced(t.pid, 0.02)
        try:
            snap, col = snapshot.take(t.pid)
        finally:
            helper.wait(timeout=10)
        assert col.status["remote"].ok, col.status["remote"].error
        helper = _hold_traced(t.pid, 5)
        try:
            t0 = time.monotonic()
            snap, col = snapshot.take(t.pid)
            took = time.monotonic() - t0
        finally:
            helper.kill()
            helper.wait(timeout=10)
        assert not col.status["remote"].ok and took < 1.5
        assert f"already traced by pid {helper.pid}" in col.status["remote"].error
        assert "still traced after 50 ms" in col.status["remote"].error
        snap, col = snapshot.take(t.pid)
        assert col.status["remote"].ok and t.alive()
