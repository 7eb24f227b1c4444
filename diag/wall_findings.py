"""Findings of an allocation wall (issue 20 item 5): pure functions of a
diag.model.wall.Wall and the target's allocator variables.  Each rule with a knob
has a test that starts a target showing it, applies the knob and sees the
named figure move the promised way (tests/test_wall_findings.py); a rule
without such a test is not here.

- ``wall-arena-lock`` (glibc): threads blocked on arena locks (on average
  >= LOCK_THREADS threads waiting at any moment of the window: a share of all
  thread time would be diluted by idle threads) while the process has fewer
  arenas than threads -> MALLOC_ARENA_MAX / glibc.malloc.arena_max at least the thread
  count.  Checked: glibc MALLOC_ARENA_MAX=1 vs 8, 4 threads.
- ``wall-arena-lock`` (jemalloc): the same under jemalloc -> narenas at
  least the thread count (or percpu_arena:percpu).  Checked: narenas:1 vs
  narenas:8.
- ``wall-mmap-churn`` (glibc): mmap+munmap from the allocator >= CHURN_PER_S
  with a fixed MALLOC_MMAP_THRESHOLD_ -> a threshold above the churned block
  size (glibc.malloc.mmap_threshold).  Checked: 256 KiB blocks, threshold
  128 KiB vs 1 MiB.
- ``wall-madvise-churn`` (jemalloc): madvise from the allocator >=
  CHURN_PER_S with a short dirty_decay_ms -> a longer one.  Checked:
  dirty_decay_ms:0 vs 10000.
- ``wall-hot-sites``: allocator CPU >= HOT_SHARE of the process, with the
  top call sites holding most of it -> names them (no knob: the fix is in
  the code: reuse, pool, fewer temporaries).
"""

from collectors.allocators.registry import for_kind
from diag.model import Finding, Knob

LOCK_THREADS = 0.1              # allocator_lock_s / window duration
CHURN_PER_S = 500.0
HOT_SHARE = 0.20
HOT_TOP = 3
GLIBC_DEFAULT_ARENAS = "8 x cores (NARENAS_FROM_NCORES)"


def _counter(wall, name, end=True):
    c = wall.counters.get(name)
    return None if c is None else (c.end if end else c.delta)


def _threads(wall):
    return _counter(wall, "process.threads") or wall.window.threads_seen or None


def rules(wall, env=None):
    """The findings of WALL; ENV: the target's allocator variables."""
    env = env or {}
    # the rules of this allocator (its vocabulary: collectors/allocators/<name>/home.py)
    own = for_kind(wall.window.allocator).vocabulary.findings
    out = []
    off = wall.off_cpu
    threads = _threads(wall)
    duration = wall.window.duration_s or 0.0
    if off is not None and duration and off.allocator_lock_s / duration >= LOCK_THREADS:
        ev = {"allocator_lock_share": round(off.allocator_lock_share, 4),
              "allocator_lock_s": round(off.allocator_lock_s, 3), "threads": threads}
        top = [s.function for s in sorted(wall.sites, key=lambda s: -s.lock_wait_s)
               if s.lock_wait_s > 0][:HOT_TOP]
        if top:
            ev["sites"] = top
        want = str(max(threads or 0, 2))
        lock = next((ARENA_LOCK[r] for r in own if r in ARENA_LOCK), None)
        f = lock(wall, env, off, ev, threads, want) if lock is not None else None
        if f is not None:
            out.append(f)
    sc = wall.syscalls
    if "wall-mmap-churn" in own and env.get("MALLOC_MMAP_THRESHOLD_") is not None:
        rate = _from_allocator_rate(sc, ("mmap", "munmap"))
        if rate is not None and rate >= CHURN_PER_S:
            cur = env["MALLOC_MMAP_THRESHOLD_"]
            out.append(Finding(
                "wall-mmap-churn", "warning",
                f"the allocator maps and unmaps {rate:,.0f} blocks a second "
                f"(fixed mmap threshold {cur})",
                {"mmap_munmap_per_s": round(rate, 1), "faults_per_s": _faults(wall)},
                Knob("mmap_threshold", cur, "environment", "33554432",
                     "MALLOC_MMAP_THRESHOLD_=33554432 (above the churned block size; or unset "
                     "it: glibc's dynamic threshold then follows freed blocks) at start-up"),
                None, "high"))
    if "wall-madvise-churn" in own:
        rate = _from_allocator_rate(sc, ("madvise",))
        if rate is not None and rate >= CHURN_PER_S:
            out.append(Finding(
                "wall-madvise-churn", "warning",
                f"jemalloc purges with {rate:,.0f} madvise calls a second",
                {"madvise_per_s": round(rate, 1), "faults_per_s": _faults(wall),
                 "dirty_purged_per_s": _per_s(wall, "jemalloc.arenas.dirty_purged")},
                Knob("dirty_decay_ms", _conf(env, "dirty_decay_ms"), "MALLOC_CONF", "10000",
                     "MALLOC_CONF=dirty_decay_ms:10000 at start-up, or live: allocdiag set PID "
                     "dirty_decay_ms 10000"),
                None, "medium"))
    cpu = wall.cpu
    if cpu is not None and (cpu.allocator_share or 0) >= HOT_SHARE and wall.sites:
        total = sum(s.allocator_cpu_s for s in wall.sites) or 0.0
        top = sorted(wall.sites, key=lambda s: -s.allocator_cpu_s)[:HOT_TOP]
        top_s = sum(s.allocator_cpu_s for s in top)
        if total and top_s / total >= 0.5:
            names = [s.function for s in top]
            out.append(Finding(
                "wall-hot-sites", "info",
                f"{cpu.allocator_share:.0%} of CPU is in the allocator, "
                f"{top_s / total:.0%} of it from {', '.join(names)}",
                {"allocator_share": round(cpu.allocator_share, 4), "sites": names,
                 "sites_share": round(top_s / total, 4)},
                None, None, "medium"))
    return tuple(out)


def _glibc_arena_lock(wall, env, off, ev, threads, want):
    arenas = _counter(wall, "glibc.arenas")
    ev["arenas"] = arenas
    current = env.get("MALLOC_ARENA_MAX") or _tunable(env, "glibc.malloc.arena_max")
    if current is not None or (arenas is not None and threads and arenas < threads):
        return Finding(
            "wall-arena-lock", "warning",
            f"threads spend {off.allocator_lock_share:.0%} of their time waiting for "
            "glibc arena locks", ev,
            Knob("arena_max", current or GLIBC_DEFAULT_ARENAS,
                 "environment" if current else "compiled default", want,
                 f"MALLOC_ARENA_MAX={want} or GLIBC_TUNABLES=glibc.malloc.arena_max="
                 f"{want} at start-up (one arena per allocating thread)"),
            None, "high")
    return None


def _jemalloc_arena_lock(wall, env, off, ev, threads, want):
    ev["narenas"] = _counter(wall, "jemalloc.narenas")
    return Finding(
        "wall-arena-lock", "warning",
        f"threads spend {off.allocator_lock_share:.0%} of their time waiting for "
        "jemalloc arena locks", ev,
        Knob("narenas", str(ev["narenas"]) if ev["narenas"] is not None else None,
             "mallctl arenas.narenas", want,
             f"MALLOC_CONF=narenas:{want} (or percpu_arena:percpu) at start-up"),
        None, "high")


# wall-arena-lock, by the allocator's rule id
ARENA_LOCK = {"wall-arena-lock/glibc": _glibc_arena_lock,
              "wall-arena-lock/jemalloc": _jemalloc_arena_lock}


def _from_allocator_rate(sc, names):
    total = 0.0
    for n in names:
        s = sc.get(n)
        if s is None or s.per_s is None:
            return None
        share = s.from_allocator_share
        total += s.per_s * (share if share is not None else 0.0)
    return total


def _faults(wall):
    f = wall.faults
    return None if f is None or f.minor_per_s is None else round(f.minor_per_s, 1)


def _per_s(wall, name):
    c = wall.counters.get(name)
    return None if c is None or c.per_s is None else round(c.per_s, 1)


def _tunable(env, name):
    for part in (env.get("GLIBC_TUNABLES") or "").replace(":", ",").split(","):
        k, _, v = part.partition("=")
        if k == name:
            return v
    return None


def _conf(env, name):
    for part in (env.get("MALLOC_CONF") or "").split(","):
        k, _, v = part.partition(":")
        if k == name:
            return v
    return None
