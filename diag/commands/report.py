"""``allocdiag report``: a recording (or a compare document) as one
self-contained HTML page."""

import sys

from diag.commands.common import add_command
from diag.model.exitcodes import ExitCode

NAME = "report"


def add_parser(sub):
    p = add_command(
        sub, NAME, help="turn a recording (or a compare --json document) into one HTML page",
        description="Read a recording made by `allocdiag record` (JSON Lines, .gz allowed) and "
                    "write one self-contained HTML page -- no script, no network request, charts "
                    "as inline SVG -- to attach to an incident: the stack over time (RSS, anon, "
                    "LazyFree, cgroup working set; allocated, active, resident, mapped), peak vs "
                    "settled per field (peak = the largest sample, settled = the median of the "
                    "last 20% of the samples), the findings with their knobs and evidence, the "
                    "process and allocator identity with the preload verdict, and the "
                    "before/after of every release in the recording (`record --release-at S`, "
                    "`release --record FILE`).\n\n"
                    "Given a document saved with `allocdiag compare --json > FILE`, it draws "
                    "per-variant RSS, anon, LazyFree and allocator resident over time and peak "
                    "vs settled bars instead (the same page `compare --html OUT` writes).\n\n"
                    "Needs matplotlib: pip install 'allocdiag[report]'.",
        examples=["allocdiag record 1234 -o incident.jsonl.gz --duration 300 --release-at 240 --yes",
                  "allocdiag report incident.jsonl.gz -o incident.html",
                  "allocdiag compare --json --preset footprint > cmp.json && "
                  "allocdiag report cmp.json -o cmp.html"])
    p.add_argument("file", metavar="FILE",
                   help="a recording (allocdiag record) or a compare --json document")
    p.add_argument("-o", "--output", required=True, metavar="OUT.html",
                   help="where to write the page (replaced atomically)")
    return p


def run(args):
    from diag import report
    from diag.commands.common import UsageError
    try:
        kind = report.render_file(args.file, args.output)
    except OSError as exc:
        # a path that cannot be read or written: the user's to fix, not a bug
        name = str(exc.filename or args.file)
        if name.startswith(args.output):
            name = args.output      # not the temporary name it is written under
        raise UsageError(f"{name}: {exc.strerror or exc}") from None
    print(f"wrote the {kind} report of {args.file} to {args.output}", file=sys.stderr)
    return ExitCode.OK
