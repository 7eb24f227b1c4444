"""Which thread of one process to borrow: the candidates read from /proc
before any stop (ranked by safepoints.CATEGORY_ORDER, then stack room), and
the verdict on a stopped one.  Every refusal is a ``safepoints.Refusal``
(a reason code and its words); the policy itself (which waits, the stack
walk proof, the Go runtime rule) is ``collectors.engine.safepoints``.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from collections.abc import Sequence
from typing import Any

from collectors import lazylog
from collectors.newest import keep_newest
from diag.model.records import field, record
from collectors.binary import unwind
from collectors.engine import abi, memory, ptrace, rseq, safepoints, stackbounds
from collectors.engine.arch import Arch
from collectors.engine.safepoints import Reason, Refusal, refusal
from collectors.engine.tracee import At, Thread, Tracer, read_bytes
from collectors.proc.maps import parse_maps
from collectors.proc.readall import read_all
from collectors.proc.syscall import NOT_IN_SYSCALL, parse_syscall
from diag.model.errors import AccessDenied, AllocdiagError, NoSuchProcess, RemoteCallError

log = lazylog.getLogger("collectors.engine")

ERESTART = safepoints.ERESTART
# What the engine itself puts on a borrowed stack, at most: the red zone it
# skips (128), 64 bytes of gap, MAX_SCRATCH of small scratch, the call frame
# (return address and stack arguments) and alignment.
FRAME_BUDGET = 4 * 1024
MS_PER_S = 1000.0
STAT_PROCESSOR_FIELD = 36     # /proc/PID/stat field 39 (processor), after "comm)"
NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
TIMESPEC = struct.Struct("<qq")   # struct __kernel_timespec (tv_sec, tv_nsec)
SECCOMP_FIELD = b"\nSeccomp:"     # fs/proc/array.c task_seccomp
# Waits judged by their syscall alone in the stop; a walk before it looks
# for the allocator, or a signal frame, below them (Chooser.prepare).
LOOK_AHEAD_CATEGORIES = frozenset({safepoints.RESTARTABLE, safepoints.EPOLL})
# syscalls that change the address space, typically for the allocator
ADDRESS_SPACE_SYSCALLS = frozenset(("brk", "mmap", "munmap", "mremap", "madvise", "mprotect"))


def kib(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} bytes"


def exec_start(sched: bytes) -> float | None:
    """se.exec_start (ms, the task's scheduler clock) from /proc/.../sched."""
    for line in sched.splitlines():
        if line.startswith(b"se.exec_start"):
            return float(line.split(b":")[1]) / MS_PER_S
    return None


# An epoll-family waiter whose timeout a borrow gave back, seen asleep again
# after its release (Chooser.note_back_asleep): (pid, tid) -> (the process's
# start time, the thread's se.exec_start then, CLOCK_MONOTONIC when seen).
# While its exec_start stays the same it has not run since, so its wait
# began before that moment: the next borrow takes that as when it went to
# sleep (last_ran) instead of moving exec_start onto CLOCK_MONOTONIC by the
# clock offset measured then.  That offset grows with the steal and IRQ time
# of the sleep (40 ms a second on a loaded 2-vCPU guest), and each restart
# given back that much too long made a recording's 1 s epoll waits end up to
# 255 ms late.  Module-wide: one-shot snapshots (a new Session each) of the
# same process reuse it.  The oldest dropped beyond ASLEEP_SINCE_MAX.
_asleep_since: dict[tuple[int, int], tuple[int | None, float, float]] = {}
ASLEEP_SINCE_MAX = 1024
# How long note_back_asleep looks for the released thread back in its wait
# (it re-enters the syscall within tens of microseconds on an idle box)
BACK_ASLEEP_WAIT_S = 0.002
# ... and only for a wait given back at least this long: a shorter one
# (redis's event loop: 100 ms at most) is over before a next borrow, and
# the look (3-6 /proc reads, 0.1-0.3 ms of CPU) would be spent for nothing
BACK_ASLEEP_MIN_LEFT_S = 0.1


@record
class Facts:
    """What /proc says of one thread without stopping it; nr -1 when it
    runs user code."""

    state: str
    nr: int
    args: tuple[int, ...]
    sp: int | None
    pc: int | None
    comm: str
    room: int | None = None
    words: str = "waiting"
    since: float | None = None
    slept_at: float | None = None    # se.exec_start (s, its CPU's task clock) behind SINCE


@record
class Candidate:
    tid: int
    category: str
    facts: Facts


@record
class Round:
    """The candidates of one round, best first, and why the others are not."""

    candidates: list[Candidate] = field(default_factory=list)
    refused: dict[int, Refusal] = field(default_factory=dict)


class Chooser:
    """Judges the threads of one process for a borrow."""

    def __init__(self, tracer: Tracer, forbidden: Sequence[tuple[int, int, str]],
                 stack_need: int, stack_window: int, go_runtime: safepoints.GoRuntime | None,
                 undelimited: frozenset[str] = frozenset()) -> None:
        self.tracer = tracer
        self.pid = tracer.pid
        self.procfs = tracer.procfs
        self.arch: Arch = tracer.arch
        self.forbidden = list(forbidden)
        # forbidden names that are a whole executable's text (code.forbidden_parts)
        self.undelimited = undelimited
        self.in_forbidden = safepoints.new_ranges(self.forbidden)   # addr -> the forbidden object's name, or None
        self.stack_need = stack_need
        self.stack_window = stack_window
        self.go = go_runtime
        self.stackmaps: stackbounds.StackMaps | None = None   # of the current round
        # the current round's thread stack pointers by the mapping holding
        # them (StackMaps.holders): a candidate's mapping is checked against
        # its own few threads, not every thread (O(threads) in the stop of a
        # 216-thread varnishd: ~100 us, and every candidate's room before it)
        self.round_stacks: dict[int, list[tuple[int, int]]] = {}
        # /proc/PID/maps as the last full round read it; a round that yields
        # candidates read these very bytes (again() gives up when they differ),
        # so the look-ahead's StackJudge is checked against them, not a read
        # of its own
        self.round_maps: bytes | None = None
        self._given_maps: bytes | None = None    # new_borrow's MAPS, for its first read
        # The thread the last borrow got, as /proc showed it before its stop:
        # the next borrow's first round looks at it alone (again())
        self.last_chosen: Candidate | None = None
        self.first_round = False    # the next round is its borrow's first (new_borrow)
        self.parked = False       # no thread of the current round was running
        self.room: dict[int, int] = {}   # tid -> room seen this borrow (refusal message)
        self.insn_before: dict[int, bytes | None] = {}     # new_borrow
        self.restart_kinds: dict[int, tuple[str | None, str | Refusal]] = {}
        # tid -> (pc, sp) a look-ahead walk judged before the stop (prepare)
        self.looked_ahead: dict[int, tuple[int, int]] = {}
        self.filtered: set[int] = set()     # threads whose calls' syscalls are judged
        self.rseq_areas: dict[int, int | None] = {}   # tid -> its struct rseq (rseq_section)
        self.judge_stack: safepoints.StackJudge | None = None   # built for a futex wait
        # tid -> what its walk in the stop could not decode, with the registers
        # and a copy of the stack it walked (decoded before the next stop)
        self.undecoded: dict[int, tuple[unwind.NeedsDecode, dict[int, int],
                                        unwind.StackCopy | None]] = {}
        self._judge_maps: bytes | None = None   # the maps it was built from

    def new_borrow(self, maps: bytes | None = None) -> None:
        """A borrow starts.  MAPS: /proc/PID/maps read by the caller for the
        same snapshot, a moment before (a recording's: before the stop, as a
        round's own read is); its first round uses them instead of reading
        them again (read_maps)."""
        self.first_round = True
        self._given_maps = maps
        self.room = {}
        self.restart_kinds = {}
        # pc -> the SYSCALL_INSN-long bytes before it, read before the stop
        # (prepare) from read-only text; eintr_restartable's check then
        # reads nothing inside the stop (~16 us of a new allocdiag process's
        # stop of an epoll waiter)
        self.insn_before = {}
        self.looked_ahead = {}
        self.filtered = set()
        self.rseq_areas = {}

    def need(self) -> int:
        """Bytes a call needs below the red zone: the engine's frame budget
        and the callee's own measured stack use."""
        return FRAME_BUDGET + self.stack_need

    # ---- before the stop ------------------------------------------------------
    def thread_facts(self, tid: int) -> Facts:
        """Facts of TID from /proc, without stopping it.  Raises
        RemoteCallError when the thread vanished."""
        stat = read_bytes(self.tracer.task(tid, "stat"), self.pid, tid)
        sc = parse_syscall(read_bytes(self.tracer.task(tid, "syscall"), self.pid, tid))
        comm = stat[stat.find(b"(") + 1:stat.rfind(b")")].decode("utf-8", "replace")
        state = stat.rsplit(b")", 1)[1].split()[0].decode()
        return Facts(state, sc.nr, sc.args, sc.sp, sc.pc, comm)

    def classify(self, tid: int, nr: int, args: tuple[int, ...], stopped: bool = False,
                 pc: int | None = None) -> tuple[str, str] | tuple[None, Refusal]:
        """(category, words) of a thread blocked in syscall NR at PC, or
        (None, refusal).  STOPPED: the thread is in our ptrace-stop, so its
        wait channel no longer says what it waits for (it was checked before
        the stop).  In a Go executable a wait the general rules refuse, or
        that needs a walk Go code cannot give, is judged by the Go runtime
        rule (safepoints.GoRuntime) when its PC is in one of the runtime's stubs."""
        cat, words = self._classify_wait(tid, nr, args, stopped)
        if self.go is not None and (cat in (None, safepoints.FUTEX)
                                    or nr == self.arch.RESTART_SYSCALL):
            go_cat, go_words = self.go.judge(nr, args, pc, self.arch.RESTART_SYSCALL)
            if go_cat is not None and go_words is not None:
                return go_cat, go_words
            if go_words is not None and cat is None:
                return None, refusal(Reason.WAIT_REFUSED, words=f"{words}: {go_words}",
                                     where="")
        if cat is None:
            return None, words if isinstance(words, Refusal) else \
                refusal(Reason.WAIT_REFUSED, words=words, where="")
        assert isinstance(words, str)
        return cat, words

    def _classify_wait(self, tid: int, nr: int, args: tuple[int, ...], stopped: bool
                       ) -> tuple[str | None, str | Refusal]:
        if nr == self.arch.RESTART_SYSCALL:
            # Judged like any other wait (safepoints.classify_restart); the
            # wait channel is read before the stop (in our stop it says
            # ptrace_stop) and the verdict kept for the stopped thread.
            if not stopped:
                try:
                    wchan = read_bytes(self.tracer.task(tid, "wchan"), self.pid, tid)
                except AllocdiagError:
                    return None, refusal(Reason.VANISHED)
                self.restart_kinds[tid] = safepoints.classify_restart(wchan, args)
            return self.restart_kinds.get(tid, (None, refusal(Reason.RESTART_UNSEEN)))
        cat, words = safepoints.classify_wait(nr, args)
        if cat is None and words is None:
            name = self.arch.SYSCALL_NAMES.get(nr, f"syscall {nr}")
            note = ""
            if nr in (safepoints.NR_semop, safepoints.NR_semtimedop):
                note = " (a ptrace stop would make it return EINTR)"
            elif name in ADDRESS_SPACE_SYSCALLS:
                note = " (changing its address space, typically for the allocator)"
            return None, refusal(Reason.BUSY_SYSCALL, name=name, note=note, where="")
        return cat, words or ""

    def chosen(self, c: Candidate) -> None:
        """C was borrowed: the next borrow looks at it first (again())."""
        self.last_chosen = c

    def again(self, only_tid: int | None) -> Round | None:
        """A round of the thread the last borrow got, alone, when it is in
        a wait again and the process's mappings are byte for byte those of
        the last full round; else None (a full round).  A recording or an
        exporter then reads that thread's two files and the mappings, not
        two files of every thread (a 216-thread varnishd: ~12 ms of CPU a
        snapshot).  The thread passes the checks a full round makes of
        each thread (consider, with_room).  What it does not redo is the
        look at the other threads: the best category among them is a
        preference, and their stack pointers, needed to prove this thread's
        stack mapping holds no other thread's stack, are the full round's.
        With the same mappings no stack mapping appeared, merged or moved,
        so only the threads whose stack pointers lay in this mapping then
        (round_stacks) can be there now.  Only a borrow's first round: when
        the thread is refused, before or after its stop, every thread is
        looked at."""
        last, first = self.last_chosen, self.first_round
        self.first_round = False
        if last is None or not first or only_tid not in (None, last.tid) or \
                self.round_maps is None:
            return None
        try:
            f = self.thread_facts(last.tid)
        except RemoteCallError:
            return None             # gone: the full round says so
        if self.read_maps() != self.round_maps:
            log.debug("pid %d: the mappings changed since the last full round", self.pid)
            return None
        c = self.consider(last.tid, f)
        if isinstance(c, Refusal):
            why: Refusal | str | None = c
        else:
            why = "running" if c.category == safepoints.RUNNING else self.with_room(c)
            if why is None:
                return Round(candidates=[c])
        log.debug("pid %d tid %d, borrowed last time, not again: %s", self.pid, last.tid, why)
        return None

    def candidates(self, only_tid: int | None) -> Round:
        """Threads worth stopping, best first (safepoints.CATEGORY_ORDER),
        and why the others are not: the last borrowed thread alone when it
        waits again (again()), else every thread."""
        rnd = self.again(only_tid)
        if rnd is not None:
            return rnd
        rnd = Round()
        why = rnd.refused
        task_dir = f"{self.procfs}/{self.pid}/task"
        try:
            tids = [int(t) for t in os.listdir(task_dir)]
        except OSError as e:
            raise ptrace.translate_errno(e.errno or 0, self.pid, "list threads") from None
        if only_tid is not None:
            if only_tid not in tids:
                raise RemoteCallError(f"thread {only_tid} does not exist", pid=self.pid)
            tids = [only_tid]
        facts_of = {}
        for tid in tids:
            try:
                facts_of[tid] = self.thread_facts(tid)
            except (NoSuchProcess, AccessDenied):
                raise
            except RemoteCallError:
                continue            # thread vanished
        # Every thread's stack pointer (blocked threads show it without a
        # stop), and the mappings: a candidate's room is known before it is
        # stopped.  The other threads of the process are listed too (only_tid).
        sps: dict[int, int | None] = {tid: f.sp for tid, f in facts_of.items()}
        if only_tid is not None:
            for t in os.listdir(task_dir):
                if int(t) != only_tid:
                    with contextlib.suppress(AllocdiagError):
                        sps[int(t)] = self.thread_facts(int(t)).sp
        # True when no thread runs: every one blocked (in a wait or not)
        self.parked = all(f.state not in ("R", "D") and f.nr != NOT_IN_SYSCALL
                          for f in facts_of.values())
        self.round_maps = self.read_maps()
        self.stackmaps = stackbounds.StackMaps(parse_maps(self.round_maps))
        self.round_stacks = self.stackmaps.holders(sps.items())
        for tid, f in facts_of.items():
            c = self.consider(tid, f)
            why_not = c if isinstance(c, Refusal) else self.with_room(c)
            if why_not is not None:
                why[tid] = why_not
            else:
                assert isinstance(c, Candidate)
                rnd.candidates.append(c)
        # Best category first; within one, the most room below the stack
        # pointer first (unknown room -- running threads -- last).
        rnd.candidates.sort(key=lambda c: (
            safepoints.CATEGORY_ORDER[c.category],
            -(c.facts.room if c.facts.room is not None else -1)))
        for tid, r in why.items():
            log.debug("pid %d tid %d refused before any stop: %s (%s)", self.pid, tid,
                      r.code.value, r.text)
        return rnd

    def consider(self, tid: int, f: Facts) -> Candidate | Refusal:
        """Thread TID as /proc shows it (F): a candidate, or why it is none."""
        if f.comm in safepoints.BACKGROUND_THREAD_COMMS:
            return refusal(Reason.BACKGROUND_THREAD, comm=f.comm)
        if f.state == "S" and f.nr >= 0:
            cat, words = self.classify(tid, f.nr, f.args, pc=f.pc)
            if cat is None:
                assert isinstance(words, Refusal)
                return self._with_where(words, f.pc, f.sp)
            assert isinstance(words, str)
            where = self.in_forbidden(f.pc) if f.pc is not None else None
            if where and not safepoints.is_libc_name(where):
                return refusal(Reason.ISSUED_INSIDE, subject=words, inside=" inside",
                               where=where)
            f.words = words
            return Candidate(tid, cat, f)
        if f.state in ("R", "S") and f.nr == NOT_IN_SYSCALL:
            if not self.forbidden:
                return refusal(Reason.RUNNING_UNJUDGED)
            if f.pc is not None and self.in_forbidden(f.pc):
                return refusal(Reason.RUNNING_INSIDE, where=self.in_forbidden(f.pc))
            return Candidate(tid, safepoints.RUNNING, f)
        if f.state == "D":
            return refusal(Reason.UNINTERRUPTIBLE)
        if f.state in ("Z", "X"):
            return refusal(Reason.EXITED)
        if f.state in ("T", "t"):
            return refusal(Reason.STOPPED)
        return refusal(Reason.OTHER_STATE, state=f.state,
                       name=self.arch.SYSCALL_NAMES.get(f.nr, f"syscall {f.nr}"))

    def with_room(self, c: Candidate) -> Refusal | None:
        """None when C's stack has room for the call (its room set), else
        why not.  Running threads show no stack pointer: judged once
        stopped."""
        if c.facts.sp is None or c.category == safepoints.RUNNING:
            return None
        _, c.facts.room, why_not = self.bounds_at(
            c.tid, c.facts.sp, thread_only=c.category == safepoints.GO_RUNTIME)
        return why_not.about(c.facts.words) if why_not else None

    def stack_pointers(self, maps: bytes) -> list[int] | None:
        """The stack pointers the last full round found in a mapping, when
        MAPS is byte for byte the /proc/PID/maps it read (else None): with
        the same mappings, the same ones hold the threads' stacks."""
        if maps != self.round_maps:
            return None
        return [sp for held in self.round_stacks.values() for _, sp in held]

    def bounds_at(self, tid: int, sp: int, fs_base: int | None = None,
                  thread_only: bool = False
                  ) -> tuple[stackbounds.Bounds | None, int | None, Refusal | None]:
        """(Bounds, room in bytes, None) of thread TID's stack with stack
        pointer SP, or (None, None, why it is no candidate): outside a
        provable stack mapping, or less room than the call needs.
        THREAD_ONLY: only a thread stack glibc created counts (the Go
        runtime rule)."""
        assert self.stackmaps is not None
        i = self.stackmaps.index(sp)
        others = [(t, s) for t, s in self.round_stacks.get(i, ()) if t != tid] \
            if i is not None else []
        bounds, why = self.stackmaps.bounds(sp, fs_base, others)
        if bounds is None:
            return None, None, refusal(Reason.STACK_UNPROVEN, why=why)
        if thread_only and bounds.kind != "thread":
            return None, None, refusal(Reason.NOT_THREAD_STACK, kind=bounds.kind)
        room = stackbounds.room(bounds, sp, self.arch.RED_ZONE)
        self.room[tid] = room
        if room < self.need():
            return None, None, refusal(Reason.NO_ROOM, room=kib(max(room, 0)),
                                       need=kib(self.need()))
        return bounds, room, None

    def _with_where(self, why: Refusal, pc: int | None, sp: int | None) -> Refusal:
        """WHY with ' inside X' when a walk with CFI parsed already (no
        parsing, no stop) finds allocator frames."""
        if self.judge_stack is None or pc is None or sp is None or \
                why.code not in (Reason.WAIT_REFUSED, Reason.BUSY_SYSCALL):
            return why
        try:
            frames = self.judge_stack.unwinder.walk({unwind.RA: pc, unwind.RSP: sp},
                                                    parse=False, partial=True)
        except Exception:
            return why
        found = self.judge_stack.verdict(frames)
        if found is None or found.code is not Reason.ALLOCATOR_FRAME:
            return why
        return Refusal(why.code, {**why.args, "where": f" {found.text}"}, why.subject)

    def read_maps(self) -> bytes:
        """/proc/PID/maps for the current round: the bytes new_borrow was
        given, in its first read only, else read now."""
        maps, self._given_maps = self._given_maps, None
        if maps is None:
            maps = read_bytes(f"{self.procfs}/{self.pid}/maps", self.pid)
        return maps

    def stack_judge(self, refresh: bool = False) -> safepoints.StackJudge:
        """The StackJudge of this process (built on first use: only when a
        futex-waiting thread is the next candidate).  REFRESH: rebuild it if
        the mappings changed since (dlopen; parsed tables stay cached),
        judged by the current round's read of them (prepare refreshes right
        after a round, which read them: a second read a moment later cost a
        recording ~0.2 ms a snapshot)."""
        if self.judge_stack is None or refresh:
            maps = self.round_maps if refresh and self.round_maps is not None else \
                read_bytes(f"{self.procfs}/{self.pid}/maps", self.pid)
            if self.judge_stack is None or maps != self._judge_maps:
                self.judge_stack = safepoints.StackJudge(
                    self.pid, maps, self.forbidden,
                    self.try_read, self.procfs, self.undelimited)
                self._judge_maps = maps
        return self.judge_stack

    def try_read(self, addr: int, n: int) -> bytes | None:
        return memory.try_read(self.pid, addr, n)

    def prepare(self, c: Candidate, fresh_maps: bool) -> tuple[bool, Refusal | None]:
        """Work done before C is stopped (not time spent waiting for a safe
        point): decode the CFI earlier stops' walks met undecoded
        (decode_undecoded), parse the CFI a futex or resumed wait's walk
        needs, walk the stack of a wait judged by its syscall
        (StackJudge.look_ahead), or load every object's CFI index for a
        running thread's walk.  Returns (whether it read the mappings, a
        refusal the look-ahead found)."""
        self.decode_undecoded()
        mode = self.seccomp_mode(c.tid)
        if mode == abi.SECCOMP_MODE_STRICT:
            # the kernel kills such a thread at the first other syscall,
            # without a ptrace stop the engine could undo (kernel/seccomp.c
            # __secure_computing_strict): never borrowed
            return False, refusal(Reason.SECCOMP_STRICT, subject=c.facts.words)
        if mode != abi.SECCOMP_MODE_DISABLED:
            # a filter, or a mode not known: its calls' syscalls are judged
            # (callframe.Caller.syscall_stop)
            self.filtered.add(c.tid)
        if c.facts.nr in safepoints.EINTR_RESTARTABLE:
            # only a wait eintr_restartable may be asked about (not a running thread)
            self.read_insn_before(c.facts.pc)
        walked = False
        if c.category in LOOK_AHEAD_CATEGORIES and c.facts.nr != self.arch.RESTART_SYSCALL \
                and c.facts.pc is not None and c.facts.sp is not None:
            # no walk in the stop for these waits: walk before it, and the
            # judge checks the thread still stands where this walk started
            judge = self.stack_judge(refresh=not fresh_maps)
            walked = True
            why = judge.look_ahead(c.facts.pc, c.facts.sp, c.facts.words)
            if why is not None:
                return walked, why
            self.looked_ahead[c.tid] = (c.facts.pc, c.facts.sp)
        if c.category == safepoints.EPOLL:
            # when it last ran, for the time left of its timeout: read only
            # for the epoll waiter about to be stopped (clock_offset moves
            # this thread to that CPU and sleeps there), not for every one;
            # of a wait with no timeout only its se.exec_start (still_asleep)
            c.facts.since, c.facts.slept_at = self.last_ran(
                c.tid, safepoints.times_out(c.facts.nr, c.facts.args))
            return walked, None
        if c.category == safepoints.GO_RUNTIME:
            return False, None      # proven by its stub's range: no walk
        if c.category == safepoints.FUTEX or c.facts.nr == self.arch.RESTART_SYSCALL:
            judge = self.stack_judge(refresh=not fresh_maps)
            pre = judge.prepare(c.facts.pc, c.facts.sp) \
                if c.facts.pc is not None and c.facts.sp is not None else None
            if pre is not None:
                return True, refusal(Reason.ALLOCATOR_AHEAD, subject=c.facts.words,
                                     frame=pre.text)
            return True, None
        if c.category == safepoints.RUNNING and self.forbidden:
            judge = self.stack_judge(refresh=not fresh_maps)
            if not fresh_maps:
                judge.load_tables()
            return True, None
        return walked, None

    def seccomp_mode(self, tid: int) -> int | None:
        """TID's seccomp mode (abi.SECCOMP_MODE_*) from its status, or None
        when unreadable.  Read before the stop: a filter another thread adds
        with SECCOMP_FILTER_FLAG_TSYNC between this read and the call is
        not seen (docs/target-writes.md)."""
        try:
            status = read_bytes(self.tracer.task(tid, "status"), self.pid, tid)
        except AllocdiagError:
            return None
        at = status.find(SECCOMP_FIELD)
        if at < 0:
            return None
        value = status[at + len(SECCOMP_FIELD):].split(None, 1)
        return int(value[0]) if value and value[0].isdigit() else None

    def read_insn_before(self, pc: int | None) -> None:
        """Keep the bytes before PC (a waiting thread's, from /proc) when PC
        lies in a mapping nobody can write: text that cannot change before
        the stop.  Writable or unknown mappings (JIT code) are read in the
        stop as before."""
        if pc is None or self.stackmaps is None:
            return
        i = self.stackmaps.index(pc - len(safepoints.SYSCALL_INSN))
        if i is None:
            return
        m = self.stackmaps.maps[i]
        if "w" in m.perms or "x" not in m.perms or pc > m.end:
            return
        self.insn_before[pc] = self.try_read(pc - len(safepoints.SYSCALL_INSN),
                                             len(safepoints.SYSCALL_INSN))

    def last_ran(self, tid: int, timed: bool = True) -> tuple[float | None, float | None]:
        """(CLOCK_MONOTONIC seconds at which TID last ran (it went to sleep
        then), or None; its se.exec_start as read): se.exec_start of
        /proc/PID/task/TID/sched, the scheduler's task clock of the CPU it
        slept on, moved onto CLOCK_MONOTONIC by that CPU's offset
        (clock_offset).  TIMED false (a wait with no timeout to give back):
        the first is None, and no offset is measured (~0.3 ms of CPU, a
        third of what the look before a stop costs)."""
        try:
            theirs = exec_start(read_bytes(self.tracer.task(tid, "sched"), self.pid, tid))
            if not timed:
                return None, theirs
            seen = _asleep_since.get((self.pid, tid))
            if seen is not None and theirs is not None and \
                    seen[:2] == (self.tracer.start, theirs):
                # asleep since before the last release looked (no offset
                # needed: note_back_asleep)
                return seen[2], theirs
            stat = read_bytes(self.tracer.task(tid, "stat"), self.pid, tid)
            cpu = int(stat.rsplit(b")", 1)[1].split()[STAT_PROCESSOR_FIELD])
        except (AllocdiagError, ValueError, IndexError):
            return None, None
        offset = clock_offset(cpu)
        return (None if theirs is None or offset is None else theirs + offset), theirs

    def note_back_asleep(self, tid: int) -> bool:
        """After the release of an epoll-family waiter whose timeout was
        given back: look (up to BACK_ASLEEP_WAIT_S) for TID asleep in its
        system call again, and keep when (_asleep_since).  Its exec_start
        read before and after the look at /proc's syscall file, unchanged,
        says it was not picked to run in between, so it was asleep since
        before the first read and the moment kept is never before its wait
        began (a timeout given back from it is never too short).  True
        when kept."""
        deadline = time.monotonic() + BACK_ASLEEP_WAIT_S
        sched = self.tracer.task(tid, "sched")
        while True:
            try:
                before = exec_start(read_bytes(sched, self.pid, tid))
                in_call = parse_syscall(read_bytes(self.tracer.task(tid, "syscall"),
                                                   self.pid, tid)).nr != NOT_IN_SYSCALL
                seen = time.monotonic()
                after = exec_start(read_bytes(sched, self.pid, tid))
            except (AllocdiagError, ValueError):
                return False
            if in_call and before is not None and before == after:
                keep_newest(_asleep_since, (self.pid, tid), (self.tracer.start, before, seen),
                            ASLEEP_SINCE_MAX)
                return True
            if seen >= deadline:
                return False
            os.sched_yield()

    def still_asleep(self, c: Candidate) -> bool:
        """True when C has not run since prepare read when it went to sleep
        (its se.exec_start unchanged), so that reading still holds for the
        wait about to be stopped; a wait that ended and began again in
        between would otherwise be given back too little time (seen once:
        858 ms for a 1 s wait, with a rehearsal in between)."""
        if c.facts.slept_at is None:
            return True
        try:
            sched = read_bytes(self.tracer.task(c.tid, "sched"), self.pid, c.tid)
        except AllocdiagError:
            return False
        return exec_start(sched) == c.facts.slept_at

    # ---- the stopped thread -------------------------------------------------------
    def judge(self, th: Thread) -> Refusal | None:
        """None when TH is at a safe point (its verdict filled in), else the
        refusal."""
        v = th.verdict
        if th.at is At.GROUP:
            return refusal(Reason.GROUP_STOP)
        nr, ret = self.arch.syscall_state(th.regs)
        eintr_fix = None
        if nr >= 0 and ret == -safepoints.EINTR and nr in safepoints.EINTR_RESTARTABLE:
            # The stop made this wait return EINTR: whether borrowed or not,
            # give it back as -ERESTARTNOHAND, so the kernel restarts it (or
            # returns EINTR if a signal with a handler is delivered on the
            # way out, as it would have without us).
            eintr_fix = self.eintr_restartable(th)
            if eintr_fix is None:
                v.restart_rax = -safepoints.ERESTARTNOHAND
                v.timeout_ns = self.timeout_arg(th.regs)
        if nr >= 0:
            cat, name = self.classify(th.tid, nr, self.arch.syscall_args(th.regs),
                                      stopped=True, pc=self.arch.pc(th.regs))
            if cat is None:
                assert isinstance(name, Refusal)
                return name
            assert isinstance(name, str)
            # The wait must not have been issued by the allocator itself (e.g.
            # a spin-lock back-off sleep): PC may be in libc's syscall wrapper,
            # but no forbidden non-libc text.
            pc_where = self.in_forbidden(self.arch.pc(th.regs))
            if pc_where and not safepoints.is_libc_name(pc_where):
                return refusal(Reason.ISSUED_INSIDE, subject=name, inside="", where=pc_where)
            if ret == -safepoints.EINTR and v.restart_rax is None:
                return refusal(Reason.EINTR_NOT_RESTARTABLE, subject=name,
                               why=eintr_fix or "not a wait")
            if cat == safepoints.FUTEX:
                why = self.stack_judge().judge(unwind.regs_from_user(th.regs))
                self.keep_undecoded(th)
                if why:
                    return why.about(name)
            elif nr == self.arch.RESTART_SYSCALL and cat != safepoints.GO_RUNTIME:
                why = self.walk_resumed(th)
                self.keep_undecoded(th)
                if why:
                    return why.about(name)
                name = v.syscall or name
            ahead = self.looked_ahead.get(th.tid)
            if cat in LOOK_AHEAD_CATEGORIES and nr != self.arch.RESTART_SYSCALL and \
                    ahead is not None and ahead != (self.arch.pc(th.regs), self.arch.sp(th.regs)):
                # it ran and waits elsewhere now: judged again next round
                return refusal(Reason.WALK_UNPROVEN, subject=name,
                               why="not where the walk before the stop found it")
            tight = self.fit(th, thread_only=cat == safepoints.GO_RUNTIME)
            if tight:
                return tight.about(name)
            v.syscall = name
            v.category = cat
            v.boundary = ret not in ERESTART and v.restart_rax is None
            v.kind = "idle"
            return None
        # in user code
        if not self.forbidden:
            return refusal(Reason.RUNNING_UNJUDGED)
        where = self.in_forbidden(self.arch.pc(th.regs))
        if where:
            return refusal(Reason.RUNNING_INSIDE, where=where)
        section = self.rseq_section(th)
        if section:
            return refusal(Reason.RUNNING_RSEQ, start=section.start_ip,
                           length=section.post_commit_offset)
        # A CFI walk finds allocator frames at any depth (and refuses signal
        # frames: a handler may have interrupted malloc).  Unless it reached
        # the thread's first frame by the CFI's own word, the scan of the
        # stack top must pass too: it refuses any return-address-looking word
        # into libc or the allocator, covering JIT or unmapped code and
        # objects without CFI, where no walk is possible.  After a proven
        # walk the scan would only refuse for nothing: the live return
        # addresses into __libc_start_call_main or start_thread of a shallow
        # stack, and stale words of earlier calls (a busy Python 3.11 main
        # thread, whose eval loop runs ~1 KiB above them, was never borrowed).
        walked, proven = self.walk_running(th)
        if walked:
            return walked
        if not proven:
            sp = self.arch.sp(th.regs)
            for addr, word in self.stack_words(sp, self.stack_window):
                where = self.in_forbidden(word)
                if where:
                    return refusal(Reason.RUNNING_RETURN_ADDRESS, where=where, offset=addr - sp)
        tight = self.fit(th)
        if tight:
            return tight.about(safepoints.RUNNING_SUBJECT)
        v.kind = "running"
        v.category = safepoints.RUNNING
        return None

    def rseq_section(self, th: Thread) -> rseq.CriticalSection | None:
        """The rseq critical section stopped TH is inside, if any (its
        registration read once per thread; none known before Linux 5.13)."""
        if th.tid not in self.rseq_areas:
            self.rseq_areas[th.tid] = rseq.registered_area(th.tid, self.pid)
        area = self.rseq_areas[th.tid]
        if not area:
            return None
        return rseq.section_at(self.pid, area, self.arch.pc(th.regs))

    def fit(self, th: Thread, thread_only: bool = False) -> Refusal | None:
        """None when the stopped thread's own stack mapping has room for
        the call (its fs_base now known), with its frame bounds set; else
        why not."""
        assert self.stackmaps is not None
        bounds, _, why = self.bounds_at(th.tid, self.arch.sp(th.regs),
                                        self.arch.thread_pointer(th.regs), thread_only)
        if why:
            return why
        th.frame.bounds = bounds
        th.frame.callee_need = self.stack_need
        return None

    def walk_running(self, th: Thread) -> tuple[Refusal | None, bool]:
        """CFI walk of a running thread: (a refusal when a frame lies in
        allocator code or the walk meets a CFA given as an expression (a
        signal frame or PLT stub: a handler may have interrupted malloc),
        or an FDE not decoded yet, else None; proven).  PROVEN: the walk
        reached the thread's first frame by its CFI's rule (unwind.END_RULE),
        every frame in mapped code with CFI.  (None, False) when no walk is
        possible.  The walk decodes nothing: pyelftools took most of a busy
        Python's 3-15 ms stops, one new FDE at a time.  At the first FDE not
        decoded the thread is refused with a copy of its stack, and
        decode_undecoded decodes that FDE and walks the copy (decoding
        what it meets) before the next stop."""
        judge = self.judge_stack
        if judge is None:
            return None, False
        regs = unwind.regs_from_user(th.regs)
        try:
            w = judge.unwinder.walk(regs, parse=False, decode=False, tolerant=True)
        except Exception:
            return None, False
        if isinstance(w.cause, unwind.CFAExpression):
            return refusal(Reason.RUNNING_UNPROVABLE, error=str(w.cause)), False
        if isinstance(w.cause, unwind.NeedsDecode):
            where = judge.allocator_frame(w.frames)
            if where:
                return refusal(Reason.RUNNING_CALLED_FROM, where=f"inside {where}"), False
            self.undecoded[th.tid] = (w.cause, regs, self.stack_copy(th))
            return refusal(Reason.RUNNING_UNDECODED, where=w.cause.where), False
        if not w.complete:
            return None, False
        where = judge.allocator_frame(w.frames)
        if where:
            return refusal(Reason.RUNNING_CALLED_FROM, where=f"inside {where}"), False
        return None, w.end == unwind.END_RULE

    def keep_undecoded(self, th: Thread) -> None:
        """After the stack judge's walk of waiting TH: what it could not
        decode, for decode_undecoded (no copy: a waiting thread's stack
        stays as it is, and is read live then)."""
        needs = self.judge_stack.needs if self.judge_stack is not None else None
        if needs is not None:
            self.undecoded[th.tid] = (needs, unwind.regs_from_user(th.regs), None)

    def stack_copy(self, th: Thread) -> unwind.StackCopy | None:
        """The stopped thread's stack from its sp upward (at most
        STACK_COPY_MAX bytes; one read), with the live stack behind it for
        the words beyond (outer frames, which have not returned), or None
        when unreadable."""
        assert self.stackmaps is not None
        sp = self.arch.sp(th.regs)
        bounds, _ = self.stackmaps.bounds(sp, self.arch.thread_pointer(th.regs))
        top = bounds.end if bounds is not None else sp + STACK_COPY_MAX
        data = self.try_read(sp, min(top - sp, STACK_COPY_MAX))
        if not data:
            return None
        return unwind.StackCopy(sp, data, unwind.PagedMemory(self.try_read))

    def decode_undecoded(self) -> None:
        """Decode, with no thread stopped, what running threads' walks in
        their stops met undecoded: each FDE named (so the next stop's walk
        gets past it, whatever the thread does meanwhile) and every FDE a
        walk of the copied stack meets.  A failure is kept by the table:
        the next walk stops there for good (unproven), not for decoding."""
        judge = self.judge_stack
        for need, regs, copy in self.undecoded.values():
            try:
                need.table.decode(need.index)
            except unwind.UnwindError as exc:
                log.debug("pid %d: %s", self.pid, exc)
            if judge is not None:
                try:
                    judge.unwinder.walk(regs, parse=True, memory=copy, tolerant=True)
                except Exception as exc:     # a walk that proves nothing here
                    log.debug("pid %d: walk of a copied stack failed: %s", self.pid, exc)
        self.undecoded.clear()

    def walk_resumed(self, th: Thread) -> Refusal | None:
        """A sleep or poll resumed by restart_syscall: None when an
        .eh_frame walk from the stopped registers (CFI parsed before the
        stop) reaches the program's own frames with none in allocator code
        (gperftools' spin lock sleeps in nanosleep), else why not."""
        judge = self.stack_judge()
        frames, why = judge.walk(unwind.regs_from_user(th.regs))
        if frames is None:
            return why
        where = judge.allocator_frame(frames)
        if where:
            return refusal(Reason.ALLOCATOR_FRAME, where=where)
        if len(frames) < 2:
            return refusal(Reason.WALK_UNPROVEN, why="stack walk found no caller")
        fn = judge.libc_function(frames[0])
        if fn:
            th.verdict.syscall = f"{fn} (resumed by restart_syscall)"
        return None

    def timeout_arg(self, regs: Any) -> int | None:
        """The finite relative timeout (ns) an epoll-family wait was called
        with, read at the stop (before any call reuses the stack), or None
        (infinite, non-blocking, unreadable, or not such a wait)."""
        nr, _ = self.arch.syscall_state(regs)
        args = self.arch.syscall_args(regs)
        if nr in safepoints.TIMEOUT_MS_ARG:
            ms = abi.signed32(args[safepoints.TIMEOUT_MS_ARG[nr]])
            return ms * NS_PER_MS if ms > 0 else None
        if nr in safepoints.TIMESPEC_ARG:
            ptr = args[safepoints.TIMESPEC_ARG[nr]]
            ts = memory.try_read(self.pid, ptr, TIMESPEC.size) if ptr else None
            if ts is None:
                return None
            sec, nsec = TIMESPEC.unpack(ts)
            return sec * NS_PER_S + nsec if sec >= 0 and 0 <= nsec < NS_PER_S else None
        return None

    def eintr_restartable(self, th: Thread) -> str | None:
        """None when a wait that holds -EINTR at the stop may be restored
        with -ERESTARTNOHAND: a 64-bit `syscall` instruction just before rip
        (int 0x80 is also 2 bytes but uses i386 numbers) and orig_rax >= 0
        (else the kernel would not restart and -514 would reach the program)."""
        regs = th.regs
        if self.arch.code_segment(regs) != safepoints.USER_CS_64:
            return "not 64-bit code"
        nr, _ = self.arch.syscall_state(regs)
        if nr < 0:
            return "no syscall to restart"
        pc = self.arch.pc(regs)
        insn = self.insn_before.get(pc)
        if insn is None:
            insn = self.try_read(pc - len(safepoints.SYSCALL_INSN), len(safepoints.SYSCALL_INSN))
        if insn != safepoints.SYSCALL_INSN:
            return "no syscall instruction before the pc"
        return None

    def stack_words(self, sp: int, window: int) -> list[tuple[int, int]]:
        out = []
        addr, end = sp, sp + window
        w = self.arch.WORD
        while addr < end:
            chunk = min(end - addr, stackbounds.PAGE_SIZE - (addr % stackbounds.PAGE_SIZE))
            data = memory.try_read(self.pid, addr, chunk)
            if data is None:
                break
            for i in range(0, len(data) - w + 1, w):
                out.append((addr + i, int.from_bytes(data[i:i + w], "little")))
            addr += chunk
        return out

    # ---- the message when no thread was borrowed ------------------------------------
    def refusal_message(self, why: dict[int, Refusal], only_tid: int | None,
                        deadline_s: float) -> str:
        """Per thread, what it was doing and why it was not borrowed, and
        what the user can do."""
        detail = "; ".join(f"tid {t} {r.text}" for t, r in sorted(why.items())[:MESSAGE_THREADS])
        if len(why) > MESSAGE_THREADS:
            detail += f"; ... ({len(why) - MESSAGE_THREADS} more threads)"
        secs = f"{deadline_s:g}"
        if any(r.code is Reason.NO_ROOM for r in why.values()):
            # Safe points existed but their stacks were too small: say so
            # first (the per-thread detail follows).
            head = (f"no thread has room for the call: largest room "
                    f"{kib(max(0, max(self.room.values(), default=0)))}, the call needs "
                    f"{kib(self.need())}")
            return f"{head}: {detail}"
        if why and all(r.code in safepoints.PERMANENT_REASONS for r in why.values()):
            head = (f"thread {only_tid} can never be borrowed" if only_tid is not None else
                    "no thread of this process can ever be borrowed")
            return (f"{head}: {detail}; what to do: read what needs no call into the "
                    "process (--no-attach)")
        if only_tid is not None:
            head = f"thread {only_tid} was never at a safe point for {secs} s"
            return f"{head}: {detail}" if detail else head
        if why and self.forbidden and all(r.busy for r in why.values()):
            head = (f"every thread was busy inside the allocator or libc for {secs} s "
                    "(none parked in a wait, none interrupted outside allocator/libc text)")
        else:
            head = f"no thread could be borrowed safely within {secs} s"
        hint = ("; what to do: try again (threads move between waits), give it more "
                "time, or read what needs no call into the process (--no-attach)")
        return (f"{head}: {detail}" if detail else head) + hint


# The refusal message names this many threads, then counts the rest.
MESSAGE_THREADS = 12
# How much of a running thread's stack is copied when its walk in the stop
# meets CFI not decoded yet (one process_vm_readv; words beyond it are read
# live when the copy is walked)
STACK_COPY_MAX = 16 * 1024
# clock_offset: samples taken, and the sleep each wakes from (short: the
# scheduler picks the thread at once, which sets its exec_start).  The
# first wake on the moved-to CPU is late (~100 us: the CPU was idle), the
# second rarely: over 200 measures on 6.18 the smaller of two was within
# 2.5 us of the smallest of three at the median, 63 us at most, for ms-
# rounded timeouts; a third cost ~0.07 ms of every such snapshot's CPU.
CLOCK_OFFSET_TRIES = 2
CLOCK_OFFSET_SLEEP_S = 20e-6


def clock_offset(cpu: int) -> float | None:
    """CLOCK_MONOTONIC minus CPU's scheduler task clock, in seconds.
    The task clock leaves out IRQ and steal time, so it drifts from
    CLOCK_MONOTONIC differently on each CPU: measured on that CPU, by
    this thread waking there from a short sleep (the scheduler sets
    exec_start as it picks the thread) and reading its own exec_start
    at once; the smallest of CLOCK_OFFSET_TRIES (the least delay after
    the pick)."""
    try:
        old = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {cpu})
    except OSError:
        return None
    try:
        best = None
        for _ in range(CLOCK_OFFSET_TRIES):
            time.sleep(CLOCK_OFFSET_SLEEP_S)
            ours = exec_start(read_all("/proc/thread-self/sched"))
            now = time.monotonic()
            if ours is not None and (best is None or now - ours < best):
                best = now - ours
        return best
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            # Off that CPU first, then the old mask back: the scheduler
            # would leave this thread where it is, on the CPU of the
            # thread it is about to stop, and spinning there it kept that
            # thread from reaching its stop (measured on redis: 2 ms
            # between PTRACE_INTERRUPT and the stop, the event loop
            # runnable and not running all that time).
            others = old - {cpu}
            if others:
                os.sched_setaffinity(0, others)
            os.sched_setaffinity(0, old)


