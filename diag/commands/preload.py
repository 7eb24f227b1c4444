"""``allocdiag preload``: did LD_PRELOAD take effect, and if not, why."""

from diag.commands.common import add_command, dump_json, pid_arg, print_error, take
from diag.model.exitcodes import ExitCode

NAME = "preload"


def add_parser(sub):
    p = add_command(
        sub, NAME, help="did LD_PRELOAD take effect, and if not, why",
        description="Compare what was requested (LD_PRELOAD in the process's initial environment, "
                    "/etc/ld.so.preload in its root) with what is mapped and with where the "
                    "process's malloc GOT slot really points.  Nothing is stopped.  Exit status 0 "
                    "when the verdict could be made (in effect or not); see --json's 'effective' "
                    "for the answer.",
        examples=["allocdiag preload 1234", "allocdiag preload --expect jemalloc 1234"])
    p.add_argument("pid", type=pid_arg)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--expect", metavar="ALLOCATOR",
                   help="the allocator you expected (jemalloc, tcmalloc, mimalloc): when nothing "
                        "was requested, explain why")
    return p


def run(args):
    from diag import render_text     # imported by the command that prints, not at start-up
    snap, col = take(args, expect=args.expect)
    if args.json:
        dump_json({"pid": snap.pid, "comm": snap.comm, "exe": snap.exe,
                   "allocator": snap.allocator.to_json(), "preload": snap.preload.to_json()})
    else:
        render_text.print_preload(snap)
    if col.first_denied is not None and not args.json:
        print_error(col.first_denied)
    return ExitCode.PARTIAL if col.partial else ExitCode.OK
