"""Building and running one call in a stopped thread, and giving the thread
back: the registers and the call frame (below the red zone and scratch,
inside the stack bounds of ``stackbounds``), the signal mask for the call,
the return-to-0 trap, timeouts (quarantine), output buffers, re-delivery of
held signals, and the exact restore at the release.
"""

from __future__ import annotations

import errno
import signal
import time
from collections.abc import Callable, Sequence

from collectors import lazylog
from diag.model.records import field, record
from collectors.engine import abi, memory, ptrace, safepoints, seccomp
from collectors.engine.arch import Arch, Regs
from collectors.engine.choose import TIMESPEC, NS_PER_MS, NS_PER_S, kib
from collectors.engine.tracee import (CRASH_HINTS, At, SigInfo, StopKind, Thread, Tracer,
                                      codename, orphan, quarantine, signame)
from diag.model.errors import NoSuchProcess, RemoteCallError

log = lazylog.getLogger("collectors.engine")

# Small scratch on the borrowed stack, at most (names and out-values).
MAX_SCRATCH = 3 * 1024
CSTRING_CHUNK = 64 * 1024   # bytes per process_vm_readv in Call.cstring (page-aligned ends)
PAGE_SIZE = abi.PAGE_SIZE
# What the engine puts between the red zone and its scratch.
SCRATCH_GAP = 64
# A restart's deadline must never come early: the estimate of when an epoll
# wait began is good to tens of microseconds (epoll_wait's ms are rounded up).
DEADLINE_SLACK_NS = 1_000_000
# Signals held and requeued one by one at the release, at most.
MAX_REQUEUE = 64
# How long a thread may take to reach a trap the engine set (re-delivery,
# stopping it after a timeout).
TRAP_WAIT_S = 2.0


class Crash(Exception):
    def __init__(self, si: SigInfo, regs: Regs) -> None:
        super().__init__(si)
        self.si = si
        self.regs = regs


@record
class Stats:
    borrows: int = 0
    calls: int = 0
    rejected_stops: int = 0
    boundary_stops: int = 0
    pause_us_total: int = 0


@record
class Record:
    """What the releases of one borrow measured."""

    pause_us: list[int] = field(default_factory=list)
    held_signals: list[dict[str, object]] = field(default_factory=list)
    # syscalls of the calls that a seccomp filter would not have let run
    # harmlessly, skipped (seccomp.judge): {"syscall", "nr", "why"}
    skipped_syscalls: list[dict[str, object]] = field(default_factory=list)


class Caller:
    """Runs calls in, and releases, threads of one process."""

    def __init__(self, tracer: Tracer, *, call_timeout_s: float, block_signals: bool,
                 mapper: Sequence[int | None] | None, unsafe: frozenset[str],
                 stats: Stats) -> None:
        self.tracer = tracer
        self.pid = tracer.pid
        self.arch: Arch = tracer.arch
        self.call_timeout_s = call_timeout_s
        self.block_signals = block_signals
        self.mapper = mapper
        self.unsafe = unsafe
        self.stats = stats
        self.record = Record()
        self.quiet = False          # no INFO line per release (the rehearsal's understudy)

    # ---- the signal mask during calls ---------------------------------------
    def call_mask(self, th: Thread) -> int:
        if "sigsegv_unblock" in self.unsafe:
            return th.sigmask
        if self.block_signals:
            return abi.ALL_BLOCKABLE & ~abi.SYNC_BITS
        return th.sigmask & ~abi.SYNC_BITS

    def set_call_mask(self, th: Thread, mask: int) -> None:
        ptrace.setsigmask(th.tid, self.pid, mask)
        th.mask_changed = True

    # ---- one call ------------------------------------------------------------------
    def scratch_top(self, th: Thread) -> int:
        sp = self.arch.sp(th.regs)
        return (sp - self.arch.RED_ZONE - SCRATCH_GAP) & ~(self.arch.STACK_ALIGN - 1)

    def resume_request(self, th: Thread) -> Callable[[int, int, int], None]:
        """How TH's call goes on: PTRACE_CONT; under a seccomp filter
        PTRACE_SYSEMU (each syscall stops before it runs, and before any
        filter sees it), or PTRACE_SYSCALL while a syscall judged harmless
        is made again (syscall_stop)."""
        if not th.seccomp_filter:
            return ptrace.cont
        return ptrace.syscall if th.rerun_stops else ptrace.sysemu

    def resume_until_trap(self, th: Thread, deadline: float) -> Regs | None:
        """CONT and handle stops until the return-to-0 trap.  Returns the
        registers at the trap, or None at DEADLINE (thread still running).
        A thread under a seccomp filter is resumed with PTRACE_SYSEMU
        instead, and each syscall of the call judged at its entry."""
        # a call never starts inside another's made-again syscall (one that
        # timed out or crashed may have left it counting)
        th.rerun_stops = 0
        self.resume_request(th)(th.tid, self.pid, 0)
        th.at = None
        while True:
            stop = self.tracer.next_stop(th, deadline, resume=self.resume_request(th))
            if stop.kind is StopKind.TIMEOUT:
                return None
            if stop.kind is StopKind.EXITED:
                th.gone = True
                raise self.tracer.gone_error(th, "during the call")
            if stop.kind is StopKind.RETURN_TRAP:
                th.at = At.DELIVERY
                return stop.regs
            if stop.kind is StopKind.FAULT and stop.si is not None:
                th.at = At.DELIVERY
                raise Crash(stop.si, stop.regs)
            if stop.kind is StopKind.GROUP:
                # SIGSTOP/SIGTSTP while calling: finish the call; after the
                # detach the thread joins the group-stop.
                th.group_stop_seen = True
            if stop.kind is StopKind.SYSCALL:
                self.syscall_stop(th)
            self.resume_request(th)(th.tid, self.pid, 0)

    def syscall_stop(self, th: Thread) -> None:
        """At a syscall stop of a call under a seccomp filter.  The call runs
        under PTRACE_SYSEMU, so this is an entry whose syscall will not run
        and which no filter has seen (kernel/entry/common.c
        syscall_trace_enter: the ptrace report comes first, and under SYSEMU
        it returns before __secure_computing).  One the thread's filters
        would not let run or fail harmlessly (they kill, raise SIGSYS or
        wake a supervisor) is left so: the call sees the -ENOSYS the entry
        code put in rax.  Any other is made again: rip back over the
        syscall instruction, resumed with PTRACE_SYSCALL through its entry
        and exit stops, then on with PTRACE_SYSEMU.  (Resuming its entry
        stop with SYSEMU at once, to save the exit stop, left the call
        hanging on 6.18.)

        Skipping with orig_rax = -1 under PTRACE_SYSCALL instead is not
        safe: the filters then run on nr -1, and a filter that kills what
        it does not know (a hand-written allowlist, as OpenSSH's sandbox;
        libseccomp's let -1 through) kills the process (measured: audit
        syscall=-1, SIGSYS)."""
        if th.rerun_stops:
            th.rerun_stops -= 1     # the made-again syscall's entry, then its exit
            return
        entry = self.syscall_entry(th)
        if entry is None:
            return      # not a stop SYSEMU makes; nothing to judge
        if th.filters is None:
            th.filters = seccomp.read_filters(th.tid)
        try:
            ok, why = seccomp.judge(th.filters, entry)
        except Exception as exc:    # noqa: BLE001 -- never abandon the call half-way
            # (the thread is inside the allocator's code): skip what could not be judged
            ok, why = False, f"the thread's seccomp filter could not be judged ({exc!r})"
        if ok:
            regs = self.arch.get_regs(th.tid, self.pid)
            self.arch.rerun_syscall(regs)
            self.arch.set_regs(th.tid, self.pid, regs)
            th.rerun_stops = 2
            return
        name = self.arch.SYSCALL_NAMES.get(entry.nr) if entry.arch == self.arch.AUDIT_ARCH \
            else None
        name = name or f"syscall {entry.nr} (audit arch {entry.arch:#x})"
        self.record.skipped_syscalls.append({"syscall": name, "nr": entry.nr, "why": why})
        log.debug("pid %d tid %d: the call's %s was skipped (it returned ENOSYS): %s",
                  self.pid, th.tid, name, why)

    def syscall_entry(self, th: Thread) -> seccomp.SyscallEntry | None:
        """The syscall entry TH stops at, or None at an exit.  A kernel
        before 5.3 has no PTRACE_GET_SYSCALL_INFO: then the registers say
        it (the entry code sets rax to -ENOSYS; an exit that returned
        -ENOSYS taken for an entry is judged for nothing), rather than the
        call being abandoned in the allocator's code."""
        try:
            return seccomp.syscall_entry(ptrace.get_syscall_info(th.tid, self.pid))
        except RemoteCallError as exc:
            log.debug("pid %d tid %d: %s; the syscall read from the registers", self.pid,
                      th.tid, exc)
        regs = self.arch.get_regs(th.tid, self.pid)
        nr, ret = self.arch.syscall_state(regs)
        if ret != -errno.ENOSYS or nr < 0:
            return None
        return seccomp.SyscallEntry(self.arch.AUDIT_ARCH, self.arch.pc(regs), nr,
                                    tuple(self.arch.syscall_args(regs)))

    def call(self, th: Thread, func: int, args: tuple[int, ...], timeout_s: float | None
             ) -> int:
        """FUNC(*ARGS) in TH; its integer return value."""
        if th.gone or th.orphaned:
            raise RemoteCallError(f"thread {th.tid} is no longer usable", pid=self.pid)
        new, writes, lowest = self.arch.prepare_call(th.regs, func, args, th.frame.scratch_low)
        self.check_frame(th, writes, lowest - th.frame.callee_need)
        self.flush(th, writes)        # the scratch the call reads and its frame: one syscall
        mask = self.call_mask(th)
        if not th.mask_changed and mask != th.sigmask:
            self.set_call_mask(th, mask)
        self.arch.set_regs(th.tid, self.pid, new)
        timeout = self.call_timeout_s if timeout_s is None else float(timeout_s)
        t0 = time.monotonic()
        debug = log.isEnabledFor(lazylog.DEBUG)    # once: this is inside the stop
        if debug:
            log.debug("pid %d tid %d call %#x%s", self.pid, th.tid, func, args)
        try:
            regs = self.resume_until_trap(th, t0 + timeout)
        except Crash as c:
            hint = CRASH_HINTS.get((c.si.signo, c.si.code))
            why = (f"the call to {func:#x} on thread {th.tid} crashed with "
                   f"{signame(c.si.signo)} ({codename(c.si.signo, c.si.code)}, address "
                   f"{c.si.addr:#x}, pc {self.arch.pc(c.regs):#x})"
                   f"{': ' + hint if hint else ''}; the thread was restored")
            quarantine(self.pid, self.tracer.start, why)
            raise RemoteCallError(why + "; process quarantined", pid=self.pid) from None
        if regs is None:
            self.timeout(th, func, timeout)
        th.frame.calls += 1
        self.stats.calls += 1
        rv = self.arch.return_value(regs)
        if debug:
            log.debug("pid %d tid %d call %#x returned %#x after %d us", self.pid, th.tid,
                      func, rv, int((time.monotonic() - t0) * 1e6))
        return rv

    def check_frame(self, th: Thread, writes: Sequence[tuple[int, bytes]], lowest_used: int
                    ) -> None:
        """Every frame byte, and the callee's stack use down to LOWEST_USED,
        inside the thread's stack bounds and below its red zone; else no
        call is made.  (Candidates were chosen with this room: a failure
        here is a bug, refused before any write.)"""
        top = self.arch.sp(th.regs) - self.arch.RED_ZONE
        floor = th.frame.bounds.floor if th.frame.bounds is not None else None
        for addr, data in writes:
            if floor is None or addr < floor or addr + len(data) > top:
                raise RemoteCallError(
                    f"call frame at {addr:#x} outside thread {th.tid}'s stack bounds; "
                    "no call made", pid=self.pid)
        if floor is None or lowest_used < floor:
            raise RemoteCallError(
                f"thread {th.tid}: the call needs {kib(top - lowest_used)} of stack, "
                f"only {kib(max(top - (floor or top), 0))} is free in its stack; no call made",
                pid=self.pid)

    def timeout(self, th: Thread, func: int, timeout: float) -> None:
        """The call to FUNC did not return in TIMEOUT: quarantine the
        process, stop and restore the thread if it can be, raise."""
        why = (f"a call to {func:#x} on thread {th.tid} did not return within "
               f"{timeout:g} s; its allocator may now hold a lock forever, so "
               "allocdiag makes no further remote calls to this process in this run")
        log.info("pid %d tid %d call %#x timed out after %g s", self.pid, th.tid, func,
                  timeout)
        quarantine(self.pid, self.tracer.start, why)
        ptrace.interrupt(th.tid, self.pid)
        deadline = time.monotonic() + TRAP_WAIT_S
        stop = self.tracer.next_stop(th, deadline, resume=self.resume_request(th))
        while stop.kind is StopKind.SYSCALL:
            # a filtered call reached a syscall before the interrupt's stop:
            # judged like any other, then on to that stop
            self.syscall_stop(th)
            self.resume_request(th)(th.tid, self.pid, 0)
            stop = self.tracer.next_stop(th, deadline, resume=self.resume_request(th))
        if stop.kind is StopKind.TIMEOUT:
            orphan(th)
            raise RemoteCallError(why + " (the thread could not be stopped to "
                                  "restore it; it will be restored when it stops)",
                                  pid=self.pid)
        if stop.kind is StopKind.EXITED:
            th.gone = True
            raise self.tracer.gone_error(th, "during the call")
        if stop.kind in (StopKind.INTERRUPT, StopKind.GROUP):
            th.at = At.GROUP if stop.kind is StopKind.GROUP else At.INTERRUPT
            try:
                regs = self.arch.get_regs(th.tid, self.pid)
                nr, _ = self.arch.syscall_state(regs)
                where = (f"in {self.arch.SYSCALL_NAMES.get(nr, nr)}" if nr >= 0
                         else "running")
                why += f" [it was {where} at pc {self.arch.pc(regs):#x}]"
            except Exception:
                pass
        else:                       # return-trap (it returned after all) or fault
            th.at = At.DELIVERY
        raise RemoteCallError(why + " (thread restored and released)", pid=self.pid)

    def flush(self, th: Thread, then: Sequence[tuple[int, bytes]] = ()) -> None:
        """Make the pending Call.write bytes now (before a read of them),
        and THEN's after them, in one process_vm_writev."""
        if th.frame.pending or then:
            memory.write_many(self.pid, [*th.frame.pending, *then])
            th.frame.pending.clear()

    # ---- output buffers --------------------------------------------------------------
    # Stack left free below an output buffer put on a roomy stack.
    STACK_BUFFER_SPARE = 16 * 1024

    def buffer(self, th: Thread, n: int) -> int:
        """N bytes for an output buffer, starting with a NUL.  On the stack
        when the thread's measured room holds it, the callee's need and
        STACK_BUFFER_SPARE below it (saves the mmap/munmap round trips,
        ~70-110 us a stop: bench/pause.py --scratch); else a mapping."""
        fr = th.frame
        low = (fr.scratch_low - int(n)) & ~(self.arch.STACK_ALIGN - 1)
        if fr.bounds is not None and \
                low - fr.callee_need - self.STACK_BUFFER_SPARE >= fr.bounds.floor:
            fr.stack_buffers += fr.scratch_low - low
            fr.scratch_low = low
            fr.pending.append((low, b"\0"))
            return low
        return self.map_buffer(th, n)

    def map_buffer(self, th: Thread, n: int) -> int:
        """N zeroed bytes in a private anonymous mapping the borrowed thread
        makes with libc mmap (async-signal-safe, takes no allocator lock)."""
        if not self.mapper or not all(self.mapper) or self.mapper[0] is None:
            raise RemoteCallError("no buffer outside the stack: libc mmap/munmap not "
                                  "resolved in the target", pid=self.pid)
        size = -(-int(n) // abi.PAGE_SIZE) * abi.PAGE_SIZE
        skipped = len(self.record.skipped_syscalls)
        mem = self.call(th, self.mapper[0], (0, size, abi.PROT_READ | abi.PROT_WRITE,
                                             abi.MAP_PRIVATE | abi.MAP_ANONYMOUS,
                                             abi.NO_FD & abi.U64_MASK, 0), None)
        if mem == 0 or mem >= abi.MAP_FAILED_MIN:
            # libc's mmap returns MAP_FAILED and leaves the errno in the
            # thread's TLS: the reason known here is a syscall skipped
            why = "".join(f"; its {s['syscall']} was not run: {s['why']}"
                          for s in self.record.skipped_syscalls[skipped:])
            raise RemoteCallError(f"mmap of {size} bytes failed in the target "
                                  f"(returned {mem:#x}){why}", pid=self.pid)
        th.frame.buffers.append((mem, size))
        return mem

    def unmap_buffers(self, th: Thread) -> None:
        """munmap every Call.buffer mapping, newest first, before the release."""
        while th.frame.buffers and not (th.gone or th.orphaned) and self.mapper:
            mem, size = th.frame.buffers.pop()
            munmap = self.mapper[1]
            assert munmap is not None
            self.call(th, munmap, (mem, size), None)

    # ---- giving the thread back --------------------------------------------------------
    def retrap(self, th: Thread) -> None:
        """Bring the thread to a signal-delivery-stop (needed to inject a
        signal) by letting it 'call' address 0: it faults at once."""
        new, writes, lowest = self.arch.prepare_call(th.regs, 0, (), th.frame.scratch_low)
        self.check_frame(th, writes, lowest)
        for addr, data in writes:
            memory.write(self.pid, addr, data)
        self.arch.set_regs(th.tid, self.pid, new)
        if self.resume_until_trap(th, time.monotonic() + TRAP_WAIT_S) is None:
            raise RemoteCallError("thread did not reach the re-delivery trap",
                                  pid=self.pid)

    def redeliver(self, th: Thread) -> SigInfo:
        """Requeue all held signals but one (kernel queues them, siginfo
        intact), return the one to inject at the detach."""
        if not th.frame.scratch_low:
            th.frame.scratch_low = th.frame.scratch_top = self.scratch_top(th)
        segv = [h for h in th.held if h.signo == signal.SIGSEGV]
        direct = segv[0] if segv else th.held[0]
        done = {id(direct)}
        for _ in range(MAX_REQUEUE):
            todo = [h for h in th.held if id(h) not in done and h.signo != signal.SIGSEGV]
            if not todo:
                break
            h = todo[0]
            done.add(id(h))
            if th.at is not At.DELIVERY:
                self.retrap(th)
            self.set_call_mask(th, (self.call_mask(th) | abi.sigbit(h.signo))
                               & ~abi.sigbit(signal.SIGSEGV))
            ptrace.setsiginfo(th.tid, self.pid, h.raw)
            # blocked -> the kernel requeues it with this siginfo; the thread
            # then faults at 0 again: a new signal-delivery-stop.
            ptrace.cont(th.tid, self.pid, h.signo)
            th.at = None
            deadline = time.monotonic() + TRAP_WAIT_S
            while th.at is not At.DELIVERY:
                stop = self.tracer.next_stop(th, deadline)
                if stop.kind is StopKind.TIMEOUT:
                    raise RemoteCallError("thread did not return to the re-delivery "
                                          "trap", pid=self.pid)
                if stop.kind is StopKind.EXITED:
                    th.gone = True
                    raise self.tracer.gone_error(th)
                if stop.kind is StopKind.RETURN_TRAP:
                    th.at = At.DELIVERY
                elif stop.kind is StopKind.FAULT and stop.si is not None:
                    th.held.append(stop.si)
                    ptrace.cont(th.tid, self.pid, 0)
                else:
                    ptrace.cont(th.tid, self.pid, 0)
        if th.at is not At.DELIVERY:
            self.retrap(th)
        return direct

    def keep_deadline(self, th: Thread, regs: Regs) -> Regs:
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
        v = th.verdict
        if v.restart_rax is None or v.since is None or v.timeout_ns is None:
            return regs
        nr, _ = self.arch.syscall_state(regs)
        v.left_ns = max(0, v.timeout_ns - int((time.monotonic() - v.since) * NS_PER_S))
        left = v.left_ns + DEADLINE_SLACK_NS
        if nr in safepoints.TIMEOUT_MS_ARG:
            regs = self.arch.copy_regs(regs)
            self.arch.set_syscall_arg(regs, safepoints.TIMEOUT_MS_ARG[nr], -(-left // NS_PER_MS))
            return regs
        if th.frame.bounds is None:
            # a stop refused before its stack was bounded: nowhere proven to
            # put the timespec; the wait restarts its whole timeout (bounded
            # by it), as the kernel's own restart would
            return regs
        regs = self.arch.copy_regs(regs)
        at = ((th.frame.scratch_top or self.scratch_top(th)) - TIMESPEC.size) \
            & ~(self.arch.STACK_ALIGN - 1)
        ts = TIMESPEC.pack(left // NS_PER_S, left % NS_PER_S)
        self.check_frame(th, [(at, ts)], at)
        memory.write(self.pid, at, ts)
        self.arch.set_syscall_arg(regs, safepoints.TIMESPEC_ARG[nr], at)
        return regs

    def release(self, th: Thread) -> None:
        """Restore registers, vector state and mask exactly, re-deliver held
        signals, detach.  Records the pause."""
        if th.gone or th.orphaned:
            return
        try:
            direct = self.redeliver(th) if th.held else None
            self.tracer.detach(th, self.keep_deadline(th, th.final_regs()),
                               "xstate" not in self.unsafe, direct)
        except (NoSuchProcess, RemoteCallError):
            if not ptrace.process_exists(self.pid, self.tracer.procfs):
                raise NoSuchProcess(self.pid, "the process exited while stopped") from None
            raise
        finally:
            if th.t_stop is not None:
                us = int((time.monotonic() - th.t_stop) * 1e6)
                self.record.pause_us.append(us)
                self.stats.pause_us_total += us
                if not self.quiet and log.isEnabledFor(lazylog.INFO):
                    if th.verdict.category is None:     # the judge refused it, stopped
                        log.info("pid %d tid %d refused after the stop: stopped %d us, "
                                 "no call made", self.pid, th.tid, us)
                    else:
                        log.info("pid %d tid %d (%s) borrowed: stopped %d us for %d calls",
                                 self.pid, th.tid, " ".join(filter(None, (
                                     th.verdict.category, th.verdict.syscall))),
                                 us, th.frame.calls)
            self.record.held_signals.extend(h.as_dict() for h in th.held)


class Call:
    """A borrowed thread (yielded by remote.RemoteProcess.borrow)."""

    def __init__(self, caller: Caller, th: Thread, max_scratch: int = MAX_SCRATCH) -> None:
        self._caller = caller
        self._th = th
        self._pid = caller.pid
        self._max_scratch = max_scratch
        self.tid = th.tid
        self.kind = th.verdict.kind
        self.syscall = th.verdict.syscall
        self.category = th.verdict.category  # safepoints.RESTARTABLE|EPOLL|FUTEX|GO_RUNTIME|RUNNING
        self.max_args = caller.arch.MAX_ARGS

    def call(self, func_addr: int, *args: int, timeout_s: float | None = None) -> int:
        """Call FUNC_ADDR(*ARGS) (integer args) in the thread; returns rax."""
        return self._caller.call(self._th, int(func_addr), tuple(args), timeout_s)

    def read(self, addr: int, n: int) -> bytes:
        self._caller.flush(self._th)
        return memory.read(self._pid, addr, n)

    def write(self, addr: int, data: bytes) -> None:
        """Write DATA at ADDR, which must lie in this borrow's scratch or
        buffers (the only target memory allocdiag writes outside a call
        frame: docs/target-writes.md)."""
        fr, n = self._th.frame, len(data)
        inside = fr.scratch_low <= addr and addr + n <= fr.scratch_top or any(
            m <= addr and addr + n <= m + size for m, size in fr.buffers)
        if not inside:
            raise RemoteCallError(f"refusing to write {n} bytes at {addr:#x}: not in this "
                                  "call's scratch or buffers", pid=self._pid)
        # made with the next call's frame (or before the next read): one
        # process_vm_writev for all; bytes no call or read follows are not
        # written at all (the thread is released without reading them)
        fr.pending.append((addr, bytes(data)))

    def scratch(self, n: int) -> int:
        """Address of N bytes (16-aligned) on the thread's stack below the red
        zone; valid until the borrow ends; nothing to free.  For small things
        (names, out-values): MAX_SCRATCH bytes in all; output buffers come
        from ``buffer``."""
        fr = self._th.frame
        low = (fr.scratch_low - int(n)) & ~(self._caller.arch.STACK_ALIGN - 1)
        if fr.scratch_top - low - fr.stack_buffers > self._max_scratch:
            raise RemoteCallError(f"stack scratch limit {self._max_scratch} bytes "
                                  "exceeded (use Call.buffer for output buffers)",
                                  pid=self._pid)
        fr.scratch_low = low
        return low

    def buffer(self, n: int) -> int:
        """Address of N bytes for an output buffer, starting with a NUL:
        a private anonymous mapping the thread makes (one mmap call),
        unmapped (one munmap call) before the thread is released -- or,
        when the thread's measured stack room holds the buffer with the
        callee's need and STACK_BUFFER_SPARE to spare, below the scratch on
        its stack.  Never a stack without that room."""
        return self._caller.buffer(self._th, n)

    def mapped(self, addr: int) -> bool:
        """True when ADDR is a Call.buffer this borrow mapped; False for
        one it put on the thread's stack (what a side effect must say)."""
        return any(mem == addr for mem, _ in self._th.frame.buffers)

    def cstring(self, addr: int, limit: int = 1 << 20) -> bytes:
        """The NUL-terminated string at ADDR, cut at LIMIT bytes.  Each read
        (up to CSTRING_CHUNK) ends on a page boundary, so it can fault only on
        a page past the string's end; such a read is retried up to its first
        page boundary."""
        self._caller.flush(self._th)
        out, total = [], 0
        while total < limit:
            n = min(CSTRING_CHUNK - addr % PAGE_SIZE, limit - total)
            try:
                data = memory.read(self._pid, addr, n)
            except memory.MemoryFault:
                data = memory.read(self._pid, addr, min(PAGE_SIZE - addr % PAGE_SIZE, n))
            i = data.find(b"\0")
            if i >= 0:
                out.append(data[:i])
                break
            out.append(data)
            total += len(data)
            addr += len(data)
        return b"".join(out)
