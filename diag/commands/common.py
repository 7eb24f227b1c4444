"""Helpers shared by the command modules."""

import argparse
import os
import sys

from diag.model.errors import AllocdiagError
from diag.model.exitcodes import ExitCode, HELP as EXIT_CODES_HELP
from diag.terminal import HelpFormatter

__all__ = ["EXIT_CODES_HELP", "UsageError", "pid_arg", "bounded", "sample_interval", "dump_json",
           "confirm", "add_command", "print_error", "take", "need_terminal",
           "terminal_missing"]


class UsageError(AllocdiagError):
    exit_code = ExitCode.USAGE


def pid_arg(text):
    """argparse type for a process id."""
    try:
        pid = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}") from None
    if pid <= 0:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}")
    return pid


def dump_json(doc, out=None, one_per_line=()):
    """DOC as indented JSON, except the lists under the top-level keys in
    ONE_PER_LINE: one compact item a line.  json's encoder is C only without
    indentation; indented, 500 host-scan rows took 17 ms, one a line 3."""
    import json     # here: a text run has no use for it (~1.5 ms of start-up, issue 23)
    out = out or sys.stdout
    if not one_per_line:
        json.dump(doc, out, indent=2, sort_keys=False)
        out.write("\n")
        return
    parts = []
    for key, value in doc.items():
        if key in one_per_line and isinstance(value, list) and value:
            text = "[\n" + ",\n".join("    " + json.dumps(v) for v in value) + "\n  ]"
        else:
            text = json.dumps(value, indent=2).replace("\n", "\n  ")
        parts.append(f"  {json.dumps(key)}: {text}")
    out.write("{\n" + ",\n".join(parts) + "\n}\n")


def confirm(question, args):
    """True to go ahead.  Without a terminal to ask on, --yes is required."""
    if getattr(args, "yes", False):
        return True
    if not sys.stdin.isatty():
        raise UsageError(f"{question} -- refusing without --yes (no terminal to ask on)")
    answer = input(f"{question} [y/N] ").strip().lower()
    return answer in ("y", "yes")


# serve's textual-serve runs a command with this set (its web driver talks
# over pipes): no terminal needed there.
TEXTUAL_DRIVER_ENV = "TEXTUAL_DRIVER"


def terminal_missing():
    """Which of the streams the terminal UI needs are not a terminal
    ("stdin", "stderr"): textual's Linux driver draws on stderr and reads
    keys from stdin; into a pipe it would write escape codes and wait for
    keys that never come.  None missing under serve's web driver."""
    if os.environ.get(TEXTUAL_DRIVER_ENV):
        return []
    return [name for name, stream in (("stdin", sys.__stdin__), ("stderr", sys.__stderr__))
            if stream is None or not stream.isatty()]


def need_terminal(command, instead):
    """A UsageError unless the terminal UI has a terminal to draw on.
    INSTEAD: what to run without one.  Called after the command's input is
    checked (a missing pid or file is said first)."""
    missing = terminal_missing()
    if missing:
        raise UsageError(
            f"`{command}` is a terminal UI, and {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not a terminal (redirected or piped)",
            remediation=f"run it in a terminal (ssh -t for a remote one), or without one: "
                        f"{instead}")


def add_command(sub, name, *, help, description, examples=(), keys=None):
    """A sub-parser with the house layout: description, examples, keys, exit codes."""
    epilog = ""
    if examples:
        epilog += "examples:\n" + "".join(f"  {e}\n" for e in examples) + "\n"
    if keys:
        epilog += f"keys: {keys}\n\n"
    epilog += EXIT_CODES_HELP
    return sub.add_parser(name, help=help, description=description, epilog=epilog,
                          formatter_class=HelpFormatter)


def bounded(convert, lo, hi, not_a, out_of_range):
    """An argparse type: CONVERT(text) within [LO, HI] (None: unbounded);
    "not a NOT_A: 'text'" when it does not convert, OUT_OF_RANGE when out."""
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {not_a}: {text!r}") from None
        if not ((lo is None or lo <= value) and (hi is None or value <= hi)):   # nan: out
            raise argparse.ArgumentTypeError(out_of_range)
        return value
    return parse


# argparse type for a sampling interval in seconds (at least 0.2)
sample_interval = bounded(float, 0.2, None, "number of seconds", "must be at least 0.2 seconds")


def print_error(exc, out=None):
    """An AllocdiagError as the user sees it: one line, then the remediation."""
    out = out or sys.stderr
    print(f"allocdiag: {exc}", file=out)
    if exc.remediation:
        print(exc.remediation, file=out)


def take(args, expect=None, attach=False):
    """A snapshot of args.pid read through args.proc: (Snapshot, Collection)."""
    from collectors.proc.procfs import ProcFS
    from diag import snapshot
    return snapshot.take(args.pid, procfs=ProcFS(args.proc), expect=expect, attach=attach,
                         per_arena=getattr(args, "arenas", False))
