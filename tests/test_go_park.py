"""The Go runtime park rule (collectors.engine.safepoints.GoRuntime): in a cgo
binary the Ms the Go runtime parks in its own stubs (runtime.futex notes,
sysmon's timed note) on glibc thread stacks are borrowed; a park on a
goroutine stack, on the main [stack], or in a stripped binary is not."""

import os
import shutil
import subprocess
import time

import pytest

import deps
from collectors.binary import image as process_image
from collectors.engine import remote
from collectors.engine import safepoints
from collectors.engine import stackbounds
from diag.model.errors import RemoteCallError
from collectors.proc.maps import parse_maps
from diag import snapshot
from targets import BUILD_DIR, build_go, start

pytestmark = pytest.mark.needs_go

MiB = 1 << 20
NR_futex = safepoints.NR_futex


def _threads(pid):
    """{tid: (nr, args, sp, pc)} of PID's threads blocked in a syscall."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall", "rb") as f:
                sc = f.read().split()
        except OSError:
            continue
        if len(sc) >= 9 and sc[0] != b"running":
            out[int(tid)] = (int(sc[0]), tuple(int(x, 16) for x in sc[1:7]),
                             int(sc[7], 16), int(sc[8], 16))
    return out


def _wait_for_thread(pid, pred, timeout=5.0, only=None, with_facts=False):
    """The first tid (ONLY, if given) whose (nr, args, sp, pc) satisfies
    PRED, within TIMEOUT; with WITH_FACTS, (tid, those facts) as read then
    (a second read may find the thread running again)."""
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        for tid, facts in sorted(_threads(pid).items()):
            if only in (None, tid) and pred(facts):
                return (tid, facts) if with_facts else tid
        time.sleep(0.05)
    raise AssertionError(f"no such thread in {pid}: {_threads(pid)}")


def _settled(pid):
    """Wait until sysmon has gone from its short runtime.usleep sleeps (a
    nanosleep, which the general restartable rule accepts anywhere) to its
    idle timed note and the threads' waits stay the same for 0.3 s: then
    every M waits in runtime.futex."""
    t_end = time.monotonic() + 10
    last = None
    while True:
        now = {t: f[:2] for t, f in _threads(pid).items()}
        quiet = any(nr == NR_futex and args[3] for nr, args in now.values()) and \
            not any(nr == safepoints.NR_nanosleep for nr, _ in now.values())
        if quiet and now == last:
            return
        assert time.monotonic() < t_end, now
        last = now if quiet else None
        time.sleep(0.3)


def _stack_kind(pid, sp):
    with open(f"/proc/{pid}/maps", "rb") as f:
        maps = stackbounds.StackMaps(parse_maps(f.read()))
    bounds, _ = maps.bounds(sp)
    return bounds.kind if bounds else None


def _go_rp(pid, **kw):
    img = process_image.ProcessImage(pid)
    return remote.RemoteProcess(pid, go_runtime=safepoints.GoRuntime.of(img.exe), **kw)


def _echo(t, word):
    t.proc.stdin.write(word.encode() + b"\n")
    t.proc.stdin.flush()
    return t.proc.stdout.readline().decode().strip()


@pytest.mark.parametrize("allocator", ["glibc", "jemalloc"])
def test_ten_separate_snapshots_borrow_go_runtime_parks(allocator):
    exe = build_go("gocgo", cgo=True)
    with start([exe], allocator=allocator) as t:
        _settled(t.pid)
        borrowed = []
        for _ in range(10):
            snap, col = snapshot.take(t.pid)
            assert col.status["remote"].ok, col.status["remote"].error
            assert snap.stats["allocated"].value >= 4 * MiB
            borrowed.append(snap.native["borrowed_thread"])
        # only the runtime's parks can be borrowed here: every M is in
        # runtime.futex, the main goroutine reads on a goroutine stack
        assert all("Go runtime" in b["syscall"] for b in borrowed), borrowed
        assert _echo(t, "still-here") == "ECHO still-here"
        t.proc.stdin.close()
        assert t.proc.wait(timeout=10) == 0


def test_timed_note_sleep_resumed_by_restart_syscall_is_borrowed_again():
    """sysmon's timed note (futex with a timeout) restarts through
    restart_syscall after a stop; the next borrow judges it by its stub."""
    exe = build_go("gocgo", cgo=True)
    with start([exe]) as t:
        _settled(t.pid)
        sysmon = _wait_for_thread(t.pid, lambda f: f[0] == NR_futex and f[1][3] != 0
                                  and _stack_kind(t.pid, f[2]) == "thread")
        seen = []
        for _ in range(3):
            rp = _go_rp(t.pid)
            with rp.borrow(sysmon) as c:
                seen.append((c.category, c.syscall))
        # right after the release the thread may still be on its way back
        # into the kernel ("running" in its syscall file): wait for it
        nr = _wait_for_thread(t.pid, lambda f: True, only=sysmon, with_facts=True)[1][0]
        assert _echo(t, "x") == "ECHO x"
    assert all(cat == safepoints.GO_RUNTIME for cat, _ in seen), seen
    assert seen[0][1] == "Go runtime note sleep in runtime.futex"
    assert "resumed by restart_syscall" in seen[-1][1], seen
    assert nr == remote._load_arch().RESTART_SYSCALL


def test_note_sleep_on_a_goroutine_stack_is_refused():
    """os/signal's receiver parks in runtime.futex (notetsleepg) on its
    goroutine stack, in the Go heap: the stub matches, the stack is not
    provably the thread's own, so it is never borrowed."""
    exe = build_go("gocgo", cgo=True)
    with start([exe, "signal"]) as t:
        tid = _wait_for_thread(t.pid, lambda f: f[0] == NR_futex and f[1][2] == 0
                               and _stack_kind(t.pid, f[2]) is None)
        rp = _go_rp(t.pid, deadline_s=0.3)
        with pytest.raises(RemoteCallError) as e:
            with rp.borrow(tid):
                pass
        assert _echo(t, "y") == "ECHO y"
    msg = str(e.value)
    assert f"tid {tid} Go runtime note sleep in runtime.futex: no guard page below" in msg, msg


def test_note_sleep_on_the_main_stack_is_refused():
    """The main thread (m0) parked by the Go runtime waits on the process's
    [stack], not on a thread stack glibc created: the rule does not apply."""
    exe = build_go("gocgo", cgo=True)
    with start([exe, "locked"]) as t:
        _wait_for_thread(t.pid, lambda f: f[0] == NR_futex and _stack_kind(t.pid, f[2]) == "main")
        rp = _go_rp(t.pid, deadline_s=0.3)
        with pytest.raises(RemoteCallError) as e:
            with rp.borrow(t.pid):
                pass
        assert _echo(t, "z") == "ECHO z"
        t.proc.stdin.close()
        assert t.proc.wait(timeout=10) == 0
    assert "Go runtime note sleep in runtime.futex: its stack is the main stack, not a " \
           "thread stack glibc created" in str(e.value), str(e.value)


def test_stripped_go_binary_is_refused_saying_why():
    deps.need("strip")
    exe = build_go("gocgo", cgo=True)
    stripped = os.path.join(BUILD_DIR, os.path.basename(exe) + "-stripped")
    if not os.path.exists(stripped):
        shutil.copy(exe, stripped + ".tmp")
        subprocess.run(["strip", stripped + ".tmp"], check=True)
        os.replace(stripped + ".tmp", stripped)
    with start([stripped]) as t:
        _settled(t.pid)
        snap, col = snapshot.take(t.pid)
    err = col.status["remote"].error or ""
    assert not col.status["remote"].ok
    assert "is a stripped Go binary (no .symtab), so where the Go runtime's syscall " \
           "stubs lie is not provable" in err, err


def test_judgement_of_a_parked_m_on_the_real_binary():
    """GoRuntime.judge on a real M's futex state (from /proc/PID/task/TID/
    syscall) with the built binary's own .symtab: the note sleep (value 0)
    is the runtime's own park; the same stub waiting with value 2 (lock2's
    mutex_sleeping, runtime/lock_futex.go) or another value (the spin-bit
    mutex's waitsema, lock_spinbit.go) is runtime lock contention; a PC
    outside the stubs is not for this rule to judge."""
    exe = build_go("gocgo", cgo=True)
    with start([exe]) as t:
        tid, (nr, args, _sp, pc) = _wait_for_thread(
            t.pid, lambda f: f[0] == NR_futex and f[1][2] == 0
            and _stack_kind(t.pid, f[2]) == "thread", with_facts=True)
        go = safepoints.GoRuntime.of(process_image.ProcessImage(t.pid).exe)
    restart = remote._load_arch().RESTART_SYSCALL
    assert go.why is None and go.stubs(pc) == "runtime.futex"
    assert go.judge(nr, args, pc, restart) == (safepoints.GO_RUNTIME,
                                               "Go runtime note sleep in runtime.futex")
    for value in (2, 0xFFFFFFFF):
        cat, why = go.judge(nr, args[:2] + (value,) + args[3:], pc, restart)
        assert cat is None and "runtime mutex contention" in why, why
    assert go.judge(nr, args, 0x1000, restart) == (None, None)
