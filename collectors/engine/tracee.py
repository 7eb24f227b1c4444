"""The lifetime of one traced thread: attach (PTRACE_SEIZE + INTERRUPT),
wait for its stops, resume, restore and detach; and the one stop decoder
(a waitpid status -> a typed ``Stop``).

Also here, because they outlive one borrow: the per-run ``REGISTRY`` of
quarantined processes and of orphans (tracees that did not stop in time and
are restored and detached as soon as they do), and the SCHED_FIFO boost of
a stopped thread.

The ptrace/waitpid syscalls themselves are ``collectors.engine.ptrace``;
the ptrace functions tests and tools use stay importable from here
(``seize``, ``interrupt``, ``detach``, ``waitpid_nohang``, ``tgkill``,
``read_memory``/``write_memory``).
"""

import atexit
import contextlib
import enum
import os
import signal
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from collectors import lazylog
from diag.model.records import field, record
from collectors.engine import abi, memory, ptrace
from collectors.engine.arch import Arch, Regs
from collectors.engine.safepoints import Reason, Refusal, refusal
from collectors.engine.stackbounds import Bounds
from collectors.proc.readall import read_all
from collectors.proc.stat import start_time
from diag.model.errors import (AccessDenied, AllocdiagError, NoSuchProcess, Quarantined,
                               RemoteCallError)

log = lazylog.getLogger("collectors.engine")

STOPPED_MSG = ("the process is stopped (SIGSTOP / job control); allocdiag never "
               "resumes a stopped process: send it SIGCONT first")

# the ptrace functions other code uses, from the lifetime module
seize = ptrace.seize
interrupt = ptrace.interrupt
cont = ptrace.cont
detach = ptrace.detach
waitpid_nohang = ptrace.waitpid_nohang
tgkill = ptrace.tgkill
translate_errno = ptrace.translate_errno
read_memory = memory.read
write_memory = memory.write


def signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"SIG{sig}"


def codename(signo: int, code: int) -> str:
    """The si_code's name for SIGNO (SEGV_MAPERR ...), or "code N"."""
    return abi.SI_CODE_NAMES.get((signo, code), f"code {code}")


# What a call's crash says about the thread, where its si_code tells.
CRASH_HINTS: dict[tuple[int, int], str] = {
    (signal.SIGSYS, abi.SYS_USER_DISPATCH):
        "the thread runs under syscall user dispatch (PR_SET_SYSCALL_USER_DISPATCH, as "
        "Wine does), which turned a syscall of the call into SIGSYS; it was not delivered",
    (signal.SIGSYS, abi.SYS_SECCOMP):
        "the thread's seccomp filter answered a syscall of the call with SECCOMP_RET_TRAP; "
        "the SIGSYS was not delivered",
    (signal.SIGSEGV, abi.SEGV_CPERR):
        "a control-protection fault: the thread has a shadow stack (CET), which a call "
        "made from outside cannot return through",
}


class SigInfo:
    """A kernel siginfo_t (raw 128 bytes kept for re-injection)."""

    __slots__ = ("raw", "signo", "errno", "code", "pid", "uid", "addr", "value")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.signo, self.errno, self.code = struct.unpack_from(abi.SI_SIGNO_FMT, raw, 0)
        self.pid, self.uid = struct.unpack_from("iI", raw, abi.SI_PID_OFF)
        self.addr: int = struct.unpack_from("Q", raw, abi.SI_ADDR_OFF)[0]
        self.value: int = struct.unpack_from("q", raw, abi.SI_VALUE_OFF)[0]

    def as_dict(self) -> dict[str, Any]:
        return {"signo": self.signo, "name": signame(self.signo), "code": self.code,
                "pid": self.pid, "uid": self.uid, "value": self.value}

    def __repr__(self) -> str:
        return f"SigInfo({signame(self.signo)}, code={self.code}, pid={self.pid})"


# ---- the stop decoder ------------------------------------------------------------

class WaitKind(enum.Enum):
    EXITED = "exited"
    KILLED = "killed"
    STOPPED = "stopped"
    UNKNOWN = "unknown"


class WaitStatus(NamedTuple):
    """A decoded waitpid status: KIND, the exit status / signal, and the
    ptrace event (status >> 16) of a stop.  (NamedTuples: made at every
    stop, inside the stop window.)"""

    kind: WaitKind
    sig: int
    event: int = 0


def decode_status(status: int) -> WaitStatus:
    """A raw waitpid status, decoded (no syscalls)."""
    if os.WIFEXITED(status):
        return WaitStatus(WaitKind.EXITED, os.WEXITSTATUS(status))
    if os.WIFSIGNALED(status):
        return WaitStatus(WaitKind.KILLED, os.WTERMSIG(status))
    if os.WIFSTOPPED(status):
        return WaitStatus(WaitKind.STOPPED, os.WSTOPSIG(status),
                          (status >> abi.EVENT_SHIFT) & abi.EVENT_MASK)
    return WaitStatus(WaitKind.UNKNOWN, 0)


class StopKind(enum.Enum):
    INTERRUPT = "interrupt"      # our PTRACE_INTERRUPT stop
    GROUP = "group"              # a group-stop (SIGSTOP & co, an event stop under SEIZE)
    EVENT = "event"              # another ptrace event stop
    SYSCALL = "syscall"          # a syscall entry or exit (a call resumed with PTRACE_SYSEMU
                                 # or PTRACE_SYSCALL)
    RETURN_TRAP = "return-trap"  # the SIGSEGV of a call returning to address 0
    FAULT = "fault"              # a synchronous signal the thread raised itself (crash)
    SIGNAL = "signal"            # any other signal-delivery-stop (asynchronous signal)
    EXITED = "exited"            # the tracee is gone (exited or killed)
    TIMEOUT = "timeout"          # nothing by the deadline (the thread still runs)


class Stop(NamedTuple):
    """A classified tracee stop."""

    kind: StopKind
    sig: int = 0
    si: SigInfo | None = None
    regs: Regs = None


def classify_stop(status: int, tid: int, pid: int, arch: Arch) -> Stop:
    """The Stop a waitpid STATUS of tracee TID reports.  A signal-delivery-
    stop reads the siginfo and registers (the tracee is in that stop)."""
    ws = decode_status(status)
    if ws.kind is not WaitKind.STOPPED:
        return Stop(StopKind.EXITED, ws.sig)
    if ws.event == abi.PTRACE_EVENT_STOP:
        return Stop(StopKind.GROUP if ws.sig in abi.STOP_SIGNALS else StopKind.INTERRUPT,
                    ws.sig)
    if ws.event:
        return Stop(StopKind.EVENT, ws.sig)
    if ws.sig == abi.SYSCALL_STOP_SIG:
        return Stop(StopKind.SYSCALL, ws.sig)
    si = SigInfo(ptrace.getsiginfo(tid, pid))
    regs = arch.get_regs(tid, pid)
    if arch.is_return_trap(regs, si):
        return Stop(StopKind.RETURN_TRAP, ws.sig, si, regs)
    if si.signo in abi.SYNC_SIGNALS and si.code > 0:
        return Stop(StopKind.FAULT, ws.sig, si, regs)
    return Stop(StopKind.SIGNAL, ws.sig, si, regs)


# ---- what the engine holds about one stopped thread ----------------------------------

class At(enum.Enum):
    """Which stop the held thread is in."""

    INTERRUPT = "interrupt"
    GROUP = "group"
    DELIVERY = "delivery"        # a signal-delivery-stop (needed to inject a signal)


@record
class Verdict:
    """What the judge found (safepoints): the kind of safe point and how the
    wait must be given back."""

    kind: str | None = None          # 'idle' | 'running'
    syscall: str | None = None       # the wait's name
    category: str | None = None      # safepoints.RESTARTABLE | EPOLL | FUTEX | GO_RUNTIME | RUNNING
    boundary: bool = False           # stopped after the wait returned
    restart_rax: int | None = None   # rax to restore instead of the saved one (EINTR -> restart)
    since: float | None = None       # monotonic time it last ran before the stop (epoll family)
    timeout_ns: int | None = None    # its relative timeout as passed (read at the stop)
    left_ns: int | None = None       # what was left of it at the release (keep_deadline)


@record
class FrameState:
    """What the calls (callframe) put on the thread's stack and in mappings."""

    scratch_top: int = 0
    scratch_low: int = 0
    bounds: Bounds | None = None     # stackbounds.Bounds of its stack
    callee_need: int = 0             # stack the callee may use below the frame
    buffers: list[tuple[int, int]] = field(default_factory=list)   # Call.buffer mappings
    stack_buffers: int = 0           # bytes of Call.buffer carved from a roomy stack
    calls: int = 0
    # Call.write/Call.buffer bytes not yet written: made with the next call's
    # frame, or before the next read, in one process_vm_writev
    pending: list[tuple[int, bytes]] = field(default_factory=list)


@record
class Thread:
    """One thread held in a ptrace-stop, and everything needed to give it
    back exactly as it was."""

    arch: Arch
    pid: int
    tid: int
    regs: Regs = None                # saved general registers
    xstate: bytes = b""              # saved XSAVE blob
    sigmask: int = 0                 # saved signal mask
    mask_changed: bool = False
    held: list[SigInfo] = field(default_factory=list)   # collected at signal-delivery-stops
    at: At | None = None
    t_stop: float | None = None      # monotonic time of the PTRACE_INTERRUPT (the pause's start)
    gone: bool = False               # the thread exited under us
    orphaned: bool = False
    group_stop_seen: bool = False
    # under a seccomp filter (or its mode unknown): calls resume with
    # PTRACE_SYSEMU and each syscall is judged (collectors.engine.seccomp)
    seccomp_filter: bool = False
    # a judged syscall being made again (Caller.syscall_stop): its entry
    # and exit stops are still to come (2, 1), or none is (0)
    rerun_stops: int = 0
    filters: list[bytes] | str | None = None     # seccomp.read_filters, read at the first syscall
    verdict: Verdict = field(default_factory=Verdict)
    frame: FrameState = field(default_factory=FrameState)

    @property
    def saved(self) -> bool:
        return self.regs is not None

    def final_regs(self) -> Regs:
        """The registers to give back: the saved ones, with rax =
        -ERESTARTNOHAND when the stop turned a wait's result into -EINTR."""
        if self.verdict.restart_rax is None:
            return self.regs
        regs = self.arch.copy_regs(self.regs)
        regs.rax = self.verdict.restart_rax & abi.U64_MASK
        return regs


class Skip(Exception):
    """A candidate thread that could not be stopped or held (REFUSAL)."""

    def __init__(self, why: Refusal) -> None:
        super().__init__(why.text)
        self.why = why


# ---- per-run registry: quarantine and orphans ---------------------------------------

class Registry:
    """Per-run state shared by every RemoteProcess of this run:

    - ``quarantine``: (pid, starttime) -> reason.  After a call timed out or
      crashed, no further calls go to that process.
    - ``orphans``: tid -> Thread, tracees that did not acknowledge
      PTRACE_INTERRUPT in time; restored and detached as soon as they stop.

    ``reset()`` empties both (tests).  The dicts are cleared in place,
    so the module-level aliases stay valid."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.quarantine: dict[tuple[int, int | None], str] = {}
        self.orphans: dict[int, Thread] = {}

    def reset(self) -> None:
        with self.lock:
            self.quarantine.clear()
            self.orphans.clear()


REGISTRY = Registry()
_orphan_lock = threading.RLock()


def quarantine_reason(pid: int, procfs: str = "/proc", start: int | None = None
                      ) -> str | None:
    """Why PID (started at START, read now when not given) is quarantined,
    or None."""
    if not REGISTRY.quarantine:
        return None             # the usual case: no stat read
    key = (pid, start_time(pid, procfs) if start is None else start)
    with REGISTRY.lock:
        return REGISTRY.quarantine.get(key)


def is_quarantined(pid: int, procfs: str = "/proc") -> bool:
    """True when an earlier call into PID timed out or crashed (this run)."""
    return quarantine_reason(pid, procfs) is not None


def quarantine(pid: int, starttime: int | None, reason: str) -> None:
    log.info("pid %d quarantined: %s", pid, reason)
    with REGISTRY.lock:
        REGISTRY.quarantine.setdefault((pid, starttime), reason)


def orphan(th: Thread) -> None:
    """Remember TH, which did not stop in time: it is restored and detached
    as soon as it stops (every borrow and at exit look)."""
    th.orphaned = True
    log.debug("pid %d tid %d orphaned: did not stop in time", th.pid, th.tid)
    with _orphan_lock:
        REGISTRY.orphans[th.tid] = th


def reap_orphans() -> None:
    with _orphan_lock:
        for tid, th in list(REGISTRY.orphans.items()):
            try:
                status = ptrace.waitpid_nohang(tid, th.pid)
            except Exception:
                REGISTRY.orphans.pop(tid, None)
                continue
            if status is None:
                continue
            REGISTRY.orphans.pop(tid, None)
            if decode_status(status).kind is not WaitKind.STOPPED:
                continue
            with contextlib.suppress(Exception):
                if th.saved:
                    th.arch.set_regs(tid, th.pid, th.final_regs())
                    th.arch.set_ext_state(tid, th.pid, th.xstate)
                    ptrace.setsigmask(tid, th.pid, th.sigmask)
                ptrace.detach(tid, th.pid, 0)
                log.debug("pid %d tid %d orphan restored and detached", th.pid, tid)


def detach_orphans(pid: int, timeout_s: float = 2.0) -> list[int]:
    """Restore and detach every thread of PID still held as an orphan, within
    TIMEOUT_S; returns the tids still held (uninterruptible past the deadline:
    the at-exit reaper tries again).  Called when a view closes its process,
    so that nothing stays attached once the user has left it."""
    deadline = time.monotonic() + timeout_s
    while True:
        reap_orphans()
        with _orphan_lock:
            left = [tid for tid, th in REGISTRY.orphans.items() if th.pid == pid]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)


def _reap_orphans_at_exit() -> None:
    deadline = time.monotonic() + 2.0
    while REGISTRY.orphans and time.monotonic() < deadline:
        reap_orphans()
        time.sleep(0.01)


atexit.register(_reap_orphans_at_exit)


# ---- /proc of the traced process -----------------------------------------------------

def read_bytes(path: str, pid: int, tid: int | None = None) -> bytes:
    try:
        return read_all(path)
    except OSError as e:
        raise ptrace.translate_errno(e.errno or 0, pid, f"read {path}", tid) from None


def status_fields(data: bytes) -> dict[str, str]:
    """/proc/PID/status as {field: value}."""
    out = {}
    for line in data.decode("utf-8", "replace").splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


def our_ids() -> tuple[int, int]:
    return (os.getpid(), threading.get_native_id())


# ---- the tracer of one process ----------------------------------------------------------

class Tracer:
    """Stops, waits for, and detaches threads of one process (PID)."""

    # Waiting for the tracee: spin only as long as an uncontended round trip
    # takes, then sleep in short steps.  Spinning longer takes a CPU away
    # from the very thread we wait for: on a 2-core box with 8 busy threads a
    # 2 ms spin per round trip made a 40-call jemalloc snapshot stop its
    # thread ~190 ms (measured; see bench/pause.py).
    SPIN_S = 0.0001
    SLEEP_S = 0.00005
    # When a CPU is free for the tracee, spinning takes nothing from it, and
    # sleeping costs the wake-up: a jemalloc stats print runs 0.1-0.3 ms
    # cold, so a 0.1 ms spin then 50 us sleeps ended each such call in a
    # sleep (idle stop 0.63 ms median; spinning up to 2 ms: 0.42 ms, same
    # run, bench/pause.py --stops).  Chosen per borrow by spin_budget().
    SPIN_FREE_CPU_S = 0.002
    # How often a waiting tracer checks the tracee is still ours.
    CHECK_EVERY_S = 0.05
    # Another tracer is waited for this long before the process is called
    # traced: another allocdiag (an exporter, a recording) holds a thread
    # for its stop, under a millisecond; a debugger stays.  An `inspect`
    # that met an exporter's stop of the same thread failed without it.
    OTHER_TRACER_GRACE_S = 0.05

    def __init__(self, pid: int, procfs: str, arch: Arch, start: int | None,
                 auxv: Callable[[], bytes]) -> None:
        self.pid = pid
        self.procfs = procfs
        self.arch = arch
        self.start = start
        self._read_auxv = auxv
        self._auxv = auxv()
        self.spin_s = self.SPIN_S
        self.cpu_free = False       # set with spin_s by the borrow (spin_budget)

    def preflight(self) -> None:
        """Checks before any stop: not quarantined, the same program still
        running, not stopped, traced by no one else, SIGSEGV not ignored."""
        st = status_fields(read_bytes(f"{self.procfs}/{self.pid}/status", self.pid))
        # read after the status: a pid reused meanwhile shows here
        start = start_time(self.pid, self.procfs)
        reason = quarantine_reason(self.pid, self.procfs, start)
        if reason:
            raise Quarantined(f"no remote calls: {reason}", pid=self.pid)
        if start != self.start:
            raise NoSuchProcess(self.pid, "the process exited (pid reused)")
        state = st.get("State", "?")[:1]
        if state in ("Z", "X"):
            raise NoSuchProcess(self.pid, "the process exited (zombie)")
        if state == "T":
            raise RemoteCallError(STOPPED_MSG, pid=self.pid)
        tracer = self._other_tracer(st)
        if tracer:
            raise RemoteCallError(f"the process is already traced by pid {tracer} "
                                  f"(a debugger? still traced after "
                                  f"{self.OTHER_TRACER_GRACE_S * 1000:.0f} ms)", pid=self.pid)
        if int(st.get("SigIgn", "0"), 16) & abi.sigbit(signal.SIGSEGV):
            raise RemoteCallError(
                "the process ignores SIGSEGV; the return trap of a remote call "
                "would reset it to the default action, so no remote calls are made",
                pid=self.pid)
        if self.exec_changed():
            raise RemoteCallError("the process executed a new program (exec) since "
                                  "it was opened; open it again", pid=self.pid)

    def task(self, tid: int, leaf: str) -> str:
        return f"{self.procfs}/{self.pid}/task/{tid}/{leaf}"

    def exec_changed(self) -> bool:
        """True when the process executed a new program since it was opened."""
        return self._read_auxv() != self._auxv

    def spin_budget(self, cpu_free: bool | None = None) -> float:
        """SPIN_FREE_CPU_S when a CPU is free besides this tracer (so the
        tracee runs on its own while we spin), else SPIN_S.  CPU_FREE: that
        answer when the caller has just read it (None: read it now)."""
        self.cpu_free = self.free_cpu() if cpu_free is None else cpu_free
        return self.SPIN_FREE_CPU_S if self.cpu_free else self.SPIN_S

    def free_cpu(self) -> bool:
        """True when a CPU is free besides this tracer: /proc/loadavg's
        runnable count includes this thread, so fewer runnable tasks than
        usable CPUs leaves one free."""
        try:
            running = int(read_all(f"{self.procfs}/loadavg").split()[3].split(b"/")[0])
            cpus = len(os.sched_getaffinity(0))
        except (OSError, ValueError, IndexError):
            return False
        return running < cpus

    # ---- waiting --------------------------------------------------------------
    def wait(self, th: Thread, deadline: float) -> int | None:
        """Next wait status of the tracee, or None at DEADLINE."""
        t0 = time.monotonic()
        next_check = t0 + self.CHECK_EVERY_S
        while True:
            status = ptrace.waitpid_nohang(th.tid, self.pid)
            if status is not None:
                return status
            now = time.monotonic()
            if now >= deadline:
                return None
            if now - t0 < self.spin_s:
                # spin, but yield to a tracee the scheduler queued on this
                # CPU (woken by our PTRACE_INTERRUPT from here, it is often
                # put on the waker's CPU): measured on redis's event loop,
                # plain spinning held it 2 ms from its stop, runnable
                os.sched_yield()
                continue
            if now >= next_check:
                next_check = now + self.CHECK_EVERY_S
                self.check_still_traced(th)
            time.sleep(self.SLEEP_S)

    def next_stop(self, th: Thread, deadline: float, absorb: bool = True,
                  resume: Callable[[int, int, int], None] = ptrace.cont) -> Stop:
        """The next stop of the tracee (``classify_stop``), or a TIMEOUT stop.

        With ABSORB, EVENT stops are resumed (with RESUME: the caller's way
        of resuming, PTRACE_CONT, PTRACE_SYSEMU or PTRACE_SYSCALL) and SIGNAL stops are
        collected into ``th.held`` (suppressed now, re-delivered with their
        siginfo at the release) and resumed, so the caller sees only the
        other kinds.  The one place that reads tracee stops."""
        while True:
            status = self.wait(th, deadline)
            if status is None:
                return Stop(StopKind.TIMEOUT)
            stop = classify_stop(status, th.tid, self.pid, self.arch)
            if absorb and stop.kind is StopKind.EVENT:
                resume(th.tid, self.pid, 0)
                continue
            if absorb and stop.kind is StopKind.SIGNAL and stop.si is not None:
                th.held.append(stop.si)
                resume(th.tid, self.pid, 0)
                continue
            return stop

    def check_still_traced(self, th: Thread) -> None:
        try:
            f = status_fields(read_bytes(self.task(th.tid, "status"), self.pid, th.tid))
        except (NoSuchProcess, RemoteCallError):
            th.gone = True
            raise self.gone_error(th) from None
        # TracerPid names the tracer *thread* (our tid), not our tgid
        if int(f.get("TracerPid", "0") or 0) not in our_ids():
            th.gone = True
            raise self.gone_error(th)

    def gone_error(self, th: Thread, when: str = "while stopped") -> AllocdiagError:
        """Classify a vanished tracee: process exited, exec'd, or only the
        thread exited.  The process state lags the thread's exit a little
        (exit_group kills threads one by one), so look for up to 0.3 s."""
        t_end = time.monotonic() + 0.3
        while True:
            if not ptrace.process_exists(self.pid, self.procfs) or \
                    start_time(self.pid, self.procfs) != self.start:
                return NoSuchProcess(self.pid, f"the process exited {when}")
            try:
                f = status_fields(read_bytes(f"{self.procfs}/{self.pid}/status", self.pid))
                if f.get("State", "")[:1] in ("Z", "X"):
                    return NoSuchProcess(self.pid, f"the process exited {when}")
                if self.exec_changed():
                    return RemoteCallError(f"the process executed a new program {when}",
                                           pid=self.pid)
            except NoSuchProcess:
                return NoSuchProcess(self.pid, f"the process exited {when}")
            except Exception:
                pass
            if time.monotonic() >= t_end:
                return RemoteCallError(f"thread {th.tid} exited {when}", pid=self.pid)
            # reap our tracee if it is a zombie, then look again
            with contextlib.suppress(Exception):
                ptrace.waitpid_nohang(th.tid, self.pid)
            time.sleep(0.005)

    # ---- attach -----------------------------------------------------------------
    def _other_tracer(self, st: dict[str, str]) -> int:
        """The pid of a tracer of the process that is not allocdiag's, once
        OTHER_TRACER_GRACE_S has passed with it there; 0 when none (ST:
        the process's status fields, read again while waiting)."""
        t_end = time.monotonic() + self.OTHER_TRACER_GRACE_S
        while True:
            tracer = int(st.get("TracerPid", "0") or 0)
            if not tracer or tracer in our_ids() or time.monotonic() >= t_end:
                return 0 if tracer in our_ids() else tracer
            time.sleep(0.001)
            st = status_fields(read_bytes(f"{self.procfs}/{self.pid}/status", self.pid))

    def stop(self, tid: int, kind: str, wait_s: float) -> Thread:
        """SEIZE + INTERRUPT TID and wait (at least WAIT_S) for the
        interrupt-stop.  Returns the Thread (state saved) or raises Skip."""
        th = Thread(self.arch, self.pid, tid)
        th.verdict.kind = kind
        try:
            # TRACESYSGOOD: the syscall stops of a call resumed with
            # PTRACE_SYSEMU (a thread under a seccomp filter) are told
            # from a SIGTRAP; without it there are none
            ptrace.seize(tid, self.pid, abi.PTRACE_O_TRACESYSGOOD)
        except AccessDenied:
            f: dict[str, str] = {}
            with contextlib.suppress(Exception):
                f = status_fields(read_bytes(self.task(tid, "status"), self.pid, tid))
            tracer = int(f.get("TracerPid", "0") or 0)
            if tracer:
                raise Skip(refusal(Reason.TRACED, tracer=tracer)) from None
            raise
        except NoSuchProcess:
            raise
        except RemoteCallError:
            raise Skip(refusal(Reason.VANISHED)) from None
        log.debug("pid %d tid %d seized", self.pid, tid)
        # The pause counts from here: from the interrupt on, the thread does
        # not run its own code, whether or not it has reached its stop yet.
        t_interrupt = time.monotonic()
        try:
            ptrace.interrupt(tid, self.pid)
        except RemoteCallError:
            th.gone = True      # died between SEIZE and INTERRUPT
            if not ptrace.process_exists(self.pid, self.procfs):
                raise NoSuchProcess(self.pid) from None
            raise Skip(refusal(Reason.VANISHED)) from None
        deadline = time.monotonic() + max(1.0, wait_s)
        try:
            stop = self.next_stop(th, deadline)
        except NoSuchProcess:
            raise
        except RemoteCallError:
            raise Skip(refusal(Reason.VANISHED)) from None
        if stop.kind is StopKind.TIMEOUT:
            # not stopping (uninterruptible): it stops later; detach then.
            orphan(th)
            raise Skip(refusal(Reason.DID_NOT_STOP))
        if stop.kind is StopKind.EXITED:
            if not ptrace.process_exists(self.pid, self.procfs):
                raise NoSuchProcess(self.pid, "the process exited")
            raise Skip(refusal(Reason.EXITED))
        if stop.kind in (StopKind.FAULT, StopKind.RETURN_TRAP) and stop.si is not None:
            # the thread faulted in its own code: hand it over untouched
            ptrace.detach(tid, self.pid, stop.si.signo)
            raise Skip(refusal(Reason.OWN_SIGNAL, signal=signame(stop.si.signo)))
        th.t_stop = t_interrupt
        th.at = At.GROUP if stop.kind is StopKind.GROUP else At.INTERRUPT
        # save everything first: from here on the release gives it back exactly
        th.regs = self.arch.get_regs(tid, self.pid)
        th.xstate = self.arch.get_ext_state(tid, self.pid)
        th.sigmask = ptrace.getsigmask(tid, self.pid)
        return th

    def detach(self, th: Thread, regs: Regs, xstate: bool, signal_info: SigInfo | None
               ) -> None:
        """Give TH back: REGS, the saved vector state (XSTATE) and mask, then
        detach, injecting SIGNAL_INFO's signal when set."""
        self.arch.set_regs(th.tid, self.pid, regs)
        if xstate:
            self.arch.set_ext_state(th.tid, self.pid, th.xstate)
        if th.mask_changed:
            ptrace.setsigmask(th.tid, self.pid, th.sigmask)
        if signal_info is not None:
            ptrace.setsiginfo(th.tid, self.pid, signal_info.raw)
            ptrace.detach(th.tid, self.pid, signal_info.signo)
        else:
            ptrace.detach(th.tid, self.pid, 0)
        log.debug("pid %d tid %d detached", self.pid, th.tid)


# ---- priority for the stop ----------------------------------------------------------------

BoostSaved = tuple[int, os.sched_param, int, os.sched_param]
FIFO_PRIORITY = 1            # the lowest SCHED_FIFO priority (sched(7))


def boost(tid: int) -> BoostSaved | None:
    """Run the borrowed thread and this tracer thread at SCHED_FIFO 1 while
    the thread is stopped for calls.  On a saturated machine every call
    otherwise waits for a CPU twice (tracee, then tracer), and the stop lasts
    tens of milliseconds for a few dozen calls.  The thread's own policy is
    restored before it is released; the window is already one where only
    SIGKILL of the tracer can intervene (and that would leave the thread on
    the call frame anyway).  Needs CAP_SYS_NICE; without it nothing changes.
    Returns what to restore, or None."""
    try:
        saved = (os.sched_getscheduler(tid), os.sched_getparam(tid),
                 os.sched_getscheduler(0), os.sched_getparam(0))
        if saved[0] != os.SCHED_OTHER:
            return None                  # the program chose a policy: leave it
        os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(FIFO_PRIORITY))
    except (PermissionError, OSError, AttributeError):
        return None
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(FIFO_PRIORITY))
    return saved


def unboost_thread(tid: int, saved: BoostSaved | None) -> None:
    """The borrowed thread's own policy back, while it is still stopped."""
    if saved is not None:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(tid, saved[0], saved[1])


def unboost_tracer(saved: BoostSaved | None) -> None:
    """This tracer thread's policy back, after the borrowed thread was
    released: leaving SCHED_FIFO on a busy CPU hands it to the queued tasks
    at once, and a tracer that did so before the release kept the thread
    stopped for that wait too (measured: ~0.4 ms a stop on a loaded box)."""
    if saved is not None:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, saved[2], saved[3])
