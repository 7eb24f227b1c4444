"""``allocdiag inspect``: one snapshot of a process (or of a saved file)."""

from diag.commands.common import UsageError, add_command, dump_json, pid_arg, print_error, take
from diag.model.exitcodes import ExitCode

NAME = "inspect"


def add_parser(sub):
    p = add_command(
        sub, NAME, help="one process: allocator, preload, kernel and cgroup memory",
        description="Describe one process: the allocator serving malloc and the others loaded "
                    "(with the evidence), the LD_PRELOAD verdict, the kernel's memory view "
                    "(RSS split, LazyFree, THP, swap), its memory cgroup (usage, working set, "
                    "limit), and the allocator's own numbers (allocated, active, resident, "
                    "mapped, ...), read by calling its stats functions on one idle thread of the "
                    "target for a few milliseconds (no other thread is stopped; --no-attach "
                    "avoids even that).  --json prints the document described in DESIGN.md.",
        examples=["allocdiag inspect 1234", "allocdiag inspect --json 1234 > snap.json",
                  "allocdiag inspect --no-attach 1234", "allocdiag inspect --from malloc_info.xml"])
    p.add_argument("pid", type=pid_arg, nargs="?")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--no-attach", action="store_true",
                   help="read /proc and the ELF files only; never stop a thread of the target "
                        "(allocator stats are then unknown)")
    p.add_argument("--arenas", action="store_true",
                   help="more detail, longer stop: per-arena rows (jemalloc; glibc arenas are "
                        "always read) and gperftools' cumulative page-heap counters")
    p.add_argument("--native", action="store_true",
                   help="also print the allocator's own numbers under their own names, each in "
                        "its unit (pages as pages and bytes), as the TUI's Allocator tab does")
    p.add_argument("--from", dest="from_file", metavar="FILE",
                   help="read a saved malloc_info XML, jemalloc malloc_stats_print JSON "
                        "(opts 'J'), gperftools MallocExtension_GetStats text or mimalloc "
                        "stats text instead of a live process")
    return p


def run(args):
    from diag import render_text     # imported by the command that prints, not at start-up
    if args.from_file:
        from diag import filemode
        snap = filemode.snapshot_from_file(args.from_file)
        if args.json:
            dump_json(snap.to_json())
        else:
            render_text.print_inspect(snap, native=args.native)
        return ExitCode.OK
    if args.pid is None:
        raise UsageError("inspect needs a PID (or --from FILE)")
    snap, col = take(args, attach=not args.no_attach)
    if args.json:
        dump_json(snap.to_json())
    else:
        render_text.print_inspect(snap, native=args.native)
    if col.partial:
        if col.first_denied is not None:
            print_error(col.first_denied)
        elif col.unsupported is not None:
            # The live part cannot be done for this allocator (a Go heap):
            # the document is printed, the exit code says so.
            print_error(col.unsupported)
            return ExitCode.UNSUPPORTED
        return ExitCode.PARTIAL
    return ExitCode.OK
