"""One sampling window over every thread of a process (issue 20 item 2).

Per thread (``pid = tid, cpu = -1``; reference/cpu-wall.md "Covering every
thread": an inherited per-task event cannot have a ring, and a per-task ring
takes only its own task's events), all sharing the thread's one ring through
PERF_EVENT_IOC_SET_OUTPUT:

- CPU-clock samples at HZ with the user registers and a STACK_BYTES copy of
  the user stack (unwound with collectors.binary.unwind, CFI parsed once per file);
- context-switch samples (at most SWITCH_HZ per thread, SWITCH_STACK_BYTES
  copy) plus ``context_switch`` SWITCH records for every switch: the time
  until the switch-in, split voluntary (blocked) / preempted, and for the
  sampled switch-outs the stack, weighted by the switch-outs each stands for;
- ``syscalls:sys_enter_<name>`` tracepoints for SYSCALLS: the count read
  from the fd, a frequency-limited sample of the calls' stacks for the
  "from the allocator" split;
- counting events for minor and major page faults (no ring).

Threads created during the window are found by a rescan of /proc/PID/task
every RESCAN_S (each new thread's first <= RESCAN_S is not seen; the
reference measured per-CPU inherit as the alternative, which needs a ring
per CPU and sees other processes' records filtered only by pid).  Rings are
drained every DRAIN_S.  Memory is bounded whatever the duration: stacks,
sites and caches are capped (MAX_STACKS, MAX_SITES, MAX_CACHE) and overflow
into an "[other]" bucket.

Switch samples can arrive at tens of thousands per second under lock
contention; each one's classification is cached by the first CACHE_FRAMES
pcs of its stack (a short walk), so only new stack prefixes pay for a full
walk and symbolization.
"""

from __future__ import annotations

import errno
import gc
import os
import resource
import struct
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from collectors import lazylog
from collectors.binary import unwind
from collectors.proc import oserror
from collectors.proc.maps import parse_maps
from collectors.proc.procfs import ProcFS
from collectors.proc.readall import read_all
from collectors.proc.stat import ZOMBIE_STATES, parse_state
from collectors.proc.status import parse_status
from collectors.proc.syscall import NOT_IN_SYSCALL, parse_syscall
from diag.model.errors import AccessDenied, NoSuchProcess
from collectors.sampler import perf, records
from collectors.sampler.attribution import ALLOCATOR, UNKNOWN, Attributor, is_lock_wait
from diag.model import wall

DEFAULT_HZ = 99
STACK_BYTES = 16384             # reference: covers the outermost allocator frame in 100 %
SWITCH_STACK_BYTES = 2048       # enough to pass __lll_lock_wait* and reach malloc/free
# Switch-outs whose stack is copied, per second per thread at most (frequency
# mode): every SWITCH record (32 bytes) still times every interval, the
# stacks of a sample of them say which were allocator waits.  Period 1 under
# arena contention (27k switch-outs/s here) lost 40,000 records in 2 s and
# cost the reader 29 % of a core.
SWITCH_HZ = 200
SYSCALL_STACK_BYTES = 8192
SYSCALL_HZ = 200                # sampled calls per second per thread and syscall, at most
MAX_THREADS = 512
# 256 pages = 1 MiB per thread kept up with 999 Hz x 16 KiB (reference).  Rings
# are locked kernel memory: smaller per thread when there are many (a LOST
# count says when one overflowed).  (threads at most, pages)
RING_PAGES_BY_THREADS = ((16, 256), (128, 64), (MAX_THREADS, 32))
# Above HIGH_RATE_HZ a few threads get 1024 pages (4 MiB, ~240 ms of one busy
# thread's 999 Hz samples) when allocdiag may lock memory freely: the drains
# are DRAIN_S plus their own work apart (55-73 ms at 999 Hz on a slow 2-vCPU
# guest) while 256 pages held ~60 ms of it, and 1-3 % of the samples were lost.  (Draining at once when a ring is
# half full kept them all, but under lock contention the reader then kept up
# with every switch record too and overran the window by seconds.)
HIGH_RATE_HZ = 500
HIGH_RATE_RING_PAGES = 1024
DRAIN_S = 0.05
RESCAN_S = 0.2
MAX_STACKS = 4096
MAX_SITES = 1024
MAX_CACHE = 50000
CACHE_FRAMES = 4
OTHER = "[other]"
_SAMPLE_TYPE = (perf.PERF_SAMPLE_IDENTIFIER | perf.PERF_SAMPLE_IP | perf.PERF_SAMPLE_TID |
                perf.PERF_SAMPLE_TIME | perf.PERF_SAMPLE_PERIOD | perf.PERF_SAMPLE_REGS_USER |
                perf.PERF_SAMPLE_STACK_USER)
_BASE_FLAGS = perf.F_DISABLED | perf.F_SAMPLE_ID_ALL | perf.F_USE_CLOCKID | perf.F_EXCLUDE_HV
CPU, SWITCH = "cpu", "switch"
log = lazylog.getLogger("collectors.sampler")
# fs/proc/array.c task_state_array: asleep, interruptible or not
SLEEP_STATES = (b"S", b"D")
OFF_T_MAX = (1 << 63) - 1       # the largest pread(2) offset: off_t is signed 64-bit
NOFILE_PER_THREAD = 9           # descriptors per thread at most: see _open_thread
NOFILE_SPARE = 64
TRACEFS_FIX = ("mount tracefs and run as root: mount -t tracefs nodev /sys/kernel/tracing "
               "(its events/*/id files are readable by root only)")


CAP_IPC_LOCK = 14                   # include/uapi/linux/capability.h


def _may_lock_memory() -> bool:
    """True when this process holds CAP_IPC_LOCK (its locked memory is not
    limited: perf's ring accounting, kernel/events/core.c perf_mmap)."""
    try:
        caps = int(parse_status(read_all("/proc/self/status")).get(b"CapEff", b"0"), 16)
    except (OSError, ValueError):
        return False
    return bool(caps >> CAP_IPC_LOCK & 1)


class _Thread:
    __slots__ = ("tid", "fds", "ring", "faults", "syscalls", "start_ns", "end_ns",
                 "out_ns", "out_preempt", "out_cls", "pending")

    def __init__(self, tid, start_ns):
        self.tid, self.start_ns, self.end_ns = tid, start_ns, None
        self.fds, self.ring = [], None
        self.faults = {}            # "minor"/"major" -> fd
        self.syscalls = {}          # name -> fd
        self.out_ns = None          # switched out since (SWITCH out record)
        self.out_preempt = False
        self.out_cls = None         # the attribution of the switch-out stack
        self.pending = None         # a switch sample that came before its SWITCH record


class Session:
    """Sampling of PID.  ``start()``, then ``poll()`` until done, then
    ``stop()`` and ``result()``; or ``run(duration_s)``."""

    def __init__(self, pid: int, hz: int = DEFAULT_HZ, procfs: str = "/proc",
                 switches: bool = True, syscalls: Iterable[str] = wall.SYSCALLS) -> None:
        self.pid, self.hz, self.procfs = pid, hz, procfs
        self.want_switches, self.want_syscalls = switches, tuple(syscalls)
        self.threads: dict[int, _Thread] = {}
        # 4 MiB rings above HIGH_RATE_HZ only with CAP_IPC_LOCK: without it a
        # user may lock perf_event_mlock_kb per CPU plus RLIMIT_MEMLOCK (9 MiB
        # here), which two such rings would fill, leaving other threads none
        self._big_rings = hz > HIGH_RATE_HZ and _may_lock_memory()
        self.by_ident: dict[int, tuple[str, str | None]] = {}  # event id -> (kind, syscall)
        self.missing: dict[str, wall.Missing] = {}             # figure -> why
        self.exclude_kernel = False
        self.lost = 0
        self.samples = self.switch_samples = 0
        self.exited = 0
        self.tp_ids: dict[str, int] = {}
        # aggregates
        self.cpu_ns = 0
        self.cpu: Counter[str] = Counter()     # ALLOCATOR / APPLICATION / UNKNOWN -> samples
        self.cpu_unwound = self.cpu_kernel = 0
        self.cpu_fn: Counter[str | None] = Counter()   # allocator function -> samples
        self.cpu_entry: Counter[str | None] = Counter()
        self.site_cpu: Counter[str] = Counter()         # site -> samples
        self.site_entry: defaultdict[str, Counter[str | None]] = defaultdict(Counter)
        self.site_frames: dict[str, tuple[str, ...]] = {}
        self.site_lock_ns: Counter[str] = Counter()
        self.site_lock_n: Counter[str] = Counter()
        self.stacks: Counter[tuple[str, bool, tuple[str, ...]]] = Counter()  # -> weight
        self.blocked_ns = self.preempted_ns = 0
        self.blocked_n = self.preempted_n = 0
        self.switches_sampled = 0
        self.lock_ns = 0
        self.lock_n = 0
        self.lock_fn: Counter[Any] = Counter()   # leaf function -> ns
        self.lock_fn_n: Counter[Any] = Counter()
        self.sys_sampled: Counter[str] = Counter()
        self.sys_alloc: Counter[str] = Counter()
        self.sys_unknown: Counter[str] = Counter()
        self.final_counts: defaultdict[str, int] = defaultdict(int)  # of closed threads
        self._cache: dict[tuple[Any, ...], tuple[Any, bool]] = {}
        self._mem_fd: int | None = None
        self._last_scan = 0.0
        self.t0_ns: int | None = None     # set by start()
        self.t1_ns: int | None = None
        self.start_wall: float | None = None
        self._rusage0: Any = None
        self.reader_cpu_s: float | None = None

    # -- setup ---------------------------------------------------------------
    def start(self) -> None:
        pid = self.pid
        try:
            maps = parse_maps(ProcFS(self.procfs).read(pid, "maps"))
        except AccessDenied as exc:
            raise AccessDenied(pid, msg=exc.msg, remediation=perf.PERMISSION_FIX) from None
        try:
            self._mem_fd = os.open(os.path.join(self.procfs, str(pid), "mem"), os.O_RDONLY)
        except OSError:
            self._mem_fd = None        # words beyond a stack copy then end the walk
        self.unwinder = unwind.Unwinder(pid, maps, self._read_mem, self.procfs)
        self.attributor = Attributor(pid, maps, self.procfs)
        self._prewarm()
        if self.want_syscalls:
            self._tracepoints()
        _raise_nofile()
        self._rusage0 = resource.getrusage(resource.RUSAGE_SELF)
        self.start_wall = time.time()
        self.t0_ns = time.monotonic_ns()
        self._scan(first=True)
        log.debug("pid %d: window started, %d threads, %d Hz, switches %s, syscalls %s",
                  pid, len(self.threads), self.hz, self.want_switches,
                  ",".join(self.tp_ids) or "none")
        if not self.threads:
            refused = [m for m in self.missing.values() if m.fix == perf.PERMISSION_FIX]
            if refused and self._tids():
                raise AccessDenied(pid, msg=f"perf_event_open refused every event: "
                                            f"{refused[0].reason}", remediation=perf.PERMISSION_FIX)
            raise NoSuchProcess(pid)
        self._last_scan = time.monotonic()

    def _prewarm(self):
        """Parse the CFI and symbol tables of every mapped object now, before
        the rings fill: the first classification otherwise pays for them
        (libc's debug file: ~0.3 s) while records pile up."""
        for pc in self.unwinder.object_starts():
            try:
                self.unwinder.walk({unwind.RA: pc, unwind.RSP: 0}, parse=True, tolerant=True,
                                   max_frames=1)
            except Exception:       # a broken object only costs its own frames later
                pass
            self.attributor.name(pc)
        # Tables restored from the disk cache allocate little, so the full
        # collection that parsing used to trigger here now fell inside the
        # window (40-70 ms in a large process: lost samples); run it first.
        gc.collect()

    def _tracepoints(self):
        for name in self.want_syscalls:
            try:
                self.tp_ids[name] = perf.tracepoint_id(f"sys_enter_{name}")
            except PermissionError:
                self._miss("syscalls", "tracefs event ids are readable by root only",
                           TRACEFS_FIX)
                self.tp_ids.clear()
                return
            except (FileNotFoundError, ValueError):
                self._miss("syscalls", "tracefs is not mounted (no syscalls:sys_enter_* ids)",
                           TRACEFS_FIX)
                self.tp_ids.clear()
                return

    def _miss(self, figure, reason, fix=None):
        self.missing.setdefault(figure, wall.Missing(figure, reason, fix))

    def _read_mem(self, addr: int, n: int) -> bytes | None:
        # pread's offset is a signed off_t: a word "at" 2^63 or above (a
        # garbage CFA; the kernel half) is not user memory, and would raise
        # OverflowError, not OSError
        if self._mem_fd is None or addr > OFF_T_MAX:
            return None
        try:
            return os.pread(self._mem_fd, n, addr)
        except OSError:
            return None

    def _tids(self):
        """The live threads; none once the process is a zombie (its task
        directory still lists the main thread until it is reaped)."""
        try:
            with open(os.path.join(self.procfs, str(self.pid), "stat"), "rb") as f:
                if parse_state(f.read()) in ZOMBIE_STATES:
                    return set()
            return {int(t) for t in os.listdir(os.path.join(self.procfs, str(self.pid), "task"))}
        except OSError as exc:
            err = oserror.translate(exc, self.pid, f"listing /proc/{self.pid}/task",
                                    procfs=self.procfs, remediation=perf.PERMISSION_FIX)
            if isinstance(err, NoSuchProcess):
                return set()
            raise err from None

    def _scan(self, first=False):
        tids = self._tids()
        now = time.monotonic_ns()
        for tid in list(self.threads):
            t = self.threads[tid]
            if t.end_ns is None and tid not in tids:
                self._retire(t, now)
        for tid in sorted(tids - set(self.threads)):
            if len(self.threads) >= MAX_THREADS:
                self._miss("window.threads_seen", f"more than {MAX_THREADS} threads: the "
                           "others are not sampled")
                break
            self._open_thread(tid, now, first)

    def _open(self, buf, tid, what, figure):
        """An event fd, or None with the figure marked missing (ESRCH: the
        thread is gone, nothing missing)."""
        try:
            return perf.open_event(buf, tid)
        except perf.PerfError as exc:
            log.debug("pid %d tid %d: perf_event_open refused %s: %s", self.pid, tid, what,
                      errno.errorcode.get(exc.errno or 0, exc.errno))
            if exc.errno == errno.ESRCH:
                return None
            if exc.errno in oserror.DENIED and not self.exclude_kernel:
                # paranoid 2 lets a user sample its own processes in user mode only
                self.exclude_kernel = True
                self._miss("cpu.kernel_share", "kernel-mode samples not allowed "
                           f"({exc.strerror}): time in the kernel is not sampled",
                           perf.PERMISSION_FIX)
                return self._open(_with_exclude_kernel(buf), tid, what, figure)
            if exc.errno in oserror.DENIED:
                self._miss(figure, f"perf_event_open refused {what}: {exc.strerror}",
                           perf.PERMISSION_FIX)
            elif exc.errno == errno.EMFILE:
                self._miss(figure, f"out of file descriptors opening {what}",
                           "raise the open-files limit (ulimit -n)")
            else:
                self._miss(figure, f"the kernel refused {what}: {exc.strerror}")
            return None

    def _ring_pages(self):
        """The next thread's ring size: by the thread count, and
        HIGH_RATE_RING_PAGES for the first tier when ``_big_rings``."""
        n = len(self.threads) + 1
        if self._big_rings and n <= RING_PAGES_BY_THREADS[0][0]:
            return HIGH_RATE_RING_PAGES
        return next(pages for most, pages in RING_PAGES_BY_THREADS if n <= most)

    def _flags(self, extra=0):
        return _BASE_FLAGS | extra | (perf.F_EXCLUDE_KERNEL if self.exclude_kernel else 0)

    def _open_thread(self, tid, now, first):
        t = _Thread(tid, now)
        rings = []

        def sampling(buf, kind, name, figure, what):
            fd = self._open(buf, tid, what, figure)
            if fd is None:
                return None
            t.fds.append(fd)
            try:
                if t.ring is None:
                    t.ring = perf.Ring(fd, self._ring_pages())
                    rings.append(fd)
                else:
                    perf.ioctl(fd, perf.PERF_EVENT_IOC_SET_OUTPUT, rings[0])
                self.by_ident[perf.event_id(fd)] = (kind, name)
            except (OSError, ValueError) as exc:
                self._miss(figure, f"no ring for {what}: {exc}",
                           "raise kernel.perf_event_mlock_kb or RLIMIT_MEMLOCK")
                return None
            return fd

        if self.hz:
            sampling(perf.attr(perf.PERF_TYPE_SOFTWARE, perf.PERF_COUNT_SW_CPU_CLOCK,
                               freq=self.hz, sample_type=_SAMPLE_TYPE, flags=self._flags(),
                               regs_user=perf.REGS_MASK, stack_user=STACK_BYTES),
                     CPU, None, "cpu", "CPU-clock sampling")
        if self.want_switches:
            sampling(perf.attr(perf.PERF_TYPE_SOFTWARE, perf.PERF_COUNT_SW_CONTEXT_SWITCHES,
                               freq=SWITCH_HZ, sample_type=_SAMPLE_TYPE,
                               flags=self._flags(perf.F_CONTEXT_SWITCH),
                               regs_user=perf.REGS_MASK, stack_user=SWITCH_STACK_BYTES),
                     SWITCH, None, "off_cpu", "context-switch sampling")
        for name, tp in self.tp_ids.items():
            fd = sampling(perf.attr(perf.PERF_TYPE_TRACEPOINT, tp, freq=SYSCALL_HZ,
                                    sample_type=_SAMPLE_TYPE, flags=self._flags(),
                                    regs_user=perf.REGS_MASK, stack_user=SYSCALL_STACK_BYTES),
                          "syscall", name, f"syscalls.{name}", f"the {name} tracepoint")
            if fd is not None:
                t.syscalls[name] = fd
        for kind, config in (("minor", perf.PERF_COUNT_SW_PAGE_FAULTS_MIN),
                             ("major", perf.PERF_COUNT_SW_PAGE_FAULTS_MAJ)):
            fd = self._open(perf.attr(perf.PERF_TYPE_SOFTWARE, config, flags=self._flags()),
                            tid, f"{kind} page-fault counting", f"faults.{kind}_per_s")
            if fd is not None:
                t.fds.append(fd)
                t.faults[kind] = fd
        if not t.fds:
            log.debug("pid %d tid %d: no event opened", self.pid, tid)
            return
        log.debug("pid %d tid %d: %d events open (%s)", self.pid, tid, len(t.fds),
                  "ring" if t.ring is not None else "counting only")
        for fd in t.fds:
            try:
                perf.ioctl(fd, perf.PERF_EVENT_IOC_ENABLE)
            except perf.PerfError:
                pass
        self.threads[tid] = t
        if self.want_switches and t.ring is not None:
            self._already_blocked(t, now)

    def _already_blocked(self, t, now):
        """A thread asleep when its events were enabled has no switch-out
        record for this wait: open its interval at NOW, classified from the
        stack at its syscall entry (/proc/PID/task/TID/syscall gives sp and
        pc; the walk stops where a register it needs is unknown)."""
        task = os.path.join(self.procfs, str(self.pid), "task", str(t.tid))
        try:
            with open(os.path.join(task, "stat"), "rb") as f:
                if parse_state(f.read()) not in SLEEP_STATES:
                    return
            with open(os.path.join(task, "syscall"), "rb") as f:
                sc = parse_syscall(f.read())
        except (OSError, ValueError):
            return
        a = None
        if sc.nr != NOT_IN_SYSCALL and sc.sp is not None and sc.pc is not None:
            w = self.unwinder.walk({unwind.RA: sc.pc, unwind.RSP: sc.sp}, parse=True,
                                   partial=True, tolerant=True)
            if w.frames:
                a = self.attributor.classify([f.pc for f in w.frames], w.complete)
        t.out_ns, t.out_preempt, t.out_cls = now, False, (a, 1)

    # -- the loop --------------------------------------------------------------
    def poll(self) -> bool:
        """Drain every ring; rescan threads when due.  False once the process is gone."""
        for t in list(self.threads.values()):
            if t.ring is not None:
                self._consume(t, t.ring.drain())
        if time.monotonic() - self._last_scan >= RESCAN_S:
            self._last_scan = time.monotonic()
            self._scan()
        return any(t.end_ns is None for t in self.threads.values())

    def _retire(self, t, now):
        if t.ring is not None:
            self._consume(t, t.ring.drain())
        self._close_interval(t, now)
        t.end_ns = now
        self.exited += 1
        self._close_thread(t)

    def _close_thread(self, t):
        for kind, fd in t.faults.items():
            self.final_counts["fault:" + kind] += perf.read_count(fd) or 0
        for name, fd in t.syscalls.items():
            self.final_counts["sys:" + name] += perf.read_count(fd) or 0
        if t.ring is not None:
            t.ring.close()
        for fd in t.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        t.fds, t.faults, t.syscalls, t.ring = [], {}, {}, None

    def stop(self) -> None:
        """Disable, drain and close everything; fix the window's end (once)."""
        if self.t1_ns is not None:
            return
        now = time.monotonic_ns()
        for t in self.threads.values():
            for fd in t.fds:
                try:
                    perf.ioctl(fd, perf.PERF_EVENT_IOC_DISABLE)
                except perf.PerfError:
                    pass
        for t in self.threads.values():
            if t.end_ns is None:
                if t.ring is not None:
                    self._consume(t, t.ring.drain())
                self._close_interval(t, now)
                t.end_ns = now
                self._close_thread(t)
        self.t1_ns = now
        log.info("pid %d: window ended after %.3f s: %d samples, %d switch samples, "
                  "%d records lost, %d threads (%d exited)", self.pid,
                  (now - (self.t0_ns or now)) / 1e9, self.samples, self.switch_samples,
                  self.lost, len(self.threads), self.exited)
        if self._mem_fd is not None:
            os.close(self._mem_fd)
            self._mem_fd = None
        r = resource.getrusage(resource.RUSAGE_SELF)
        if self._rusage0 is not None:
            self.reader_cpu_s = (r.ru_utime + r.ru_stime -
                                 self._rusage0.ru_utime - self._rusage0.ru_stime)

    # -- records -------------------------------------------------------------------
    def _consume(self, t, data):
        if not data:
            return
        lost = self.lost
        for rec in records.decode(data):
            if type(rec) is records.Sample:
                kind, name = self.by_ident.get(rec.ident, (None, None))
                if kind == CPU:
                    self._cpu_sample(rec)
                elif kind == SWITCH:
                    self._switch_sample(t, rec)
                elif kind == "syscall":
                    self._syscall_sample(name, rec)
            elif type(rec) is records.Switch:
                self._switch(t, rec)
            else:
                self.lost += rec.count
        if self.lost != lost:
            log.debug("pid %d tid %d: %d records lost in one drain", self.pid, t.tid,
                      self.lost - lost)

    def _attribute(self, rec, fallback, cache_prefix):
        """Attribution of a sample's stack (None without registers)."""
        if rec.regs is None:
            return None
        memory = unwind.StackCopy(*rec.stack) if rec.stack else None
        if memory is not None and fallback and self._mem_fd is not None:
            memory.fallback = unwind.PagedMemory(self._read_mem)
        key = None
        if cache_prefix:
            head = self.unwinder.walk(rec.regs, parse=True, memory=memory, tolerant=True,
                                      max_frames=CACHE_FRAMES)
            key = tuple(f.pc for f in head.frames) or (rec.regs.get(unwind.RA, rec.ip),)
            if head.complete:
                key += ("end",)
            hit = self._cache.get(key)
            if hit is not None:
                return hit
        w = self.unwinder.walk(rec.regs, parse=True, memory=memory, tolerant=True)
        # no frame: classify by the user pc (rec.ip is the kernel's for a
        # sample taken in kernel mode)
        pcs = [f.pc for f in w.frames] or [rec.regs.get(unwind.RA, rec.ip)]
        if key is None:
            key = (tuple(pcs), w.complete)
            hit = self._cache.get(key)
            if hit is not None:
                return hit
        a = self.attributor.classify(pcs, w.complete)
        if len(self._cache) < MAX_CACHE:
            self._cache[key] = (a, w.complete)
        return a, w.complete

    def _cpu_sample(self, rec):
        self.samples += 1
        self.cpu_ns += rec.period
        if rec.kernel:
            self.cpu_kernel += 1
        got = self._attribute(rec, True, False)
        if got is None:
            self.cpu[UNKNOWN] += 1
            self._stack(CPU, False, ("[no user registers]",), 1)
            return
        a, complete = got
        if complete:
            self.cpu_unwound += 1
        self.cpu[a.cls] += 1
        self._stack(CPU, a.cls == ALLOCATOR, a.folded, 1)
        if a.cls == ALLOCATOR:
            self.cpu_fn[a.function] += 1
            self.cpu_entry[a.entry] += 1
            site = self._site(a)
            self.site_cpu[site] += 1
            self.site_entry[site][a.entry] += 1

    def _site(self, a):
        site = a.site
        if site not in self.site_frames:
            if len(self.site_frames) >= MAX_SITES:
                return OTHER
            self.site_frames[site] = a.site_frames
        return site

    def _stack(self, kind, alloc, folded, weight):
        key = (kind, alloc, folded)
        if key not in self.stacks and len(self.stacks) >= MAX_STACKS:
            key = (kind, alloc, (OTHER,))
        self.stacks[key] += weight

    def _switch_sample(self, t, rec):
        self.switch_samples += 1
        got = self._attribute(rec, False, True)
        # The kernel emits the switch sample before the SWITCH-out record
        # (perf_event_task_sched_out: __perf_sw_event_sched, then
        # __perf_event_task_sched_out -> perf_event_switch).
        t.pending = ((got[0] if got else None), max(1, rec.period))

    def _switch(self, t, rec):
        if rec.out:
            # an interval still open lost its switch-in (a LOST record, or a
            # thread that woke before its events were enabled): not counted
            t.out_ns = t.out_cls = None
            t.out_ns, t.out_preempt = rec.time, rec.preempt
            t.out_cls, t.pending = t.pending, None
        else:
            self._close_interval(t, rec.time)

    def _close_interval(self, t, now_ns):
        if t.out_ns is None:
            return
        dt = max(0, now_ns - max(t.out_ns, self.t0_ns))
        # a sampled switch-out stands for PERIOD switch-outs (frequency mode)
        a, weight = t.out_cls if t.out_cls is not None else (None, 0)
        t.out_ns, t.out_cls = None, None
        self.switches_sampled += weight > 0
        if t.out_preempt:
            self.preempted_ns += dt
            self.preempted_n += 1
            return
        self.blocked_ns += dt
        self.blocked_n += 1
        if a is not None:
            self._stack("off_cpu", a.cls == ALLOCATOR, a.folded, dt // 1000)
        if a is not None and is_lock_wait(a):
            self.lock_ns += dt * weight
            self.lock_n += weight
            self.lock_fn[a.function] += dt * weight
            self.lock_fn_n[a.function] += weight
            site = self._site(a)
            self.site_lock_ns[site] += dt * weight
            self.site_lock_n[site] += weight
            self.site_entry[site][a.entry] += 0

    def _syscall_sample(self, name, rec):
        got = self._attribute(rec, True, True)
        self.sys_sampled[name] += 1
        if got is None or got[0].cls == UNKNOWN:
            self.sys_unknown[name] += 1
        elif got[0].cls == ALLOCATOR:
            self.sys_alloc[name] += 1

    # -- the result ------------------------------------------------------------
    def run(self, duration_s: float, tick: Callable[[float], Any] | None = None) -> str:
        """start(), poll for DURATION_S (Ctrl-C ends early), stop(); returns
        the way the window ended (diag.model.wall COMPLETE / INTERRUPTED / EXITED)."""
        self.start()
        return self.run_started(duration_s, tick)

    def run_started(self, duration_s: float,
                    tick: Callable[[float], Any] | None = None) -> str:
        """The polling loop of run() for a session already started."""
        ended = wall.COMPLETE
        deadline = time.monotonic() + duration_s
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(DRAIN_S, left))
                if not self.poll():
                    ended = wall.EXITED
                    break
                if tick is not None:
                    tick(duration_s - max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:
            ended = wall.INTERRUPTED
        finally:
            self.stop()
        return ended

    def _elapsed_s(self) -> float:
        """Seconds from the window's start to its end (to now while it runs)."""
        assert self.t0_ns is not None, "start() first"
        return ((self.t1_ns or time.monotonic_ns()) - self.t0_ns) / 1e9

    def _count(self, key):
        """A counter summed over every closed thread, None when none had it."""
        return self.final_counts.get(key)

    def window(self, requested_s: float, ended: str, comm: str | None = None,
               allocator: str | None = None, extra_missing: Iterable[wall.Missing] = (),
               pause_us: Iterable[int] = ()) -> wall.Window:
        duration = self._elapsed_s()
        assert self.start_wall is not None, "start() first"
        return wall.Window(
            pid=self.pid, start=self.start_wall, duration_s=duration, requested_s=requested_s,
            hz=self.hz, samples=self.samples, switch_samples=self.switch_samples,
            lost=self.lost, threads_seen=len(self.threads), threads_exited=self.exited,
            ended=ended, comm=comm, allocator=allocator, reader_cpu_s=self.reader_cpu_s,
            missing=tuple(self.missing.values()) + tuple(extra_missing),
            pause_us=tuple(pause_us))

    def parts(self) -> tuple[Any, ...]:
        """(cpu, off_cpu, faults, syscalls, sites, stacks) for diag.model.wall.Wall;
        of a running session, what was gathered so far (faults and syscall
        counts only once stopped: the counters are read when a thread is
        closed)."""
        duration = self._elapsed_s()
        secs = self.cpu_ns / 1e9
        per_sample = secs / self.samples if self.samples else 0.0

        def fn_times(counter, total_samples, scale):
            return tuple(wall.FunctionTime(f, n, n * scale, n / total_samples)
                         for f, n in counter.most_common())

        cpu = None
        if "cpu" not in self.missing or self.samples:
            cpu = wall.Cpu(samples=self.samples, seconds=secs,
                           allocator_samples=self.cpu[ALLOCATOR],
                           unknown_samples=self.cpu[UNKNOWN], unwound_samples=self.cpu_unwound,
                           kernel_samples=self.cpu_kernel,
                           by_function=fn_times(self.cpu_fn, self.samples or 1, per_sample),
                           by_entry=fn_times(self.cpu_entry, self.samples or 1, per_sample))
        end_ns = self.t1_ns or time.monotonic_ns()      # a running session: so far
        thread_s = sum(((t.end_ns or end_ns) - max(t.start_ns, self.t0_ns)) / 1e9
                       for t in self.threads.values())
        off = None
        if "off_cpu" not in self.missing:
            # Lock time: each sampled switch-out's interval weighted by the
            # switch-outs its sample stands for (exact at period 1).
            scale = min(1.0, self.blocked_ns / self.lock_ns) if self.lock_ns else 1.0
            off = wall.OffCpu(
                thread_s=thread_s, blocked_s=self.blocked_ns / 1e9,
                preempted_s=self.preempted_ns / 1e9, blocked_switches=self.blocked_n,
                preempted_switches=self.preempted_n,
                allocator_lock_s=self.lock_ns * scale / 1e9,
                allocator_lock_switches=self.lock_n,
                switches_sampled=self.switches_sampled,
                by_function=tuple(wall.FunctionTime(f, self.lock_fn_n[f], ns * scale / 1e9,
                                                    ns * scale / 1e9 / thread_s if thread_s
                                                    else 0.0)
                                  for f, ns in self.lock_fn.most_common()))
        faults = wall.Faults(minor=self._count("fault:minor"), major=self._count("fault:major"),
                             duration_s=duration)
        syscalls = {}
        for name in self.want_syscalls:
            syscalls[name] = wall.SyscallRate(
                name, count=self._count("sys:" + name),
                duration_s=duration, sampled=self.sys_sampled[name],
                from_allocator=self.sys_alloc[name], unknown=self.sys_unknown[name])
        names = set(self.site_cpu) | set(self.site_lock_ns)
        sites = sorted(
            (wall.Site(function=s, frames=self.site_frames.get(s, ()),
                       entry=(self.site_entry[s].most_common(1)[0][0]
                              if self.site_entry[s] else None),
                       allocator_samples=self.site_cpu[s],
                       allocator_cpu_s=self.site_cpu[s] * per_sample,
                       lock_wait_s=self.site_lock_ns[s] * scale / 1e9,
                       lock_switches=self.site_lock_n[s])
             for s in names),
            key=lambda s: -(s.allocator_cpu_s + s.lock_wait_s))
        stacks = tuple(wall.Stack(folded, w, kind, alloc)
                       for (kind, alloc, folded), w in self.stacks.most_common() if w > 0)
        return cpu, off, faults, syscalls, tuple(sites), stacks


def _raise_nofile():
    """Up to 9 descriptors per thread: lift allocdiag's own soft limit on
    open files to the hard one (EMFILE is still reported as missing)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else \
        max(soft, NOFILE_PER_THREAD * MAX_THREADS + NOFILE_SPARE)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass


def _with_exclude_kernel(buf: Any) -> Any:
    flags, = struct.unpack_from("<Q", buf, perf.ATTR_FLAGS_OFF)
    struct.pack_into("<Q", buf, perf.ATTR_FLAGS_OFF, flags | perf.F_EXCLUDE_KERNEL)
    return buf
