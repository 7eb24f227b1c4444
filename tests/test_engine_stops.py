"""The one stop decoder (collectors.engine.tracee): waitpid statuses of a
real traced child become the right typed stops."""

import os
import signal
import subprocess
import time

import pytest

from collectors.engine import arch, ptrace, tracee
from collectors.engine.tracee import StopKind, WaitKind


def _status(pid, timeout=3.0):
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        st = ptrace.waitpid_nohang(pid, pid)
        if st is not None:
            return st
        time.sleep(0.001)
    raise AssertionError("no stop")


@pytest.fixture
def child():
    p = subprocess.Popen(["sleep", "30"])
    try:
        yield p.pid
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=5) if p.returncode is None else None


def test_decoder_on_a_real_child(child):
    a = arch.load()
    pid = child
    ptrace.seize(pid, pid)
    ptrace.interrupt(pid, pid)
    st = _status(pid)
    assert tracee.decode_status(st).kind is WaitKind.STOPPED
    assert tracee.decode_status(st).event == 128              # PTRACE_EVENT_STOP
    assert tracee.classify_stop(st, pid, pid, a).kind is StopKind.INTERRUPT

    ptrace.cont(pid, pid, 0)
    os.kill(pid, signal.SIGUSR1)
    stop = tracee.classify_stop(_status(pid), pid, pid, a)
    assert stop.kind is StopKind.SIGNAL
    assert stop.si.signo == signal.SIGUSR1 and stop.si.pid == os.getpid()

    ptrace.cont(pid, pid, 0)                  # suppress it
    os.kill(pid, signal.SIGSTOP)
    stop = tracee.classify_stop(_status(pid), pid, pid, a)
    assert stop.kind is StopKind.SIGNAL and stop.si.signo == signal.SIGSTOP
    ptrace.cont(pid, pid, signal.SIGSTOP)     # deliver it: a group-stop follows
    stop = tracee.classify_stop(_status(pid), pid, pid, a)
    assert stop.kind is StopKind.GROUP and stop.sig == signal.SIGSTOP

    os.kill(pid, signal.SIGKILL)
    st = _status(pid)
    assert tracee.decode_status(st) == tracee.WaitStatus(WaitKind.KILLED, signal.SIGKILL)
    assert tracee.classify_stop(st, pid, pid, a).kind is StopKind.EXITED


def test_fault_is_told_from_the_return_trap(child):
    """A SIGSEGV the thread raised at a non-zero pc is a FAULT (a crash),
    the one at pc 0 after a call returned is the RETURN_TRAP."""
    a = arch.load()
    pid = child
    ptrace.seize(pid, pid)
    ptrace.interrupt(pid, pid)
    _status(pid)
    regs = a.get_regs(pid, pid)
    new = a.copy_regs(regs)
    new.rip = 0                       # "return" to 0: the engine's trap
    new.orig_rax = (1 << 64) - 1      # no syscall restart (it would move rip back 2)
    a.set_regs(pid, pid, new)
    ptrace.cont(pid, pid, 0)
    stop = tracee.classify_stop(_status(pid), pid, pid, a)
    assert stop.kind is StopKind.RETURN_TRAP
    new.rip = 8                       # not mapped either, but not the trap
    a.set_regs(pid, pid, new)
    ptrace.cont(pid, pid, 0)
    stop = tracee.classify_stop(_status(pid), pid, pid, a)
    assert stop.kind is StopKind.FAULT and stop.si.signo == signal.SIGSEGV
