"""``allocdiag demo``: the field's classic situations, live, on this machine.

Starts a set of the workloads in ``examples/`` under the allocators that are
installed, waits until each reached the state it reproduces, then opens the
TUI's host view on them (or, with ``--no-tui``, prints ``explain`` for
each, and for the scenes that show an allocation wall a short ``wall``
window).  Every child is stopped on the way out -- normal exit, Ctrl-C, or a
crash of the TUI -- and each child also dies with its parent
(PR_SET_PDEATHSIG), so nothing is left behind.
"""

import contextlib
import os
import signal
import sys
from typing import NamedTuple

from diag.model.errors import Unsupported
from diag.model.exitcodes import ExitCode

WALL_WINDOW_S = 2.0     # the --no-tui wall window of a wall scene


class Scene(NamedTuple):
    workload: str
    allocator: str
    args: tuple
    what: str               # what it shows, and where to look
    env: tuple = ()         # ((K, V), ...) on top of the workload's defaults
    variant: str = ""       # tells two scenes of one workload and allocator apart
    wall: bool = False      # busy in its allocator: --no-tui prints a wall window

    @property
    def key(self):
        """``workload:allocator[:variant]``, what --only matches a prefix of."""
        return ":".join(p for p in (self.workload, self.allocator, self.variant) if p)


SCENES = (
    Scene("lying_rss", "jemalloc", (), "LazyFree inflating RSS (jemalloc muzzy decay)"),
    Scene("glibc_held", "glibc", (), "glibc holding freed memory that malloc_trim(0) returns"),
    Scene("arena_sprawl", "glibc", ("--live", "600"), "one glibc arena per thread"),
    Scene("staircase", "jemalloc", (), "a fragmentation staircase under load then idle"),
    Scene("preload_mistakes", "glibc", ("typo",), "an LD_PRELOAD with a typo, not in effect"),
    Scene("burst_idle", "tcmalloc", (),
          "tcmalloc's page heap keeping a freed burst (TCMALLOC_RELEASE_RATE=0)"),
    Scene("burst_idle", "mimalloc", (),
          "mimalloc keeping a freed burst committed (decommit delay, idle process)"),
    # The allocation wall (docs/wall.md): busy scenes, CPU bounded by --duty
    # (busy the first PCT ms of every 100 ms, threads in phase): about 0.7 (also
    # at 70%: the lock serialises them) and 0.3 of a CPU measured on 2 CPUs.
    # arena_sprawl's lock wait in threads (the finding's threshold: 0.1),
    # measured with a test suite running beside it: at 50% 0.05-0.27, at 70%
    # 0.31-0.6 with two busy threads -- and 0.087 once, in a pristine chroot's
    # suite.  Three busy threads (--threads 6), 2026-11-28: 0.5-0.6 alone,
    # 1.0-1.3 with two CPU burners beside it (two busy threads: 0.16, 0.001).
    Scene("arena_sprawl", "glibc", ("--threads", "6", "--busy", "--duty", "70"),
          "threads queueing on one glibc arena lock (MALLOC_ARENA_MAX=1, 3 busy threads): "
          "open it, Time tab: lock wait in __lll_lock_wait_private, call site replace_one, "
          "finding 'waiting for glibc arena locks' with knob arena_max",
          env=(("MALLOC_ARENA_MAX", "1"),), variant="busy", wall=True),
    Scene("alloc_wall", "glibc", ("--mode", "perrequest", "--seconds", "0.5", "--then",
                                  "busy", "--duty", "30"),
          "a request handler allocating per request (PYTHONMALLOC=malloc): open it, Time "
          "tab: allocator CPU share by function (malloc, free, _int_malloc), call sites",
          env=(("PYTHONMALLOC", "malloc"),), wall=True),
)


def _examples():
    """examples.launch from the source checkout: next to this package when
    run from the tree, else the current directory (the installed package
    does not carry examples/), else $ALLOCDIAG_EXAMPLES' parent."""
    roots = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.getcwd()]
    if os.environ.get("ALLOCDIAG_EXAMPLES"):
        roots.insert(0, os.path.dirname(os.path.abspath(os.environ["ALLOCDIAG_EXAMPLES"])))
    for root in roots:
        if os.path.isfile(os.path.join(root, "examples", "launch.py")):
            if root not in sys.path:
                sys.path.insert(0, root)
            from examples import launch
            return launch
    raise Unsupported("allocdiag demo needs the examples/ directory of a source checkout: run it "
                      "from the repository (sh tools/bootstrap.sh run demo) or set "
                      "ALLOCDIAG_EXAMPLES=/path/to/examples")


def available(only=None):
    launch = _examples()
    installed = set(launch.installed_allocators())
    return [s for s in SCENES if s.allocator in installed and (
        not only or any(s.key == o or s.key.startswith(o + ":") for o in only))]


@contextlib.contextmanager
def running(scenes, timeout=90, progress=None):
    """Start SCENES; yield [(pid, scene)]; stop them all."""
    launch = _examples()
    procs = []
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}

    def stop_all(*_):
        raise KeyboardInterrupt

    for s in old:
        signal.signal(s, stop_all)
    try:
        for scene in scenes:
            if progress:
                progress(f"starting {scene.workload} under {scene.allocator}: {scene.what}")
            p = launch.start(scene.workload, scene.allocator, env=dict(scene.env),
                             args=scene.args)
            procs.append((p, scene))
        ready = []
        for p, scene in procs:
            launch.wait_ready(p, timeout)
            ready.append((p.pid, scene))
            if progress:
                progress(f"  ready: {scene.workload} (pid {p.pid})")
        yield ready
    finally:
        for p, *_ in procs:
            with contextlib.suppress(Exception):
                launch.stop(p)
        for s, h in old.items():
            signal.signal(s, h)


def run(only=None, host_view=None, out=sys.stdout):
    """Start the scenes; HOST_VIEW(pids) shows them (the TUI's host view, given
    by the command), or without it each is explained as text on OUT."""
    scenes = available(only)
    if not scenes:
        print("no demo workload can run here (no allocator installed?)", file=sys.stderr)
        return ExitCode.UNSUPPORTED
    with running(scenes, progress=lambda m: print(m, file=sys.stderr)) as ready:
        if host_view is not None:
            return host_view([pid for pid, *_ in ready])
        from diag import snapshot
        from diag.render_text import print_explain
        for pid, scene in ready:
            env = "".join(f" {k}={v}" for k, v in scene.env)
            print(f"=== {scene.workload} under {scene.allocator}{env}: {scene.what}", file=out)
            snap, _ = snapshot.take(pid)
            print_explain(snap, out=out)
            if scene.wall:
                print_wall(pid, out=out)
            print(file=out)
    return ExitCode.OK


def print_wall(pid, seconds=WALL_WINDOW_S, out=sys.stdout):
    """A short ``allocdiag wall`` window of PID, compact; progress on a terminal;
    a window that cannot be sampled says why (the rest of the demo goes on)."""
    from diag.model.errors import AllocdiagError
    from diag import render_wall, wall_take
    tty = sys.stderr.isatty()

    def tick(elapsed):
        if tty:
            sys.stderr.write(f"\rsampling the allocation wall of pid {pid}: "
                             f"{elapsed:3.1f}/{seconds:g} s")
            sys.stderr.flush()

    print(f"--- allocation wall over {seconds:g} s (allocdiag wall {pid})", file=out)
    try:
        w = wall_take.take(pid, duration_s=seconds, tick=tick)
    except AllocdiagError as exc:
        remedy = getattr(exc, "remediation", None)
        print(f"  not sampled: {exc}" + (f" ({remedy})" if remedy else ""), file=out)
        return None
    finally:
        if tty:
            sys.stderr.write("\r" + " " * 70 + "\r")
            sys.stderr.flush()
    render_wall.text(w, out=out, compact=True)
    return w
