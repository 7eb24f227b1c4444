"""Text of an allocation wall (diag.model.wall.Wall) for ``allocdiag wall``.

Labels come from diag.fields (WALL_BY_NAME); a figure that was not measured
prints as "-" with its reason in the "missing" section, never as 0.
"""

import sys

from diag import render
from diag.fields import WALL_BY_NAME
from diag.model.wall import SYSCALLS

TOP_FUNCTIONS = 8
TOP_SITES = 10
TOP_COUNTERS = 24
TOP_LEVELS = 8          # levels (gauges) shown after the counts that moved
COMPACT_TOP = 4         # compact=True (allocdiag demo): rows of each list


def _pct(x):
    return "-" if x is None else f"{100.0 * x:.1f}%"


def _num(x, nd=1):
    return "-" if x is None else f"{x:,.{nd}f}"


def _label(name):
    f = WALL_BY_NAME.get(name)
    return f.label if f is not None else name


def counters_shown(w, n):
    """The counters worth a row: the counts that moved, fastest first (at
    most N), then the levels that are not 0 -> 0, the changed ones first
    (the rest of N, at least TOP_LEVELS: gperftools has levels only).
    jemalloc alone has 26 mutex maxima, all 0 in a process without
    contention: listed first, they used to fill every row and hide the
    counts that moved."""
    if not n:
        return []
    moved = sorted((c for c in w.counters.values() if c.kind != "gauge" and c.delta),
                   key=lambda c: -(c.per_s or 0))
    levels = sorted((c for c in w.counters.values() if c.kind == "gauge" and (c.start or c.end)),
                    key=lambda c: (c.start == c.end, c.name))
    moved = moved[:n]
    return moved + levels[:max(TOP_LEVELS, n - len(moved))]


def counters_left_out(w, shown):
    """The line under a counter table that does not show every counter
    (SHOWN: counters_shown's answer), or None."""
    left = len(w.counters) - len(shown)
    if left <= 0:
        return None
    return (f"{left} more not shown: counts that did not move, levels at 0, or past the "
            f"first rows; --json has every one")


def text(w, out=None, compact=False):
    """COMPACT: the first COMPACT_TOP rows of each list and no counters (the
    demo's short window); the full text is ``allocdiag wall``'s."""
    out = out or sys.stdout
    top_functions, top_sites, top_counters = ((COMPACT_TOP, COMPACT_TOP, 0) if compact
                                              else (TOP_FUNCTIONS, TOP_SITES, TOP_COUNTERS))
    win = w.window
    p = lambda *a: print(*a, file=out)    # noqa: E731
    ended = {"interrupted": " (ended early: Ctrl-C)",
             "exited": " (ended early: the process exited)"}.get(win.ended, "")
    p(f"pid {win.pid} ({win.comm or '?'}), allocator {win.allocator or 'not detected'}: "
      f"{win.duration_s:.1f} s at {win.hz} Hz{ended}, {win.samples} CPU samples, "
      f"{win.threads_seen} threads, {win.lost} records lost")
    cpu = w.cpu
    p("")
    p("CPU")
    if cpu is None or not cpu.samples:
        p("  no CPU samples (the process did not run, or sampling was refused)")
    else:
        render.kv([(_label("cpu.allocator_share"), f"{_pct(cpu.allocator_share)}  "
                    f"({_num(cpu.allocator_s, 2)} CPU s of {_num(cpu.seconds, 2)})"),
                   (_label("cpu.application_share"), _pct(cpu.application_share)),
                   (_label("cpu.unknown_share"), f"{_pct(cpu.unknown_share)}  (stack walk "
                    "stopped early: neither allocator nor application)"),
                   (_label("cpu.unwound_share"), _pct(cpu.unwound_share)),
                   (_label("cpu.kernel_share"), _pct(cpu.kernel_share))], out=out)
        if cpu.by_function:
            p("  allocator time by function:")
            render.table([[f"    {f.function}", _pct(f.share), str(f.samples)]
                          for f in cpu.by_function[:top_functions]],
                         ["", "of CPU", "samples"], right={1, 2}, out=out)
    off = w.off_cpu
    p("")
    p("Off CPU (switch-out to switch-in; includes the run-queue wait after a wake-up)")
    if off is None:
        p("  not measured (see missing)")
    else:
        render.kv([(_label("off_cpu.allocator_lock_s"),
                    f"{_num(off.allocator_lock_s, 3)} s = {_pct(off.allocator_lock_share)} of "
                    f"thread time ({off.allocator_lock_switches} waits)"),
                   (_label("off_cpu.blocked_s"), f"{_num(off.blocked_s, 3)} s "
                    f"({off.blocked_switches} switch-outs)"),
                   (_label("off_cpu.preempted_s"), f"{_num(off.preempted_s, 3)} s "
                    f"({off.preempted_switches} switch-outs)")], out=out)
        for f in off.by_function[:top_functions]:
            p(f"    waiting in {f.function}: {_num(f.seconds, 3)} s")
    p("")
    p("Faults and syscalls (per second; share from the allocator by calling stack)")
    rows = []
    if w.faults is not None:
        rows.append(["minor faults", _num(w.faults.minor_per_s), ""])
        rows.append(["major faults", _num(w.faults.major_per_s), ""])
    for name in SYSCALLS:
        s = w.syscalls.get(name)
        if s is None:
            continue
        share = s.from_allocator_share
        rows.append([name, _num(s.per_s), "-" if share is None else
                     f"{_pct(share)} of {s.sampled - s.unknown} sampled"])
    render.table(rows, ["", "per s", "from allocator"], right={1}, out=out)
    if w.sites:
        p("")
        p("Call sites (first frame outside the allocator)")
        render.table([[s.function, _num(s.allocator_cpu_s, 3), _num(s.lock_wait_s, 3),
                       s.entry or "", " < ".join(s.frames[1:4])]
                      for s in w.sites[:top_sites]],
                     ["site", "alloc CPU s", "lock wait s", "entry", "called from"],
                     right={1, 2}, out=out)
    shown = counters_shown(w, top_counters)
    if shown:
        p("")
        p("Allocator counters over the window (delta, per s; levels: start -> end)")
        rows = []
        for c in shown:
            if c.kind == "gauge":
                rows.append([c.name, f"{c.start} -> {c.end}", "", c.unit])
            else:
                rows.append([c.name, f"{c.delta:,}", _num(c.per_s), c.unit])
        render.table(rows, ["counter", "delta", "per s", "unit"], right={1, 2}, out=out)
        left_out = counters_left_out(w, shown)
        if left_out:
            p(f"  ({left_out})")
    if w.findings:
        p("")
        p("Findings")
        for f in w.findings:
            p(f"  [{f.severity}] {f.title}")
            if f.knob is not None:
                p(f"    knob {f.knob.name}: {f.knob.current} ({f.knob.source}) -> "
                  f"{f.knob.suggested}: {f.knob.how}")
    if win.missing:
        p("")
        p("Missing")
        for m in win.missing:
            p(f"  {m.figure}: {m.reason}" + (f"\n    fix: {m.fix}" if m.fix else ""))
