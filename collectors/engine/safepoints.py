"""Safe-point policy of the remote-call engine: which thread may be borrowed.

A borrowed thread must hold no allocator lock (DESIGN.md "Remote calls",
rule 2; measured facts in reference/safe-points.md).  In order of
preference (``CATEGORY_ORDER``):

- ``restartable``: parked in a wait that the kernel restarts by itself when
  the saved registers are restored (rax at the stop is -ERESTARTSYS,
  -ERESTARTNOHAND or -ERESTART_RESTARTBLOCK; each one measured by
  tests/test_safepoints.py on this kernel), issued from outside allocator
  code.  No stack walk needed.
- ``epoll``: epoll_wait/epoll_pwait/epoll_pwait2/rt_sigtimedwait.  They hold a
  plain -EINTR at the stop; the engine restores them with rax =
  -ERESTARTNOHAND (``eintr_restart_regs``), the kernel's own restart path.
- ``futex``: a FUTEX_WAIT_BITSET wait (condition variable, semaphore,
  pthread_join) that a ``.eh_frame`` stack walk from the stopped thread's
  registers proves is outside the allocator: no frame in allocator code, and
  the outermost frame of the innermost C-library run inside an allow-listed
  wait function (exact ``.dynsym`` ranges).  Never FUTEX_WAIT (glibc's lock
  contention waits with value 2), PI, requeue or futex_waitv.
- ``go-runtime``: an M of a cgo binary parked by the Go runtime itself, in
  its own syscall stubs on a glibc thread stack (``GoRuntime``: no .eh_frame
  walk is possible through Go code, the stub's exact .symtab range is the
  proof).
- ``running``: interrupted in user code outside every forbidden range.

What a running thread must not be inside (the C library, the loader, the
allocator's code) is computed by the caller (``collectors.allocators.code``)
and given to the engine as ranges.
"""

from __future__ import annotations

import enum
import errno
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable

from collectors import lazylog
from collectors.newest import keep_newest
from diag.model.records import field, record, replace
from collectors.binary import unwind
from collectors.binary.elf import STT_FUNC, STT_GNU_IFUNC
from collectors.binary.ranges import Ranges
from collectors.engine import abi, arch_x86_64

log = lazylog.getLogger("collectors.engine")


# collectors.binary.ranges is not typed: its constructor, through a typed name
new_ranges: Callable[[Iterable[tuple[int, int, Any]]], Ranges] = Ranges


# ---- why a thread is not borrowed: reason codes ---------------------------------
# Every refusal is a Reason; decisions look at the code, never at the words.
# The words users (and tests) read come from REASON_TEXT, keyed by the code.

class Reason(enum.Enum):
    BACKGROUND_THREAD = "background-thread"
    WAIT_REFUSED = "wait-refused"            # the policy refuses this wait (futex lock, ...)
    BUSY_SYSCALL = "busy-syscall"            # in a syscall that is no wait (mmap, write, ...)
    ISSUED_INSIDE = "issued-inside"          # a wait issued from forbidden non-libc text
    RUNNING_UNJUDGED = "running-unjudged"
    RUNNING_INSIDE = "running-inside"
    RUNNING_UNPROVABLE = "running-unprovable"
    RUNNING_CALLED_FROM = "running-called-from"
    RUNNING_RETURN_ADDRESS = "running-return-address"
    RUNNING_RSEQ = "running-rseq"               # inside a restartable sequence (engine.rseq)
    RUNNING_NOT_STOPPED = "running-not-stopped"  # stops without a call past their budget: paced
    RUNNING_UNDECODED = "running-undecoded"     # its walk met CFI not decoded yet (decoded after)
    UNINTERRUPTIBLE = "uninterruptible"
    EXITED = "exited"
    STOPPED = "stopped"
    OTHER_STATE = "other-state"
    STACK_UNPROVEN = "stack-unproven"        # no provable stack mapping (stackbounds)
    NOT_THREAD_STACK = "not-thread-stack"
    NO_ROOM = "no-room"                      # a stack too small for the call
    ALLOCATOR_FRAME = "allocator-frame"      # a walk found allocator code
    ALLOCATOR_AHEAD = "allocator-ahead"      # ... before the stop (look-ahead walk)
    WALK_UNPROVEN = "walk-unproven"          # a walk did not prove the wait safe
    TRACED = "traced"
    VANISHED = "vanished"
    DID_NOT_STOP = "did-not-stop"
    OWN_SIGNAL = "own-signal"
    GROUP_STOP = "group-stop"
    EINTR_NOT_RESTARTABLE = "eintr-not-restartable"
    RESTART_UNSEEN = "restart-unseen"
    SECCOMP_STRICT = "seccomp-strict"           # any syscall in the call kills the thread
    SIGNAL_HANDLER = "signal-handler"           # a signal frame below the wait (look-ahead)


# The words for each code.  "{subject}" is what the thread was doing (the
# wait's name); a template without it gets "subject: " in front when set.
REASON_TEXT: Mapping[Reason, str] = {
    Reason.BACKGROUND_THREAD: "{comm}: the allocator's own background thread",
    Reason.WAIT_REFUSED: "{words}{where}",
    Reason.BUSY_SYSCALL: "in {name}{note}{where}",
    Reason.ISSUED_INSIDE: "{subject} issued from{inside} {where}",
    Reason.RUNNING_UNJUDGED: "running user code (no forbidden ranges to judge it)",
    Reason.RUNNING_INSIDE: "running inside {where}",
    Reason.RUNNING_UNPROVABLE: "running: stack not provable ({error})",
    Reason.RUNNING_CALLED_FROM: "running: called from {where}",
    Reason.RUNNING_RETURN_ADDRESS: "running: return address into {where} at sp+{offset:#x}",
    Reason.RUNNING_RSEQ: "running inside a restartable sequence (rseq critical section at "
                         "{start:#x}, {length} bytes): a call would cancel its abort",
    Reason.RUNNING_NOT_STOPPED: "running (not stopped in this round: this borrow's stops that "
                                "made no call reached their bound, and are paced)",
    Reason.RUNNING_UNDECODED: ("running: its stack reaches {where}, whose unwind rules no "
                               "run had decoded (decoded after the stop, for the next one)"),
    Reason.UNINTERRUPTIBLE: "uninterruptible sleep (disk or kernel wait)",
    Reason.EXITED: "exited",
    Reason.STOPPED: "stopped",
    Reason.OTHER_STATE: "{name} (state {state})",
    Reason.STACK_UNPROVEN: "{why}",
    Reason.NOT_THREAD_STACK: ("its stack is the {kind} stack, not a thread stack glibc "
                              "created (the Go runtime rule needs one)"),
    Reason.NO_ROOM: ("has {room} of its stack free below the stack pointer; "
                     "the call needs {need}"),
    Reason.ALLOCATOR_FRAME: "inside {where}",
    Reason.ALLOCATOR_AHEAD: "{subject} {frame}",
    Reason.WALK_UNPROVEN: "{why}",
    Reason.TRACED: "traced by pid {tracer}",
    Reason.VANISHED: "vanished",
    Reason.DID_NOT_STOP: "did not stop (uninterruptible)",
    Reason.OWN_SIGNAL: "handling its own {signal}",
    Reason.GROUP_STOP: "group-stop",
    Reason.EINTR_NOT_RESTARTABLE: ("{subject}: returned EINTR at the stop and cannot be "
                                   "restarted ({why}); released"),
    Reason.RESTART_UNSEEN: "a wait resumed by restart_syscall that was not seen before the stop",
    Reason.SIGNAL_HANDLER: ("{subject} inside a signal handler (a signal frame lies on its "
                            "stack): the code the signal interrupted may be the "
                            "allocator's, holding its lock"),
    Reason.SECCOMP_STRICT: ("in seccomp strict mode, where any syscall but read, "
                            "write, exit and sigreturn kills the thread (an allocation's "
                            "brk or mmap, a lock's futex inside the call)"),
}
# Refusals no wait can change: the thread will never be borrowed (a process
# of such threads only is refused at once, not after the deadline).
PERMANENT_REASONS = frozenset({Reason.SECCOMP_STRICT})

# Refusals of threads found busy (running, or in a syscall that is no wait):
# when every thread is one, the process is busy inside allocator or libc.
BUSY_REASONS = frozenset({
    Reason.BUSY_SYSCALL, Reason.RUNNING_UNJUDGED, Reason.RUNNING_INSIDE,
    Reason.RUNNING_UNPROVABLE, Reason.RUNNING_CALLED_FROM, Reason.RUNNING_RETURN_ADDRESS,
    Reason.RUNNING_RSEQ, Reason.RUNNING_NOT_STOPPED})
RUNNING_SUBJECT = "running"


@record(frozen=True)
class Refusal:
    """Why one thread is not borrowed: a code, the facts its words need,
    and what the thread was doing (SUBJECT)."""

    code: Reason
    args: Mapping[str, Any] = field(default_factory=dict)
    subject: str | None = None

    def about(self, subject: str) -> Refusal:
        """The same refusal, said of a thread doing SUBJECT."""
        return replace(self, subject=subject)

    @property
    def busy(self) -> bool:
        """The thread was busy (running or in a non-wait syscall)."""
        return self.code in BUSY_REASONS or self.subject == RUNNING_SUBJECT

    @property
    def text(self) -> str:
        template = REASON_TEXT[self.code]
        detail = template.format(subject=self.subject, **self.args)
        if self.subject is not None and "{subject}" not in template:
            return f"{self.subject}: {detail}"
        return detail

    def __str__(self) -> str:
        return self.text


def refusal(code: Reason, subject: str | None = None, **args: Any) -> Refusal:
    return Refusal(code, args, subject)

# ---- syscalls (x86-64 numbers, arch/x86/entry/syscalls/syscall_64.tbl) -----
# Waits that restart transparently after a ptrace stop (rax at the stop, on
# Linux 6.18: -ERESTARTSYS for accept/accept4/recvfrom/recvmsg/wait4/waitid/
# read; -ERESTARTNOHAND for pause/rt_sigsuspend/select/pselect6/ppoll;
# -ERESTART_RESTARTBLOCK for nanosleep/clock_nanosleep/poll with a timeout).
NR = arch_x86_64.NR
RESTARTABLE_WAITS = {NR[n]: n for n in (
    "read", "poll", "select", "pause", "nanosleep", "accept", "recvfrom", "recvmsg",
    "wait4", "rt_sigsuspend", "clock_nanosleep", "waitid", "pselect6", "ppoll", "accept4")}
# Waits that return a plain -EINTR after a ptrace stop (fs/eventpoll.c ep_poll,
# kernel/signal.c do_sigtimedwait): restored with rax = -ERESTARTNOHAND.
EPOLL_WAITS = {NR[n]: n for n in (
    "epoll_wait", "epoll_pwait", "epoll_pwait2", "rt_sigtimedwait")}
# Epoll-family waits' relative timeouts (argument index), which a restart
# would otherwise start again in full: milliseconds (int) in a register, or
# a struct timespec pointer (include/linux/syscalls.h).
TIMEOUT_MS_ARG = {NR["epoll_wait"]: 3, NR["epoll_pwait"]: 3}
TIMESPEC_ARG = {NR["epoll_pwait2"]: 3, NR["rt_sigtimedwait"]: 2}


def times_out(nr: int, args: tuple[int, ...]) -> bool:
    """False when an epoll-family wait NR called with ARGS (as /proc's
    syscall file shows them) has no finite timeout to give back at the
    release (callframe.keep_deadline): milliseconds <= 0 (infinite, or
    none at all), or a NULL timespec pointer; True otherwise (a pointed-to
    timespec is read only at the stop)."""
    if nr in TIMEOUT_MS_ARG and len(args) > TIMEOUT_MS_ARG[nr]:
        return abi.signed32(args[TIMEOUT_MS_ARG[nr]]) > 0
    if nr in TIMESPEC_ARG and len(args) > TIMESPEC_ARG[nr]:
        return args[TIMESPEC_ARG[nr]] != 0
    return True


NR_futex = NR["futex"]
NR_semop, NR_semtimedop = NR["semop"], NR["semtimedop"]
NR_futex_waitv = NR["futex_waitv"]
NR_restart_syscall = NR["restart_syscall"]

# Waits that may be given back with rax = -ERESTARTNOHAND when a stop left
# -EINTR in rax: a -EINTR from them means "interrupted, nothing done".
EINTR_RESTARTABLE = frozenset(RESTARTABLE_WAITS) | frozenset(EPOLL_WAITS) | {
    NR_futex, NR_semop, NR_semtimedop}

# include/uapi/linux/futex.h
FUTEX_WAIT = 0
FUTEX_LOCK_PI = 6
FUTEX_WAIT_BITSET = 9
FUTEX_WAIT_REQUEUE_PI = 11
FUTEX_LOCK_PI2 = 13
FUTEX_PRIVATE_FLAG = 128
FUTEX_CLOCK_REALTIME = 256
FUTEX_CMD_MASK = ~(FUTEX_PRIVATE_FLAG | FUTEX_CLOCK_REALTIME)

# errno values the kernel leaves in rax (include/linux/errno.h)
EINTR = errno.EINTR
ERESTARTSYS = abi.ERESTARTSYS
ERESTARTNOINTR = abi.ERESTARTNOINTR
ERESTARTNOHAND = abi.ERESTARTNOHAND
ERESTART_RESTARTBLOCK = abi.ERESTART_RESTARTBLOCK
ERESTART = {-ERESTARTSYS: "ERESTARTSYS", -ERESTARTNOINTR: "ERESTARTNOINTR",
            -ERESTARTNOHAND: "ERESTARTNOHAND",
            -ERESTART_RESTARTBLOCK: "ERESTART_RESTARTBLOCK"}

SYSCALL_INSN = arch_x86_64.SYSCALL_INSN   # x86-64 `syscall`
SIGRETURN_TRAMPOLINE = arch_x86_64.SIGRETURN_TRAMPOLINE   # a signal handler's return
USER_CS_64 = arch_x86_64.USER_CS_64       # 64-bit code (int 0x80 is the i386 ABI)

RESTARTABLE, EPOLL, FUTEX, RUNNING = "restartable", "epoll", "futex", "running"
GO_RUNTIME = "go-runtime"
CATEGORY_ORDER = {RESTARTABLE: 0, EPOLL: 1, FUTEX: 2, GO_RUNTIME: 2, RUNNING: 3}

# Allocators' own threads (comm), never borrowed: they wait inside allocator
# code, often on a condition variable that looks like any other.
BACKGROUND_THREAD_COMMS = ("jemalloc_bg_thd",)

# C-library functions a thread may be parked in for the futex rule (exact
# .dynsym ranges; Debian's libc has no .symtab).  Internal helpers
# (__futex_abstimed_wait_common, __pthread_cond_wait_common) lie inside the
# walk but not outermost.
LIBC_WAIT_FUNCTIONS = frozenset((
    "pthread_cond_wait", "pthread_cond_timedwait", "pthread_cond_clockwait",
    "sem_wait", "sem_timedwait", "sem_clockwait",
    "pthread_join", "pthread_timedjoin_np", "pthread_clockjoin_np",
    "pthread_barrier_wait",
))
# glibc's allocator entry points (its internal functions are only reachable
# through these, so a frame inside any of them means "inside malloc").
GLIBC_MALLOC_FUNCTIONS = frozenset((
    "malloc", "free", "calloc", "realloc", "reallocarray", "memalign", "aligned_alloc",
    "posix_memalign", "valloc", "pvalloc", "malloc_usable_size", "malloc_trim",
    "mallinfo", "mallinfo2", "malloc_stats", "malloc_info", "mallopt", "cfree",
    "__libc_malloc", "__libc_free", "__libc_calloc", "__libc_realloc",
    "__libc_memalign", "__libc_valloc", "__libc_pvalloc", "__libc_mallinfo",
    "__libc_mallopt", "__malloc_hook", "malloc_get_state", "malloc_set_state",
))
LIBC_PREFIXES = ("libc.so", "libc-", "ld-linux", "ld-musl", "libc.musl", "libpthread")


def is_libc_name(name: str) -> bool:
    return os.path.basename(name).startswith(LIBC_PREFIXES)


def futex_cmd(op: int) -> int:
    """The FUTEX_* command of a futex op word (flags stripped)."""
    return op & FUTEX_CMD_MASK & 0x7F


def classify_wait(nr: int, args: Sequence[int]) -> tuple[str | None, str | None]:
    """(category, words) for a thread blocked in syscall NR with ARGS, or
    (None, why refused).  Categories: RESTARTABLE, EPOLL, FUTEX."""
    if nr in RESTARTABLE_WAITS:
        return RESTARTABLE, RESTARTABLE_WAITS[nr]
    if nr in EPOLL_WAITS:
        return EPOLL, EPOLL_WAITS[nr]
    if nr == NR_futex:
        op = args[1] if len(args) > 1 else -1
        cmd = futex_cmd(op)
        if cmd == FUTEX_WAIT_BITSET:
            return FUTEX, "futex condition-variable/semaphore wait"
        if cmd == FUTEX_WAIT and len(args) > 2 and args[2] == 2:
            return None, "futex lock wait (mutex contention)"
        if cmd in (FUTEX_LOCK_PI, FUTEX_LOCK_PI2, FUTEX_WAIT_REQUEUE_PI):
            return None, "futex priority-inheritance lock wait"
        if cmd == FUTEX_WAIT:
            return None, "plain futex wait (not a condition variable or semaphore)"
        return None, f"futex operation {op:#x}"
    if nr == NR_futex_waitv:
        return None, "futex_waitv"
    return None, None


# restart_syscall (219) runs a wait the kernel resumes from its restart block
# after any interruption (a ptrace stop, SIGSTOP/SIGCONT, a signal without
# handler): kernel/time/hrtimer.c hrtimer_nanosleep_restart (nanosleep,
# clock_nanosleep), fs/select.c do_restart_poll (poll with a timeout),
# kernel/futex/waitwake.c futex_wait_restart (futex with a timeout), and the
# posix-cpu/alarm timer sleeps -- each against its original absolute
# deadline.  The syscall number no longer says which; the wait channel does
# (a futex wait sleeps in futex_do_wait / futex_wait_queue*), and the
# argument registers still hold the original call's (the kernel changes only
# rax, rcx, r11).  Measured on 6.18: wchan do_syscall_64 for a resumed
# clock_nanosleep, poll_schedule_timeout.constprop.0 for poll, futex_do_wait
# for a timed condition wait (args op 0x89 = FUTEX_WAIT_BITSET|PRIVATE).


def classify_restart(wchan: bytes, args: Sequence[int]) -> tuple[str | None, str]:
    """(category, words) for a thread blocked in restart_syscall with wait
    channel WCHAN (bytes) and argument registers ARGS, or (None, why).  A
    resumed futex is judged like the futex it is (op from the argument
    registers); any other is a resumed sleep or poll: RESTARTABLE, which the
    engine accepts only after an .eh_frame walk shows no allocator frame."""
    if b"futex" in wchan:
        cat, words = classify_wait(NR_futex, args)
        return cat, f"{words} (resumed by restart_syscall)"
    return RESTARTABLE, "a sleep or poll resumed by restart_syscall"


# ---- the stack-walk proof for futex waits -----------------------------------------

# (libc path, its wait functions, its malloc functions, every exported function)
LibcFacts = tuple[str, Ranges, Ranges, Ranges]


JMP_REL32 = 0xE9


def _tail_call_targets(obj: Any, opener: Any, sym: Any) -> list[tuple[int, int]] | None:
    """[(start, end)] (object addresses) of the functions SYM tail-calls;
    None when its code or the CFI could not be read.

    A tail call leaves no frame: glibc's sem_wait and sem_clockwait end with
    ``jmp`` into an internal, unexported slow path, which is then the
    outermost libc frame of the walk.  Such a target counts as part of SYM
    when a `jmp rel32` inside SYM's exact range lands exactly on the start of
    an FDE outside it (a stray 0xe9 byte inside another instruction almost
    never does); its range is that FDE's."""
    try:
        code = obj.text_bytes(sym.st_value, sym.st_size, opener.open)
        table = unwind.cfi_table(opener)
    except Exception:
        return None
    out = []
    for i in range(len(code or b"") - 4):
        if code[i] != JMP_REL32:
            continue
        target = sym.st_value + i + 5 + int.from_bytes(code[i + 1:i + 5], "little", signed=True)
        if sym.st_value <= target < sym.st_value + sym.st_size:
            continue
        fde = table.fde_starting_at(target)
        if fde:
            out.append(fde)
    return out


# A libc's functions, in the object's own addresses (its load address
# applied at lookup, Ranges.at): one set per file, whatever process or
# address maps it (a stop's rehearsal on allocdiag's own understudy and the
# target share it).  Building them costs 8-10 ms of CPU on the slow guest
# (the ~3,000 .dynsym entries and a scan of the wait functions' code), so
# they are also kept on disk with the file's other facts (diskcache; this
# module is one of its producers).  Keyed by the parsed object, which the
# ELF cache keeps one of per file identity.
LIBC_PART = "libcfuncs"
_LIBC_RANGES: dict[Any, tuple[Ranges, Ranges, Ranges]] = {}
LIBC_RANGES_KEPT = 8


def _libc_functions(obj: Any, opener: Any
                    ) -> tuple[tuple[list[tuple[int, int, str]], ...], bool]:
    """((waits, malloc, named), complete): [(start, end, name)] in object
    addresses of OBJ's wait functions (with their tail-call targets), its
    malloc functions, and every exported function under one name each;
    COMPLETE is False when a wait function's code could not be read (its
    tail-call targets are then missing: a thread there is refused, and the
    rows are not kept on disk)."""
    complete = True
    waits: list[tuple[int, int, str]] = []
    malloc: dict[tuple[int, int], tuple[int, int, str]] = {}
    named: dict[tuple[int, int], tuple[int, int, str]] = {}
    for s in obj.dynsym:
        if not s.defined or not s.st_value or s.type not in (STT_FUNC, STT_GNU_IFUNC):
            continue
        rng = (s.st_value, s.st_value + max(s.st_size, 1), s.name)
        _keep_public(named, rng)
        if s.name in LIBC_WAIT_FUNCTIONS:
            waits.append(rng)
            targets = _tail_call_targets(obj, opener, s)
            complete = complete and targets is not None
            waits.extend((a, b, f"{s.name} (tail call)") for a, b in targets or ())
        elif s.name in GLIBC_MALLOC_FUNCTIONS:
            _keep_public(malloc, rng)
    return (waits, sorted(malloc.values()), sorted(named.values())), complete


def _keep_public(table: dict[tuple[int, int], tuple[int, int, str]],
                 rng: tuple[int, int, str]) -> None:
    """One name per range in TABLE: the public one (nanosleep, not
    __nanosleep; malloc, not __libc_malloc)."""
    if rng[:2] not in table or table[rng[:2]][2].startswith("_"):
        table[rng[:2]] = rng


def _libc_ranges(obj: Any, opener: Any) -> tuple[Ranges, Ranges, Ranges]:
    ranges = _LIBC_RANGES.get(obj)
    if ranges is None:
        stored = obj.load_part(LIBC_PART)
        rows: tuple[Any, ...]
        # written by this very code (the store's producer check): its shape only
        if isinstance(stored, tuple) and len(stored) == 3 and \
                all(isinstance(table, list) for table in stored):
            rows = stored
        else:
            rows, complete = _libc_functions(obj, opener)
            if complete:
                obj.store_part(LIBC_PART, rows)
        ranges = (new_ranges(rows[0]), new_ranges(rows[1]), new_ranges(rows[2]))
        keep_newest(_LIBC_RANGES, obj, ranges, LIBC_RANGES_KEPT)
    return ranges


def _libc_facts_of(obj: Any, bias: int, m: Any) -> LibcFacts:
    waits, malloc, named = _libc_ranges(obj, m.opener)
    return (m.path, waits.at(bias), malloc.at(bias), named.at(bias))


# Look-ahead walks kept by StackJudge (one a candidate thread).
LOOK_AHEAD_KEPT = 16


class _WordsRead(unwind.PagedMemory):
    """PagedMemory that keeps the words a walk read ({address: 8 bytes}),
    and whether a read came back short or failed (``short``)."""

    def __init__(self, read: Callable[[int, int], bytes | None]) -> None:
        self.short = False

        def reader(at: int, n: int) -> bytes | None:
            data = read(at, n)
            if data is None or len(data) < n:
                self.short = True
            return data

        super().__init__(reader)
        self.read_words: dict[int, bytes] = {}

    def word(self, addr: int) -> int:
        value = super().word(addr)
        self.read_words[addr] = value.to_bytes(unwind.WORD, "little")
        return value


class StackJudge:
    """Judges futex-waiting threads of one process by walking their stacks.

    FORBIDDEN is the engine's ``forbidden_ranges``: its non-libc entries are
    allocator code (an allocator library's text, a static allocator's symbol
    ranges, or a whole executable whose allocator could not be delimited);
    libc/ld.so entries are not, but glibc's malloc functions are (exact
    ``.dynsym`` ranges).  READ(addr, n) -> bytes or None."""

    def __init__(self, pid: int, maps: bytes, forbidden: Sequence[tuple[int, int, str]],
                 read: Callable[[int, int], bytes | None], procfs: str = "/proc",
                 undelimited: frozenset[str] = frozenset()) -> None:
        self.unwinder = unwind.Unwinder(pid, maps, read, procfs)
        self.read = read
        self.allocator = new_ranges([r for r in forbidden if not is_libc_name(r[2])])
        # allocator code proven (an allocator library, a delimited static
        # allocator): not an executable's whole text (UNDELIMITED names),
        # where a frame may be the program's own
        self.proven = new_ranges([r for r in forbidden if not is_libc_name(r[2])
                                  and r[2] not in undelimited])
        self._libc: LibcFacts | None = None
        self._libc_done = False
        # what the last walk from a stopped thread could not decode (walk)
        self.needs: unwind.NeedsDecode | None = None
        # look_ahead's last findings by (pc, sp): the bytes each walk read
        # (stack pages, the trampoline's text) and what it found
        self._ahead: dict[tuple[int, int], tuple[dict[int, bytes], tuple[str, str] | None]] = {}
        # judge's last verdicts by the stopped thread's registers, each with
        # the stack words its walk read; prepare's by (pc, sp), likewise
        self._judged: dict[tuple[tuple[int, int], ...],
                           tuple[dict[int, bytes], Refusal | None]] = {}
        self._prepared: dict[tuple[int, int], tuple[dict[int, bytes], Refusal | None]] = {}

    # -- libc facts, from the libc mapping's .dynsym ----------------------------
    def _libc_facts(self) -> LibcFacts | None:
        if self._libc_done:
            return self._libc
        self._libc_done = True
        from collectors.binary import elf
        for m in self.unwinder._maps:
            if not os.path.basename(m.path).startswith(("libc.so", "libc-")):
                continue
            try:
                obj = elf.CACHE.get(m.opener)
                bias_of: Callable[[Any], int] = self.unwinder._bias
                bias = bias_of(m)
            except Exception:
                return None
            self._libc = _libc_facts_of(obj, bias, m)
            break
        return self._libc

    def libc_function(self, frame: unwind.Frame) -> str | None:
        """The exported C-library function FRAME is in (exact .dynsym
        range), or None."""
        facts = self._libc_facts()
        if facts is None or frame.path != facts[0]:
            return None
        fn: str | None = facts[3](frame.pc)
        return fn

    def _is_libc(self, frame: unwind.Frame) -> bool:
        return is_libc_name(frame.path)

    def verdict(self, frames: Sequence[unwind.Frame]) -> Refusal | None:
        """None when FRAMES (innermost first) prove a wait outside the
        allocator, else the refusal."""
        facts = self._libc_facts()
        for f in frames:
            where = self.allocator(f.pc)
            if where:
                return refusal(Reason.ALLOCATOR_FRAME, where=where)
            if facts is not None and f.path == facts[0]:
                fn = facts[2](f.pc)
                if fn:
                    return refusal(Reason.ALLOCATOR_FRAME, where=f"glibc {fn}()")
        if not frames or not self._is_libc(frames[0]):
            return refusal(Reason.WALK_UNPROVEN,
                           why="futex call not made by the C library's wait functions")
        outer = frames[0]
        for f in frames:
            if not self._is_libc(f):
                break
            outer = f
        if facts is None:
            return refusal(Reason.WALK_UNPROVEN, why="C library symbols unavailable")
        fn = facts[1](outer.pc) if outer.path == facts[0] else None
        if fn is None:
            return refusal(Reason.WALK_UNPROVEN, why=(
                f"waiting in {os.path.basename(outer.path)}+{outer.vaddr:#x}, not in "
                "pthread_cond_wait/sem_wait/pthread_join"))
        return None

    def allocator_frame(self, frames: Sequence[unwind.Frame],
                        ranges: Callable[[int], str | None] | None = None) -> str | None:
        """Where the first frame of FRAMES in allocator code is (an
        allocator object, or "glibc malloc()"), or None (the running-thread
        rule: libc frames are fine, malloc's are not).  RANGES: the allocator
        ranges to look in (default: every non-libc forbidden range)."""
        facts = self._libc_facts()
        ranges = self.allocator if ranges is None else ranges
        for f in frames:
            where: str | None = ranges(f.pc)
            if where:
                return where
            if facts is not None and f.path == facts[0] and facts[2](f.pc):
                return f"glibc {facts[2](f.pc)}()"
        return None

    def load_tables(self) -> None:
        """Load the CFI index of every mapped object and the C library's
        function ranges (before a running thread is stopped: its objects
        cannot be known in advance, and allocator_frame asks the ranges of
        every frame).  Cheap with .eh_frame_hdr (libc 0.01 s); failures are
        left for the walk to meet.  Loaded in the stop instead, the ranges
        (the disk cache's libcfuncs entry, 2,251 ranges sorted) were 2 of a
        busy Python's 5-12 ms stops.  (The FDEs that walk needs are decoded
        after it: Chooser.walk_running.)"""
        self.unwinder.load()
        self._libc_facts()

    def prepare(self, pc: int, sp: int) -> Refusal | None:
        """Before any stop: parse the CFI a walk from (PC, SP) reaches, and
        pre-judge.  Returns a refusal when the look-ahead already shows
        allocator frames (no need to stop the thread), else None.  Kept as
        look_ahead's walks are (_looked_ahead): a thread parked in one
        futex wait is walked again only when a word the walk read changed."""
        def find(stack: _WordsRead) -> tuple[Refusal | None, bool]:
            where = self.allocator_frame(self.unwinder.prepare(pc, sp, memory=stack))
            return (refusal(Reason.ALLOCATOR_FRAME, where=where) if where else None), True

        why: Refusal | None = self._kept_walk(self._prepared, (pc, sp), find)
        return why

    def look_ahead(self, pc: int, sp: int, subject: str) -> Refusal | None:
        """Before the stop of a thread in a wait judged by its syscall alone
        (restartable, epoll: no walk in the stop), a walk from /proc's PC and
        SP: the refusal when it finds allocator code (a wait made from inside
        the allocator: a callback, a hook, a spin-lock sleep through libc) or
        a signal frame (a handler that may have interrupted the allocator,
        holding its lock: a call would wait on that lock for ever), else None.
        A walk that stops early for another reason (no CFI: JIT or Go code;
        a frame based on a register /proc does not show) proves nothing
        either way; the wait is judged as before."""
        found = self._looked_ahead(pc, sp)
        if found is None:
            return None
        if found[0] == Reason.ALLOCATOR_FRAME.value:
            return refusal(Reason.ALLOCATOR_AHEAD, subject=subject,
                           frame=refusal(Reason.ALLOCATOR_FRAME, where=found[1]).text)
        return refusal(Reason.SIGNAL_HANDLER, subject=subject)

    def _looked_ahead(self, pc: int, sp: int) -> tuple[str, str] | None:
        """What a walk from (PC, SP) finds: (ALLOCATOR_FRAME's code, where)
        or (SIGNAL_HANDLER's code, ""), else None.  The same as the last
        walk from there when every stack word that walk read (the saved
        registers and return addresses, not the frames' locals) and the
        text it looked at read the same now: the walk is a function of
        them and of this judge's tables (a thread parked in one wait: a
        page read or two instead of the walk, ~0.1 ms of a recording's
        snapshot)."""
        def find(stack: _WordsRead) -> tuple[tuple[str, str] | None, bool]:
            try:
                w = self.unwinder.walk({unwind.RA: pc, unwind.RSP: sp}, parse=True,
                                       partial=True, tolerant=True, memory=stack)
            except Exception as exc:    # a table that does not parse: proves nothing, as
                log.debug("look-ahead walk from pc %#x failed: %s", pc, exc)  # one cut short
                return None, False
            where = self.allocator_frame(w.frames, self.proven)
            cause = w.cause
            if where:
                return (Reason.ALLOCATOR_FRAME.value, where), True
            if isinstance(cause, unwind.CFAExpression) and cause.pc is not None and w.frames:
                text = self.read(cause.pc, len(SIGRETURN_TRAMPOLINE))
                if text is None:
                    return None, False      # unreadable: nothing kept
                stack.read_words[cause.pc] = text
                if text == SIGRETURN_TRAMPOLINE:
                    return (Reason.SIGNAL_HANDLER.value, ""), True
            return None, True

        found: tuple[str, str] | None = self._kept_walk(self._ahead, (pc, sp), find)
        return found

    def _kept_walk(self, table: dict[Any, tuple[dict[int, bytes], Any]], key: Any,
                   find: Callable[[_WordsRead], tuple[Any, bool]]) -> Any:
        """FIND's answer from a walk that reads through the _WordsRead it is
        given ((answer, whether it may be kept)), or TABLE's answer under KEY
        while every word that walk read (and any text FIND added to them)
        reads the same.  A walk cut by an unreadable word may go further
        later, and one FIND says proves nothing: neither is kept."""
        kept = table.get(key)
        if kept is not None and self._same_words(kept[0]):
            return kept[1]
        stack = _WordsRead(self.read)
        answer, keep = find(stack)
        if keep and not stack.short:
            keep_newest(table, key, (stack.read_words, answer), LOOK_AHEAD_KEPT)
        else:
            table.pop(key, None)
        return answer

    def _same_words(self, read: dict[int, bytes]) -> bool:
        """True when each {address: bytes} of READ reads the same now, the
        words of one page read together."""
        pages: dict[int, list[int]] = {}
        for at in read:
            pages.setdefault(at & ~(unwind.PAGE - 1), []).append(at)
        for page, ats in pages.items():
            low, high = min(ats), max(at + len(read[at]) for at in ats)
            data = self.read(low, high - low) if high - page <= unwind.PAGE else None
            if data is None or len(data) != high - low:
                return False
            if any(data[at - low:at - low + len(read[at])] != read[at] for at in ats):
                return False
        return True

    def walk(self, dwarf_regs: dict[int, int], memory: unwind.PagedMemory | None = None
             ) -> tuple[list[unwind.Frame] | None, Refusal | None]:
        """(frames, None), or (None, why not): a walk from the stopped
        thread's registers with CFI parsed already (never parses or decodes
        while a thread is stopped).  At an FDE not decoded yet it stops, and
        ``needs`` names it (Chooser.decode_undecoded decodes it after the
        stop)."""
        self.needs = None
        try:
            return self.unwinder.walk(dwarf_regs, parse=False, decode=False,
                                      memory=memory), None
        except unwind.NeedsDecode as e:
            self.needs = e
            return None, refusal(Reason.WALK_UNPROVEN, why=(
                f"stack walk reaches {e.where}, whose unwind rules no run had decoded "
                "(decoded for the next try)"))
        except unwind.NeedsParse as e:
            return None, refusal(Reason.WALK_UNPROVEN, why=(
                f"stack walk needs {os.path.basename(e.path)}'s CFI (parsed for the next try)"))
        except Exception as e:      # any failure: not proven
            return None, refusal(Reason.WALK_UNPROVEN, why=f"stack walk failed ({e})")

    def judge(self, dwarf_regs: dict[int, int]) -> Refusal | None:
        """None = proven safe, else the refusal.  The walk is a function of
        the registers, the stack words it reads and this judge's tables:
        while a stopped thread's registers and every word its last walk
        read are the same, so is the verdict, given without the walk (a
        thread parked in one futex wait, stopped once a snapshot: 1-2 page
        reads instead of ~0.15 ms of walking inside the stop)."""
        def find(stack: _WordsRead) -> tuple[Refusal | None, bool]:
            frames, why = self.walk(dwarf_regs, stack)
            return (why, False) if frames is None else (self.verdict(frames), True)

        self.needs = None           # a verdict kept: nothing left undecoded
        verdict: Refusal | None = self._kept_walk(
            self._judged, tuple(sorted(dwarf_regs.items())), find)
        return verdict


# ---- the Go runtime's own parks (cgo binaries) ---------------------------------
#
# Go emits no .eh_frame for Go code, so no walk can prove where a Go thread
# waits; the PC can.  The Go runtime makes its blocking syscalls from a few
# assembly stubs (runtime/sys_linux_amd64.s): runtime.futex, called only by
# futexsleep/futexwakeup (runtime/os_linux.go), and runtime.usleep
# (nanosleep; sysmon's idle sleep, runtime/proc.go).  Go runtime code never
# calls the C allocator (it has its own, runtime/malloc.go; C code is
# reached only through cgocall, whose C side returns before the thread is
# back in Go), so a thread whose PC is the instruction after the syscall in
# one of these stubs holds no C allocator lock.  The other place a
# thread stands on a syscall in Go code is a goroutine's stack (syscall.
# Syscall, notetsleepg from os/signal's receiver): goroutine stacks live in
# the Go heap with no guard and no fs_base inside, so stackbounds refuses
# them; the rule applies only where stackbounds proves a glibc thread stack
# (a cgo M's g0 stack: runtime/cgo gcc_linux_amd64.c _cgo_sys_thread_start
# creates every M with pthread_create, default attributes).
#
# Futex waits: runtime notes sleep with value 0 (runtime/lock_futex.go
# notesleep/notetsleep_internal: futexsleep(key32(&n.key), 0, ns)); runtime
# mutex contention sleeps with value 2 (lock_futex.go lock2: mutex_sleeping)
# or, with the spin-bit mutex of Go 1.24+ (lock_spinbit.go), on the M's
# waitsema through semasleep with a decremented, non-zero value.  Only value
# 0 is a note: the others are refused.  Go's netpoller (epoll_pwait from
# runtime.epollwait, or Syscall6 in Go 1.21+) and a plain usleep in nanosleep
# are already accepted by the epoll and restartable rules, which need no walk;
# this rule adds the futex notes and a nanosleep or timed note resumed by
# restart_syscall (a walk would be needed there).  Restored exactly, each
# restarts as the kernel would after any stop (-ERESTARTSYS, or
# restart_syscall against the original deadline); Go's futexsleep callers
# loop over spurious wakeups anyway.

NR_nanosleep = NR["nanosleep"]
# stub (Go symbol, .abi0 suffix optional) -> the syscall it makes
GO_STUBS = {"runtime.futex": NR_futex, "runtime.usleep": NR_nanosleep}
GO_NOTE_VALUE = 0                 # runtime/lock_futex.go: notes sleep on key 0
GO_ABI0 = ".abi0"                 # Go 1.17+: assembly functions' symbol suffix


class GoRuntime:
    """The Go runtime's syscall stubs in a Go executable (exact .symtab
    ranges), and the judgement of a thread parked in one.  ``why`` is set
    (and the rule refuses everything) when the ranges cannot be known."""

    def __init__(self, path: str, stubs: Sequence[tuple[int, int, str]],
                 why: str | None = None) -> None:
        self.path = path
        self.stubs = new_ranges(stubs)
        self.why = why

    @classmethod
    def of(cls, obj: Any) -> GoRuntime | None:
        """GoRuntime of the loaded executable OBJ (image.LoadedObject), or
        None when it is not a Go binary."""
        if obj is None or obj.elf is None or not obj.elf.is_go:
            return None
        base = os.path.basename(obj.path)
        if obj.bias is None:
            return cls(obj.path, [], f"{base}'s load address is unknown")
        try:
            symtab = obj.elf.symtab(obj.opener.open)
        except Exception as e:      # unreadable: not proven
            return cls(obj.path, [], f"{base}'s .symtab is unreadable ({e})")
        if not symtab:
            return cls(obj.path, [], (
                f"{base} is a stripped Go binary (no .symtab), so where the Go runtime's "
                "syscall stubs lie is not provable"))
        stubs = []
        for name, s in symtab.items():
            stub = name.removesuffix(GO_ABI0)
            if stub in GO_STUBS and s.st_size:
                stubs.append((obj.bias + s.st_value, obj.bias + s.st_value + s.st_size, stub))
        if not stubs:
            return cls(obj.path, [], f"{base} has no runtime.futex/runtime.usleep symbols")
        return cls(obj.path, stubs)

    def judge(self, nr: int, args: Sequence[int], pc: int | None, restart_nr: int
              ) -> tuple[str | None, str | None]:
        """(GO_RUNTIME, words), or (None, why refused), or (None, None) when
        the rule does not apply (PC in no Go stub).  NR: the syscall number
        at the stop, RESTART_NR the arch's restart_syscall; ARGS the argument
        registers (a resumed wait keeps its original ones)."""
        if nr not in (NR_futex, NR_nanosleep, restart_nr):
            return None, None
        if self.why:
            return None, self.why
        stub = self.stubs(pc) if pc is not None else None
        if stub is None:
            return None, None
        made = GO_STUBS[stub]
        if nr != made and nr != restart_nr:
            return None, None
        resumed = " (resumed by restart_syscall)" if nr == restart_nr else ""
        if made == NR_nanosleep:
            return GO_RUNTIME, f"Go runtime sleep in {stub}{resumed}"
        cmd = futex_cmd(args[1]) if len(args) > 2 else -1
        if cmd not in (FUTEX_WAIT, FUTEX_WAIT_BITSET):
            return None, f"futex operation {args[1] if args else -1:#x} in {stub}"
        if args[2] != GO_NOTE_VALUE:
            return None, (f"Go runtime lock wait in {stub} (value {args[2]:#x}: runtime "
                          "mutex contention, not a note)")
        return GO_RUNTIME, f"Go runtime note sleep in {stub}{resumed}"
