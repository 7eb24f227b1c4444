"""``allocdiag compare``: one workload under every installed allocator (or a
chosen set of allocators and knob sets), peak vs settled, with evidence.

For each variant the command is started with the variant's ``LD_PRELOAD`` and
knob environment, in its own session (and, with ``isolate``, in its own
transient memory cgroup).  It is sampled at a fixed interval: the kernel's
numbers (rss, rss_anon, lazyfree; the cgroup working set) every tick, and the
allocator's own layers through the engine (``diag.snapshot.take(pid,
attach=True)``) whenever the pause budget allows.  Phases, in order:

    warmup   ``warmup_s`` seconds (the same for every variant)
    load     ``load`` (a shell command, run WITHOUT the variant's preload)
             until it exits or ``load_s`` passed -- or, without ``load``,
             ``run``: until the command exits, or prints a line matching
             ``idle_after`` (a finite workload that then stays up), or
             ``timeout_s``
    idle     ``idle_s`` seconds of nothing; the command is stopped after it

``peak`` is the per-field maximum over every sample of the run; ``settled``
is the last sample of the idle phase (allocator fields from the last sample
that read them in that phase) or, for a command that exited by itself, the
last sample before it did.  With ``repeat`` > 1 runs go round-robin over the
variants (so a drift of the machine hits every variant alike); a variant's
``peak``/``settled`` are then the medians and ``spread`` has min/median/max.

A variant whose preload did not take effect (requested library missing,
malloc bound elsewhere, another allocator than the one asked for) is kept in
the document with ``excluded_reason`` and left out of the ranking.

Nothing here renders; ``render_text`` below is the table the command prints.
"""

import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time

from diag.model.records import field, field_names, record
from collectors.allocators import registry
from diag.model.errors import AllocdiagError, NoSuchProcess
from collectors.proc.cgroup import cgroup_memory
from collectors.proc.procfs import ProcFS
from diag.model.exitcodes import ExitCode
from diag.fields import CGROUP_FIELDS, PROCESS_FIELDS, STATS_FIELDS

LIBDIR = "/usr/lib/x86_64-linux-gnu"

# allocator name -> (library to preload or None, the kind diag.snapshot reports)
ALLOCATORS = {
    "glibc": (None, "glibc"),
    "jemalloc": (f"{LIBDIR}/libjemalloc.so.2", "jemalloc"),
    "tcmalloc": (f"{LIBDIR}/libtcmalloc.so.4", "tcmalloc"),
    "tcmalloc_minimal": (f"{LIBDIR}/libtcmalloc_minimal.so.4", "tcmalloc"),
    "mimalloc": (f"{LIBDIR}/libmimalloc.so.2", "mimalloc"),
}

# Allocator variables cleared from the inherited environment, so every
# variant starts from the same configuration (only its own knobs set).
CLEARED_ENV = ("LD_PRELOAD", "MALLOC_CONF", "_RJEM_MALLOC_CONF", "JE_MALLOC_CONF",
               "GLIBC_TUNABLES")
CLEARED_PREFIXES = ("MIMALLOC_", "TCMALLOC_", "MALLOC_")

# The fields a variant's peak/settled carry (names of diag/fields.py).
PROCESS_KEYS = ("rss", "rss_anon", "lazyfree", "anon_thp", "swap")
CGROUP_KEYS = ("usage", "working_set")
STATS_KEYS = tuple(STATS_FIELDS)
KEYS = PROCESS_KEYS + CGROUP_KEYS + STATS_KEYS
assert all(k in PROCESS_FIELDS for k in PROCESS_KEYS)
assert all(k in CGROUP_FIELDS for k in CGROUP_KEYS)

# Load tools' throughput lines: (regex, unit).  The last match wins.
THROUGHPUT = (
    (re.compile(r"Requests/sec:\s*([\d.]+)"), "requests/s"),                 # wrk
    (re.compile(r"Requests per second:\s*([\d.]+)"), "requests/s"),          # ab
    (re.compile(r"([\d.]+)\s+requests per second"), "requests/s"),           # redis-benchmark
    (re.compile(r"\bops_s=([\d.]+)"), "ops/s"),                              # examples/
    (re.compile(r"\b(?:ops/s|ops/sec|rps|req/s|throughput)[:=]\s*([\d.]+)", re.I), "ops/s"),
)

MiB = 1024 * 1024


class CompareError(AllocdiagError):
    """A compare run cannot be set up (bad variant, command not found)."""

    exit_code = ExitCode.USAGE


# --- variants ----------------------------------------------------------------

@record
class Variant:
    name: str                       # as the user wrote it (or the allocator name)
    allocator: str                  # allocator name, or the library's file name
    library: str | None = None             # LD_PRELOAD path (None: glibc)
    expect_kind: str | None = None         # the kind the snapshot must report
    env: dict = field(default_factory=dict)
    skip_reason: str | None = None         # not run at all (unknown name, not installed)

    def to_json(self):
        return {"name": self.name, "allocator": self.allocator, "library": self.library,
                "env": dict(self.env)}


def installed():
    """Names of the allocators whose library exists here (glibc always)."""
    return [a for a, (lib, _) in ALLOCATORS.items() if lib is None or os.path.exists(lib)]


def _kind_of_library(path):
    base = os.path.basename(path)
    for a in registry.ALL:
        if a.vocabulary.library_word and a.vocabulary.library_word in base:
            return a.kind
    return None


def _close(name):
    import difflib
    m = difflib.get_close_matches(name, list(ALLOCATORS), n=1)
    return f" (did you mean {m[0]}?)" if m else ""


def knob_env(allocator, knobs):
    """Environment for ALLOCATOR's KNOBS ([(key, value)]).

    Keys written in capitals are environment variables and pass through
    (``MALLOC_ARENA_MAX=2``, ``TCMALLOC_RELEASE_RATE=10``).  Lower-case keys
    are the allocator's option names:
      jemalloc          MALLOC_CONF=k:v,...
      glibc             GLIBC_TUNABLES=glibc.malloc.k=v:... (``glibc.*`` as is)
      mimalloc          MIMALLOC_K=v; ``purge_delay`` (2.1 name) also sets
                        MIMALLOC_DECOMMIT_DELAY, its 2.0 name, and vice versa
      tcmalloc(_minimal) TCMALLOC_K=v
    """
    env = {}
    kind = ALLOCATORS.get(allocator, (None, _kind_of_library(allocator) or allocator))[1]
    allocator_knobs = registry.for_kind(kind).knobs
    if allocator_knobs is not None:
        allocator_knobs.start_env(knobs, env)
        return env
    for key, value in knobs:
        if key.upper() != key:
            raise CompareError(f"knob {key}={value}: no knob syntax known for {allocator!r}; "
                               "write it as an environment variable (capitals)")
        env[key] = value
    return env


def _valid_variants():
    return (f"valid variants: {', '.join(ALLOCATORS)} (installed here: "
            f"{', '.join(installed())}), a library path /path/to/libX.so, each optionally "
            "with :KNOB=VALUE,...")


def split_variants(words):
    """The variant specs in WORDS (the --variants arguments), which may be
    separated by spaces or commas: ``glibc,jemalloc`` is two variants.  A
    comma also separates the knobs of one variant
    (``jemalloc:dirty_decay_ms=1000,muzzy_decay_ms=0``), so a comma-separated
    piece that is ``KEY=VALUE`` (no ``:`` or ``/`` before its ``=``) belongs to
    the variant before it when that variant has knobs."""
    specs = []
    for word in words:
        for i, piece in enumerate(p.strip() for p in word.split(",")):
            key = piece.partition("=")[0]
            if i and "=" in piece and not any(c in key for c in ":/") and ":" in specs[-1]:
                specs[-1] += "," + piece
            elif piece:
                specs.extend(piece.split())
    return specs


def parse_variants(words):
    """Variants of the --variants arguments WORDS (see ``split_variants``).

    Raises CompareError (a usage error, before anything is started) for an
    empty set and for an unknown allocator name, listing the valid ones."""
    specs = split_variants(words)
    if not specs:
        raise CompareError(f"--variants: no variant given; {_valid_variants()}")
    variants = [parse_variant(s) for s in specs]
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise CompareError("--variants: a variant is named twice")
    if all(v.skip_reason for v in variants):
        raise CompareError("--variants: none of them can run here ("
                           + "; ".join(v.skip_reason for v in variants) + f"); {_valid_variants()}")
    return variants


def parse_variant(spec):
    """``ALLOCATOR[:k=v,k=v]`` or ``/path/to/lib.so[:k=v,...]`` -> Variant.

    An unknown allocator name raises CompareError listing the valid ones
    (nothing has been started yet).  A known allocator whose library is not
    installed is kept, not run, and excluded with the reason."""
    head, _, tail = spec.partition(":")
    knobs = []
    for item in filter(None, (s.strip() for s in tail.split(","))):
        k, eq, v = item.partition("=")
        if not eq or not k:
            raise CompareError(f"variant {spec!r}: knob {item!r} is not KEY=VALUE")
        knobs.append((k.strip(), v.strip()))
    if "/" in head:
        lib = head
        alloc = os.path.basename(head)
        kind = _kind_of_library(head)
        return Variant(spec, alloc, lib, kind, knob_env(alloc, knobs))
    if head not in ALLOCATORS:
        raise CompareError(f"unknown variant {spec!r}{_close(head)}; {_valid_variants()}")
    lib, kind = ALLOCATORS[head]
    v = Variant(spec, head, lib, kind, knob_env(head, knobs))
    if lib and not os.path.exists(lib):
        v.skip_reason = f"{lib} is not installed"
    return v


def default_variants():
    return [parse_variant(a) for a in installed()]


def child_environment(variant, base=None):
    env = {k: v for k, v in (base if base is not None else os.environ).items()
           if k not in CLEARED_ENV and not k.startswith(CLEARED_PREFIXES)}
    if variant.library:
        env["LD_PRELOAD"] = variant.library
    env.update(variant.env)
    return env


# --- confounds -----------------------------------------------------------------

def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _bracketed(text):
    m = re.search(r"\[(\w+)\]", text or "")
    return m.group(1) if m else text


def confounds():
    """What the published methodology pins: THP, swap, CPUs, governor, load."""
    meminfo = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        k, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            meminfo[k] = int(parts[0]) * 1024
    try:
        affinity = len(os.sched_getaffinity(0))
    except OSError:
        affinity = None
    gov = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    load = _read("/proc/loadavg")
    return {
        "thp_enabled": _bracketed(_read("/sys/kernel/mm/transparent_hugepage/enabled")),
        "thp_defrag": _bracketed(_read("/sys/kernel/mm/transparent_hugepage/defrag")),
        "swap_total": meminfo.get("SwapTotal"),
        "swap_free": meminfo.get("SwapFree"),
        "swappiness": _int(_read("/proc/sys/vm/swappiness")),
        "mem_total": meminfo.get("MemTotal"),
        "mem_available": meminfo.get("MemAvailable"),
        "cpus": os.cpu_count(),
        "cpus_allowed": affinity,
        "governor": gov,            # None: not readable (no cpufreq, e.g. a VM)
        "loadavg_1m": float(load.split()[0]) if load else None,
        "kernel": os.uname().release,
    }


def _int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


# --- transient cgroup ------------------------------------------------------------

class TransientCgroup:
    """A child memory cgroup under our own, for one run (v2 or v1)."""

    def __init__(self, path, version):
        self.path, self.version = path, version

    @classmethod
    def create(cls, tag, root="/sys/fs/cgroup"):
        """A new child group, or (None, reason) when no writable parent."""
        paths = ProcFS().cgroup_paths(os.getpid())
        candidates = []
        if "memory" in paths and os.path.isdir(os.path.join(root, "memory")):
            candidates.append((os.path.join(root, "memory", paths["memory"].lstrip("/")), 1))
        if "" in paths:
            for base in (root, os.path.join(root, "unified")):
                if os.path.exists(os.path.join(base, "cgroup.controllers")):
                    candidates.append((os.path.join(base, paths[""].lstrip("/")), 2))
                    break
        reasons = []
        for parent, version in candidates:
            path = os.path.join(parent, f"allocdiag-compare-{os.getpid()}-{tag}")
            try:
                os.mkdir(path)
            except OSError as exc:
                reasons.append(f"v{version} {parent}: {exc.strerror}")
                continue
            probe = "memory.current" if version == 2 else "memory.usage_in_bytes"
            if not os.path.exists(os.path.join(path, probe)):
                os.rmdir(path)
                reasons.append(f"v{version} {parent}: the memory controller is not enabled "
                               "for its children")
                continue
            return cls(path, version), None
        return None, "; ".join(reasons) or "no cgroup memory controller found"

    def enter_fn(self):
        procs = os.path.join(self.path, "cgroup.procs")

        def enter():
            with open(procs, "w") as f:
                f.write("0")
        return enter

    def remove(self):
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                time.sleep(0.1)
        return False


_libc = None


def _child_setup(cgroup):
    """preexec_fn: die with allocdiag (PR_SET_PDEATHSIG SIGTERM), enter the
    transient cgroup first when there is one."""
    global _libc
    if _libc is None:
        import ctypes
        _libc = ctypes.CDLL(None, use_errno=True)
    enter = cgroup.enter_fn() if cgroup else None
    libc = _libc

    def setup():
        libc.prctl(1, signal.SIGTERM)       # PR_SET_PDEATHSIG
        if enter:
            enter()
    return setup


# --- one run ---------------------------------------------------------------------

class Lines:
    """A thread that reads a pipe's lines with their time; optional match event."""

    def __init__(self, stream, t0, pattern=None, keep=400):
        self.lines = []          # (seconds since t0, text), the last KEEP
        self.pattern = re.compile(pattern) if pattern else None
        self.matched = threading.Event()
        self.keep = keep
        self.total = 0
        self.t0 = t0
        self.thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self.thread.start()

    def _run(self, stream):
        for raw in iter(stream.readline, b""):
            text = raw.decode(errors="replace").rstrip("\n")
            self.total += 1
            self.lines.append((round(time.monotonic() - self.t0, 3), text))
            if len(self.lines) > self.keep:
                del self.lines[: len(self.lines) - self.keep]
            if self.pattern is not None and self.pattern.search(text):
                self.matched.set()
        stream.close()

    def texts(self):
        return [t for _, t in self.lines]


def _stop(proc, timeout=5):
    """SIGTERM the process group, then SIGKILL; reaped."""
    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)   # stragglers of the group
    except (ProcessLookupError, PermissionError):
        pass
    return proc.returncode


def _exit_status(code):
    if code is None:
        return None
    return {"code": code, "signal": signal.Signals(-code).name if code < 0 else None}


class PauseBudget:
    """A token bucket of stop time: ``ms_per_minute`` refilled continuously,
    at most one minute's worth saved up."""

    def __init__(self, ms_per_minute):
        self.rate = ms_per_minute / 60.0 / 1000.0     # seconds of pause per second
        self.capacity = ms_per_minute / 1000.0
        self.tokens = self.capacity
        self.last = time.monotonic()
        self.used_s = 0.0
        self.estimate = 0.005

    def allows(self):
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
        self.last = now
        return self.tokens >= self.estimate

    def spend(self, pause_s):
        self.tokens -= pause_s
        self.used_s += pause_s
        self.estimate = max(0.001, 0.5 * self.estimate + 0.5 * pause_s)


def _sample(pid, attach, procfs, t, phase):
    """One sample dict: {t, phase, attached, <fields>} (+ the snapshot when attached)."""
    from diag import snapshot
    out = {"t": round(t, 3), "phase": phase, "attached": False}
    snap = None
    if attach:
        snap, col = snapshot.take(pid, attach=True, deadline_s=0.5)
        remote = col.status.get("remote")
        out["attached"] = bool(remote and remote.ok and remote.pause_us is not None)
        out["pause_us"] = remote.pause_us if remote else None
        if remote and not remote.ok:
            out["remote_error"] = remote.error
        proc_mem, cg = snap.process, snap.cgroup
    else:
        status = procfs.status(pid)
        proc_mem = procfs.memory(pid, status=status)
        try:
            cg = cgroup_memory(procfs.cgroup_paths(pid))
        except AllocdiagError:
            cg = None
    for k in PROCESS_KEYS:
        out[k] = getattr(proc_mem, k, None)
    # The kernel's high-water mark of RSS: the true peak between samples
    # (a workload that builds and drops within one interval is not missed).
    try:
        hwm = procfs.status(pid).get(b"VmHWM")
        out["rss_hwm"] = int(hwm.split()[0]) * 1024 if hwm else None
    except (AllocdiagError, ValueError, IndexError):
        out["rss_hwm"] = None
    for k in CGROUP_KEYS:
        out[k] = getattr(cg, k, None) if cg is not None else None
    if snap is not None and out["attached"]:
        for k in STATS_KEYS:
            out[k] = snap.stats[k].value if k in snap.stats else None
    return out, snap


def _finding(snap):
    if snap is None or not snap.findings:
        return None
    f = max(snap.findings, key=lambda f: f.expected_effect_bytes or 0)
    return {"id": f.id, "severity": f.severity, "title": f.title,
            "expected_effect_bytes": f.expected_effect_bytes,
            "knob": f.knob.to_json() if f.knob else None}


def _throughput(lines):
    best = None
    for text in lines:
        for rx, unit in THROUGHPUT:
            m = rx.search(text)
            if m:
                try:
                    best = {"value": float(m.group(1)), "unit": unit, "line": text.strip()}
                except ValueError:
                    pass
    return best


def _preload(snap, variant):
    """(preload_effective, verdict, excluded_reason) from the first snapshot."""
    if snap is None:
        return None, None, "no snapshot could be taken (the command exited first?)"
    pre, kind = snap.preload, snap.allocator.kind
    reason = None
    if variant.library and pre.effective is False:
        reason = pre.verdict
        if pre.reasons:
            reason += f" ({pre.reasons[0]})"
    elif variant.expect_kind and kind != variant.expect_kind:
        reason = f"malloc is served by {kind}, not {variant.expect_kind}"
    elif variant.library is None and not registry.for_kind(kind).vocabulary.always_loaded:
        reason = f"malloc is served by {kind} (an inherited preload?), not glibc"
    return pre.effective, pre.verdict, reason


@record
class Settings:
    command: list
    load: str | None = None
    load_s: float = 10.0
    idle_s: float = 10.0
    warmup_s: float = 1.0
    interval_s: float = 1.0
    timeout_s: float = 600.0
    ready: str | None = None               # regex: wait for a line before the warm-up starts
    ready_timeout_s: float = 120.0
    idle_after: str | None = None          # regex: a finite command's "done, staying up" line
    pause_ms_per_minute: float = 600.0
    isolate: bool = False
    repeat: int = 1
    noise_pct: float = 5.0
    rank_by: str = "rss"
    cwd: str | None = None
    example_env: bool = False       # set ALLOCDIAG_EXAMPLE_ALLOCATOR (examples/ presets)

    def to_json(self):
        return {k: getattr(self, k) for k in field_names(self)}


def run_variant(variant, settings, index=0, progress=None):
    """Run SETTINGS.command once under VARIANT; returns the run's dict."""
    procfs = ProcFS()
    budget = PauseBudget(settings.pause_ms_per_minute)
    cg, cg_reason = None, None
    if settings.isolate:
        cg, cg_reason = TransientCgroup.create(f"{index}")
    t0 = time.monotonic()
    run = {"variant": variant.name, "samples": [], "phases": {}, "isolated": cg is not None,
           "isolate_reason": cg_reason if settings.isolate and cg is None else None,
           "cgroup": cg.path if cg else None}
    env = child_environment(variant)
    if settings.example_env:
        env["ALLOCDIAG_EXAMPLE_ALLOCATOR"] = variant.allocator
    try:
        proc = subprocess.Popen(settings.command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True,
                                cwd=settings.cwd, preexec_fn=_child_setup(cg))
    except OSError as exc:
        if cg:
            cg.remove()
        raise CompareError(f"cannot start {settings.command[0]!r}: {exc.strerror}") from None
    out = Lines(proc.stdout, t0, settings.idle_after)
    load_proc = load_out = None
    first_snap = last_snap = None
    settled = None
    ended_by = None
    phase = "warmup" if not settings.ready else "start"
    phase_start = time.monotonic()
    run["phases"][phase] = 0.0
    # The first sample waits for the dynamic loader (and any exec chain such
    # as a pyenv shim) to be done, so the preload verdict sees the program.
    next_tick = time.monotonic() + min(0.25, settings.interval_s)

    def enter(name):
        nonlocal phase, phase_start
        phase, phase_start = name, time.monotonic()
        run["phases"][name] = round(phase_start - t0, 3)
        if progress:
            progress(f"  {variant.name}: {name}")

    try:
        while True:
            now = time.monotonic()
            # -- phase transitions -------------------------------------------
            exited = proc.poll() is not None
            if exited and ended_by is None:
                ended_by = "exited"
            if phase == "start":
                if any(re.search(settings.ready, t) for t in out.texts()):
                    enter("warmup")
                elif now - t0 > settings.ready_timeout_s or exited:
                    ended_by = ended_by or "no ready line"
                    break
            if phase == "warmup" and now - phase_start >= settings.warmup_s:
                if settings.load:
                    load_proc = subprocess.Popen(
                        settings.load, shell=True, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        start_new_session=True, cwd=settings.cwd, preexec_fn=_child_setup(None))
                    load_out = Lines(load_proc.stdout, t0)
                    enter("load")
                else:
                    enter("run")
            if phase == "load" and (load_proc.poll() is not None
                                    or now - phase_start >= settings.load_s):
                run["load_exit"] = _exit_status(_stop(load_proc) if load_proc.poll() is None
                                                else load_proc.returncode)
                run["load_stopped"] = load_proc.returncode is not None and \
                    now - phase_start >= settings.load_s
                enter("idle")
            if phase == "run" and settings.idle_after and out.matched.is_set():
                enter("idle")
            if phase == "idle" and now - phase_start >= settings.idle_s:
                ended_by = ended_by or "idle done"
            if exited or ended_by or now - t0 > settings.timeout_s:
                ended_by = ended_by or "timeout"
                break
            # -- one sample -----------------------------------------------------
            if now >= next_tick:
                attach = budget.allows()
                try:
                    s, snap = _sample(proc.pid, attach, procfs, now - t0, phase)
                except NoSuchProcess:
                    continue
                if s.get("pause_us"):
                    budget.spend(s["pause_us"] / 1e6)
                if snap is not None and s["attached"]:
                    first_snap = first_snap or snap
                    last_snap = snap
                elif snap is not None and first_snap is None:
                    first_snap = snap
                run["samples"].append(s)
                next_tick += settings.interval_s
                if next_tick < time.monotonic():
                    next_tick = time.monotonic() + settings.interval_s
            time.sleep(max(0.01, min(0.05, next_tick - time.monotonic())))
        # A last sample at the end of the idle phase (the settled figure),
        # attached when the process is still there.
        if proc.poll() is None and phase == "idle":
            try:
                s, snap = _sample(proc.pid, True, procfs, time.monotonic() - t0, "idle")
                if s.get("pause_us"):
                    budget.spend(s["pause_us"] / 1e6)
                run["samples"].append(s)
                if s["attached"]:
                    last_snap = snap
                    first_snap = first_snap or snap
            except NoSuchProcess:
                pass
    finally:
        wall = time.monotonic() - t0
        if load_proc is not None and load_proc.poll() is None:
            _stop(load_proc)
        code = proc.poll()
        stopped = code is None
        code = _stop(proc)
        out.thread.join(2)
        if load_out is not None:
            load_out.thread.join(2)
        if cg is not None:
            run["cgroup_removed"] = cg.remove()

    run["ended_by"] = ended_by
    run["wall_s"] = round(wall, 3)
    run["exit_status"] = _exit_status(code)
    run["stopped_by_allocdiag"] = stopped
    run["pause_ms_total"] = round(budget.used_s * 1000, 3)
    run["output"] = out.texts()[-50:]
    run["load_output"] = load_out.texts()[-50:] if load_out else []
    run["throughput"] = _throughput(load_out.texts()) if load_out else _throughput(out.texts())
    # The verdict of the last snapshot: the process is long past its loader
    # and any exec chain by then (the first could still see a wrapper).
    eff, verdict, reason = _preload(last_snap or first_snap, variant)
    if first_snap is not None and last_snap is not None and first_snap is not last_snap:
        early = _preload(first_snap, variant)
        if early[2] and not reason:
            run["early_verdict"] = early[1]
    run["preload_effective"], run["preload_verdict"] = eff, verdict
    run["excluded_reason"] = reason
    snap = last_snap or first_snap
    run["allocator_kind"] = snap.allocator.kind if snap else None
    samples = run["samples"]
    run["peak"] = {k: max((s[k] for s in samples if s.get(k) is not None), default=None)
                   for k in KEYS}
    hwm = max((s["rss_hwm"] for s in samples if s.get("rss_hwm")), default=None)
    run["peak_rss_sampled"] = run["peak"]["rss"]
    if hwm is not None and (run["peak"]["rss"] is None or hwm > run["peak"]["rss"]):
        run["peak"]["rss"] = hwm
    run["peak_sources"] = {
        "rss": "VmHWM (the kernel's high-water mark) or the largest sample",
        "other": f"the largest of the samples taken every {settings.interval_s:g} s: a peak "
                 "shorter than the interval is missed"}
    idle = [s for s in samples if s["phase"] == "idle"]
    if idle:
        settled_from = "idle"
    else:
        idle = samples[-1:]
        settled_from = "last sample before the command exited" if ended_by == "exited" \
            else f"last sample ({ended_by})"
    settled = {}
    for k in KEYS:
        vals = [s[k] for s in idle if s.get(k) is not None]
        settled[k] = vals[-1] if vals else None
    run["settled"] = settled
    run["settled_from"] = settled_from
    run["finding"] = _finding(last_snap)
    return run


# --- many runs ------------------------------------------------------------------

def _median(vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    m = statistics.median(vals)
    return int(m) if all(isinstance(v, int) for v in vals) else m


def _spread(vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    return {"min": min(vals), "median": _median(vals), "max": max(vals)}


def summarize(variant, runs):
    """The variant's entry of the document from its runs."""
    entry = variant.to_json()
    if variant.skip_reason:
        entry.update(preload_effective=None, preload_verdict=None,
                     excluded_reason=variant.skip_reason, runs=[], peak={}, settled={},
                     gap={}, spread={}, finding=None, wall_s=None, throughput=None,
                     exit_status=None, allocator_kind=None)
        return entry
    entry["allocator_kind"] = next((r["allocator_kind"] for r in runs if r["allocator_kind"]), None)
    effs = [r["preload_effective"] for r in runs]
    entry["preload_effective"] = effs[0] if len(set(effs)) == 1 else False
    entry["preload_verdict"] = runs[0]["preload_verdict"]
    reasons = [r["excluded_reason"] for r in runs if r["excluded_reason"]]
    entry["excluded_reason"] = reasons[0] if reasons else None
    entry["peak"] = {k: _median([r["peak"][k] for r in runs]) for k in KEYS}
    entry["settled"] = {k: _median([r["settled"][k] for r in runs]) for k in KEYS}
    entry["gap"] = {k: (entry["peak"][k] - entry["settled"][k])
                    if entry["peak"][k] is not None and entry["settled"][k] is not None else None
                    for k in ("rss", "rss_anon", "resident", "allocated")}
    entry["spread"] = {}
    for where in ("peak", "settled"):
        for k in ("rss", "rss_anon", "resident", "allocated"):
            entry["spread"][f"{where}.{k}"] = _spread([r[where][k] for r in runs])
    entry["spread"]["wall_s"] = _spread([r["wall_s"] for r in runs])
    tps = [r["throughput"]["value"] for r in runs if r.get("throughput")]
    entry["throughput"] = None
    if tps:
        t = next(r["throughput"] for r in runs if r.get("throughput"))
        entry["throughput"] = {"value": _median(tps), "unit": t["unit"], **(
            {"min": min(tps), "max": max(tps)} if len(tps) > 1 else {})}
    entry["wall_s"] = _median([r["wall_s"] for r in runs])
    entry["finding"] = runs[-1]["finding"]
    entry["settled_from"] = runs[-1]["settled_from"]
    entry["exit_status"] = runs[-1]["exit_status"]
    entry["runs"] = runs
    return entry


def rank(entries, key="rss", noise_pct=5.0):
    """Groups of variants in ascending order of settled KEY.  A variant joins
    the previous group when their settled ranges (min..max over repeats,
    widened by NOISE_PCT) overlap: within noise, not ranked apart."""
    ok = [e for e in entries if not e["excluded_reason"] and e["settled"].get(key) is not None]
    ok.sort(key=lambda e: e["settled"][key])
    groups = []
    anchor_hi = None
    for e in ok:
        sp = e["spread"].get(f"settled.{key}") or {"min": e["settled"][key],
                                                     "max": e["settled"][key]}
        # Compared with the group's first (smallest) member, not the previous
        # one, so a chain of small steps does not make one big group.
        if groups and sp["min"] <= anchor_hi * (1 + noise_pct / 100.0):
            groups[-1]["names"].append(e["name"])
            groups[-1]["within_noise"] = True
        else:
            groups.append({"rank": len(groups) + 1, "names": [e["name"]], "within_noise": False})
            anchor_hi = sp["max"]
    return groups


def compare(variants, settings, progress=None):
    """Run every variant SETTINGS.repeat times (round-robin); the document.

    SIGTERM/SIGHUP are turned into KeyboardInterrupt for the duration, so
    the running variant's processes and cgroup are cleaned up on the way out."""
    old = {}
    if threading.current_thread() is threading.main_thread():
        def interrupt(*_):
            raise KeyboardInterrupt
        for sig in (signal.SIGTERM, signal.SIGHUP):
            old[sig] = signal.signal(sig, interrupt)
    try:
        return _compare(variants, settings, progress)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _compare(variants, settings, progress=None):
    conf = confounds()
    runs = {v.name: [] for v in variants}
    for r in range(settings.repeat):
        for i, v in enumerate(variants):
            if v.skip_reason:
                continue
            if progress:
                progress(f"{v.name}: run {r + 1}/{settings.repeat}")
            runs[v.name].append(run_variant(v, settings, index=f"{r}-{i}", progress=progress))
    entries = [summarize(v, runs[v.name]) for v in variants]
    for e in entries:
        e["rank"] = None
    groups = rank(entries, settings.rank_by, settings.noise_pct)
    for g in groups:
        for e in entries:
            if e["name"] in g["names"]:
                e["rank"] = g["rank"]
                e["within_noise_of"] = [n for n in g["names"] if n != e["name"]]
    return {
        "schema_version": 1,
        "kind": "compare",
        "taken_at": time.time(),
        "command": list(settings.command),
        "settings": settings.to_json(),
        "confounds": conf,
        "confounds_after": {"loadavg_1m": confounds()["loadavg_1m"]},
        "ranking": {"by": f"settled.{settings.rank_by}", "noise_pct": settings.noise_pct,
                    "groups": groups},
        "variants": entries,
    }


# --- text ---------------------------------------------------------------------------

def _mib(v):
    return "-" if v is None else f"{v / MiB:.1f}"


def render_text(doc, out=sys.stdout):
    s = doc["settings"]
    c = doc["confounds"]
    w = out.write
    w(f"allocdiag compare: {shlex.join(doc['command'])}\n")
    phases = f"warm-up {s['warmup_s']:g} s, "
    phases += (f"load {s['load']!r} for {s['load_s']:g} s, " if s["load"] else "run, ")
    phases += f"idle {s['idle_s']:g} s; sampled every {s['interval_s']:g} s; {s['repeat']} run(s)"
    w(f"  {phases}\n")
    gov = c["governor"] or "not readable"
    swap = "none" if not c["swap_total"] else f"{_mib(c['swap_total'])} MiB"
    w(f"  confounds: THP {c['thp_enabled']} (defrag {c['thp_defrag']}), swap {swap}, "
      f"{c['cpus']} CPUs ({c['cpus_allowed']} allowed), governor {gov}, "
      f"load average {c['loadavg_1m']} -> {doc['confounds_after']['loadavg_1m']}, "
      f"kernel {c['kernel']}\n")
    w("  MiB; peak = maximum over the run, settled = end of the idle phase; "
      "alloc/res/ret = the allocator's allocated/resident/retained\n\n")
    cols = ("rank", "variant", "preload", "peak RSS", "set. RSS", "gap", "peak anon",
            "set. anon", "LazyFree", "alloc pk", "alloc set", "res pk", "res set",
            "ret set", "wall s")
    widths = (5, 30, 8, 9, 9, 7, 10, 10, 9, 9, 10, 8, 8, 8, 7)
    w("".join(f"{h:<{n}}" if i < 3 else f"{h:>{n}}" for i, (h, n) in
              enumerate(zip(cols, widths))) + "\n")
    entries = sorted(doc["variants"], key=lambda e: (e["rank"] is None, e["rank"] or 0))
    for e in entries:
        pk, st, gap = e["peak"], e["settled"], e["gap"]
        rank = "-" if e["rank"] is None else f"{e['rank']}{'~' if e.get('within_noise_of') else ''}"
        pre = {True: "yes", False: "NO", None: "n/a"}[e["preload_effective"]]
        cells = (rank, e["name"][:29], pre, _mib(pk.get("rss")), _mib(st.get("rss")),
                 _mib(gap.get("rss")), _mib(pk.get("rss_anon")), _mib(st.get("rss_anon")),
                 _mib(st.get("lazyfree")), _mib(pk.get("allocated")), _mib(st.get("allocated")),
                 _mib(pk.get("resident")), _mib(st.get("resident")), _mib(st.get("retained")),
                 "-" if e.get("wall_s") is None else f"{e['wall_s']:.1f}")
        w("".join(f"{x:<{n}}" if i < 3 else f"{x:>{n}}" for i, (x, n) in
                  enumerate(zip(cells, widths))) + "\n")
    w("\n")
    for e in entries:
        bits = []
        if e["excluded_reason"]:
            bits.append(f"EXCLUDED: {e['excluded_reason']}")
        if e.get("within_noise_of"):
            bits.append(f"within noise ({doc['ranking']['noise_pct']:g}%) of "
                        f"{', '.join(e['within_noise_of'])}: not ranked apart")
        if e.get("throughput"):
            t = e["throughput"]
            bits.append(f"throughput {t['value']:g} {t['unit']}")
        if e.get("finding"):
            f = e["finding"]
            eff = f.get("expected_effect_bytes")
            bits.append(f"finding: {f['title']}" + (f" (~{_mib(eff)} MiB)" if eff else ""))
        if len(e.get("runs") or ()) > 1:
            sp = e["spread"].get("settled.rss")
            if sp:
                bits.append(f"settled RSS min/median/max {_mib(sp['min'])}/{_mib(sp['median'])}/"
                            f"{_mib(sp['max'])}")
        st = e.get("exit_status")
        if st and not (e["runs"] and e["runs"][-1]["stopped_by_allocdiag"]) and st["code"]:
            bits.append(f"exit status {st['code']}")
        if bits:
            w(f"  {e['name']}: " + "; ".join(bits) + "\n")


# --- presets -------------------------------------------------------------------------

def examples_dir():
    """examples/ of the source checkout (see diag.demo)."""
    from diag import demo
    return os.path.dirname(os.path.abspath(demo._examples().__file__))


def _fields(text):
    out = {}
    for tok in text.split():
        k, eq, v = tok.partition("=")
        if eq:
            out[k] = v
    return out


def extract_preset(doc, preset):
    """Add each run's workload-reported figures (``workload``) to DOC:
    footprint: its READY line (build_s, peak_rss, rss after the drop, ...);
    staircase: RSS and live bytes at each idle phase (the steps)."""
    for e in doc["variants"]:
        for r in e.get("runs") or ():
            lines = r.get("output") or []
            if preset == "footprint":
                ready = [t for t in lines if t.startswith("READY ")]
                r["workload"] = ({k: _num(v) for k, v in _fields(ready[-1]).items()}
                                 if ready else None)
            elif preset == "staircase":
                steps = [_fields(t) for t in lines if t.startswith("PHASE idle ")]
                r["workload"] = {"steps": [{k: _num(v) for k, v in s.items()} for s in steps]}
        if e.get("runs"):
            e["workload"] = e["runs"][-1].get("workload")


def _num(v):
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v


def dumps(doc):
    return json.dumps(doc, indent=2)
