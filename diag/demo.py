"""``allocdiag demo``: the field's classic situations, live, on this machine.

Starts a set of the workloads in ``examples/`` under the allocators that are
installed, waits until each reached the state it reproduces, then opens the
TUI's host view on them (or, with ``--no-tui``, prints ``explain`` for
each).  Every child is stopped on the way out -- normal exit, Ctrl-C, or a
crash of the TUI -- and each child also dies with its parent
(PR_SET_PDEATHSIG), so nothing is left behind.
"""

import contextlib
import os
import signal
import sys

from collectors.errors import Unsupported
from diag.exitcodes import ExitCode

# (workload, allocator, args, what it shows)
SCENES = (
    ("lying_rss", "jemalloc", (), "LazyFree inflating RSS (jemalloc muzzy decay)"),
    ("glibc_held", "glibc", (), "glibc holding freed memory that malloc_trim(0) returns"),
    ("arena_sprawl", "glibc", ("--live", "600"), "one glibc arena per thread"),
    ("staircase", "jemalloc", (), "a fragmentation staircase under load then idle"),
    ("preload_mistakes", "glibc", ("typo",), "an LD_PRELOAD with a typo, not in effect"),
    ("burst_idle", "tcmalloc", (),
     "tcmalloc's page heap keeping a freed burst (TCMALLOC_RELEASE_RATE=0)"),
    ("burst_idle", "mimalloc", (),
     "mimalloc keeping a freed burst committed (decommit delay, idle process)"),
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
    out = []
    for name, alloc, args, what in SCENES:
        if only and name not in only and f"{name}:{alloc}" not in only:
            continue
        if alloc not in installed:
            continue
        out.append((name, alloc, args, what))
    return out


@contextlib.contextmanager
def running(scenes, timeout=90, progress=None):
    """Start SCENES; yield [(pid, name, allocator, what)]; stop them all."""
    launch = _examples()
    procs = []
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}

    def stop_all(*_):
        raise KeyboardInterrupt

    for s in old:
        signal.signal(s, stop_all)
    try:
        for name, alloc, args, what in scenes:
            if progress:
                progress(f"starting {name} under {alloc}: {what}")
            p = launch.start(name, alloc, args=args)
            procs.append((p, name, alloc, what))
        ready = []
        for p, name, alloc, what in procs:
            launch.wait_ready(p, timeout)
            ready.append((p.pid, name, alloc, what))
            if progress:
                progress(f"  ready: {name} (pid {p.pid})")
        yield ready
    finally:
        for p, *_ in procs:
            with contextlib.suppress(Exception):
                launch.stop(p)
        for s, h in old.items():
            signal.signal(s, h)


def run_host_view(pids, host_interval=2.0):
    """The TUI's host view on PIDS, its "allocator resident" and "top finding"
    columns filled in the background by diag.hostlive (bounded rate, pause
    budget; "allocator not read: REASON" for a process it cannot borrow)."""
    from tui.app import run_host
    return run_host(pids=pids, host_interval=host_interval,
                    live_options={"min_gap_s": 0.5, "refresh_s": 20.0}) or ExitCode.OK


def run(only=None, tui=True, out=sys.stdout):
    scenes = available(only)
    if not scenes:
        print("no demo workload can run here (no allocator installed?)", file=sys.stderr)
        return ExitCode.UNSUPPORTED
    with running(scenes, progress=lambda m: print(m, file=sys.stderr)) as ready:
        if tui:
            return run_host_view([pid for pid, *_ in ready])
        from diag import snapshot
        from diag.render_text import print_explain
        for pid, name, alloc, what in ready:
            print(f"=== {name} under {alloc}: {what}", file=out)
            snap, _ = snapshot.take(pid)
            print_explain(snap, out=out)
            print(file=out)
    return ExitCode.OK
