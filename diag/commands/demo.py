"""``allocdiag demo``: the example situations, live."""

from diag.commands.common import add_command
from diag.exitcodes import ExitCode

NAME = "demo"


def add_parser(sub):
    p = add_command(
        sub, NAME, help="run the classic allocator situations from examples/ and look at them",
        description="Start a set of the example workloads (LazyFree-inflated RSS under jemalloc, "
                    "glibc holding freed memory, arena sprawl, a fragmentation staircase, a "
                    "preload typo, tcmalloc's page heap and mimalloc's committed segments "
                    "keeping a freed burst) under the installed allocators, then open the "
                    "terminal UI on them; with --no-tui print `explain` for each.  Every "
                    "workload is stopped when the demo ends.  Needs about 1.3 GiB of memory.",
        examples=["allocdiag demo", "allocdiag demo --no-tui --only glibc_held"])
    p.add_argument("--no-tui", action="store_true", help="print explain for each instead")
    p.add_argument("--only", action="append", metavar="WORKLOAD",
                   help="run only this workload, or WORKLOAD:ALLOCATOR for one scene "
                        "(repeatable); see --list")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    return p


def run(args):
    from diag import demo
    if args.list:
        for name, alloc, _, what in demo.SCENES:
            print(f"{name:18} {alloc:10} {what}")
        return ExitCode.OK
    return demo.run(only=args.only, tui=not args.no_tui)
