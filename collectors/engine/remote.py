"""Remote calls: run a function inside a live process on one borrowed thread.

Pure Python over ctypes (``collectors.engine.tracee``); the register/call-frame
details live in the arch module picked by ``platform.machine()``
(``collectors.engine.arch_x86_64``).  DESIGN.md "Remote calls: rules that keep
production safe" is the contract; every rule has a test in
``tests/test_remote_engine.py``.

Public API
----------
``RemoteProcess(pid, *, forbidden_ranges=(), deadline_s=2.0, procfs="/proc",
call_timeout_s=1.0, block_signals=True)``
    A target process.  Raises NoSuchProcess / AccessDenied / RemoteCallError
    early (gone, not readable, ignores SIGSEGV, address 0 mapped).
    ``forbidden_ranges``: ``[(start, end, name)]`` of allocator + libc (+ ld.so)
    text, e.g. from ``text_ranges()``; a *running* thread whose PC points into
    them, or whose CFI walk finds an allocator frame, is never borrowed, nor,
    unless that walk reached the thread's first frame by the CFI's own rule,
    one with any word in the top ``stack_window`` bytes of its stack pointing
    into them.  Without ranges only threads parked in an idle wait are used.

``RemoteProcess.borrow(tid=None)`` (context manager) -> ``Call``
    Picks a safe thread (or only TID), stops only it (PTRACE_SEIZE +
    PTRACE_INTERRUPT), saves registers + XSAVE state + signal mask, yields a
    ``Call``; on exit restores all of it exactly, re-delivers held signals
    with their original siginfo and detaches.  Gives up with RemoteCallError
    after ``deadline_s`` with, per thread, what it was doing and why it was
    refused ("tid 812 futex lock wait (mutex contention)", "tid 9
    jemalloc_bg_thd: the allocator's own background thread").
    SIGINT/TERM/HUP/QUIT to this process are blocked while a
    thread is stopped and take effect after the detach.
    After it: ``.pause_us`` (µs each stopped thread was stopped, from the
    PTRACE_INTERRUPT to the detach, rejected candidates included),
    ``.held_signals`` (signals that arrived during the window and were
    re-delivered), ``.skipped_syscalls`` (syscalls of the calls that the
    thread's seccomp filter would have answered by killing it, a SIGSYS or
    a supervisor: skipped, they returned ENOSYS), ``.last`` (dict: tid, kind, syscall,
    category, restarted_eintr -- the wait was given back as -ERESTARTNOHAND --,
    boundary, calls).

``Call.call(func_addr, *args, timeout_s=None) -> int``   the function's return value (rax)
``Call.read(addr, n) -> bytes`` / ``Call.write(addr, data)``   target memory
``Call.scratch(n) -> int``   n bytes on the borrowed thread's stack below the red zone
    (small: names and out-values, at most ``MAX_SCRATCH`` bytes in all)
``Call.buffer(n) -> int``   n bytes for an output buffer, starting with a NUL: an
    anonymous mapping the borrowed thread makes with libc ``mmap`` (unmapped
    before it is released), or its stack when the measured room holds it
``Call.cstring(addr, limit=1<<20) -> bytes``   NUL-terminated string
``Call.tid``, ``Call.kind`` ("idle" or "running"), ``Call.syscall`` (wait name or None),
``Call.category`` ("restartable", "epoll", "futex", "go-runtime" or "running")

A borrow must run start to end in one OS thread (ptrace requests are only
accepted from the tracing thread); different borrows may use different threads.

``is_quarantined(pid) -> bool`` / ``quarantine_reason(pid) -> str | None``
    After any call timeout or crash the process (pid + start time) is
    quarantined for the rest of this run: every later borrow raises
    Quarantined, because its allocator may now hold a lock forever.

``text_ranges(pid, names, procfs="/proc") -> [(start, end, name)]``
    Executable mappings whose file name contains one of NAMES (helper to build
    ``forbidden_ranges``).

The safety rules this engine implements are listed in the package docstring
(``collectors.engine``); the parts: ``tracee`` (attach/stop/detach, the stop
decoder), ``choose`` + ``safepoints`` (which thread, reason codes),
``callframe`` (one call, the release), ``memory``, ``ptrace`` (syscalls),
``abi`` (kernel numbers), ``arch_x86_64``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from collectors import lazylog
from diag.model.records import asdict
from collectors import giveway
from collectors.engine import abi, arch, ptrace, rehearsal, safepoints
from collectors.engine.callframe import MAX_SCRATCH, Call, Caller, Stats
from collectors.engine.choose import BACK_ASLEEP_MIN_LEFT_S, FRAME_BUDGET, NS_PER_S, Chooser
from collectors.engine.memory import MemoryReader
from collectors.engine.safepoints import Reason, Refusal, refusal
from collectors.engine.tracee import (REGISTRY, STOPPED_MSG, Registry, SigInfo, Skip, Stop,
                                      Thread, Tracer, boost, detach_orphans,
                                      is_quarantined, quarantine_reason, read_bytes,
                                      reap_orphans, unboost_thread,
                                      unboost_tracer)
from collectors.proc.maps import parse_maps
from collectors.proc.stat import start_time
from diag.model.errors import NoSuchProcess, RemoteCallError

__all__ = ["RemoteProcess", "Call", "is_quarantined", "quarantine_reason",
           "detach_orphans", "text_ranges", "DEFAULT_STACK_NEED", "MAX_SCRATCH"]

log = lazylog.getLogger("collectors.engine")

# The callee's own stack need when the caller declares none (calls whose
# need was not measured: keep the engine's historical 16 KiB head-room).
DEFAULT_STACK_NEED = 16 * 1024
# Bytes at the top of a running thread's stack scanned for return addresses
# into forbidden text.
STACK_WINDOW = 2048
TIMERSLACK_NS = 1000        # the tracer's sleeps while it waits (ptrace.set_timerslack_ns)

# names kept for callers and tests
_load_arch = arch.load
_quarantine = REGISTRY.quarantine
__all__ += ["Registry", "REGISTRY", "SigInfo", "Stop", "FRAME_BUDGET", "Reason", "Refusal",
            "MemoryReader"]


def text_ranges(pid: int, names: Iterable[str], procfs: str = "/proc"
                ) -> list[tuple[int, int, str]]:
    """Executable mappings of PID whose file name contains any of NAMES,
    as [(start, end, name)], adjacent pieces merged."""
    out: list[tuple[int, int, str]] = []
    for m in parse_maps(read_bytes(f"{procfs}/{pid}/maps", pid)):
        if "x" not in m.perms or not m.path:
            continue
        base = os.path.basename(m.path)
        if not any(n in base for n in names):
            continue
        if out and out[-1][1] == m.start and out[-1][2] == base:
            out[-1] = (out[-1][0], m.end, base)
        else:
            out.append((m.start, m.end, base))
    return out


class RemoteProcess:
    """See the module docstring."""

    MAX_SCRATCH = MAX_SCRATCH
    STACK_BUFFER_SPARE = Caller.STACK_BUFFER_SPARE
    SPIN_S = Tracer.SPIN_S
    SPIN_FREE_CPU_S = Tracer.SPIN_FREE_CPU_S
    # Rounds after which a process whose threads are all parked, and whose
    # safe points all lack stack room, is refused (_acquire).
    PARKED_ROUNDS = 5
    # What one borrow may cost the target in stops of running threads that
    # were refused (found inside the allocator or libc: no call made).  A
    # busy thread in a malloc loop is found there almost every time: measured
    # on the slow guest, a mimalloc burst was stopped 238 times in 1.8 s for
    # 118 ms before its thread slept.  Past this budget a running thread is
    # stopped at most once every RUNNING_STOPS_PACE_S in this borrow (waiting
    # threads as before): a single-threaded server under full load is never
    # in a wait long enough to be borrowed there, and is borrowed only when a
    # stop finds it in its own code (a hard stop at the budget refused every
    # snapshot of one in the soak test).
    RUNNING_STOPS_BUDGET_US = 20_000
    RUNNING_STOPS_PACE_S = 0.1

    def __init__(self, pid: int, *, forbidden_ranges: Iterable[tuple[int, int, str]] = (),
                 deadline_s: float = 2.0, procfs: str = "/proc", call_timeout_s: float = 1.0,
                 block_signals: bool = True, boost: bool = True,
                 stack_window: int = STACK_WINDOW,
                 stack_need: int = DEFAULT_STACK_NEED,
                 mapper: Sequence[int | None] | None = None,
                 go_runtime: safepoints.GoRuntime | None = None,
                 undelimited: Iterable[str] = (),
                 _unsafe: Iterable[str] = ()) -> None:
        self.pid = int(pid)
        self.procfs = procfs
        self.arch = arch.load()
        self.deadline_s = float(deadline_s)
        self.boost = bool(boost)
        # Test-only switches that disable one protection, to show the tests
        # catch its absence: "xstate", "sigsegv_unblock", "sigblock".
        self._unsafe = frozenset(_unsafe)
        self.last: dict[str, Any] | None = None
        self._stats = Stats()
        if not ptrace.process_exists(self.pid, procfs):
            raise NoSuchProcess(self.pid)
        self._tracer = Tracer(self.pid, procfs, self.arch, start_time(self.pid, procfs),
                              self._read_auxv)
        rs = sorted((int(s), int(e), str(n)) for s, e, n in forbidden_ranges)
        self._chooser = Chooser(self._tracer, rs, int(stack_need), int(stack_window),
                                go_runtime, frozenset(undelimited))
        self._caller = Caller(self._tracer, call_timeout_s=float(call_timeout_s),
                              block_signals=bool(block_signals), mapper=mapper,
                              unsafe=self._unsafe, stats=self._stats)
        first = read_bytes(f"{procfs}/{self.pid}/maps", self.pid).split(b"\n", 1)[0]
        if any(m.start == 0 for m in parse_maps(first)):
            raise RemoteCallError("address 0 is mapped in the target, so the "
                                  "return-to-0 trap cannot work; no remote calls",
                                  pid=self.pid)
        self._preflight()
        rehearsal.prepare(self.arch)

    # ---- what callers read ------------------------------------------------------
    @property
    def pause_us(self) -> list[int]:
        """µs each stopped thread of the last borrow was stopped."""
        return self._caller.record.pause_us

    @property
    def held_signals(self) -> list[dict[str, object]]:
        return self._caller.record.held_signals

    @property
    def skipped_syscalls(self) -> list[dict[str, object]]:
        """The last borrow's syscalls a seccomp filter would not have let
        run harmlessly, skipped (callframe.Caller.syscall_stop)."""
        return self._caller.record.skipped_syscalls

    @property
    def stats(self) -> dict[str, int]:
        return asdict(self._stats)

    @property
    def stack_need(self) -> int:
        return self._chooser.stack_need

    def stack_pointers(self, maps: bytes) -> list[int] | None:
        """The threads' stack pointers its last look at every thread found,
        when MAPS is the /proc/PID/maps it read then (Chooser.stack_pointers)."""
        return self._chooser.stack_pointers(maps)

    @property
    def mapper(self) -> Sequence[int | None] | None:
        return self._caller.mapper

    @mapper.setter
    def mapper(self, value: Sequence[int | None] | None) -> None:
        self._caller.mapper = value

    # kept for tests: the stack judge and the spin budget
    @property
    def _judge_stack(self) -> safepoints.StackJudge | None:
        return self._chooser.judge_stack

    def _stack_judge(self) -> safepoints.StackJudge:
        return self._chooser.stack_judge()

    def _spin_budget(self) -> float:
        return self._tracer.spin_budget()

    # ---- checks that need no stop -------------------------------------------
    def _read_auxv(self) -> bytes:
        return read_bytes(f"{self.procfs}/{self.pid}/auxv", self.pid)

    def _preflight(self) -> None:
        self._tracer.preflight()

    # ---- signal blocking in allocdiag -----------------------------------------
    def _block(self) -> set[int | signal.Signals] | None:
        if "sigblock" in self._unsafe:
            return None
        return signal.pthread_sigmask(signal.SIG_BLOCK, abi.DEFERRED_SIGNALS)

    @staticmethod
    def _unblock(old: set[int | signal.Signals] | None) -> None:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    # ---- acquiring a thread ---------------------------------------------------
    def _acquire(self, only_tid: int | None
                 ) -> tuple[Thread, set[int | signal.Signals] | None, object]:
        """The stopped thread at a safe point, allocdiag's old sigmask, and
        what choosing it built (the round's facts and refusals: one object
        per thread), for the caller to drop after the release.  Dropped at
        this method's return, it was freed inside the stop: 80-240 us of a
        216-thread varnishd's ~950 us stop went to freeing it."""
        ch = self._chooser
        t_end = time.monotonic() + self.deadline_s
        last_why: dict[int, Refusal] = {}
        rounds = parked_rounds = 0
        fresh_maps = False
        running_refused = running_refused_us = 0     # this borrow's stops for nothing
        next_running_stop = 0.0                       # past the budget: paced
        stopped_why: dict[int, Refusal] = {}          # running threads' refusals after a stop
        while True:
            rounds += 1
            rnd = ch.candidates(only_tid)
            last_why.update(rnd.refused)
            if not rnd.candidates and ch.parked and \
                    any(r.code is Reason.NO_ROOM for r in rnd.refused.values()):
                # Every thread is parked and the safe points among them have
                # too little stack: nothing changes before the program acts,
                # so a few rounds decide it (no 2 s wait for the same answer).
                parked_rounds += 1
                if parked_rounds >= self.PARKED_ROUNDS:
                    raise RemoteCallError(self._refusal(last_why, only_tid), pid=self.pid)
            else:
                parked_rounds = 0
            for c in rnd.candidates:
                if c.category == safepoints.RUNNING and \
                        running_refused_us >= self.RUNNING_STOPS_BUDGET_US and \
                        time.monotonic() < next_running_stop:
                    # it runs now: why it was refused when last stopped, not an
                    # older round's reason (a moment in D state is "not busy")
                    last_why[c.tid] = stopped_why.get(c.tid) or \
                        refusal(Reason.RUNNING_NOT_STOPPED)
                    continue
                # between reading the threads, preparing one and stopping
                # it (collectors.giveway): none of the target's is stopped
                giveway.give_way()
                t0 = time.monotonic()
                worked, pre = ch.prepare(c, fresh_maps)
                fresh_maps = fresh_maps or worked
                t_end += time.monotonic() - t0     # parsing, decoding: not waiting time
                if pre is not None:
                    last_why[c.tid] = pre
                    log.debug("pid %d tid %d refused before the stop: %s", self.pid, c.tid,
                              pre.code.value)
                    continue
                giveway.give_way()
                # the same requests and code on allocdiag's own understudy
                # just before the stop, so it runs on warm caches (and, before
                # this process's first stop, the whole borrow path ten times)
                rehearsed = rehearsal.rehearse(self.arch, self._tracer.free_cpu,
                                               understudy_process)
                if not ch.still_asleep(c):
                    # an epoll waiter that ran meanwhile: when it went to
                    # sleep is no longer known; the next round reads it again
                    continue
                # Whether a CPU is free: the answer the rehearsal read a moment
                # ago with the understudy blocked, whether it then ran or not
                # (read again now, the understudy on its way back into read(2)
                # counts as runnable: /proc/loadavg said 1 running before and 2
                # after in 10 of 10 new CLI runs, and every rehearsed stop
                # boosted the target); when it was not asked, read now (at the
                # borrow's start a just-started understudy was still runnable).
                self._tracer.spin_s = self._tracer.spin_budget(rehearsed)
                old = self._block()
                th = None
                try:
                    th = self._tracer.stop(c.tid, "running" if c.category == safepoints.RUNNING
                                           else "idle", self.deadline_s)
                    th.verdict.since = c.facts.since
                    th.seccomp_filter = c.tid in ch.filtered
                    reason = ch.judge(th)
                except Skip as s:
                    self._unblock(old)
                    last_why[c.tid] = s.why
                    log.debug("pid %d tid %d skipped: %s (%s)", self.pid, c.tid,
                              s.why.code.value, s.why.text)
                    continue
                except BaseException:
                    if th is not None and not th.gone:
                        with contextlib.suppress(Exception):
                            self._caller.release(th)
                    self._unblock(old)
                    raise
                if reason is None:
                    ch.chosen(c)
                    last_why.pop(c.tid, None)
                    log.debug("pid %d tid %d chosen: %s %s, room %s", self.pid, c.tid,
                              th.verdict.category, th.verdict.syscall, c.facts.room)
                    return th, old, (rnd, last_why, stopped_why)
                last_why[c.tid] = reason
                # a stop the target paid for without a call: -v says why
                log.info("pid %d tid %d refused after the stop: %s (%s)", self.pid, c.tid,
                         reason.code.value, reason.text)
                self._stats.rejected_stops += 1
                paused = len(self._caller.record.pause_us)
                try:
                    self._caller.release(th)
                finally:
                    self._unblock(old)
                    if c.category == safepoints.RUNNING:
                        stopped_why[c.tid] = reason
                        running_refused += 1
                        spent = running_refused_us >= self.RUNNING_STOPS_BUDGET_US
                        running_refused_us += sum(self._caller.record.pause_us[paused:])
                        if running_refused_us >= self.RUNNING_STOPS_BUDGET_US:
                            next_running_stop = time.monotonic() + self.RUNNING_STOPS_PACE_S
                            if not spent:
                                log.info("pid %d: running threads stopped %d times for %d us "
                                         "with no call made: from now on one such stop every "
                                         "%g s at most in this borrow", self.pid,
                                         running_refused, running_refused_us,
                                         self.RUNNING_STOPS_PACE_S)
                if reason.code is Reason.GROUP_STOP:
                    raise RemoteCallError(STOPPED_MSG, pid=self.pid)
            if time.monotonic() >= t_end or last_why and all(
                    r.code in safepoints.PERMANENT_REASONS for r in last_why.values()):
                msg = self._refusal(last_why, only_tid)
                if running_refused_us >= self.RUNNING_STOPS_BUDGET_US:
                    msg += (f" (running threads were stopped {running_refused} times, "
                            f"{running_refused_us / 1000:.0f} ms in all, and found there "
                            f"each time; past {self.RUNNING_STOPS_BUDGET_US // 1000} ms, a "
                            f"bound on what one snapshot may stop a busy thread for "
                            f"nothing, one such stop every {self.RUNNING_STOPS_PACE_S:g} s)")
                raise RemoteCallError(msg, pid=self.pid)
            self._preflight()
            time.sleep(0.001 if rounds < 20 else 0.005)

    def _refusal(self, why: dict[int, Refusal], only_tid: int | None) -> str:
        msg = self._chooser.refusal_message(why, only_tid, self.deadline_s)
        log.debug("pid %d: no thread borrowed: %s", self.pid, msg)
        return msg

    # ---- public -------------------------------------------------------------------
    @contextlib.contextmanager
    def borrow(self, tid: int | None = None, maps: bytes | None = None) -> Iterator[Call]:
        """Stop one safe thread (or only TID) and yield a Call on it.  MAPS:
        /proc/PID/maps just read by the caller for the same work (a
        snapshot's), used instead of a read of its own (Chooser.new_borrow)."""
        reap_orphans()
        self._caller.record = type(self._caller.record)()
        self.last = None
        self._chooser.new_borrow(maps)
        with _borrowing():
            self._preflight()
            th, old, chosen_from = self._acquire(tid)
            boosted = None
            try:
                th.frame.scratch_top = th.frame.scratch_low = self._caller.scratch_top(th)
                if th.verdict.boundary:
                    self._stats.boundary_stops += 1
                self._stats.borrows += 1
                # SCHED_FIFO only when no CPU was free just before the stop
                # (spin_budget): with one free the tracee is not kept waiting
                # for a CPU, and the two policy changes cost ~25 us of the stop
                boosted = boost(th.tid) if self.boost and not self._tracer.cpu_free else None
                yield Call(self._caller, th, self.MAX_SCRATCH)
            finally:
                try:
                    try:
                        self._caller.unmap_buffers(th)
                    finally:
                        unboost_thread(th.tid, boosted)
                        try:
                            self._caller.release(th)
                        finally:
                            unboost_tracer(boosted)
                finally:
                    v = th.verdict
                    self.last = {"tid": th.tid, "kind": v.kind, "syscall": v.syscall,
                                 "category": v.category, "restarted_eintr":
                                 v.restart_rax is not None, "boundary": v.boundary,
                                 "calls": th.frame.calls, "group_stop_seen": th.group_stop_seen}
                    self._unblock(old)
                    del chosen_from     # the thread runs again: freed now
                    if v.left_ns is not None and v.left_ns >= BACK_ASLEEP_MIN_LEFT_S * NS_PER_S \
                            and not th.gone:
                        # a timeout given back (keep_deadline): when its
                        # restarted wait began, for the next borrow's
                        # give-back (choose._asleep_since)
                        self._chooser.note_back_asleep(th.tid)


@contextlib.contextmanager
def _borrowing() -> Iterator[None]:
    """This tracer thread's settings for a borrow, as they were after it
    (also when the borrow fails): its timer slack at TIMERSLACK_NS, and no
    cyclic collection of allocdiag's own objects while a thread may be
    stopped (a recording's snapshots met one in ~2% of their stops: 100
    snapshot.take in one process, 5 collections inside a stop)."""
    slack = ptrace.set_timerslack_ns(TIMERSLACK_NS)
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
        if slack is not None:
            ptrace.set_timerslack_ns(slack)


def understudy_process(pid: int, procfs: str) -> RemoteProcess:
    """The rehearsal's understudy as a RemoteProcess, for the warm-up
    before a process's first stop (rehearsal.rehearse): never boosted, and
    no INFO line per borrow (``-v`` shows the target's stops only)."""
    rp = RemoteProcess(pid, procfs=procfs, deadline_s=rehearsal.WAIT_S, boost=False)
    rp._caller.quiet = True
    return rp
