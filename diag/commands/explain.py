"""``allocdiag explain``: where the RSS goes, and what to do about it."""

from diag.commands.common import add_command, dump_json, pid_arg, take
from diag.model.exitcodes import ExitCode

NAME = "explain"


def add_parser(sub):
    p = add_command(
        sub, NAME, help="where the RSS goes, and what to do about it",
        description="A plain-language account of one process: where its RSS goes (allocator-held "
                    "live, fragmentation and free pages, LazyFree, other anonymous memory, files), "
                    "the findings in order of bytes at stake with the knob, its current value and "
                    "where that came from, and what an RSS panel and a cgroup working-set panel "
                    "would show and why they differ.",
        examples=["allocdiag explain 1234", "allocdiag explain --json 1234"])
    p.add_argument("pid", type=pid_arg)
    p.add_argument("--json", action="store_true",
                   help="print the snapshot document (with findings) and its breakdown: "
                        "the layers of the text, each with its provenance (and raw figure "
                        "when adjusted)")
    p.add_argument("--no-attach", action="store_true", help="read /proc only (fewer findings)")
    return p


def run(args):
    from diag import render_text     # imported by the command that prints, not at start-up
    snap, col = take(args, attach=not args.no_attach)
    if args.json:
        from diag import breakdown
        dump_json({**snap.to_json(), "breakdown": breakdown.to_json(snap)})
    else:
        render_text.print_explain(snap)
    if col.unsupported is not None:
        return ExitCode.UNSUPPORTED     # no allocator stats for this heap (a Go program)
    return ExitCode.PARTIAL if col.partial else ExitCode.OK
