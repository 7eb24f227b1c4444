"""``allocdiag record``: snapshots of a process to JSON Lines."""

import sys
import time

from diag import render
from diag.commands.common import add_command, pid_arg, sample_interval
from diag.exitcodes import ExitCode

NAME = "record"


def add_parser(sub):
    p = add_command(
        sub, NAME, help="record snapshots of PID to a JSON Lines file (gzip with .gz)",
        description="Write one snapshot per line -- the same document as `inspect --json` -- every "
                    "INTERVAL seconds until DURATION passes, the process exits, or Ctrl-C.  A "
                    "recording is how an incident is shared: `allocdiag replay FILE` opens it in "
                    "the process view.",
        examples=["allocdiag record 1234 -o incident.jsonl.gz --duration 600"])
    p.add_argument("pid", type=pid_arg)
    p.add_argument("-o", "--output", required=True, metavar="FILE")
    p.add_argument("--interval", type=sample_interval, default=2.0, metavar="S",
                   help="seconds between samples (default 2, at least 0.2)")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="stop after S seconds (default: until the process exits or Ctrl-C)")
    p.add_argument("--no-attach", action="store_true", help="read /proc only; never stop a thread")
    return p


def run(args):
    from diag import recording
    tty = sys.stderr.isatty()
    t0 = time.monotonic()
    written = 0             # what the recording holds, also after Ctrl-C

    def progress(count, snap):
        nonlocal written
        written = count
        msg = (f"{count} snapshots, {time.monotonic() - t0:.0f} s, "
               f"RSS {render.human_bytes(snap.process.rss)} -> {args.output}")
        if tty:
            print("\r" + msg, end="", file=sys.stderr, flush=True)
        elif count == 1 or count % 30 == 0:
            print(msg, file=sys.stderr)

    try:
        written = recording.record(args.pid, args.output, interval=args.interval,
                                   duration=args.duration, progress_cb=progress,
                                   no_attach=args.no_attach)
    except KeyboardInterrupt:
        pass                # the recorder closed the file; `written` is what it holds
    if tty:
        print(file=sys.stderr)
    print(f"recorded {written} snapshots of pid {args.pid} to {args.output}", file=sys.stderr)
    return ExitCode.OK
