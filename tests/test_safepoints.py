"""Safe points of the remote engine (collectors/engine/safepoints.py) on real
processes: epoll-family waits made invisible, restartable waits, futex waits
proven by a stack walk, borrowing order and refusal messages.

Target: tests/targets/sp_waits.c -- one worker thread parked in a chosen
wait, counting every EINTR its waits return (read without stopping it).
"""

import logging
import os
import re
import signal
import time

import pytest

from targets import build_c, start, wait_for

from collectors.engine import tracee as ptrace

from collectors.engine import remote
from diag.model.errors import RemoteCallError, Unsupported
from collectors.engine.remote import RemoteProcess, text_ranges

ITERS, EINTR, BAD, LAST_RET, LAST_ERRNO, USR1, DONE, TIMEOUTS = range(8)
NR_FUTEX = 202
LIBC_NAMES = ("libc.so", "ld-linux", "libjemalloc", "libtcmalloc", "libmimalloc")


def sp_bin():
    return build_c("sp_waits.c", "-pthread")


def parse_ready(ready):
    out = {}
    for word in ready.split():
        k, _, v = word.partition("=")
        out[k] = int(v, 16) if v.startswith("0x") else int(v) if v.isdigit() else v
    return out


def stat(t, a, field):
    raw = ptrace.read_memory(t.pid, a["stats"] + 8 * field, 8)
    return int.from_bytes(raw, "little", signed=True)


def syscall_of(pid, tid):
    with open(f"/proc/{pid}/task/{tid}/syscall") as f:
        return f.read().split()


def thread_state(pid, tid):
    """The State letter of /proc/PID/task/TID/stat."""
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def parked(t, a, nr, timeout=3.0):
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        sc = syscall_of(t.pid, a["tid"])
        if sc[0] == str(nr) and thread_state(t.pid, a["tid"]) == "S":
            return
        time.sleep(0.002)
    raise AssertionError(f"worker never parked in syscall {nr}")


def assert_released(pid):
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            st = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        assert st["TracerPid"].strip() == "0", tid
        assert not st["State"].startswith("t"), tid


@pytest.fixture
def sp():
    stack = []

    def _start(mode, **kw):
        cm = start([sp_bin(), mode], **kw)
        t = cm.__enter__()
        stack.append(cm)
        return t, parse_ready(t.ready)

    yield _start
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


def rax_at_stop(pid, tid):
    """Stop TID once (no call), return (rax, orig_rax), restore exactly."""
    from collectors.engine import arch_x86_64 as arch
    ptrace.seize(tid, pid)
    ptrace.interrupt(tid, pid)
    while ptrace.waitpid_nohang(tid, pid) is None:
        time.sleep(0.0005)
    regs = arch.get_regs(tid, pid)
    ptrace.detach(tid, pid)
    return arch.syscall_state(regs)[1], arch.syscall_state(regs)[0]


# ---------------------------------------------------------------------------
# epoll-family waits

EPOLL_MODES = [("epoll_wait", 232), ("epoll_pwait", 281), ("epoll_pwait2", 441),
               ("sigtimedwait", 128)]


@pytest.mark.parametrize("mode,nr", EPOLL_MODES)
def test_epoll_wait_stop_shows_eintr(sp, mode, nr):
    """The measured fact the rule rests on: at the interrupt stop these waits
    hold -EINTR, and restoring the registers exactly makes the program see
    it (what the engine must not do)."""
    t, a = sp(mode)
    parked(t, a, nr)
    assert rax_at_stop(t.pid, a["tid"]) == (-4, nr)
    wait_for(lambda: stat(t, a, EINTR) >= 1, what="the EINTR the program sees")
    time.sleep(0.05)
    assert stat(t, a, EINTR) == 1


@pytest.mark.parametrize("mode,nr", EPOLL_MODES)
def test_epoll_waits_borrowed_without_visible_eintr(sp, mode, nr):
    t, a = sp(mode)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
    rewritten = 0
    for _ in range(40):
        parked(t, a, nr)
        with rp.borrow(tid=a["tid"]) as c:
            assert c.kind == "idle"
            assert c.syscall == {"sigtimedwait": "rt_sigtimedwait"}.get(mode, mode)
        rewritten += rp.last["restarted_eintr"]
    time.sleep(0.05)
    assert rewritten >= 30, rewritten           # the stop really made them EINTR
    assert stat(t, a, EINTR) == 0
    assert stat(t, a, BAD) == 0
    assert_released(t.pid)


def test_epoll_eintr_check_reads_the_syscall_instruction_before_the_stop(sp, monkeypatch):
    """Whether an EINTR wait can be restarted depends on the `syscall`
    instruction before its pc: read before the stop (the pc /proc shows for
    the sleeping thread, in read-only text), so the check inside the stop
    reads no memory; the wait is still given back without an EINTR."""
    from collectors.engine import choose
    t, a = sp("epoll_wait")
    inside = []
    judging = []
    real_read, real_check = choose.Chooser.try_read, choose.Chooser.eintr_restartable

    def read(self, addr, n):
        if judging:
            inside.append(addr)
        return real_read(self, addr, n)

    def check(self, th):
        judging.append(1)
        try:
            return real_check(self, th)
        finally:
            judging.pop()
    monkeypatch.setattr(choose.Chooser, "try_read", read)
    monkeypatch.setattr(choose.Chooser, "eintr_restartable", check)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
    rewritten = 0
    for _ in range(10):
        parked(t, a, 232)
        with rp.borrow(tid=a["tid"]) as c:
            assert c.syscall == "epoll_wait"
        rewritten += rp.last["restarted_eintr"]
        assert rp._chooser.insn_before
    time.sleep(0.05)
    assert rewritten >= 8 and inside == []
    assert stat(t, a, EINTR) == 0 and stat(t, a, BAD) == 0
    assert_released(t.pid)


@pytest.mark.parametrize("mode,nr", EPOLL_MODES)
def test_epoll_waits_with_calls_many_borrows(sp, mode, nr):
    """200 borrows each making a real call: the registers given back are
    the saved ones with rax = -ERESTARTNOHAND, the call's own registers
    never leak: 0 EINTR, the wait still parked in the same syscall."""
    t, a = sp(mode)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
    pauses = []
    for _ in range(200):
        with rp.borrow(tid=a["tid"]) as c:
            assert c.call(a["getpid"]) == t.pid
        pauses.append(rp.pause_us[-1])
    time.sleep(0.05)
    assert stat(t, a, EINTR) == 0 and stat(t, a, BAD) == 0
    assert syscall_of(t.pid, a["tid"])[0] == str(nr)
    pauses.sort()
    print(f"{mode}: 200 borrows with a call, pause median {pauses[100]} us, max {pauses[-1]} us")
    assert_released(t.pid)


@pytest.mark.parametrize("mode,nr", EPOLL_MODES[:3])
def test_real_signal_during_the_stop_gives_one_eintr(sp, mode, nr):
    """A SIGUSR1 (handler, no SA_RESTART) sent while we hold the thread: the
    program sees exactly one EINTR and the handler runs once, as without us."""
    t, a = sp(mode)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
    for i in range(3):
        parked(t, a, nr)
        with rp.borrow(tid=a["tid"]) as c:
            os.kill(t.pid, signal.SIGUSR1)
            time.sleep(0.01)
            assert c.call(a["getpid"]) == t.pid          # held during the call
        t_end = time.monotonic() + 2
        while stat(t, a, USR1) < i + 1 and time.monotonic() < t_end:
            time.sleep(0.005)
        assert stat(t, a, USR1) == i + 1
        assert stat(t, a, EINTR) == i + 1
    assert_released(t.pid)


def test_finite_epoll_timeout_still_returns(sp):
    """A 300 ms epoll_wait borrowed again and again still times out (0
    returned, no EINTR): a restart restarts with the full timeout, bounded."""
    t, a = sp("epoll_wait", env={"SP_WAIT_MS": "300"})
    rp = RemoteProcess(t.pid)
    for _ in range(10):
        parked(t, a, 232)
        with rp.borrow(tid=a["tid"]):
            pass
        time.sleep(0.02)
    t_end = time.monotonic() + 3
    while stat(t, a, TIMEOUTS) < 2 and time.monotonic() < t_end:
        time.sleep(0.01)
    assert stat(t, a, TIMEOUTS) >= 2
    assert stat(t, a, EINTR) == 0 and stat(t, a, BAD) == 0


# ---------------------------------------------------------------------------
# restartable waits

RESTARTABLE = [("accept", 43, -512), ("accept4", 288, -512), ("recvfrom", 45, -512),
               ("recvmsg", 47, -512), ("wait4", 61, -512), ("waitid", 247, -512),
               ("sigsuspend", 130, -514)]


@pytest.mark.parametrize("mode,nr,rax", RESTARTABLE)
def test_restartable_wait_rax_at_stop(sp, mode, nr, rax):
    """Measured here, not assumed: these waits hold -ERESTARTSYS /
    -ERESTARTNOHAND at the stop, and an exact restore is invisible."""
    t, a = sp(mode)
    parked(t, a, nr)
    for _ in range(3):
        assert rax_at_stop(t.pid, a["tid"]) == (rax, nr)
        time.sleep(0.01)
    time.sleep(0.05)
    assert stat(t, a, ITERS) == 0 and stat(t, a, EINTR) == 0


@pytest.mark.parametrize("mode,nr,rax", RESTARTABLE)
def test_restartable_waits_are_borrowed(sp, mode, nr, rax):
    t, a = sp(mode)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
    for _ in range(20):
        parked(t, a, nr)
        with rp.borrow(tid=a["tid"]) as c:
            assert c.kind == "idle" and c.category == "restartable"
    time.sleep(0.05)
    assert stat(t, a, ITERS) == 0 and stat(t, a, EINTR) == 0   # nothing returned
    assert_released(t.pid)


# ---------------------------------------------------------------------------
# futex waits

@pytest.mark.parametrize("mode", ["condwait", "semwait", "join", "condtimedwait"])
def test_futex_condvar_waits_proven_by_stack_walk(sp, mode):
    env = {"SP_WAIT_MS": "60000"} if mode == "condtimedwait" else {}
    t, a = sp(mode, env=env)
    parked(t, a, NR_FUTEX)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
    for _ in range(15):
        with rp.borrow(tid=a["tid"]) as c:
            assert c.category == "futex", c.syscall
    time.sleep(0.05)
    assert stat(t, a, ITERS) == 0 and stat(t, a, EINTR) == 0
    assert_released(t.pid)


def test_futex_wait_in_allocator_code_is_refused(sp):
    """The same condvar wait, but called from a function the test declares
    allocator code: the walk finds the frame, the thread is refused without
    being stopped (look-ahead) or after the walk."""
    from elftools.elf.elffile import ELFFile
    t, a = sp("fakealloc")
    with open(sp_bin(), "rb") as f:
        sym = ELFFile(f).get_section_by_name(".symtab").get_symbol_by_name(
            "fake_allocator_wait")[0]
    fake = [(a["fake_lo"], a["fake_lo"] + sym["st_size"], "libfakealloc.so")]
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES) + fake,
                       deadline_s=0.3)
    with pytest.raises(RemoteCallError) as ei:
        with rp.borrow(tid=a["tid"]):
            pass
    assert "inside libfakealloc.so" in str(ei.value)
    assert "condition-variable" in str(ei.value)
    assert_released(t.pid)


def _fake_range(name, a):
    from elftools.elf.elffile import ELFFile
    with open(sp_bin(), "rb") as f:
        syms = ELFFile(f).get_section_by_name(".symtab")
        sym = syms.get_symbol_by_name(name)[0]
        lo = a["fake_lo"] - syms.get_symbol_by_name("fake_allocator_wait")[0]["st_value"] \
            + sym["st_value"]
    return [(lo, lo + sym["st_size"], "libfakealloc.so")]


@pytest.mark.parametrize("walk", [True, False])
def test_running_thread_called_from_allocator_is_refused(sp, monkeypatch, caplog, walk):
    """A thread running application code ~3 KiB of frames below an allocator
    frame: the CFI walk refuses it; the stack-top scan alone (walk switched
    off) does not see that frame and would borrow it.  Each stop refused
    after it was made is said at -v's level (INFO), with why and how long."""
    t, a = sp("fakespin")
    if not walk:
        from collectors.engine.choose import Chooser
        monkeypatch.setattr(Chooser, "walk_running", lambda self, th: (None, False))
    fake = _fake_range("fake_allocator_spin", a)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES) + fake,
                       deadline_s=0.5)
    if walk:
        with caplog.at_level(logging.INFO, logger="collectors.engine"):
            with pytest.raises(RemoteCallError, match="called from inside libfakealloc.so"):
                with rp.borrow(tid=a["tid"]):
                    pass
        said = [r.getMessage() for r in caplog.records if r.name == "collectors.engine"]
        tid = a["tid"]
        assert any(m.startswith(f"pid {t.pid} tid {tid} refused after the stop: ") and
                   "libfakealloc.so" in m for m in said), said
        assert any(re.fullmatch(rf"pid {t.pid} tid {tid} refused after the stop: stopped "
                                r"\d+ us, no call made", m) for m in said), said
        assert not any("None" in m for m in said), said
    else:
        with rp.borrow(tid=a["tid"]) as c:
            assert c.category == "running"
    it = stat(t, a, ITERS)
    wait_for(lambda: stat(t, a, ITERS) > it, what="the thread spinning on")
    assert_released(t.pid)


def test_running_thread_just_above_libc_is_borrowed(sp, monkeypatch):
    """A thread spinning in application code right above start_thread: the
    stack-top scan sees return addresses into libc (start_thread's, live,
    and stale ones left by an earlier snprintf), but the CFI walk reaches
    clone3, the thread's first frame by its CFI's own rule, with no
    allocator frame: it is borrowed, running.  Without a walk (switched off)
    the scan refuses it, as it refused every busy Python 3.11 main thread."""
    t, a = sp("shallowspin")
    wait_for(lambda: stat(t, a, ITERS) > 0, what="the thread spinning")
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES), deadline_s=2.0)
    with rp.borrow(tid=a["tid"]) as c:
        assert c.category == "running"
    assert_released(t.pid)
    from collectors.engine.choose import Chooser
    monkeypatch.setattr(Chooser, "walk_running", lambda self, th: (None, False))
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES), deadline_s=0.3)
    with pytest.raises(RemoteCallError, match="return address into libc"):
        with rp.borrow(tid=a["tid"]):
            pass
    it = stat(t, a, ITERS)
    wait_for(lambda: stat(t, a, ITERS) > it, what="the thread spinning on")
    assert_released(t.pid)


@pytest.mark.parametrize("mode,category", [("shallowspin", "running"), ("condwait", "futex")])
def test_a_stop_decodes_no_cfi(sp, monkeypatch, caplog, mode, category):
    """The walk in a stop decodes no FDE: with nothing decoded (no table
    kept in memory or on disk), every FDE is decoded with the target
    running (none of its threads in a tracing stop: pyelftools took most of
    a busy Python's 3-15 ms stops), and the thread is borrowed.  A running
    thread's first stop meets CFI not decoded yet and is refused (its
    frames cannot be known before the stop); a futex wait's deeper frames
    are decoded after such a refusal too, when the look-ahead walk before
    the stop could not reach them."""
    from collectors.binary import diskcache, unwind
    t, a = sp(mode)
    if category == "running":
        wait_for(lambda: stat(t, a, ITERS) > 0, what="the thread spinning")
    else:
        parked(t, a, NR_FUTEX)
        # the look-ahead before the stop decodes none of its frames (as one
        # stopped by a frame based on a register /proc does not show); the
        # objects' CFI indexes are loaded
        from collectors.engine import safepoints
        monkeypatch.setattr(safepoints.StackJudge, "prepare",
                            lambda self, pc, sp: self.load_tables())
    monkeypatch.setenv(diskcache.ENV_DISABLE, "1")
    unwind.clear_cache()
    decoded = []       # per FDE decoded: the target's threads in a tracing stop then

    def traced_stops():
        return [tid for tid in os.listdir(f"/proc/{t.pid}/task")
                if thread_state(t.pid, tid) == "t"]

    real = unwind.CfiTable._decode_rows

    def watched(self, i):
        decoded.append(traced_stops())
        return real(self, i)

    monkeypatch.setattr(unwind.CfiTable, "_decode_rows", watched)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES), deadline_s=2.0)
    with caplog.at_level(logging.INFO, logger="collectors.engine"):
        with rp.borrow(tid=a["tid"]) as c:
            assert c.category == category
    assert decoded, "nothing was decoded: the test proves nothing"
    assert all(stopped == [] for stopped in decoded), decoded
    if category == "running":
        said = [r.getMessage() for r in caplog.records if r.name == "collectors.engine"]
        assert any("running-undecoded" in m and "whose unwind rules no run had decoded" in m
                   for m in said), said
    assert_released(t.pid)


def test_futex_mutex_wait_is_refused(sp):
    t, a = sp("mutex")
    parked(t, a, NR_FUTEX)
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES),
                       deadline_s=0.3)
    with pytest.raises(RemoteCallError, match="futex lock wait"):
        with rp.borrow(tid=a["tid"]):
            pass
    assert rp.stats["rejected_stops"] == 0        # never stopped
    assert_released(t.pid)


def test_jemalloc_background_thread_is_refused():
    """jemalloc's own background thread waits on a condvar inside
    libjemalloc: refused by name, and its stack walk names libjemalloc."""
    with start([sp_bin(), "mutex"], allocator="jemalloc",
               env={"MALLOC_CONF": "background_thread:true"}) as t:
        a = parse_ready(t.ready)
        t_end = time.monotonic() + 3
        bg = []
        while not bg and time.monotonic() < t_end:
            bg = [int(x) for x in os.listdir(f"/proc/{t.pid}/task")
                  if open(f"/proc/{t.pid}/task/{x}/comm").read().strip() == "jemalloc_bg_thd"]
            time.sleep(0.02)
        assert bg, "no jemalloc background thread"
        rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES),
                           deadline_s=0.3)
        with pytest.raises(RemoteCallError) as ei:
            with rp.borrow(tid=bg[0]):
                pass
        assert f"tid {bg[0]} jemalloc_bg_thd: the allocator's own background thread" \
            in str(ei.value)
        # the walk itself (bypassing the name rule) also refuses it
        sj = rp._stack_judge()
        sc = syscall_of(t.pid, bg[0])
        why = sj.prepare(int(sc[-1], 16), int(sc[-2], 16))
        assert why and "libjemalloc" in why.text, why
        assert a["tid"]
        assert_released(t.pid)


# ---------------------------------------------------------------------------
# order and messages

def test_borrowing_order_prefers_restartable_then_epoll(sp):
    """Main thread in read() (restartable) and worker in epoll_wait: main is
    taken first."""
    t, a = sp("epoll_wait")
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
    for _ in range(5):
        parked(t, a, 232)
        parked(t, {"tid": a["main"]}, 0)         # main reads stdin (again)
        with rp.borrow() as c:
            assert c.tid == a["main"] and c.syscall == "read"


def test_order_epoll_before_proven_futex(sp):
    """Main thread in a condvar wait (borrowable after a walk), worker in
    epoll_wait: the epoll thread is taken (its stack walked before the stop
    only: no walk inside it)."""
    t, a = sp("epoll_wait", env={"SP_MAIN": "condwait"})
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
    for _ in range(5):
        parked(t, a, 232)
        parked(t, {"tid": a["main"]}, 202)
        with rp.borrow() as c:
            assert c.tid == a["tid"] and c.category == "epoll"
    with rp.borrow(tid=a["main"]) as c:                  # and main is borrowable
        assert c.category == "futex"
    assert stat(t, a, EINTR) == 0


def test_order_restartable_before_futex(sp):
    """Worker in a condvar wait, main in read(): restartable first."""
    from collectors.binary import unwind
    unwind.clear_cache()
    t, a = sp("condwait")
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES))
    parked(t, {"tid": a["main"]}, 0)             # main reads stdin
    with rp.borrow() as c:
        assert c.tid == a["main"] and c.category == "restartable"
    with rp.borrow(tid=a["tid"]) as c:
        assert c.category == "futex"


def test_refusal_message_says_what_each_thread_does(sp):
    t, a = sp("mutex")
    rp = RemoteProcess(t.pid, forbidden_ranges=text_ranges(t.pid, LIBC_NAMES),
                       deadline_s=0.3)
    with pytest.raises(RemoteCallError) as ei:
        with rp.borrow(tid=a["tid"]):
            pass
    msg = str(ei.value)
    assert f"tid {a['tid']} futex lock wait" in msg
    assert "busy inside the allocator" not in msg
    assert ei.value.exit_code == 6


def test_unsupported_architecture_is_a_clean_error():
    with pytest.raises(Unsupported, match="unsupported architecture aarch64"):
        remote._load_arch("aarch64")


def test_registry_reset():
    remote.REGISTRY.quarantine[(1, 2)] = "x"
    remote.REGISTRY.reset()
    assert remote._quarantine == {}
    assert remote._quarantine is remote.REGISTRY.quarantine


def test_a_running_threads_judge_has_the_c_librarys_ranges_before_the_stop():
    """load_tables, called before a running thread is stopped, also loads the
    C library's function ranges that allocator_frame asks of every frame:
    loaded in the stop, they were ~2 ms of a busy Python's stop."""
    from collectors.engine import safepoints
    with open("/proc/self/maps", "rb") as f:
        maps = f.read()
    judge = safepoints.StackJudge(os.getpid(), maps, forbidden=(), read=lambda addr, n: None)
    assert not judge._libc_done
    judge.load_tables()
    assert judge._libc_done and judge._libc is not None
    path, _waits, malloc, _named = judge._libc
    assert os.path.basename(path).startswith("libc.so")
    from collectors.binary import elf
    libc = next(m for m in judge.unwinder._maps if m.path == path)
    st_value = elf.CACHE.get(libc.opener).dynamic("malloc").st_value
    assert malloc(judge.unwinder._bias(libc) + st_value) == "malloc"
