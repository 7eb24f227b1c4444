"""The rehearsal before each stop (collectors/engine/rehearsal.py): the
engine's own understudy process is stopped, called and restored with the
same code just before the target's thread is, so the target's stop runs on
warm caches (bench/pause.py --snapshots shows the gain).  Here: that it
happens, that it never touches the target, that it leaves the understudy as
it was, that it ends with allocdiag, and that without it stops still work."""

import itertools
import os
import signal
import subprocess
import sys
import time

import pytest

from targets import build_c, start

from collectors.engine import rehearsal
from collectors.engine.remote import RemoteProcess
from collectors.engine.tracee import Tracer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def asleep_untraced(pid, within_s=1.0):
    """/proc/PID/status once it shows PID sleeping and untraced: a detached
    understudy runs a moment before it blocks in its read(2) again."""
    deadline = time.monotonic() + within_s
    while True:
        st = status(pid)
        if (st["TracerPid"] == "0" and st["State"].startswith("S")) or time.monotonic() > deadline:
            return st
        time.sleep(0.005)


def syscall_line(pid):
    with open(f"/proc/{pid}/syscall") as f:
        return f.read().split()


@pytest.fixture(autouse=True)
def fresh_understudy(monkeypatch):
    monkeypatch.delenv(rehearsal.ENV_OFF, raising=False)
    monkeypatch.delenv(rehearsal.ENV_NO_WARM_UP, raising=False)
    # a CPU is free (on a busy CI box it may not be; that case has its test)
    monkeypatch.setattr(Tracer, "free_cpu", lambda self: True)
    rehearsal.reset()
    yield
    rehearsal.reset()


@pytest.fixture
def idle():
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        yield t


def test_each_stop_is_rehearsed_on_the_understudy_which_is_left_as_it_was(idle):
    rp = RemoteProcess(idle.pid)
    pid = rehearsal.understudy_pid()
    assert pid is not None and pid != idle.pid
    # a child of allocdiag's, never of the target's
    assert int(status(pid)["PPid"]) == os.getpid()
    for _ in range(5):
        with rp.borrow() as c:
            assert c.tid != pid
            assert status(pid)["TracerPid"] == "0"   # rehearsed and released before the stop
    assert rehearsal.rehearsals() == 5 and rehearsal.broken() is None
    # the real stops' figures hold the target's stops only
    assert rp.stats["borrows"] == 5 and len(rp.pause_us) == 1
    st = asleep_untraced(pid)
    assert st["TracerPid"] == "0" and st["State"].startswith("S")
    assert syscall_line(pid)[0] == "0"               # back in its read(2)
    # cat reads to end-of-file and exits 0: the rehearsals disturbed nothing
    assert rehearsal.reset() == 0


def test_a_process_warms_up_on_the_understudy_before_its_first_stop_only(idle):
    """Ten whole borrows of the understudy (RemoteProcess.borrow, the judge,
    scratch, a call, a buffer read back) before this process's first stop,
    none before the later ones; the target is never borrowed for it, and
    the understudy is left as it was."""
    rp = RemoteProcess(idle.pid)
    with rp.borrow():
        assert rehearsal.warm_up_borrows() == rehearsal.WARM_UP_BORROWS
    pid = rehearsal.understudy_pid()
    for _ in range(3):
        with rp.borrow():
            pass
    assert rehearsal.warm_up_borrows() == rehearsal.WARM_UP_BORROWS
    assert rp.stats["borrows"] == 4               # the target's own stops only
    st = asleep_untraced(pid)
    assert st["TracerPid"] == "0" and st["State"].startswith("S")
    assert rehearsal.reset() == 0


@pytest.mark.parametrize("why", ["no free cpu", "switched off"])
def test_no_warm_up_without_a_free_cpu_or_when_switched_off(idle, monkeypatch, why):
    if why == "no free cpu":
        monkeypatch.setattr(Tracer, "free_cpu", lambda self: False)
    else:
        monkeypatch.setenv(rehearsal.ENV_NO_WARM_UP, "1")
    with RemoteProcess(idle.pid).borrow():
        pass
    assert rehearsal.warm_up_borrows() == 0


def test_no_rehearsal_when_no_cpu_is_free(idle, monkeypatch):
    # on a saturated host allocdiag's own CPU is what the host pays: the
    # stop then goes unrehearsed (and SCHED_FIFO shortens it instead), and
    # the answer the rehearsal got is the stop's: /proc/loadavg is asked
    # once a stop, not again after the rehearsal declined
    asked = []
    monkeypatch.setattr(Tracer, "free_cpu", lambda self: asked.append(1) is not None)
    rp = RemoteProcess(idle.pid)
    for _ in range(3):
        with rp.borrow():
            assert rp._tracer.cpu_free is False
    assert rp.stats["borrows"] == 3
    assert rehearsal.rehearsals() == 0 and rehearsal.broken() is None
    assert len(asked) == 3


def test_a_rehearsed_stop_keeps_the_free_cpu_the_rehearsal_saw(idle, monkeypatch):
    # Read after the rehearsal, /proc/loadavg counts the understudy on its
    # way back into read(2) as runnable (1 running before, 2 after, seen in
    # every new CLI run): the stop must keep the answer read with the
    # understudy blocked, not boost the target with SCHED_FIFO.
    from collectors.engine import remote
    # (the warm-up's own borrows of the understudy ask too: False)
    answers = itertools.chain([True], itertools.repeat(False))
    monkeypatch.setattr(Tracer, "free_cpu", lambda self: next(answers))
    boosted = []
    monkeypatch.setattr(remote, "boost", lambda tid: boosted.append(tid))
    rp = RemoteProcess(idle.pid)
    with rp.borrow():
        assert rp._tracer.cpu_free is True
    assert rehearsal.rehearsals() == 1 and boosted == []


def test_without_rehearsals_stops_still_work(idle, monkeypatch):
    monkeypatch.setenv(rehearsal.ENV_OFF, "1")
    rp = RemoteProcess(idle.pid)
    with rp.borrow():
        pass
    assert rehearsal.understudy_pid() is None and rehearsal.rehearsals() == 0


def test_a_missing_understudy_program_turns_rehearsals_off_not_the_stop(idle, monkeypatch):
    monkeypatch.setattr(rehearsal, "PROGRAM", "no-such-program-allocdiag")
    rp = RemoteProcess(idle.pid)
    with rp.borrow():
        pass
    assert rehearsal.understudy_pid() is None
    assert "No such file" in rehearsal.broken() and rehearsal.PROGRAM in rehearsal.broken()


@pytest.mark.parametrize("after", [0, 2])
def test_a_killed_understudy_turns_rehearsals_off_not_the_stop(idle, after):
    rp = RemoteProcess(idle.pid)
    for _ in range(after):
        with rp.borrow():
            pass
    os.kill(rehearsal.understudy_pid(), signal.SIGKILL)
    for _ in range(3):
        with rp.borrow():
            pass
    assert rp.stats["borrows"] == after + 3
    assert rehearsal.broken() is not None and rehearsal.rehearsals() == after


@pytest.mark.parametrize("how", ["exit", "SIGKILL"])
def test_the_understudy_ends_with_allocdiag(idle, how):
    code = (
        "import os, signal, sys\n"
        "from collectors.engine import rehearsal\n"
        "from collectors.engine.remote import RemoteProcess\n"
        f"rp = RemoteProcess({idle.pid})\n"
        "with rp.borrow(): pass\n"
        "print(rehearsal.understudy_pid(), flush=True)\n"
        + ("os.kill(os.getpid(), signal.SIGKILL)\n" if how == "SIGKILL" else "sys.exit(0)\n"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
    pid = int(r.stdout.split()[0])
    # the pipe's writer is gone: cat reads end-of-file and exits (reparented
    # and reaped by init, or a zombie of a dead parent for a moment)
    t_end = time.monotonic() + 5
    while time.monotonic() < t_end:
        try:
            if status(pid)["State"].startswith("Z"):
                break
        except FileNotFoundError:
            break
        time.sleep(0.01)
    else:
        pytest.fail(f"understudy {pid} outlived allocdiag ({how})")
