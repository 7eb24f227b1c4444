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
    text, e.g. from ``text_ranges()``; a *running* thread whose PC or any word
    in the top ``stack_window`` bytes of its stack points into them is never
    borrowed.  Without ranges only threads parked in an idle wait are used.

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
    After it: ``.pause_us`` (µs each stopped thread was stopped, rejected
    candidates included), ``.held_signals`` (signals that arrived during the
    window and were re-delivered), ``.last`` (dict: tid, kind, syscall,
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

Safety rules implemented here
-----------------------------
- Safe points (policy in ``collectors.engine.safepoints``), tried in this order:
  restartable waits (read, poll, select, pause, nanosleep, accept/accept4,
  recvfrom/recvmsg, wait4/waitid, rt_sigsuspend, ...; issued from outside
  allocator text), epoll-family waits (epoll_wait/epoll_pwait/epoll_pwait2/
  rt_sigtimedwait: they hold -EINTR at the stop and are given back with
  rax = -ERESTARTNOHAND, orig_rax and rip unchanged, after checking `0f 05`
  at rip-2 and cs 0x33), FUTEX_WAIT_BITSET waits that a ``.eh_frame`` walk
  (``collectors.binary.unwind``; CFI parsed before the stop) proves outside the
  allocator and inside pthread_cond_*wait/sem_*wait/pthread_join, the Go
  runtime's own parks in a cgo binary (``go_runtime``: a
  ``safepoints.GoRuntime``; PC in its runtime.futex/runtime.usleep stub, on a
  glibc thread stack only), and last running threads interrupted outside
  every forbidden range.  A stop that
  lands after the wait returned (rax >= 0) is restored exactly.  Futex lock
  waits, PI/requeue ops, futex_waitv, semop, mmap & co and allocator
  background threads (``jemalloc_bg_thd``) are never borrowed.  Any stopped
  wait that holds -EINTR because of the stop is given back with
  -ERESTARTNOHAND, borrowed or not.
- The return-to-0 trap is a forced SIGSEGV: SIGSEGV (and the other synchronous
  signals) are unblocked in the thread for the call so the kernel never resets
  the program's SIGSEGV handler; a process that ignores SIGSEGV is refused.
- Signals: with ``block_signals`` (default) the thread's mask blocks every
  asynchronous signal during the window, so they stay queued in the kernel
  (original siginfo untouched, standard-signal semantics unchanged) and are
  delivered when the mask is restored.  Any signal-delivery-stop that still
  happens (a signal dequeued in the microseconds between SEIZE and the stop,
  or any signal with ``block_signals=False``) is collected with
  PTRACE_GETSIGINFO, suppressed, and after the registers are restored
  re-delivered with its original siginfo: one by injection at the final
  signal-delivery-stop (SETSIGINFO + DETACH with the signal), others requeued
  by injecting them while blocked (the kernel queues them with their siginfo).
  Nothing is ever re-sent with kill().
- restart_syscall (a sleep, poll or timed futex wait resumed after any
  earlier interruption) is judged like any other wait
  (``safepoints.classify_restart``): a futex by its wait channel and
  argument registers, a sleep or poll by an ``.eh_frame`` walk with no
  allocator frame; restored exactly, it continues to its original deadline.
  An epoll-family wait restored with -ERESTARTNOHAND gets what is left of
  its timeout (``_keep_deadline``), not the whole timeout again.
- Stack bounds (``collectors.engine.stackbounds``): every byte written on the
  borrowed stack -- red zone kept, scratch, call frame, alignment -- and the
  callee's own measured stack need (``stack_need``) lie inside the thread's
  own stack mapping above its lowest page and a margin; a thread without
  that room is not a candidate (candidates are ranked by room, and the next
  one is tried).  ``Call.write`` writes only into scratch or buffers the
  borrow made.  Inventory of every write: docs/target-writes.md.
- Small scratch is stack below the red zone (nothing to free); big output
  buffers are anonymous mappings, unmapped before the thread is released.
- No PTRACE_O_EXITKILL: if allocdiag dies the target continues.
"""

import atexit
import contextlib
import importlib
import os
import platform
import signal
import struct
import threading
import time
from collections import namedtuple

from collectors.engine import memory

from collectors.engine import tracee as ptrace

from collectors.engine import safepoints

from collectors.engine import stackbounds

from collectors.binary import unwind
from collectors.binary.ranges import Ranges
from collectors.proc.maps import parse_maps
from collectors.proc.stat import start_time
from diag.model.errors import (AccessDenied, AllocdiagError, NoSuchProcess, Quarantined,
                               RemoteCallError, Unsupported)

__all__ = ["RemoteProcess", "Call", "is_quarantined", "quarantine_reason",
           "text_ranges"]

PAGE_SIZE = 4096
# What the engine itself puts on a borrowed stack, at most: the red zone it
# skips (128), 64 bytes of gap, MAX_SCRATCH of small scratch, the call frame
# (return address and stack arguments) and alignment.
MAX_SCRATCH = 3 * 1024
FRAME_BUDGET = 4 * 1024
# The callee's own stack need when the caller declares none (calls whose
# need was not measured: keep the engine's historical 16 KiB head-room).
DEFAULT_STACK_NEED = 16 * 1024
# mmap(2) arguments for Call.buffer (asm-generic/mman-common.h)
PROT_READ, PROT_WRITE = 1, 2
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20
MAP_FAILED_MIN = (1 << 64) - 4096   # mmap returns -errno (as unsigned) on failure
CSTRING_CHUNK = 64 * 1024   # bytes per process_vm_readv in Call.cstring (page-aligned ends)

# Architectures with an arch module.  (aarch64 is described in
# arch_x86_64's docstring but not written yet.)
_ARCH_MODULES = {"x86_64": "arch_x86_64", "amd64": "arch_x86_64"}


def _load_arch(machine=None):
    machine = machine or platform.machine()
    mod = _ARCH_MODULES.get(machine)
    if mod is None:
        raise Unsupported(f"unsupported architecture {machine}: remote calls (live "
                          "allocator stats) are implemented for x86_64 only; "
                          "--no-attach still works")
    return importlib.import_module(f"collectors.engine.{mod}")


# ---- signals ---------------------------------------------------------------
SIGSEGV = signal.SIGSEGV
_DEFERRED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}
_SYNC = (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL,
         signal.SIGTRAP, signal.SIGSYS)
_STOP_SIGNALS = {signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}


class Registry:
    """Per-run state shared by every RemoteProcess of this run:

    - ``quarantine``: (pid, starttime) -> reason.  After a call timed out or
      crashed, no further calls go to that process.
    - ``orphans``: tid -> _Stopped, tracees that did not acknowledge
      PTRACE_INTERRUPT in time; restored and detached as soon as they stop.

    ``reset()`` empties both (tests).  The dicts are cleared in place,
    so the module-level aliases stay valid."""

    def __init__(self):
        self.lock = threading.Lock()
        self.quarantine = {}
        self.orphans = {}

    def reset(self):
        with self.lock:
            self.quarantine.clear()
            self.orphans.clear()


REGISTRY = Registry()


def _bit(sig):
    return 1 << (int(sig) - 1)


_SYNC_BITS = sum(_bit(s) for s in _SYNC)
_ALL_BLOCKABLE = ((1 << 64) - 1) & ~(_bit(signal.SIGKILL) | _bit(signal.SIGSTOP))

# Libraries whose syscall wrappers an idle thread legitimately sits in.
_LIBC_PREFIXES = ("libc.so", "libc-", "ld-linux", "ld-musl", "libc.musl",
                  "libpthread")

ERESTART = safepoints.ERESTART


class SigInfo:
    """A kernel siginfo_t (raw 128 bytes kept for re-injection)."""

    __slots__ = ("raw", "signo", "errno", "code", "pid", "uid", "addr", "value")

    def __init__(self, raw):
        self.raw = raw
        self.signo, self.errno, self.code = struct.unpack_from("iii", raw, 0)
        self.pid, self.uid = struct.unpack_from("iI", raw, 16)
        self.addr, = struct.unpack_from("Q", raw, 16)
        self.value, = struct.unpack_from("q", raw, 24)

    def as_dict(self):
        return {"signo": self.signo, "name": _signame(self.signo), "code": self.code,
                "pid": self.pid, "uid": self.uid, "value": self.value}

    def __repr__(self):
        return f"SigInfo({_signame(self.signo)}, code={self.code}, pid={self.pid})"


def _our_ids():
    return (os.getpid(), threading.get_native_id())


def _signame(sig):
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"SIG{sig}"


# ---- quarantine registry (process-wide) -------------------------------------
_qlock = REGISTRY.lock
_quarantine = REGISTRY.quarantine


def quarantine_reason(pid, procfs="/proc"):
    """Why PID is quarantined, or None."""
    key = (pid, start_time(pid, procfs))
    with _qlock:
        return _quarantine.get(key)


def is_quarantined(pid, procfs="/proc"):
    """True when an earlier call into PID timed out or crashed (this run)."""
    return quarantine_reason(pid, procfs) is not None


def _quarantine_pid(pid, starttime, reason):
    with _qlock:
        _quarantine.setdefault((pid, starttime), reason)


# ---- orphans: tracees we could not stop in time -----------------------------
# A traced thread that does not acknowledge PTRACE_INTERRUPT (uninterruptible
# sleep) cannot be detached until it stops.  It is remembered here and
# restored/detached as soon as it stops (checked at every borrow and at exit).
_orphans = REGISTRY.orphans
_orphan_lock = threading.RLock()


def _reap_orphans():
    with _orphan_lock:
        for tid, st in list(_orphans.items()):
            try:
                status = ptrace.waitpid_nohang(tid, st.pid)
            except Exception:
                _orphans.pop(tid, None)
                continue
            if status is None:
                continue
            kind, _, _ = ptrace.decode_status(status)
            _orphans.pop(tid, None)
            if kind != "stopped":
                continue
            with contextlib.suppress(Exception):
                if st.regs is not None:
                    st.arch.set_regs(tid, st.pid, st.final_regs())
                    st.arch.set_ext_state(tid, st.pid, st.xstate)
                    ptrace.setsigmask(tid, st.pid, st.sigmask)
                ptrace.detach(tid, st.pid, 0)


def detach_orphans(pid, timeout_s=2.0):
    """Restore and detach every thread of PID still held as an orphan, within
    TIMEOUT_S; returns the tids still held (uninterruptible past the deadline:
    the at-exit reaper tries again).  Called when a view closes its process,
    so that nothing stays attached once the user has left it."""
    deadline = time.monotonic() + timeout_s
    while True:
        _reap_orphans()
        with _orphan_lock:
            left = [tid for tid, st in _orphans.items() if st.pid == pid]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)


def _reap_orphans_at_exit():
    deadline = time.monotonic() + 2.0
    while _orphans and time.monotonic() < deadline:
        _reap_orphans()
        time.sleep(0.01)


atexit.register(_reap_orphans_at_exit)


# ---- /proc helpers ------------------------------------------------------------

def _read_bytes(path, pid, tid=None):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ptrace.translate_errno(e.errno, pid, f"read {path}", tid) from None


def _exec_start(sched):
    """se.exec_start (ms, the task's scheduler clock) from /proc/.../sched."""
    for line in sched.splitlines():
        if line.startswith(b"se.exec_start"):
            return float(line.split(b":")[1]) / 1000.0
    return None


def _signed32(v):
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & (1 << 31) else v


def _kib(n):
    return f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} bytes"


def _read_text(path, pid, tid=None):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError as e:
        raise ptrace.translate_errno(e.errno, pid, f"read {path}", tid) from None


def text_ranges(pid, names, procfs="/proc"):
    """Executable mappings of PID whose file name contains any of NAMES,
    as [(start, end, name)], adjacent pieces merged."""
    out = []
    for line in _read_text(f"{procfs}/{pid}/maps", pid).splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or "x" not in parts[1]:
            continue
        path = parts[5].strip()
        base = os.path.basename(path)
        if not any(n in base for n in names):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        if out and out[-1][1] == start and out[-1][2] == base:
            out[-1] = (out[-1][0], end, base)
        else:
            out.append((start, end, base))
    return out


def _status_fields(text):
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


# ---- the engine ----------------------------------------------------------------

class _Stopped:
    """One thread we hold in a ptrace-stop, and everything needed to give it
    back exactly as it was."""

    def __init__(self, arch, pid, tid):
        self.arch = arch
        self.pid = pid
        self.tid = tid
        self.regs = None          # saved general registers
        self.xstate = None        # saved XSAVE blob
        self.sigmask = None       # saved signal mask
        self.mask_changed = False
        self.held = []            # SigInfo collected at signal-delivery-stops
        self.at = None            # 'interrupt' | 'delivery' | 'group'
        self.t_stop = None
        self.gone = False         # the thread exited under us
        self.orphaned = False
        self.group_stop_seen = False
        self.kind = None          # 'idle' | 'running'
        self.syscall = None
        self.boundary = False
        self.calls = 0
        self.scratch_top = None
        self.scratch_low = None
        self.bounds = None        # stackbounds.Bounds of its stack
        self.callee_need = 0      # stack the callee may use below the frame
        self.buffers = []         # [(addr, size)] mappings made by Call.buffer
        self.stack_buffers = 0    # bytes of Call.buffer carved from a roomy stack
        self.category = None      # safepoints.RESTARTABLE | EPOLL | FUTEX | GO_RUNTIME | RUNNING
        self.restart_rax = None   # rax to restore instead of the saved one (EINTR -> restart)
        self.since = None         # monotonic time it last ran before the stop (epoll family)
        self.timeout_ns = None    # its relative timeout as passed (read at the stop)

    def final_regs(self):
        """The registers to give back: the saved ones, with rax =
        -ERESTARTNOHAND when the stop turned a wait's result into -EINTR."""
        if self.restart_rax is None:
            return self.regs
        regs = self.arch.copy_regs(self.regs)
        regs.rax = self.restart_rax & ((1 << 64) - 1)
        return regs


class RemoteProcess:
    """See the module docstring."""

    MAX_SCRATCH = MAX_SCRATCH
    # Stack left free below an output buffer put on a roomy stack (Call.buffer).
    STACK_BUFFER_SPARE = 16 * 1024

    def __init__(self, pid, *, forbidden_ranges=(), deadline_s=2.0, procfs="/proc",
                 call_timeout_s=1.0, block_signals=True, boost=True, stack_window=2048,
                 stack_need=DEFAULT_STACK_NEED, mapper=None, go_runtime=None, _unsafe=()):
        self.pid = int(pid)
        self.procfs = procfs
        self.arch = _load_arch()
        self.deadline_s = float(deadline_s)
        self.call_timeout_s = float(call_timeout_s)
        self.block_signals = bool(block_signals)
        self.boost = bool(boost)
        self.stack_window = int(stack_window)
        # Bytes of stack the called functions use below the frame (measured
        # per allocator entry point, written beside the gather code).
        self.stack_need = int(stack_need)
        # (mmap, munmap) addresses in the target's libc for Call.buffer.
        self.mapper = mapper
        # safepoints.GoRuntime of a Go executable (its runtime's own parks), or None
        self._go = go_runtime
        self._stackmaps = None    # stackbounds.StackMaps of the current round
        self._round_sps = ()      # ((tid, sp), ...) of the current round
        self._parked = False      # no thread of the current round was running
        self._room = {}           # tid -> room seen this borrow (refusal message)
        self._restart_kinds = {}  # tid -> (category, words) of its restart_syscall wait
        rs = sorted((int(s), int(e), str(n)) for s, e, n in forbidden_ranges)
        self._forbidden = rs
        self._in_forbidden = Ranges(rs)     # addr -> the forbidden object's name, or None
        self._judge_stack = None  # safepoints.StackJudge, built when a futex wait is judged
        self._judge_maps = None   # the /proc/PID/maps text it was built from
        # Test-only switches that disable one protection, to show the tests
        # catch its absence: "xstate", "sigsegv_unblock", "sigblock".
        self._unsafe = frozenset(_unsafe)
        self.pause_us = []
        self.held_signals = []
        self.last = None
        self._spin_s = self.SPIN_S
        self.stats = {"borrows": 0, "calls": 0, "rejected_stops": 0,
                      "boundary_stops": 0, "pause_us_total": 0}
        if not ptrace.process_exists(self.pid, procfs):
            raise NoSuchProcess(self.pid)
        self._start = start_time(self.pid, procfs)
        self._auxv = self._read_auxv()
        maps = _read_text(f"{procfs}/{self.pid}/maps", self.pid)
        first = maps.split("-", 1)[0]
        if first and int(first, 16) == 0:
            raise RemoteCallError("address 0 is mapped in the target, so the "
                                  "return-to-0 trap cannot work; no remote calls",
                                  pid=self.pid)
        self._preflight()

    # ---- checks that need no stop -------------------------------------------
    def _read_auxv(self):
        try:
            with open(f"{self.procfs}/{self.pid}/auxv", "rb") as f:
                return f.read()
        except OSError as e:
            raise ptrace.translate_errno(e.errno, self.pid, "read auxv") from None

    def _preflight(self):
        reason = quarantine_reason(self.pid, self.procfs)
        if reason:
            raise Quarantined(f"no remote calls: {reason}", pid=self.pid)
        st = _status_fields(_read_text(f"{self.procfs}/{self.pid}/status", self.pid))
        if start_time(self.pid, self.procfs) != self._start:
            raise NoSuchProcess(self.pid, "the process exited (pid reused)")
        state = st.get("State", "?")[:1]
        if state in ("Z", "X"):
            raise NoSuchProcess(self.pid, "the process exited (zombie)")
        if state == "T":
            raise RemoteCallError(
                "the process is stopped (SIGSTOP / job control); allocdiag never "
                "resumes a stopped process: send it SIGCONT first", pid=self.pid)
        tracer = int(st.get("TracerPid", "0") or 0)
        if tracer and tracer not in _our_ids():
            raise RemoteCallError(f"the process is already traced by pid {tracer} "
                                  "(a debugger?)", pid=self.pid)
        if int(st.get("SigIgn", "0"), 16) & _bit(SIGSEGV):
            raise RemoteCallError(
                "the process ignores SIGSEGV; the return trap of a remote call "
                "would reset it to the default action, so no remote calls are made",
                pid=self.pid)
        if self._read_auxv() != self._auxv:
            raise RemoteCallError("the process executed a new program (exec) since "
                                  "it was opened; open it again", pid=self.pid)

    def _task(self, tid, leaf):
        return f"{self.procfs}/{self.pid}/task/{tid}/{leaf}"

    def _thread_facts(self, tid):
        """(state, nr, args, sp, pc, comm) of TID from /proc, without stopping
        it; nr -1 when it runs user code.  Raises RemoteCallError when the
        thread vanished."""
        stat = _read_text(self._task(tid, "stat"), self.pid, tid)
        sc = _read_text(self._task(tid, "syscall"), self.pid, tid).split()
        comm = stat[stat.find("(") + 1:stat.rfind(")")]
        state = stat.rsplit(")", 1)[1].split()[0]
        nr, args, sp, pc = -1, (), None, None
        if sc and sc[0] != "running":
            nr = int(sc[0])
            if len(sc) >= 9:
                args = tuple(int(x, 16) for x in sc[1:7])
                sp, pc = int(sc[7], 16), int(sc[8], 16)
            elif len(sc) >= 3:
                sp, pc = int(sc[-2], 16), int(sc[-1], 16)
        return state, nr, args, sp, pc, comm

    def _classify(self, tid, nr, args, stopped=False, pc=None):
        """(category, words) of a thread blocked in syscall NR at PC, or
        (None, why).  STOPPED: the thread is in our ptrace-stop, so its wait
        channel no longer says what it waits for (it was checked before the
        stop).  In a Go executable a wait the general rules refuse, or that
        needs a walk Go code cannot give, is judged by the Go runtime rule
        (safepoints.GoRuntime) when its PC is in one of the runtime's stubs."""
        cat, words = self._classify_wait(tid, nr, args, stopped)
        if self._go is not None and (cat in (None, safepoints.FUTEX)
                                     or nr == self.arch.RESTART_SYSCALL):
            go_cat, go_words = self._go.judge(nr, args, pc, self.arch.RESTART_SYSCALL)
            if go_cat is not None:
                return go_cat, go_words
            if go_words is not None and cat is None:
                return None, f"{words}: {go_words}"
        return cat, words

    def _classify_wait(self, tid, nr, args, stopped):
        if nr == self.arch.RESTART_SYSCALL:
            # Judged like any other wait (safepoints.classify_restart); the
            # wait channel is read before the stop (in our stop it says
            # ptrace_stop) and the verdict kept for the stopped thread.
            if not stopped:
                try:
                    wchan = _read_bytes(self._task(tid, "wchan"), self.pid, tid)
                except AllocdiagError:
                    return None, "vanished"
                self._restart_kinds[tid] = safepoints.classify_restart(wchan, args)
            return self._restart_kinds.get(tid, (None, "a wait resumed by restart_syscall "
                                                 "that was not seen before the stop"))
        cat, words = safepoints.classify_wait(nr, args)
        if cat is None and words is None:
            name = self.arch.SYSCALL_NAMES.get(nr, f"syscall {nr}")
            words = f"in {name}"
            if nr in (safepoints.NR_semop, safepoints.NR_semtimedop):
                words += " (a ptrace stop would make it return EINTR)"
            elif name in ("brk", "mmap", "munmap", "mremap", "madvise", "mprotect"):
                words += " (changing its address space, typically for the allocator)"
        return cat, words

    def _candidates(self, only_tid):
        """Threads worth stopping, best first (safepoints.CATEGORY_ORDER), as
        [(tid, category, facts)], and why the others are not."""
        cands, why = [], {}
        try:
            tids = [int(t) for t in os.listdir(f"{self.procfs}/{self.pid}/task")]
        except OSError as e:
            raise ptrace.translate_errno(e.errno, self.pid, "list threads") from None
        if only_tid is not None:
            if only_tid not in tids:
                raise RemoteCallError(f"thread {only_tid} does not exist", pid=self.pid)
            tids = [only_tid]
        facts_of = {}
        for tid in tids:
            try:
                facts_of[tid] = self._thread_facts(tid)
            except (NoSuchProcess, AccessDenied):
                raise
            except RemoteCallError:
                continue            # thread vanished
        # Every thread's stack pointer (blocked threads show it without a
        # stop), and the mappings: a candidate's room is known before it is
        # stopped.  The other threads of the process are listed too (only_tid).
        sps = {tid: f[3] for tid, f in facts_of.items()}
        if only_tid is not None:
            for t in os.listdir(f"{self.procfs}/{self.pid}/task"):
                if int(t) != only_tid:
                    with contextlib.suppress(AllocdiagError):
                        sps[int(t)] = self._thread_facts(int(t))[3]
        self._round_sps = tuple(sps.items())
        # True when no thread runs: every one blocked (in a wait or not)
        self._parked = all(f[0] not in ("R", "D") and f[1] != -1 for f in facts_of.values())
        self._stackmaps = stackbounds.StackMaps(parse_maps(
            _read_bytes(f"{self.procfs}/{self.pid}/maps", self.pid)))
        for tid, (state, nr, args, sp, pc, comm) in facts_of.items():
            facts = {"nr": nr, "args": args, "sp": sp, "pc": pc, "comm": comm, "room": None}
            if comm in safepoints.BACKGROUND_THREAD_COMMS:
                why[tid] = f"{comm}: the allocator's own background thread"
            elif state == "S" and nr >= 0:
                cat, words = self._classify(tid, nr, args, pc=pc)
                if cat is None:
                    why[tid] = words + self._where(pc, sp)
                    continue
                where = self._in_forbidden(pc) if pc is not None else None
                if where and not safepoints.is_libc_name(where):
                    why[tid] = f"{words} issued from inside {where}"
                    continue
                facts["words"] = words
                if cat == safepoints.EPOLL:
                    facts["since"] = self._last_ran(tid)
                cands.append((tid, cat, facts))
            elif state in ("R", "S") and nr == -1:
                if not self._forbidden:
                    why[tid] = "running user code (no forbidden ranges to judge it)"
                elif pc is not None and self._in_forbidden(pc):
                    why[tid] = f"running inside {self._in_forbidden(pc)}"
                else:
                    cands.append((tid, safepoints.RUNNING, facts))
            elif state == "D":
                why[tid] = "uninterruptible sleep (disk or kernel wait)"
            elif state in ("Z", "X"):
                why[tid] = "exited"
            elif state in ("T", "t"):
                why[tid] = "stopped"
            else:
                why[tid] = f"{self.arch.SYSCALL_NAMES.get(nr, f'syscall {nr}')} " \
                           f"(state {state})"
        # A safe point whose stack has no room for the call is no candidate.
        # (Running threads show no stack pointer: judged once stopped.)
        fits = []
        for tid, cat, facts in cands:
            if facts["sp"] is not None and cat != safepoints.RUNNING:
                facts["room"], why_not = self._room_at(
                    tid, facts["sp"], thread_only=cat == safepoints.GO_RUNTIME)
                if why_not:
                    why[tid] = f"{facts.get('words', 'waiting')}: {why_not}"
                    continue
            fits.append((tid, cat, facts))
        cands = fits
        # Best category first; within one, the most room below the stack
        # pointer first (unknown room -- running threads -- last).
        cands.sort(key=lambda c: (safepoints.CATEGORY_ORDER[c[1]],
                                  -(c[2]["room"] if c[2]["room"] is not None else -1)))
        return cands, why

    def _need(self):
        """Bytes a call needs below the red zone: the engine's frame budget
        and the callee's own measured stack use."""
        return FRAME_BUDGET + self.stack_need

    def _room_at(self, tid, sp, fs_base=None, thread_only=False):
        """(room in bytes, None) of thread TID with stack pointer SP, or
        (None, why it is no candidate): outside a provable stack mapping, or
        less room than the call needs.  THREAD_ONLY: only a thread stack
        glibc created counts (the Go runtime rule)."""
        others = tuple((t, s) for t, s in self._round_sps if t != tid)
        bounds, why = self._stackmaps.bounds(sp, fs_base, others)
        if bounds is None:
            return None, why
        if thread_only and bounds.kind != "thread":
            return None, (f"its stack is the {bounds.kind} stack, not a thread stack glibc "
                          "created (the Go runtime rule needs one)")
        room = stackbounds.room(bounds, sp, self.arch.RED_ZONE)
        self._room[tid] = room
        if room < self._need():
            return None, (f"has {_kib(max(room, 0))} of its stack free below the stack "
                          f"pointer; the call needs {_kib(self._need())}")
        return room, None

    def _where(self, pc, sp):
        """' inside X' for a refused wait when a walk with CFI parsed already
        (no parsing, no stop) finds allocator frames; else ''."""
        if self._judge_stack is None or pc is None or sp is None:
            return ""
        try:
            frames = self._judge_stack.unwinder.walk({unwind.RA: pc, unwind.RSP: sp},
                                                     parse=False, partial=True)
        except Exception:
            return ""
        why = self._judge_stack.verdict(frames)
        return f" {why}" if why and why.startswith("inside") else ""

    def _stack_judge(self, refresh=False):
        """The StackJudge of this process (built on first use: only when a
        futex-waiting thread is the next candidate).  REFRESH: rebuild it if
        the mappings changed since (dlopen; parsed tables stay cached)."""
        if self._judge_stack is None or refresh:
            maps = _read_text(f"{self.procfs}/{self.pid}/maps", self.pid)
            if self._judge_stack is None or maps != self._judge_maps:
                self._judge_stack = safepoints.StackJudge(
                    self.pid, maps, self._forbidden, self._try_read, self.procfs)
                self._judge_maps = maps
        return self._judge_stack

    def _try_read(self, addr, n):
        return memory.try_read(self.pid, addr, n)

    # ---- signal blocking in allocdiag -----------------------------------------
    def _block(self):
        if "sigblock" in self._unsafe:
            return None
        return signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED)

    @staticmethod
    def _unblock(old):
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    # ---- waiting ----------------------------------------------------------------
    # Waiting for the tracee: spin only as long as an uncontended round trip
    # takes, then sleep in short steps.  Spinning longer takes a CPU away
    # from the very thread we wait for: on a 2-core box with 8 busy threads a
    # 2 ms spin per round trip made a 40-call jemalloc snapshot stop its
    # thread ~190 ms (measured; see bench/pause.py).
    SPIN_S = 0.0001
    # Rounds after which a process whose threads are all parked, and whose
    # safe points all lack stack room, is refused (_acquire).
    PARKED_ROUNDS = 5
    DEADLINE_SLACK_NS = 1_000_000
    SLEEP_S = 0.00005
    # When a CPU is free for the tracee, spinning takes nothing from it, and
    # sleeping costs the wake-up: a jemalloc stats print runs 0.1-0.3 ms
    # cold, so a 0.1 ms spin then 50 us sleeps ended each such call in a
    # sleep (idle stop 0.63 ms median; spinning up to 2 ms: 0.42 ms, same
    # run, bench/pause.py --stops).  Chosen per borrow by _spin_budget().
    SPIN_FREE_CPU_S = 0.002

    def _spin_budget(self):
        """SPIN_FREE_CPU_S when a CPU is free besides this tracer (so the
        tracee runs on its own while we spin), else SPIN_S.  Read before the
        stop: /proc/loadavg's runnable count includes this thread, so fewer
        runnable tasks than usable CPUs leaves one free."""
        try:
            with open(f"{self.procfs}/loadavg", "rb") as f:
                running = int(f.read().split()[3].split(b"/")[0])
            cpus = len(os.sched_getaffinity(0))
        except (OSError, ValueError, IndexError):
            return self.SPIN_S
        return self.SPIN_FREE_CPU_S if running < cpus else self.SPIN_S

    def _wait(self, st, deadline):
        """Next wait status of the tracee, or None at DEADLINE."""
        t0 = time.monotonic()
        next_check = t0 + 0.05
        while True:
            status = ptrace.waitpid_nohang(st.tid, self.pid)
            if status is not None:
                return status
            now = time.monotonic()
            if now >= deadline:
                return None
            if now - t0 < self._spin_s:
                continue
            if now >= next_check:
                next_check = now + 0.05
                self._check_still_traced(st)
            time.sleep(self.SLEEP_S)

    def _next_stop(self, st, deadline, absorb=True):
        """The next stop of the tracee, classified (``Stop.kind``):

        - ``interrupt``: our PTRACE_INTERRUPT stop;
        - ``group``: a group-stop (SIGSTOP & co, reported as an event stop
          under PTRACE_SEIZE);
        - ``event``: another ptrace event stop;
        - ``return-trap``: the SIGSEGV of a call returning to address 0;
        - ``fault``: a synchronous signal the thread raised itself (crash);
        - ``signal``: any other signal-delivery-stop (asynchronous signal);
        - ``exited``: the tracee is gone (exited or killed);
        - ``timeout``: nothing by DEADLINE (the thread still runs).

        With ABSORB, ``event`` stops are resumed and ``signal`` stops are
        collected into ``st.held`` (suppressed now, re-delivered with their
        siginfo at the release) and resumed, so the caller sees only the
        other kinds.  The one place that reads tracee stops."""
        while True:
            status = self._wait(st, deadline)
            if status is None:
                return Stop("timeout", 0, None, None)
            k, sig, event = ptrace.decode_status(status)
            if k != "stopped":
                return Stop("exited", sig, None, None)
            if event == ptrace.PTRACE_EVENT_STOP:
                return Stop("group" if sig in _STOP_SIGNALS else "interrupt", sig, None, None)
            if event:
                if absorb:
                    ptrace.cont(st.tid, self.pid, 0)
                    continue
                return Stop("event", sig, None, None)
            si = SigInfo(ptrace.getsiginfo(st.tid, self.pid))
            regs = self.arch.get_regs(st.tid, self.pid)
            if self.arch.is_return_trap(regs, si):
                return Stop("return-trap", sig, si, regs)
            if si.signo in _SYNC and si.code > 0:
                return Stop("fault", sig, si, regs)
            if absorb:
                st.held.append(si)
                ptrace.cont(st.tid, self.pid, 0)
                continue
            return Stop("signal", sig, si, regs)

    def _check_still_traced(self, st):
        try:
            f = _status_fields(_read_text(self._task(st.tid, "status"), self.pid, st.tid))
        except (NoSuchProcess, RemoteCallError):
            st.gone = True
            raise self._gone_error(st) from None
        # TracerPid names the tracer *thread* (our tid), not our tgid
        if int(f.get("TracerPid", "0") or 0) not in _our_ids():
            st.gone = True
            raise self._gone_error(st)

    def _gone_error(self, st, when="while stopped"):
        """Classify a vanished tracee: process exited, exec'd, or only the
        thread exited.  The process state lags the thread's exit a little
        (exit_group kills threads one by one), so look for up to 0.3 s."""
        t_end = time.monotonic() + 0.3
        while True:
            if not ptrace.process_exists(self.pid, self.procfs) or \
                    start_time(self.pid, self.procfs) != self._start:
                return NoSuchProcess(self.pid, f"the process exited {when}")
            try:
                f = _status_fields(_read_text(f"{self.procfs}/{self.pid}/status",
                                              self.pid))
                if f.get("State", "")[:1] in ("Z", "X"):
                    return NoSuchProcess(self.pid, f"the process exited {when}")
                if self._read_auxv() != self._auxv:
                    return RemoteCallError(f"the process executed a new program {when}",
                                           pid=self.pid)
            except NoSuchProcess:
                return NoSuchProcess(self.pid, f"the process exited {when}")
            except Exception:
                pass
            if time.monotonic() >= t_end:
                return RemoteCallError(f"thread {st.tid} exited {when}", pid=self.pid)
            # reap our tracee if it is a zombie, then look again
            with contextlib.suppress(Exception):
                ptrace.waitpid_nohang(st.tid, self.pid)
            time.sleep(0.005)

    # ---- acquiring a thread ---------------------------------------------------
    def _stop(self, tid, kind):
        """SEIZE + INTERRUPT TID and wait for the interrupt-stop.  Returns the
        _Stopped (state saved) or raises _Skip."""
        st = _Stopped(self.arch, self.pid, tid)
        st.kind = kind
        try:
            ptrace.seize(tid, self.pid)
        except AccessDenied:
            f = {}
            with contextlib.suppress(Exception):
                f = _status_fields(_read_text(self._task(tid, "status"), self.pid, tid))
            tracer = int(f.get("TracerPid", "0") or 0)
            if tracer:
                raise _Skip(f"traced by pid {tracer}") from None
            raise
        except NoSuchProcess:
            raise
        except RemoteCallError:
            raise _Skip("vanished") from None
        try:
            ptrace.interrupt(tid, self.pid)
        except RemoteCallError:
            st.gone = True      # died between SEIZE and INTERRUPT
            if not ptrace.process_exists(self.pid, self.procfs):
                raise NoSuchProcess(self.pid) from None
            raise _Skip("vanished") from None
        deadline = time.monotonic() + max(1.0, self.deadline_s)
        try:
            stop = self._next_stop(st, deadline)
        except NoSuchProcess:
            raise
        except RemoteCallError:
            raise _Skip("vanished") from None
        if stop.kind == "timeout":
            # not stopping (uninterruptible): it stops later; detach then.
            st.orphaned = True
            with _orphan_lock:
                _orphans[tid] = st
            raise _Skip("did not stop (uninterruptible)")
        if stop.kind == "exited":
            if not ptrace.process_exists(self.pid, self.procfs):
                raise NoSuchProcess(self.pid, "the process exited")
            raise _Skip("exited")
        if stop.kind in ("fault", "return-trap"):
            # the thread faulted in its own code: hand it over untouched
            ptrace.detach(tid, self.pid, stop.si.signo)
            raise _Skip(f"handling its own {_signame(stop.si.signo)}")
        st.t_stop = time.monotonic()
        st.at = stop.kind                 # 'interrupt' or 'group'
        # save everything first: from here on _release gives it back exactly
        st.regs = self.arch.get_regs(tid, self.pid)
        st.xstate = self.arch.get_ext_state(tid, self.pid)
        st.sigmask = ptrace.getsigmask(tid, self.pid)
        return st

    def _judge(self, st):
        """None when ST is at a safe point, else the reason it is not."""
        if st.at == "group":
            return "group-stop"
        nr, ret = self.arch.syscall_state(st.regs)
        eintr_fix = None
        if nr >= 0 and ret == -safepoints.EINTR and nr in safepoints.EINTR_RESTARTABLE:
            # The stop made this wait return EINTR: whether borrowed or not,
            # give it back as -ERESTARTNOHAND, so the kernel restarts it (or
            # returns EINTR if a signal with a handler is delivered on the
            # way out, as it would have without us).
            eintr_fix = self._eintr_restartable(st)
            if eintr_fix is None:
                st.restart_rax = -safepoints.ERESTARTNOHAND
                st.timeout_ns = self._timeout_arg(st.regs)
        if nr >= 0:
            cat, name = self._classify(st.tid, nr, self.arch.syscall_args(st.regs),
                                       stopped=True, pc=self.arch.pc(st.regs))
            if cat is None:
                return name
            # The wait must not have been issued by the allocator itself (e.g.
            # a spin-lock back-off sleep): PC may be in libc's syscall wrapper,
            # but no forbidden non-libc text.
            bad = self._idle_caller_check(st)
            if bad:
                return f"{name} {bad}"
            if ret == -safepoints.EINTR and st.restart_rax is None:
                return f"{name}: returned EINTR at the stop and cannot be restarted " \
                       f"({eintr_fix or 'not a wait'}); released"
            if cat == safepoints.FUTEX:
                why = self._stack_judge().judge(unwind.regs_from_user(st.regs))
                if why:
                    return f"{name}: {why}"
            elif nr == self.arch.RESTART_SYSCALL and cat != safepoints.GO_RUNTIME:
                why = self._walk_resumed(st)
                if why:
                    return f"{name}: {why}"
                name = st.syscall or name
            tight = self._fit(st, thread_only=cat == safepoints.GO_RUNTIME)
            if tight:
                return f"{name}: {tight}"
            st.syscall = name
            st.category = cat
            st.boundary = ret not in ERESTART and st.restart_rax is None
            st.kind = "idle"
            return None
        # in user code
        if not self._forbidden:
            return "running user code (no forbidden ranges to judge it)"
        where = self._in_forbidden(self.arch.pc(st.regs))
        if where:
            return f"running inside {where}"
        # Two checks, both must pass: a CFI walk finds allocator frames at
        # any depth (and refuses signal frames: a handler may have
        # interrupted malloc), and the scan of the stack top refuses any
        # return-address-looking word into libc or the allocator (it also
        # covers JIT or unmapped code, where no walk is possible).
        walked = self._walk_running(st)
        if walked:
            return walked
        sp = self.arch.sp(st.regs)
        for addr, word in self._stack_words(sp, self.stack_window):
            where = self._in_forbidden(word)
            if where:
                return f"running: return address into {where} at sp+{addr - sp:#x}"
        tight = self._fit(st)
        if tight:
            return f"running: {tight}"
        st.kind = "running"
        st.category = safepoints.RUNNING
        return None

    def _fit(self, st, thread_only=False):
        """None when the stopped thread's own stack mapping has room for
        the call (its fs_base now known), with ST.bounds set; else why not."""
        sp = self.arch.sp(st.regs)
        room, why = self._room_at(st.tid, sp, self.arch.thread_pointer(st.regs), thread_only)
        if why:
            return why
        st.bounds, _ = self._stackmaps.bounds(sp, self.arch.thread_pointer(st.regs))
        st.callee_need = self.stack_need
        return None

    def _walk_running(self, st):
        """CFI walk of a running thread: "" when every frame lies outside
        allocator code, a refusal reason when one does not or when the walk
        meets a signal frame or PLT stub (a handler may have interrupted
        malloc), None when no walk is possible."""
        judge = self._judge_stack
        if judge is None:
            return None
        try:
            frames = judge.unwinder.walk(unwind.regs_from_user(st.regs), parse=False)
        except unwind.NeedsParse:
            return None
        except unwind.UnwindError as e:
            if "expression" in str(e):
                return f"running: stack not provable ({e})"
            return None
        except Exception:
            return None
        where = judge.allocator_frame(frames)
        return f"running: called from {where}" if where else ""

    def _last_ran(self, tid):
        """CLOCK_MONOTONIC seconds at which TID last ran (it went to sleep
        then), or None: se.exec_start of /proc/PID/task/TID/sched, the
        scheduler's task clock of the CPU it slept on, moved onto
        CLOCK_MONOTONIC by that CPU's offset (_clock_offset)."""
        try:
            sched = _read_bytes(self._task(tid, "sched"), self.pid, tid)
            stat = _read_bytes(self._task(tid, "stat"), self.pid, tid)
            cpu = int(stat.rsplit(b")", 1)[1].split()[36])     # field 39: processor
        except (AllocdiagError, ValueError, IndexError):
            return None
        theirs = _exec_start(sched)
        offset = self._clock_offset(cpu)
        return None if theirs is None or offset is None else theirs + offset

    def _clock_offset(self, cpu):
        """CLOCK_MONOTONIC minus CPU's scheduler task clock, in seconds.
        The task clock leaves out IRQ and steal time, so it drifts from
        CLOCK_MONOTONIC differently on each CPU: measured on that CPU, by
        this thread waking there from a short sleep (the scheduler sets
        exec_start as it picks the thread) and reading its own exec_start
        at once; the smallest of three (the least delay after the pick)."""
        try:
            old = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {cpu})
        except OSError:
            return None
        try:
            best = None
            for _ in range(3):
                time.sleep(0.00002)
                with open("/proc/thread-self/sched", "rb") as f:
                    ours = _exec_start(f.read())
                now = time.monotonic()
                if ours is not None and (best is None or now - ours < best):
                    best = now - ours
            return best
        except OSError:
            return None
        finally:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, old)

    def _keep_deadline(self, st, regs):
        """REGS with the timeout of an epoll-family wait given back for a
        restart (rax -ERESTARTNOHAND) cut to what is left of it.  The kernel
        re-executes the syscall with its arguments as they are, and these
        waits take a relative timeout: without this, each stop would restart
        the full timeout again (measured: a 1 s epoll_wait took 3.2 s under
        10 snapshots).  epoll_wait/epoll_pwait: milliseconds in the 4th
        argument register; epoll_pwait2/rt_sigtimedwait: a timespec pointer,
        pointed at a copy holding the remaining time, written at the top of
        this borrow's scratch (inside the thread's stack bounds, below the
        red zone; the kernel reads it as the syscall restarts)."""
        if st.restart_rax is None or st.since is None or st.timeout_ns is None:
            return regs
        nr, _ = self.arch.syscall_state(regs)
        # What is left, plus DEADLINE_SLACK_NS: the estimate of when the wait
        # began is good to tens of microseconds, and a wait must never end
        # before its deadline (epoll_wait's milliseconds are rounded up).
        left = max(0, st.timeout_ns - int((time.monotonic() - st.since) * 1e9)) + \
            self.DEADLINE_SLACK_NS
        if nr in safepoints.TIMEOUT_MS_ARG:
            regs = self.arch.copy_regs(regs)
            self.arch.set_syscall_arg(regs, safepoints.TIMEOUT_MS_ARG[nr], -(-left // 1_000_000))
            return regs
        if st.bounds is None:
            # a stop refused before its stack was bounded: nowhere proven to
            # put the timespec; the wait restarts its whole timeout (bounded
            # by it), as the kernel's own restart would
            return regs
        regs = self.arch.copy_regs(regs)
        at = ((st.scratch_top or self._scratch_top(st)) - 16) & ~15
        ts = struct.pack("<qq", left // 1_000_000_000, left % 1_000_000_000)
        self._check_frame(st, [(at, ts)], at)
        memory.write(self.pid, at, ts)
        self.arch.set_syscall_arg(regs, safepoints.TIMESPEC_ARG[nr], at)
        return regs

    def _timeout_arg(self, regs):
        """The finite relative timeout (ns) an epoll-family wait was called
        with, read at the stop (before any call reuses the stack), or None
        (infinite, non-blocking, unreadable, or not such a wait)."""
        nr, _ = self.arch.syscall_state(regs)
        args = self.arch.syscall_args(regs)
        if nr in safepoints.TIMEOUT_MS_ARG:
            ms = _signed32(args[safepoints.TIMEOUT_MS_ARG[nr]])
            return ms * 1_000_000 if ms > 0 else None
        if nr in safepoints.TIMESPEC_ARG:
            ptr = args[safepoints.TIMESPEC_ARG[nr]]
            ts = memory.try_read(self.pid, ptr, 16) if ptr else None
            if ts is None:
                return None
            sec, nsec = struct.unpack("<qq", ts)
            return sec * 1_000_000_000 + nsec if sec >= 0 and 0 <= nsec < 1_000_000_000 \
                else None
        return None

    def _eintr_restartable(self, st):
        """None when a wait that holds -EINTR at the stop may be restored
        with -ERESTARTNOHAND: a 64-bit `syscall` instruction just before rip
        (int 0x80 is also 2 bytes but uses i386 numbers) and orig_rax >= 0
        (else the kernel would not restart and -514 would reach the program)."""
        regs = st.regs
        if self.arch.code_segment(regs) != safepoints.USER_CS_64:
            return "not 64-bit code"
        nr, _ = self.arch.syscall_state(regs)
        if nr < 0:
            return "no syscall to restart"
        insn = self._try_read(self.arch.pc(regs) - len(safepoints.SYSCALL_INSN),
                              len(safepoints.SYSCALL_INSN))
        if insn != safepoints.SYSCALL_INSN:
            return "no syscall instruction before the pc"
        return None

    def _walk_resumed(self, st):
        """A sleep or poll resumed by restart_syscall: None when an
        .eh_frame walk from the stopped registers (CFI parsed before the
        stop) reaches the program's own frames with none in allocator code
        (gperftools' spin lock sleeps in nanosleep), else why not."""
        judge = self._stack_judge()
        try:
            frames = judge.unwinder.walk(unwind.regs_from_user(st.regs), parse=False)
        except unwind.NeedsParse as e:
            return f"stack walk needs {os.path.basename(e.path)}'s CFI (parsed for the next try)"
        except Exception as e:      # any failure: not proven
            return f"stack walk failed ({e})"
        where = judge.allocator_frame(frames)
        if where:
            return where
        if len(frames) < 2:
            return "stack walk found no caller"
        fn = judge.libc_function(frames[0])
        if fn:
            st.syscall = f"{fn} (resumed by restart_syscall)"
        return None

    def _idle_caller_check(self, st):
        """An idle wait must not be a raw syscall instruction inside allocator
        text.  (The stack above a libc wrapper is not scanned: its frame holds
        stale words -- an idle main thread in read() had a stale tcmalloc
        return address at sp+0 -- and allocators park on futexes, which are
        never borrowed anyway.)"""
        pc_where = self._in_forbidden(self.arch.pc(st.regs))
        if pc_where and not pc_where.startswith(_LIBC_PREFIXES):
            return f"issued from {pc_where}"
        return None

    def _stack_words(self, sp, window):
        out = []
        addr, end = sp, sp + window
        while addr < end:
            chunk = min(end - addr, 4096 - (addr % 4096))
            data = memory.try_read(self.pid, addr, chunk)
            if data is None:
                break
            w = self.arch.WORD
            for i in range(0, len(data) - w + 1, w):
                out.append((addr + i, int.from_bytes(data[i:i + w], "little")))
            addr += chunk
        return out

    def _acquire(self, only_tid):
        """Returns (stopped thread, old allocdiag sigmask)."""
        t_end = time.monotonic() + self.deadline_s
        last_why = {}
        rounds = 0
        parked_rounds = 0
        fresh_maps = False
        while True:
            rounds += 1
            cands, why = self._candidates(only_tid)
            last_why.update(why)
            if not cands and self._parked and any("the call needs" in r for r in why.values()):
                # Every thread is parked and the safe points among them have
                # too little stack: nothing changes before the program acts,
                # so a few rounds decide it (no 2 s wait for the same answer).
                parked_rounds += 1
                if parked_rounds >= self.PARKED_ROUNDS:
                    raise RemoteCallError(self._refusal(last_why, only_tid), pid=self.pid)
            else:
                parked_rounds = 0
            for tid, cat, facts in cands:
                if cat == safepoints.GO_RUNTIME:
                    pass            # proven by its stub's range: no walk
                elif cat == safepoints.FUTEX or facts["nr"] == self.arch.RESTART_SYSCALL:
                    # Parse the CFI the walk needs now, before the stop (the
                    # parse is not time spent waiting for a safe point).
                    t0 = time.monotonic()
                    judge = self._stack_judge(refresh=not fresh_maps)
                    fresh_maps = True
                    pre = judge.prepare(facts["pc"], facts["sp"]) \
                        if facts["pc"] is not None else None
                    t_end += time.monotonic() - t0
                    if pre:
                        last_why[tid] = f"{facts['words']} {pre}"
                        continue
                elif cat == safepoints.RUNNING and self._forbidden:
                    # Its stack is walked while stopped: load every object's
                    # CFI index now (once per file per run; not waiting time).
                    t0 = time.monotonic()
                    judge = self._stack_judge(refresh=not fresh_maps)
                    if not fresh_maps:
                        judge.load_tables()
                    fresh_maps = True
                    t_end += time.monotonic() - t0
                old = self._block()
                st = None
                try:
                    st = self._stop(tid, "idle" if cat != safepoints.RUNNING else "running")
                    st.since = facts.get("since")
                    reason = self._judge(st)
                except _Skip as s:
                    self._unblock(old)
                    last_why[tid] = s.reason
                    continue
                except BaseException:
                    if st is not None and not st.gone:
                        with contextlib.suppress(Exception):
                            self._release(st)
                    self._unblock(old)
                    raise
                if reason is None:
                    last_why.pop(tid, None)
                    return st, old
                last_why[tid] = reason
                self.stats["rejected_stops"] += 1
                try:
                    self._release(st)
                finally:
                    self._unblock(old)
                if reason == "group-stop":
                    raise RemoteCallError(
                        "the process is stopped (SIGSTOP / job control); allocdiag "
                        "never resumes a stopped process: send it SIGCONT first",
                        pid=self.pid)
            if time.monotonic() >= t_end:
                raise RemoteCallError(self._refusal(last_why, only_tid), pid=self.pid)
            self._preflight()
            time.sleep(0.001 if rounds < 20 else 0.005)

    def _refusal(self, why, only_tid):
        """Per thread, what it was doing and why it was not borrowed, and
        what the user can do."""
        detail = "; ".join(f"tid {t} {r}" for t, r in sorted(why.items())[:12])
        if len(why) > 12:
            detail += f"; ... ({len(why) - 12} more threads)"
        secs = f"{self.deadline_s:g}"
        need = self._need()
        if any("the call needs" in r for r in why.values()):
            # Safe points existed but their stacks were too small: say so
            # first (the per-thread detail follows).
            head = (f"no thread has room for the call: largest room "
                    f"{_kib(max(0, max(self._room.values(), default=0)))}, the call needs "
                    f"{_kib(need)}")
            return f"{head}: {detail}"
        if only_tid is not None:
            head = f"thread {only_tid} was never at a safe point for {secs} s"
            return f"{head}: {detail}" if detail else head
        if why and self._forbidden and all(r.startswith(("running", "in "))
                                                   for r in why.values()):
            head = (f"every thread was busy inside the allocator or libc for {secs} s "
                    "(none parked in a wait, none interrupted outside allocator/libc text)")
        else:
            head = f"no thread could be borrowed safely within {secs} s"
        hint = ("; what to do: try again (threads move between waits), give it more "
                "time, or read what needs no call into the process (--no-attach)")
        return (f"{head}: {detail}" if detail else head) + hint

    # ---- running code in the thread -------------------------------------------
    def _call_mask(self, st):
        if "sigsegv_unblock" in self._unsafe:
            return st.sigmask
        if self.block_signals:
            return _ALL_BLOCKABLE & ~_SYNC_BITS
        return st.sigmask & ~_SYNC_BITS

    def _set_call_mask(self, st, mask):
        ptrace.setsigmask(st.tid, self.pid, mask)
        st.mask_changed = True

    def _resume_until_trap(self, st, deadline):
        """CONT and handle stops until the return-to-0 trap.  Returns the
        registers at the trap, or None at DEADLINE (thread still running)."""
        ptrace.cont(st.tid, self.pid, 0)
        st.at = None
        while True:
            stop = self._next_stop(st, deadline)
            if stop.kind == "timeout":
                return None
            if stop.kind == "exited":
                st.gone = True
                raise self._gone_error(st, "during the call")
            if stop.kind == "return-trap":
                st.at = "delivery"
                return stop.regs
            if stop.kind == "fault":
                st.at = "delivery"
                raise _Crash(stop.si, stop.regs)
            if stop.kind == "group":
                # SIGSTOP/SIGTSTP while calling: finish the call; after the
                # detach the thread joins the group-stop.
                st.group_stop_seen = True
            ptrace.cont(st.tid, self.pid, 0)

    def _call(self, st, func, args, timeout_s):
        if st.gone or st.orphaned:
            raise RemoteCallError(f"thread {st.tid} is no longer usable", pid=self.pid)
        new, writes, lowest = self.arch.prepare_call(st.regs, func, args, st.scratch_low)
        self._check_frame(st, writes, lowest - st.callee_need)
        for addr, data in writes:
            memory.write(self.pid, addr, data)
        mask = self._call_mask(st)
        if not st.mask_changed and mask != st.sigmask:
            self._set_call_mask(st, mask)
        self.arch.set_regs(st.tid, self.pid, new)
        timeout = self.call_timeout_s if timeout_s is None else float(timeout_s)
        try:
            regs = self._resume_until_trap(st, time.monotonic() + timeout)
        except _Crash as c:
            why = (f"the call to {func:#x} on thread {st.tid} crashed with "
                   f"{_signame(c.si.signo)} (code {c.si.code}, address {c.si.addr:#x}, "
                   f"pc {self.arch.pc(c.regs):#x}); the thread was restored")
            _quarantine_pid(self.pid, self._start, why)
            raise RemoteCallError(why + "; process quarantined", pid=self.pid) from None
        if regs is None:
            regs = self._timeout(st, func, timeout)
        st.calls += 1
        self.stats["calls"] += 1
        return self.arch.return_value(regs)

    def _check_frame(self, st, writes, lowest_used):
        """Every frame byte, and the callee's stack use down to LOWEST_USED,
        inside the thread's stack bounds and below its red zone; else no
        call is made.  (Candidates were chosen with this room: a failure
        here is a bug, refused before any write.)"""
        top = self.arch.sp(st.regs) - self.arch.RED_ZONE
        floor = st.bounds.floor if st.bounds is not None else None
        for addr, data in writes:
            if floor is None or addr < floor or addr + len(data) > top:
                raise RemoteCallError(
                    f"call frame at {addr:#x} outside thread {st.tid}'s stack bounds; "
                    "no call made", pid=self.pid)
        if lowest_used < floor:
            raise RemoteCallError(
                f"thread {st.tid}: the call needs {_kib(top - lowest_used)} of stack, "
                f"only {_kib(max(top - floor, 0))} is free in its stack; no call made",
                pid=self.pid)

    def _buffer(self, st, n):
        """N bytes for an output buffer, starting with a NUL.  On the stack
        when the thread's measured room holds it, the callee's need and
        STACK_BUFFER_SPARE below it (saves the mmap/munmap round trips,
        ~70-110 us a stop: bench/pause.py --scratch); else a mapping."""
        low = (st.scratch_low - int(n)) & ~(self.arch.STACK_ALIGN - 1)
        if st.bounds is not None and \
                low - st.callee_need - self.STACK_BUFFER_SPARE >= st.bounds.floor:
            st.stack_buffers += st.scratch_low - low
            st.scratch_low = low
            memory.write(self.pid, low, b"\0")
            return low
        return self._map_buffer(st, n)

    def _map_buffer(self, st, n):
        """N zeroed bytes in a private anonymous mapping the borrowed thread
        makes with libc mmap (async-signal-safe, takes no allocator lock)."""
        if not self.mapper or not all(self.mapper):
            raise RemoteCallError("no buffer outside the stack: libc mmap/munmap not "
                                  "resolved in the target", pid=self.pid)
        size = -(-int(n) // PAGE_SIZE) * PAGE_SIZE
        mem = self._call(st, self.mapper[0], (0, size, PROT_READ | PROT_WRITE,
                                              MAP_PRIVATE | MAP_ANONYMOUS, (1 << 64) - 1, 0), None)
        if mem == 0 or mem >= MAP_FAILED_MIN:
            raise RemoteCallError(f"mmap of {size} bytes failed in the target "
                                  f"(errno {(-mem) & 0xFFF if mem else '?'})", pid=self.pid)
        st.buffers.append((mem, size))
        return mem

    def _unmap_buffers(self, st):
        """munmap every Call.buffer mapping, newest first, before the release."""
        while st.buffers and not (st.gone or st.orphaned):
            mem, size = st.buffers.pop()
            self._call(st, self.mapper[1], (mem, size), None)

    def _timeout(self, st, func, timeout):
        why = (f"a call to {func:#x} on thread {st.tid} did not return within "
               f"{timeout:g} s; its allocator may now hold a lock forever, so "
               "allocdiag makes no further remote calls to this process in this run")
        _quarantine_pid(self.pid, self._start, why)
        ptrace.interrupt(st.tid, self.pid)
        stop = self._next_stop(st, time.monotonic() + 2.0)
        if stop.kind == "timeout":
            st.orphaned = True
            with _orphan_lock:
                _orphans[st.tid] = st
            raise RemoteCallError(why + " (the thread could not be stopped to "
                                  "restore it; it will be restored when it stops)",
                                  pid=self.pid)
        if stop.kind == "exited":
            st.gone = True
            raise self._gone_error(st, "during the call")
        if stop.kind in ("interrupt", "group"):
            st.at = stop.kind
            with contextlib.suppress(Exception):
                regs = self.arch.get_regs(st.tid, self.pid)
                nr, _ = self.arch.syscall_state(regs)
                where = (f"in {self.arch.SYSCALL_NAMES.get(nr, nr)}" if nr >= 0
                         else "running")
                why += f" [it was {where} at pc {self.arch.pc(regs):#x}]"
        else:                       # return-trap (it returned after all) or fault
            st.at = "delivery"
        raise RemoteCallError(why + " (thread restored and released)", pid=self.pid)

    # ---- giving the thread back -------------------------------------------------
    def _retrap(self, st):
        """Bring the thread to a signal-delivery-stop (needed to inject a
        signal) by letting it 'call' address 0: it faults at once."""
        new, writes, lowest = self.arch.prepare_call(st.regs, 0, (), st.scratch_low)
        self._check_frame(st, writes, lowest)
        for addr, data in writes:
            memory.write(self.pid, addr, data)
        self.arch.set_regs(st.tid, self.pid, new)
        if self._resume_until_trap(st, time.monotonic() + 2.0) is None:
            raise RemoteCallError("thread did not reach the re-delivery trap",
                                  pid=self.pid)

    def _redeliver(self, st):
        """Requeue all held signals but one (kernel queues them, siginfo
        intact), return the one to inject at the detach."""
        if st.scratch_low is None:
            st.scratch_low = st.scratch_top = self._scratch_top(st)
        segv = [h for h in st.held if h.signo == SIGSEGV]
        direct = segv[0] if segv else st.held[0]
        done = {id(direct)}
        for _ in range(64):
            todo = [h for h in st.held if id(h) not in done and h.signo != SIGSEGV]
            if not todo:
                break
            h = todo[0]
            done.add(id(h))
            if st.at != "delivery":
                self._retrap(st)
            self._set_call_mask(st, (self._call_mask(st) | _bit(h.signo)) & ~_bit(SIGSEGV))
            ptrace.setsiginfo(st.tid, self.pid, h.raw)
            # blocked -> the kernel requeues it with this siginfo; the thread
            # then faults at 0 again: a new signal-delivery-stop.
            ptrace.cont(st.tid, self.pid, h.signo)
            st.at = None
            deadline = time.monotonic() + 2.0
            while st.at != "delivery":
                stop = self._next_stop(st, deadline)
                if stop.kind == "timeout":
                    raise RemoteCallError("thread did not return to the re-delivery "
                                          "trap", pid=self.pid)
                if stop.kind == "exited":
                    st.gone = True
                    raise self._gone_error(st)
                if stop.kind == "return-trap":
                    st.at = "delivery"
                elif stop.kind == "fault":
                    st.held.append(stop.si)
                    ptrace.cont(st.tid, self.pid, 0)
                else:
                    ptrace.cont(st.tid, self.pid, 0)
        if st.at != "delivery":
            self._retrap(st)
        return direct

    def _release(self, st):
        """Restore registers, vector state and mask exactly, re-deliver held
        signals, detach.  Records the pause."""
        if st.gone or st.orphaned:
            return
        try:
            direct = self._redeliver(st) if st.held else None
            self.arch.set_regs(st.tid, self.pid, self._keep_deadline(st, st.final_regs()))
            if "xstate" not in self._unsafe:
                self.arch.set_ext_state(st.tid, self.pid, st.xstate)
            if st.mask_changed:
                ptrace.setsigmask(st.tid, self.pid, st.sigmask)
            if direct is not None:
                ptrace.setsiginfo(st.tid, self.pid, direct.raw)
                ptrace.detach(st.tid, self.pid, direct.signo)
            else:
                ptrace.detach(st.tid, self.pid, 0)
        except (NoSuchProcess, RemoteCallError):
            if not ptrace.process_exists(self.pid, self.procfs):
                raise NoSuchProcess(self.pid, "the process exited while stopped") from None
            raise
        finally:
            if st.t_stop is not None:
                us = int((time.monotonic() - st.t_stop) * 1e6)
                self.pause_us.append(us)
                self.stats["pause_us_total"] += us
            self.held_signals.extend(h.as_dict() for h in st.held)

    def _scratch_top(self, st):
        sp = self.arch.sp(st.regs)
        return (sp - self.arch.RED_ZONE - 64) & ~(self.arch.STACK_ALIGN - 1)

    # ---- public -------------------------------------------------------------------
    @contextlib.contextmanager
    def borrow(self, tid=None):
        """Stop one safe thread (or only TID) and yield a Call on it."""
        _reap_orphans()
        self.pause_us = []
        self.held_signals = []
        self.last = None
        self._room = {}
        self._restart_kinds = {}
        ptrace.set_timerslack_ns(1000)
        self._preflight()
        self._spin_s = self._spin_budget()
        st, old = self._acquire(tid)
        boosted = None
        try:
            st.scratch_top = st.scratch_low = self._scratch_top(st)
            if st.boundary:
                self.stats["boundary_stops"] += 1
            self.stats["borrows"] += 1
            boosted = _boost(st.tid) if self.boost else None
            yield Call(self, st)
        finally:
            try:
                try:
                    self._unmap_buffers(st)
                finally:
                    _unboost(st.tid, boosted)
                    self._release(st)
            finally:
                self.last = {"tid": st.tid, "kind": st.kind, "syscall": st.syscall,
                             "category": st.category, "restarted_eintr":
                             st.restart_rax is not None, "boundary": st.boundary, "calls": st.calls,
                             "group_stop_seen": st.group_stop_seen}
                self._unblock(old)


def _boost(tid):
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
        os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(1))
    except (PermissionError, OSError, AttributeError):
        return None
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except OSError:
        pass
    return saved


def _unboost(tid, saved):
    if saved is None:
        return
    try:
        os.sched_setscheduler(0, saved[2], saved[3])
    except OSError:
        pass
    try:
        os.sched_setscheduler(tid, saved[0], saved[1])
    except OSError:
        pass


class Call:
    """A borrowed thread (yielded by RemoteProcess.borrow)."""

    def __init__(self, rp, st):
        self._rp = rp
        self._st = st
        self.tid = st.tid
        self.kind = st.kind
        self.syscall = st.syscall
        self.category = st.category  # safepoints.RESTARTABLE|EPOLL|FUTEX|GO_RUNTIME|RUNNING
        self.max_args = rp.arch.MAX_ARGS

    def call(self, func_addr, *args, timeout_s=None):
        """Call FUNC_ADDR(*ARGS) (integer args) in the thread; returns rax."""
        return self._rp._call(self._st, int(func_addr), args, timeout_s)

    def read(self, addr, n):
        return memory.read(self._rp.pid, addr, n)

    def write(self, addr, data):
        """Write DATA at ADDR, which must lie in this borrow's scratch or
        buffers (the only target memory allocdiag writes outside a call
        frame: docs/target-writes.md)."""
        st, n = self._st, len(data)
        inside = st.scratch_low <= addr and addr + n <= st.scratch_top or any(
            m <= addr and addr + n <= m + size for m, size in st.buffers)
        if not inside:
            raise RemoteCallError(f"refusing to write {n} bytes at {addr:#x}: not in this "
                                  "call's scratch or buffers", pid=self._rp.pid)
        memory.write(self._rp.pid, addr, data)

    def scratch(self, n):
        """Address of N bytes (16-aligned) on the thread's stack below the red
        zone; valid until the borrow ends; nothing to free.  For small things
        (names, out-values): MAX_SCRATCH bytes in all; output buffers come
        from ``buffer``."""
        st = self._st
        low = (st.scratch_low - int(n)) & ~(self._rp.arch.STACK_ALIGN - 1)
        if st.scratch_top - low - st.stack_buffers > self._rp.MAX_SCRATCH:
            raise RemoteCallError(f"stack scratch limit {self._rp.MAX_SCRATCH} bytes "
                                  "exceeded (use Call.buffer for output buffers)",
                                  pid=self._rp.pid)
        st.scratch_low = low
        return low

    def buffer(self, n):
        """Address of N bytes for an output buffer, starting with a NUL:
        a private anonymous mapping the thread makes (one mmap call),
        unmapped (one munmap call) before the thread is released -- or,
        when the thread's measured stack room holds the buffer with the
        callee's need and STACK_BUFFER_SPARE to spare, below the scratch on
        its stack.  Never a stack without that room."""
        return self._rp._buffer(self._st, n)

    def cstring(self, addr, limit=1 << 20):
        """The NUL-terminated string at ADDR, cut at LIMIT bytes.  Each read
        (up to CSTRING_CHUNK) ends on a page boundary, so it can fault only on
        a page past the string's end; such a read is retried up to its first
        page boundary."""
        out, total = [], 0
        while total < limit:
            n = min(CSTRING_CHUNK - addr % PAGE_SIZE, limit - total)
            try:
                data = memory.read(self._rp.pid, addr, n)
            except memory.MemoryFault:
                data = memory.read(self._rp.pid, addr, min(PAGE_SIZE - addr % PAGE_SIZE, n))
            i = data.find(b"\0")
            if i >= 0:
                out.append(data[:i])
                break
            out.append(data)
            total += len(data)
            addr += len(data)
        return b"".join(out)


Stop = namedtuple("Stop", "kind sig si regs")
Stop.__doc__ = "A classified tracee stop (RemoteProcess._next_stop)."


class _Skip(Exception):
    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


class _Crash(Exception):
    def __init__(self, si, regs):
        super().__init__(si)
        self.si = si
        self.regs = regs
