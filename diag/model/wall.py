"""The allocation wall of one process over one window: the model.

One ``Wall`` says, for a window of S seconds sampled with ``perf_event_open``
(DESIGN.md "sampling"; collectors.sampler builds it), where the process's
on-CPU time went (application, the allocator by function, unknown), how long
its threads waited blocked on allocator locks, its page-fault and
mmap-family syscall rates split "from the allocator" vs "from elsewhere", the
allocator's own counters over the same window, the call sites that drive the
allocator's CPU and lock waits, and findings.

Every class is a frozen record (diag.model.records); ``Wall.to_json()`` gives the one JSON
document of ``allocdiag wall --json`` (``schema_version`` below).  Each key is
described once in diag.fields (``WALL_FIELD_ROWS``: name = the dotted JSON
path, unit, meaning, source), which the TUI labels, metric HELP strings and
docs/wall.md use.  Shares are fractions 0..1, durations seconds, rates per
second.  ``None`` means not measured; the reason is in ``window.missing``.

"Inside the allocator" (collectors.sampler.attribution): a sample whose user
stack holds an allocator entry point or a frame in an allocator library; the
outermost such frame names the entry, the first frame outside it is the call
site.  A sample whose stack walk stopped before it could tell is counted as
``unknown``, never as application time.

Like diag.model, this module imports nothing of allocdiag's but diag.model.
"""

from __future__ import annotations

from typing import Optional

from diag.model.records import field, record
from diag.model import JSON, Finding

SCHEMA_VERSION = 1

# How a window ended (Window.ended)
COMPLETE, INTERRUPTED, EXITED = "complete", "interrupted", "exited"
# Off-CPU interval kinds (SWITCH records' PERF_RECORD_MISC_SWITCH_OUT_PREEMPT)
BLOCKED, PREEMPTED = "blocked", "preempted"
# The syscalls counted, in the order shown
SYSCALLS = ("mmap", "munmap", "madvise", "brk", "mprotect")
# The name of allocator time that no symbol names (stripped glibc internals)
GLIBC_INTERNAL = "glibc malloc (internal)"


def _round(x: Optional[float], nd: int = 6) -> Optional[float]:
    return None if x is None else round(x, nd)


def _share(part: Optional[float], whole: Optional[float]) -> Optional[float]:
    """part / whole, or None when nothing was measured."""
    return None if not whole or part is None else part / whole


@record(frozen=True)
class Missing:
    """A figure that could not be measured: which, why, and the fix."""

    figure: str                     # a dotted JSON path (``off_cpu``, ``syscalls.mmap``)
    reason: str
    fix: Optional[str] = None

    def to_json(self) -> JSON:
        return {"figure": self.figure, "reason": self.reason, "fix": self.fix}


@record(frozen=True)
class Window:
    """What was sampled: when, how long, how densely, and what is missing."""

    pid: int
    start: float                    # Unix time the sampling began
    duration_s: float               # as measured (shorter than asked when ended early)
    requested_s: float
    hz: int                         # CPU-clock samples per second of a thread's CPU time
    samples: int                    # CPU samples decoded
    switch_samples: int = 0         # switch-out samples decoded
    lost: int = 0                   # records the kernel dropped (PERF_RECORD_LOST)
    threads_seen: int = 0           # threads sampled at some point of the window
    threads_exited: int = 0         # of which exited during it
    ended: str = COMPLETE           # complete | interrupted | exited
    comm: Optional[str] = None
    allocator: Optional[str] = None  # the kind that serves malloc (diag.model.Allocator.kind)
    reader_cpu_s: Optional[float] = None  # allocdiag's own CPU time for the window
    missing: tuple[Missing, ...] = ()
    pause_us: tuple[int, ...] = ()            # each stop of a borrowed thread for the counters (us)

    def to_json(self) -> JSON:
        return {"pid": self.pid, "comm": self.comm, "allocator": self.allocator,
                "start": _round(self.start, 3), "duration_s": _round(self.duration_s, 3),
                "requested_s": self.requested_s, "hz": self.hz, "samples": self.samples,
                "switch_samples": self.switch_samples, "lost": self.lost,
                "threads_seen": self.threads_seen, "threads_exited": self.threads_exited,
                "ended": self.ended, "reader_cpu_s": _round(self.reader_cpu_s, 3),
                "pause_us": list(self.pause_us),
                "missing": [m.to_json() for m in self.missing]}


@record(frozen=True)
class FunctionTime:
    """Samples charged to one allocator function (the leaf-most frame inside
    the allocator that a symbol names, else GLIBC_INTERNAL / ``lib+0xADDR``)."""

    function: str
    samples: int
    seconds: float
    share: float                    # of all CPU samples (cpu) / all thread time (off_cpu)

    def to_json(self) -> JSON:
        return {"function": self.function, "samples": self.samples,
                "seconds": _round(self.seconds), "share": _round(self.share)}


@record(frozen=True)
class Cpu:
    """On-CPU time: every sample is application, allocator or unknown."""

    samples: int = 0
    seconds: float = 0.0            # samples x the sampling period
    allocator_samples: int = 0
    unknown_samples: int = 0        # walk stopped before any allocator or application frame
    unwound_samples: int = 0        # walks that reached the thread's first frame
    kernel_samples: int = 0         # taken in kernel mode (charged to the user stack at entry)
    by_function: tuple[FunctionTime, ...] = ()  # most first
    by_entry: tuple[FunctionTime, ...] = ()  # by outermost allocator entry point

    @property
    def allocator_share(self) -> Optional[float]:
        return _share(self.allocator_samples, self.samples)

    @property
    def application_share(self) -> Optional[float]:
        return _share(self.samples - self.allocator_samples - self.unknown_samples,
                      self.samples)

    @property
    def unknown_share(self) -> Optional[float]:
        return _share(self.unknown_samples, self.samples)

    @property
    def unwound_share(self) -> Optional[float]:
        return _share(self.unwound_samples, self.samples)

    @property
    def kernel_share(self) -> Optional[float]:
        return _share(self.kernel_samples, self.samples)

    @property
    def allocator_s(self) -> float:
        return self.seconds * (self.allocator_share or 0.0)

    def to_json(self) -> JSON:
        return {"samples": self.samples, "seconds": _round(self.seconds),
                "allocator_share": _round(self.allocator_share),
                "allocator_s": _round(self.allocator_s),
                "application_share": _round(self.application_share),
                "unknown_share": _round(self.unknown_share),
                "unwound_share": _round(self.unwound_share),
                "kernel_share": _round(self.kernel_share),
                "by_function": [f.to_json() for f in self.by_function],
                "by_entry": [f.to_json() for f in self.by_entry]}


@record(frozen=True)
class OffCpu:
    """Time threads spent switched out, from SWITCH records.  An interval
    runs from switch-out to switch-in, so it includes the run-queue wait
    after the wake-up."""

    thread_s: float = 0.0           # sum over threads of the time each was observed
    blocked_s: float = 0.0          # voluntary switch-outs (futex, I/O, sleep)
    preempted_s: float = 0.0        # switched out while still runnable
    blocked_switches: int = 0
    preempted_switches: int = 0
    # blocked with an allocator frame on the stack, in a lock wait (an
    # allocator thread's condition wait or sleep is idle, not counted)
    allocator_lock_s: float = 0.0
    allocator_lock_switches: int = 0
    by_function: tuple[FunctionTime, ...] = ()  # the wait's allocator frame
    # switch-outs whose stack was looked at; the allocator_lock_* figures are
    # those intervals scaled by all / sampled (exact when equal)
    switches_sampled: int = 0

    @property
    def allocator_lock_share(self) -> Optional[float]:
        return _share(self.allocator_lock_s, self.thread_s)

    @property
    def blocked_share(self) -> Optional[float]:
        return _share(self.blocked_s, self.thread_s)

    def to_json(self) -> JSON:
        return {"thread_s": _round(self.thread_s), "blocked_s": _round(self.blocked_s),
                "blocked_share": _round(self.blocked_share),
                "preempted_s": _round(self.preempted_s),
                "blocked_switches": self.blocked_switches,
                "preempted_switches": self.preempted_switches,
                "allocator_lock_s": _round(self.allocator_lock_s),
                "allocator_lock_share": _round(self.allocator_lock_share),
                "allocator_lock_switches": self.allocator_lock_switches,
                "switches_sampled": self.switches_sampled,
                "by_function": [f.to_json() for f in self.by_function]}


@record(frozen=True)
class Faults:
    """Page faults of every sampled thread over the window (kernel counters)."""

    minor: Optional[int] = None
    major: Optional[int] = None
    duration_s: float = 0.0

    @property
    def minor_per_s(self) -> Optional[float]:
        return _share(self.minor, self.duration_s)

    @property
    def major_per_s(self) -> Optional[float]:
        return _share(self.major, self.duration_s)

    def to_json(self) -> JSON:
        return {"minor": self.minor, "major": self.major,
                "minor_per_s": _round(self.minor_per_s, 1),
                "major_per_s": _round(self.major_per_s, 1)}


@record(frozen=True)
class SyscallRate:
    """One syscall's count over the window (a tracepoint counter) and its
    split by calling stack, from a sample of the calls."""

    name: str
    count: Optional[int] = None
    duration_s: float = 0.0
    sampled: int = 0                # calls whose stack was looked at
    from_allocator: int = 0         # of those, with an allocator frame on the stack
    unknown: int = 0                # of those, whose walk could not tell

    @property
    def per_s(self) -> Optional[float]:
        return _share(self.count, self.duration_s)

    @property
    def from_allocator_share(self) -> Optional[float]:
        return _share(self.from_allocator, self.sampled - self.unknown)

    def to_json(self) -> JSON:
        return {"count": self.count, "per_s": _round(self.per_s, 1),
                "sampled": self.sampled, "from_allocator": self.from_allocator,
                "unknown": self.unknown,
                "from_allocator_share": _round(self.from_allocator_share)}


@record(frozen=True)
class Counter:
    """One of the allocator's own counters, read at the window's start and
    end with the borrowed call (collectors.livestats).  ``kind`` "delta": a
    monotonic count (delta, per_s meaningful); "gauge": a level (arenas,
    threads: start and end shown, delta = end - start)."""

    name: str                       # "<allocator>.<path>", e.g. jemalloc.mutexes.ctl.num_wait
    start: Optional[int]
    end: Optional[int]
    duration_s: float
    unit: str = "count"             # count | ns | bytes
    kind: str = "delta"             # delta | gauge
    provenance: str = "measured"    # diag.model provenances
    source: Optional[str] = None    # the allocator's own name for it

    @property
    def delta(self) -> Optional[int]:
        return None if self.start is None or self.end is None else self.end - self.start

    @property
    def per_s(self) -> Optional[float]:
        return _share(self.delta, self.duration_s) if self.kind == "delta" else None

    def to_json(self) -> JSON:
        return {"start": self.start, "end": self.end, "delta": self.delta,
                "per_s": _round(self.per_s, 3), "unit": self.unit, "kind": self.kind,
                "provenance": self.provenance, "source": self.source}


@record(frozen=True)
class Site:
    """A call site: the first frame outside the allocator (symbolized,
    demangled), with the frames outward from it, and what it cost."""

    function: str
    frames: tuple[str, ...] = ()    # from the call site outward (at most SITE_FRAMES)
    entry: Optional[str] = None     # the allocator entry point it called most
    allocator_samples: int = 0
    allocator_cpu_s: float = 0.0
    lock_wait_s: float = 0.0
    lock_switches: int = 0

    def to_json(self) -> JSON:
        return {"function": self.function, "frames": list(self.frames), "entry": self.entry,
                "allocator_samples": self.allocator_samples,
                "allocator_cpu_s": _round(self.allocator_cpu_s),
                "lock_wait_s": _round(self.lock_wait_s), "lock_switches": self.lock_switches}


@record(frozen=True)
class Stack:
    """One folded stack (outermost frame first) and its weight: CPU samples
    (``kind`` "cpu") or off-CPU microseconds ("off_cpu").  Feeds --collapsed
    and the report's icicle."""

    frames: tuple[str, ...]
    weight: int
    kind: str = "cpu"
    allocator: bool = False

    def folded(self) -> str:
        # ";" separates frames in the format: one inside a C++ name is replaced
        return ";".join(f.replace(";", ":") for f in self.frames) + f" {self.weight}"

    def to_json(self) -> JSON:
        return {"frames": list(self.frames), "weight": self.weight, "kind": self.kind,
                "allocator": self.allocator}


@record(frozen=True)
class Wall:
    """One window's wall.  ``counters``: {name: Counter}; ``syscalls``:
    {name: SyscallRate} for SYSCALLS; ``stacks`` is not part of the default
    JSON (``to_json(stacks=True)``)."""

    window: Window
    cpu: Optional[Cpu] = None
    off_cpu: Optional[OffCpu] = None
    faults: Optional[Faults] = None
    syscalls: dict[str, SyscallRate] = field(default_factory=dict)
    counters: dict[str, Counter] = field(default_factory=dict)
    sites: tuple[Site, ...] = ()
    findings: tuple[Finding, ...] = ()
    stacks: tuple[Stack, ...] = ()

    def to_json(self, stacks: bool = False) -> JSON:
        out = {"schema_version": SCHEMA_VERSION, "kind": "wall",
               "window": self.window.to_json(),
               "cpu": self.cpu.to_json() if self.cpu is not None else None,
               "off_cpu": self.off_cpu.to_json() if self.off_cpu is not None else None,
               "faults": self.faults.to_json() if self.faults is not None else None,
               "syscalls": {n: s.to_json() for n, s in self.syscalls.items()},
               "counters": {n: c.to_json() for n, c in self.counters.items()},
               "sites": [s.to_json() for s in self.sites],
               "findings": [f.to_json() for f in self.findings]}
        if stacks:
            out["stacks"] = [s.to_json() for s in self.stacks]
        return out

    def collapsed(self, kind: str = "cpu") -> list[str]:
        """Folded-stack lines ("a;b;c N") of KIND, for flamegraph.pl,
        speedscope and inferno."""
        return [s.folded() for s in self.stacks if s.kind == kind]


__all__ = [c.__name__ for c in (Missing, Window, FunctionTime, Cpu, OffCpu, Faults,
                                SyscallRate, Counter, Site, Stack, Wall)] + [
    "Finding", "SCHEMA_VERSION", "SYSCALLS", "GLIBC_INTERNAL", "COMPLETE", "INTERRUPTED",
    "EXITED", "BLOCKED", "PREEMPTED"]
