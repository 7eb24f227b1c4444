"""``allocdiag wall``: the allocation wall of a live process over a window."""

import sys

from diag.commands.common import add_command, bounded, dump_json, pid_arg
from diag.model.exitcodes import ExitCode

NAME = "wall"


_duration = bounded(float, 0.2, 3600, "number of seconds", "must be between 0.2 and 3600 seconds")
_hz = bounded(int, 1, 10000, "sampling rate", "must be between 1 and 10000")


def add_parser(sub):
    p = add_command(
        sub, NAME, help="how much CPU and waiting goes into the allocator, from which call sites",
        description="Sample PID for a window with perf_event_open (no thread stopped for "
                    "sampling, no preload, no BPF): the share of on-CPU time inside the "
                    "allocator and in which of its functions, time blocked on allocator locks, "
                    "page faults and mmap/munmap/madvise/brk/mprotect calls per second split "
                    "'from the allocator' vs 'from elsewhere' by the calling stack, the "
                    "allocator's own counters over the same window (read at both ends with a "
                    "stop of one idle thread of a few ms), the call sites that drive it, and "
                    "findings with the knob a test confirmed.  Needs root or CAP_PERFMON "
                    "(syscall counts: root, tracefs mounted).  Ctrl-C ends the window early and "
                    "still prints.  See docs/wall.md.",
        examples=["allocdiag wall 1234", "allocdiag wall --duration 5 --json 1234 > wall.json",
                  "allocdiag wall --collapsed wall.folded 1234 && flamegraph.pl wall.folded "
                  "> wall.svg"])
    p.add_argument("pid", type=pid_arg)
    p.add_argument("--duration", type=_duration, default=10.0, metavar="S",
                   help="seconds to sample (default 10)")
    p.add_argument("--hz", type=_hz, default=None, metavar="N",
                   help="CPU samples per second of each thread's CPU time (default 99)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--collapsed", metavar="FILE",
                   help="also write folded stacks (CPU samples) for flamegraph.pl, speedscope "
                        "or inferno to FILE")
    p.add_argument("--no-counters", action="store_true",
                   help="do not read the allocator's counters (no thread is stopped at all)")
    return p


def run(args):
    from collectors.sampler.session import DEFAULT_HZ
    from diag import render_wall, wall_take
    hz = args.hz or DEFAULT_HZ
    tty = sys.stderr.isatty() and not args.json

    def tick(elapsed):
        if tty:
            done = int(20 * min(1.0, elapsed / args.duration))
            sys.stderr.write(f"\rsampling pid {args.pid} [{'#' * done}{'.' * (20 - done)}] "
                             f"{elapsed:4.1f}/{args.duration:g} s (Ctrl-C: stop and print)")
            sys.stderr.flush()

    w = wall_take.take(args.pid, duration_s=args.duration, hz=hz, procfs=args.proc,
                       tick=tick, counters=not args.no_counters)
    if tty:
        sys.stderr.write("\r" + " " * 78 + "\r")
    if args.collapsed:
        with open(args.collapsed, "w") as f:
            for line in w.collapsed("cpu"):
                f.write(line + "\n")
    if args.json:
        dump_json(w.to_json())
    else:
        render_wall.text(w)
    measured = [x for x in (w.cpu, w.off_cpu) if x is not None]
    return ExitCode.PARTIAL if w.window.missing and measured else ExitCode.OK
