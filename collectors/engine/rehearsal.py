"""A rehearsal of the stop, on a process of allocdiag's own, a moment before
the target's thread is stopped.

Why: a stop's cost to the target is the time between the interrupt and
the detach, and on an idle machine most of it is not the work but caches
gone cold.  Measured on the 2-vCPU KVM guest this was built on (2026-11-26,
the seven ptrace/process_vm requests of a stop's save, frame write, output
read and restore, on an already stopped thread): 160 us when they follow
0.3 s of idling, 22 us when the same seven ran just before, 18 us back to
back; spinning the CPU first, or 50 trivial syscalls, did not help (158 and
157 us).  The same happens to the engine's own Python code.  So before each
stop the engine runs the same code on an understudy -- a ``cat`` child
reading a pipe allocdiag holds -- stopping it, making one call in it (to
address 0: the return trap at once), reading its stack and giving it back,
with the same functions the real stop uses.  That costs allocdiag
~0.45 ms of its own CPU per stop (cold) and nothing to the target
(bench/pause.py --snapshots prints the stop with and without it).  Only
when a CPU is free (the engine asks ``Tracer.free_cpu``): on a saturated
host allocdiag's own CPU per snapshot is what the host's requests pay, more
than the stop (issue 23), so there the stop goes unrehearsed.

The understudy never outlives allocdiag: it blocks reading a pipe whose only
writer is this process, so it sees end-of-file and exits when allocdiag
exits, however it exits (no preexec function, no PTRACE_O_EXITKILL needed).
It is a child of allocdiag's, not of the target's: the target is never
touched by a rehearsal.  Best effort: when ``cat`` is missing, cannot be
traced or misbehaves, rehearsals stop for this run and stops are as before.
``ALLOCDIAG_NO_REHEARSAL=1`` turns them off (bench comparisons).
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from collectors import lazylog
from collectors.engine import memory
from collectors.engine.arch import Arch
from collectors.engine.callframe import Caller, Stats
from collectors.engine.stackbounds import StackMaps
from collectors.engine.tracee import Skip, Tracer, read_bytes
from collectors.proc.maps import parse_maps
from collectors.proc.stat import start_time
from diag.model.errors import AllocdiagError

log = lazylog.getLogger("collectors.engine")

ENV_OFF = "ALLOCDIAG_NO_REHEARSAL"
# The understudy's program: blocks in read(2) on its stdin, a restartable
# wait like the targets' own idle threads, and exits at end-of-file.
PROGRAM = "cat"
# How long a rehearsal may wait for the understudy to stop or trap.
WAIT_S = 0.2
# Bytes of its stack read back, as a stop reads its output buffer.
READ_BACK = 4096
# How long the first rehearsal waits for a new understudy to block in its
# read (exec and start-up of cat: ~1-2 ms).
START_WAIT_S = 0.05
# The warm-up before a process's first stop.  That stop ran 50-100 us
# longer than the process's later ones at the same idle, every segment of
# it ~1.4x slower (bench/README.md, 2026-11-27), and more rehearsals did not
# help (30 instead of 1: 290 against 296 us); ten whole borrows of the
# understudy did (tcmalloc 258-291 us against 306-313, alternated; three or
# five: nothing), as ten snapshots of another process did.  It is the code
# around the stop that rehearsals do not run -- RemoteProcess.borrow, the
# judge, the Call methods -- and ten is what CPython 3.11 asks before it
# specialises a function's bytecode (it quickens a code object after 8
# runs).  ~11 ms of allocdiag's CPU, once per allocdiag process.
WARM_UP_BORROWS = 10
CLOSE_WAIT_S = 1.0      # for the understudy to exit at end-of-file, then SIGKILL
WARM_UP_BUFFER = 16 * 1024
ENV_NO_WARM_UP = "ALLOCDIAG_NO_WARM_UP"      # bench comparisons


class Understudy:
    """The ``cat`` child and the engine objects that stop it."""

    def __init__(self, arch: Arch, procfs: str = "/proc") -> None:
        # posix_spawn, not subprocess (whose import, with selectors, is ~2
        # ms of a CLI run); found on PATH by the spawn itself
        # (FileNotFoundError when missing).  Python's descriptors are
        # close-on-exec: the child has the pipe's read end as stdin and
        # /dev/null as stdout and stderr, nothing else.
        read_end, self.stdin = os.pipe()
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            self.pid = os.posix_spawnp(PROGRAM, [PROGRAM], os.environ, file_actions=[
                (os.POSIX_SPAWN_DUP2, read_end, 0), (os.POSIX_SPAWN_DUP2, devnull, 1),
                (os.POSIX_SPAWN_DUP2, devnull, 2)])
        except OSError:
            os.close(self.stdin)
            raise
        finally:
            os.close(read_end)
            os.close(devnull)
        self.status: int | None = None
        self.owner = os.getpid()
        self.procfs = procfs
        self.tracer = Tracer(self.pid, procfs, arch, start_time(self.pid, procfs),
                             lambda: b"")
        self.caller = Caller(self.tracer, call_timeout_s=WAIT_S, block_signals=True,
                             mapper=None, unsafe=frozenset(), stats=Stats())
        self.caller.quiet = True
        self.stack: StackMaps | None = None
        self.rehearsals = 0

    def ready(self, wait_s: float = 0.0) -> bool:
        """True once the child blocks in its read (not while it starts),
        waiting up to WAIT_S for it."""
        t_end = time.monotonic() + wait_s
        while True:
            try:
                stat = read_bytes(f"{self.procfs}/{self.pid}/stat", self.pid)
            except AllocdiagError:
                raise OSError("the understudy exited") from None
            state = stat.rsplit(b")", 1)[1].split()[0]
            if state == b"S":
                return True
            if state in (b"Z", b"X"):
                raise OSError("the understudy exited")
            if time.monotonic() >= t_end:
                return False
            time.sleep(0.001)

    def rehearse(self) -> None:
        """Stop, call, read, restore, detach: the path of a real stop."""
        th = self.tracer.stop(self.pid, "idle", WAIT_S)
        try:
            if self.stack is None:
                self.stack = StackMaps(parse_maps(read_bytes(
                    f"{self.procfs}/{self.pid}/maps", self.pid)))
            sp = self.tracer.arch.sp(th.regs)
            th.frame.bounds, why = self.stack.bounds(sp)
            if th.frame.bounds is None:
                raise OSError(f"understudy stack: {why}")
            th.frame.scratch_top = th.frame.scratch_low = self.caller.scratch_top(th)
            self.caller.call(th, 0, (), WAIT_S)
            memory.read(self.pid, th.frame.scratch_low - READ_BACK, READ_BACK)
        finally:
            self.caller.release(th)

    def close(self) -> int | None:
        """End-of-file to the understudy; its exit status (0: it read to the
        end as cat does, so no rehearsal disturbed it)."""
        if self.owner != os.getpid():
            return None
        if self.status is not None:
            return self.status
        try:
            os.close(self.stdin)
        except OSError:
            pass
        t_end = time.monotonic() + CLOSE_WAIT_S
        try:
            while True:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() >= t_end:
                    os.kill(self.pid, signal.SIGKILL)
                    _pid, status = os.waitpid(self.pid, 0)
                    break
                time.sleep(0.001)
        except ChildProcessError:       # reaped by someone else
            return None
        self.status = os.waitstatus_to_exitcode(status)
        return self.status


_lock = threading.Lock()
_understudy: Understudy | None = None
_broken: str | None = None
_warmed: int | None = None     # the pid of the allocdiag process that warmed up
_warm_up_borrows = 0           # borrows the warm-up made (tests)


def enabled() -> bool:
    return _broken is None and os.environ.get(ENV_OFF, "") in ("", "0")


def _get(arch: Arch) -> Understudy:
    """This process's understudy (started now if it has none: a forked
    allocdiag worker does not use its parent's)."""
    global _understudy
    if _understudy is None or _understudy.owner != os.getpid():
        _understudy = Understudy(arch)
        atexit.register(_understudy.close)
    return _understudy


def prepare(arch: Arch) -> None:
    """Start the understudy ahead of the first stop (it needs a moment to
    block in its read); nothing when rehearsals are off."""
    global _broken
    if not enabled() or not _lock.acquire(blocking=False):
        return
    try:
        _get(arch)
    except OSError as e:
        _broken = str(e)
        log.debug("rehearsals off for this run: %s", e)
    finally:
        _lock.release()


def rehearse(arch: Arch, worth_it: Callable[[], bool] | None = None,
             warm_up: Callable[[int, str], Borrower] | None = None) -> bool | None:
    """Run one rehearsal now, if WORTH_IT() (asked once the understudy is
    blocked in its read, so it does not count itself); before this
    process's first, the warm-up: WARM_UP_BORROWS borrows of the
    understudy by WARM_UP(pid, procfs), a RemoteProcess.  What WORTH_IT said,
    so the caller need not ask again: True (it ran), False (not worth it);
    None when it was not asked (rehearsals off or broken, another thread of
    this process rehearsing, the understudy not ready)."""
    global _broken
    if not enabled() or not _lock.acquire(blocking=False):
        return None
    try:
        understudy = _get(arch)
        # until the first rehearsal, wait for it to block in its read; after
        # that a vanished understudy shows in the stop itself
        if understudy.rehearsals == 0 and not understudy.ready(START_WAIT_S):
            return None
        if worth_it is not None and not worth_it():
            return False
        if _warmed != os.getpid() and warm_up is not None:
            _warm_up(understudy, warm_up)
        understudy.rehearse()
        understudy.rehearsals += 1
        return True
    except (AllocdiagError, OSError, Skip) as e:
        _broken = str(e)
        log.debug("rehearsals off for this run: %s", e)
        return None
    finally:
        _lock.release()


class Borrower(Protocol):
    def borrow(self) -> AbstractContextManager[Any]: ...


def _warm_up(understudy: Understudy, make: Callable[[int, str], Borrower]) -> None:
    """Before this process's first stop: WARM_UP_BORROWS borrows of the
    understudy through the whole borrow path, each writing scratch, calling
    (address 0: the return trap at once) and reading a buffer back.  A
    failure only ends the warm-up: the rehearsal and the stop go on."""
    global _warmed, _warm_up_borrows
    _warmed = os.getpid()
    if os.environ.get(ENV_NO_WARM_UP, "") not in ("", "0"):
        return
    # MAKE is collectors.engine.remote's (which imports this module); its
    # borrows find the lock held: they are not rehearsed themselves
    try:
        rp = make(understudy.pid, understudy.procfs)
        for _ in range(WARM_UP_BORROWS):
            with rp.borrow() as c:
                buf = c.buffer(WARM_UP_BUFFER)
                at = c.scratch(len(PROGRAM) + 1)
                c.write(at, PROGRAM.encode() + b"\0")
                c.call(0)
                c.read(buf, READ_BACK)
            _warm_up_borrows += 1
    except (AllocdiagError, OSError, Skip) as e:
        log.debug("warm-up ended: %s", e)


def understudy_pid() -> int | None:
    """The understudy's pid, when one runs (tests)."""
    return _understudy.pid if _understudy is not None else None


def broken() -> str | None:
    """Why rehearsals stopped in this run, or None."""
    return _broken


def rehearsals() -> int:
    """Rehearsals run on this process's understudy (tests)."""
    return _understudy.rehearsals if _understudy is not None else 0


def warm_up_borrows() -> int:
    """Borrows of the understudy the warm-up made (tests)."""
    return _warm_up_borrows


def reset() -> int | None:
    """End the understudy (its exit status), forget a breakage and the
    warm-up (tests)."""
    global _understudy, _broken, _warmed, _warm_up_borrows
    with _lock:
        status = _understudy.close() if _understudy is not None else None
        _understudy, _broken, _warmed, _warm_up_borrows = None, None, None, 0
    return status
