"""``allocdiag demo``: the example situations, live."""

import sys

from diag.commands.common import add_command, terminal_missing
from diag.model.exitcodes import ExitCode

NAME = "demo"


def add_parser(sub):
    p = add_command(
        sub, NAME, help="run the classic allocator situations from examples/ and look at them",
        description="Start a set of the example workloads (LazyFree-inflated RSS under jemalloc, "
                    "glibc holding freed memory, arena sprawl, a fragmentation staircase, a "
                    "preload typo, tcmalloc's page heap and mimalloc's committed segments "
                    "keeping a freed burst, and two allocation walls: threads queueing on one "
                    "glibc arena lock, a request handler allocating per request) under the "
                    "installed allocators, then open the terminal UI on them (select a wall "
                    "scene, Enter, then the Time tab: 6); with --no-tui (or without a "
                    "terminal) print `explain` for each and, for the wall scenes, a 2 s "
                    "`wall` window.  Every "
                    "workload is stopped when the demo ends.  Needs about 1.3 GiB of memory.",
        examples=["allocdiag demo", "allocdiag demo --no-tui --only glibc_held",
                  "allocdiag demo --no-tui --only arena_sprawl:glibc:busy --only alloc_wall"])
    p.add_argument("--no-tui", action="store_true", help="print explain for each instead (and a 2 s wall window for the "
                        "wall scenes)")
    p.add_argument("--only", action="append", metavar="WORKLOAD",
                   help="run only this workload, or WORKLOAD:ALLOCATOR[:VARIANT] for one "
                        "scene (repeatable); see --list")
    p.add_argument("--list", action="store_true", help="list the scenes (WORKLOAD:ALLOCATOR[:VARIANT]) and exit")
    return p


def run(args):
    from diag import demo
    if args.list:
        for s in demo.SCENES:
            print(f"{s.key:24} {s.what}")
        return ExitCode.OK
    no_tui = args.no_tui
    missing = [] if no_tui else terminal_missing()
    if missing:
        # a script or a CI job running the demo: its text, not a UI that
        # would wait for keys on a pipe
        print(f"allocdiag demo: {' and '.join(missing)} not a terminal: the scenes' text "
              f"reports follow (as with --no-tui)", file=sys.stderr)
        no_tui = True
    return demo.run(only=args.only, host_view=None if no_tui else host_view)


def host_view(pids, host_interval=2.0):
    """The TUI's host view on PIDS, its "allocator resident" and "top finding"
    columns filled in the background by diag.hostlive (bounded rate, pause
    budget; "allocator not read: REASON" for a process it cannot borrow)."""
    from tui.app import run_host
    return run_host(pids=pids, host_interval=host_interval,
                    live_options={"min_gap_s": 0.5, "refresh_s": 20.0}) or ExitCode.OK
