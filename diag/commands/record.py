"""``allocdiag record``: snapshots of a process to JSON Lines."""

import contextlib
import os
import signal
import sys
import threading
import time

from diag import render
from diag.commands.common import add_command, pid_arg, sample_interval
from diag.model.exitcodes import ExitCode

NAME = "record"


def add_parser(sub):
    p = add_command(
        sub, NAME, help="record snapshots of PID to a JSON Lines file (gzip with .gz)",
        description="Write one snapshot per line -- the same document as `inspect --json` -- every "
                    "INTERVAL seconds until DURATION passes, the process exits, or Ctrl-C.  A "
                    "recording is how an incident is shared: `allocdiag replay FILE` opens it in "
                    "the process view; `allocdiag report FILE -o OUT.html` makes one HTML page of it.  "
                    "After the first snapshot only what can change is read again (the "
                    "process's mappings are compared, not re-parsed): a few milliseconds of "
                    "CPU per snapshot, more for a large heap (bench/record_cost.py).",
        examples=["allocdiag record 1234 -o incident.jsonl.gz --duration 600",
                  "allocdiag record 1234 -o rel.jsonl --duration 20 --release-at 10 --yes",
                  "allocdiag record 1234 -o wall.jsonl.gz --duration 60 --wall",
                  "allocdiag report incident.jsonl.gz -o incident.html"])
    p.add_argument("pid", type=pid_arg)
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="the recording (gzip when it ends in .gz); an existing FILE is "
                        "replaced when the first snapshot is written, and left as it was "
                        "when that fails")
    p.add_argument("--interval", type=sample_interval, default=2.0, metavar="S",
                   help="seconds between samples (default 2, at least 0.2)")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="stop after S seconds (default: until the process exits or Ctrl-C)")
    p.add_argument("--no-attach", action="store_true", help="read /proc only; never stop a thread")
    p.add_argument("--release-at", type=float, default=None, metavar="S",
                   help="S seconds into the recording, call the allocator's release function "
                        "(as `allocdiag release`) and write its before/after as an event line "
                        "(`allocdiag report` shows it); asks first unless --yes")
    p.add_argument("--wall", action="store_true",
                   help="between two snapshots, sample the allocation wall (as `allocdiag wall`: "
                        "perf_event_open, no thread stopped for it) and write each window as a "
                        "wall line; `replay` shows it in the Time tab, `report` draws it")
    p.add_argument("--yes", "-y", action="store_true",
                   help="with --release-at: do not ask for confirmation")
    return p


def _release_events(args):
    """The ``events`` argument of diag.recording.record for --release-at."""
    if args.release_at is None:
        return ()
    from diag.model.errors import AllocdiagError, Unsupported
    from diag import actions, recording
    from diag.commands.common import UsageError, confirm
    if args.no_attach:
        raise UsageError("--release-at calls into the process: not with --no-attach")
    if args.release_at < 0 or (args.duration is not None and args.release_at >= args.duration):
        raise UsageError("--release-at must be between 0 and --duration")
    kind, call = actions.describe_release(args.pid)
    if call is None:
        raise Unsupported(f"{kind}: allocdiag knows no release call for this allocator",
                          pid=args.pid)
    if not confirm(f"call {call} in pid {args.pid} ({kind}) {args.release_at:g} s into "
                   "the recording?", args):
        raise UsageError("not confirmed: nothing recorded")

    def release(pid):
        try:
            doc = recording.release_event(actions.release(pid))
            print(f"\nreleased: {doc['call']} {recording.returned_words(doc['return'])}",
                  file=sys.stderr)
        except AllocdiagError as exc:
            # The recording goes on; the report shows the failed attempt.
            doc = {"pid": pid, "call": call, "error": str(exc)}
            print(f"\nrelease failed: {exc}", file=sys.stderr)
        return "release", doc
    return ((args.release_at, release),)


# Signals that end a recording cleanly: Ctrl-C, `kill`, a closed terminal or ssh session.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _stop_on_signals(event):
    """While recording: the first of STOP_SIGNALS sets EVENT (the sample being
    taken is finished and written, then the recording ends); a second one
    raises KeyboardInterrupt (the file is still closed with whole lines)."""
    got = []

    def handler(signum, _frame):
        got.append(signal.Signals(signum).name)
        if event.is_set():
            raise KeyboardInterrupt
        event.set()
    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _wall_sampler(args):
    """The ``wall`` argument of diag.recording.record for --wall."""
    if not args.wall:
        return None
    from diag.commands.common import UsageError
    from diag import wallsample
    if args.no_attach:
        raise UsageError("--wall reads the allocator's counters with two short stops per "
                         "window: not with --no-attach")
    return lambda pid, seconds, stop: wallsample.sample(pid, seconds, stop=stop)


def run(args):
    from diag import recording
    events = _release_events(args)
    wall = _wall_sampler(args)
    tty = sys.stderr.isatty()
    t0 = time.monotonic()
    written = 0             # what the recording holds, also after a signal

    def progress(count, snap):
        nonlocal written
        written = count
        msg = (f"{count} snapshots, {time.monotonic() - t0:.0f} s, "
               f"RSS {render.human_bytes(snap.process.rss)} -> {args.output}")
        try:
            if tty:
                print("\r" + msg, end="", file=sys.stderr, flush=True)
            elif count == 1 or count % 30 == 0:
                print(msg, file=sys.stderr)
        except OSError:
            _terminal_gone()    # SIGHUP: recording goes on to a clean end

    interrupt = threading.Event()
    with _stop_on_signals(interrupt) as got:
        try:
            written = recording.record(args.pid, args.output, interval=args.interval,
                                       duration=args.duration, progress_cb=progress,
                                       no_attach=args.no_attach, events=events,
                                       interrupt=interrupt, wall=wall)
        except recording.RecordInterrupted as exc:
            written = exc.count     # the recorder closed the file; this is what it holds
    how = f" (stopped by {got[0]})" if got else ""
    try:
        print(("\n" if tty else "") +
              f"recorded {written} snapshots of pid {args.pid} to {args.output}{how}",
              file=sys.stderr, flush=True)
    except OSError:
        _terminal_gone()    # a closed session: the file is complete
    return ExitCode.OK


def _terminal_gone():
    """stderr's terminal is closed: what the failed write left in its buffer
    would fail again at exit, where Python turns it into exit status 120.
    Later messages go nowhere instead."""
    sys.stderr = open(os.devnull, "w")
