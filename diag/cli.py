"""allocdiag command line: the global options and the dispatcher.

Each command lives in its own module under ``diag.commands`` (parser and
``run``); its human text comes from ``diag.render_text``.  Errors are
``diag.model.errors.AllocdiagError`` subclasses, printed and mapped to
``diag.model.exitcodes.ExitCode`` here, once.
"""

import argparse
import gc
import os
import sys

from collectors import lazylog
from collectors.binary import diskcache
from diag.model.errors import AccessDenied, AllocdiagError, BadPath
from diag import __version__, commands
from diag.commands.common import EXIT_CODES_HELP, print_error
from diag.model.exitcodes import ExitCode
from diag.terminal import HelpFormatter


# argparse passes each of its own messages ("usage: ", "options", "show
# this help message and exit") through gettext, and gettext looks for a
# "messages" catalogue on every call: it imports locale and stats a file per
# language, 2.5 ms of each run (issue 23).  Python ships no such catalogue
# and allocdiag's own text is English: argparse's stays as written (its
# own fallback when gettext is missing).
argparse._ = str                                    # type: ignore[attr-defined]
argparse.ngettext = lambda one, many, n: one if n == 1 else many   # type: ignore[attr-defined]


def _add_global_options(p):
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log what allocdiag decides on stderr, one line each: which "
                        "allocator serves malloc, which thread was borrowed and how long "
                        "it stopped, a reader's fallback")
    p.add_argument("--debug", action="store_true",
                   help="log everything, with each logger's name, and show tracebacks of "
                        "internal errors")
    p.add_argument("--log-file", metavar="FILE",
                   help="write the -v/--debug lines to FILE instead of stderr (use it with "
                        "the TUI, whose screen is stderr)")
    p.add_argument("--no-cache", action="store_true",
                   help="do not read or write the detection cache ($XDG_CACHE_HOME/allocdiag, "
                        "default ~/.cache/allocdiag): parse every ELF file as on a first run "
                        "(same as ALLOCDIAG_NO_CACHE=1)")
    p.add_argument("--proc", default="/proc", metavar="DIR",
                   help="procfs root to read (default /proc; a captured tree for offline use)")


def build_parser(command=None):
    """The whole command line; with COMMAND (a word of ``commands.MODULES``)
    only that command's sub-parser: importing and building all seventeen
    costs a CLI run ~25 ms (issue 23), and a run uses one."""
    p = argparse.ArgumentParser(
        prog="allocdiag",
        description="Which allocator serves malloc in a running Linux process, what it holds, "
                    "and how that reconciles with the kernel's RSS, LazyFree and cgroup numbers.",
        epilog=EXIT_CODES_HELP + "\nRun 'allocdiag COMMAND --help' for each command's options.",
        formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=f"allocdiag {__version__}")
    _add_global_options(p)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for mod in commands.load() if command is None else [commands.module(command)]:
        mod.add_parser(sub)
    p.set_defaults(command_parsers=sub.choices)
    return p


def command_word(argv):
    """The command ARGV names, when its first word after the global options
    is one; else None (no command: ``top``; a top-level --help or --version;
    a typo, which the whole parser reports with the list of commands)."""
    pre = argparse.ArgumentParser(add_help=False, exit_on_error=False,
                                  formatter_class=HelpFormatter)
    _add_global_options(pre)
    try:
        _known, rest = pre.parse_known_args(argv)
    except argparse.ArgumentError:  # a global option's value missing: the whole parser says so
        return None
    for word in rest:
        if word in ("-h", "--help", "--version"):
            return None
        if not word.startswith("-"):
            return word if word in commands.MODULES else None
    return None


def parse(parser, argv):
    """The arguments; an unknown one is reported by its command's parser,
    with that command's usage line (argparse's own parse_args reports it
    with the top-level usage, which does not show the command's options).
    No command is ``top``: what the global options left over goes to it,
    into the same namespace (``allocdiag -v --no-attach`` is ``allocdiag -v
    top --no-attach``; argparse sets only the defaults a namespace lacks)."""
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        args, extra = parser.parse_known_args(["top"] + extra, namespace=args)
    if extra:
        command = args.command_parsers.get(args.command, parser)
        # a command with actions of its own (heap show, heap dump ...)
        actions = getattr(args, "action_parsers", None)
        if actions:
            command = actions.get(getattr(args, args.action_dest, None), command)
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


# The cyclic collector's first threshold for a CLI run.  A command starts by
# importing ~100 modules: ~50,000 objects, almost none of them garbage, which
# the collector at its default (700) traversed in ~70 passes before the first
# snapshot was printed: 20 ms of a 270 ms `inspect` on the slow guest (issue
# 23).  At 100,000 a short command runs without a pass, and a long one still
# collects every 100,000 new objects, which bounds what cycles can hold.
GC_THRESHOLD0 = 100_000


def main(argv=None):
    """Run one command; its exit code.  The collector's threshold is the
    CLI's while it runs and the caller's again after (tests and `compare`
    call main() in a process that goes on)."""
    threshold = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD0, *threshold[1:])
    try:
        return _run(list(argv if argv is not None else sys.argv[1:]))
    finally:
        gc.set_threshold(*threshold)


def _run(argv):
    parser = build_parser(command_word(argv))
    args = parse(parser, argv)
    try:
        setup_logging(args)
        if args.no_cache:
            # the environment, so that commands starting allocdiag children
            # (serve, compare, demo) pass it on
            os.environ[diskcache.ENV_DISABLE] = "1"
            diskcache.configure(False)
        log.debug("allocdiag %s: %s", __version__, " ".join(sys.argv[1:] if argv is None else argv))
        return int(commands.module(args.command).run(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        # `allocdiag ps | head`: not an error.
        sys.stderr.close()
        return ExitCode.OK
    except AllocdiagError as exc:
        print_error(exc)
        return int(exc.exit_code)
    except OSError as exc:
        # A path the user named (recording, output file, directory) that a
        # command opened without translating: say which, not "internal error".
        # Errors about /proc are the collectors' to translate; those stay bugs.
        if exc.filename is None or str(exc.filename).startswith("/proc/") or args.debug:
            if args.debug:
                raise
            return _internal_error()
        err = AccessDenied(None, msg=f"{exc.filename}: {exc.strerror}", remediation=None) \
            if isinstance(exc, PermissionError) else BadPath.from_oserror(exc)
        print_error(err)
        return int(err.exit_code)
    except Exception:
        if args.debug:
            raise
        return _internal_error()


def entry():
    """The ``allocdiag`` program (the console script and ``python -m
    diag``): main(), then the objects it made are frozen out of the cyclic
    collector.  The interpreter's finalisation collects every tracked object
    once more whether the collector is on or not: 45-70 ms of a 260 ms
    `inspect` on the slow guest, 10 ms with them frozen, for a process that
    is ending anyway (atexit handlers still run; the standard streams are
    still flushed).  Not in main(), which tests and `compare` call in a
    process that goes on."""
    rc = main()
    gc.freeze()
    return rc


log = lazylog.getLogger("diag")


def setup_logging(args):
    """-v (or --log-file alone): INFO lines; --debug: every line with its
    logger's name; --log-file FILE: to FILE, not stderr (diag.logsetup).
    Without any of them nothing is logged, not even warnings: what a user
    must see the commands print themselves.  Then, unless the ``logging``
    module is already there (a test, an earlier main() that logged), it is
    not imported at all: collectors.lazylog drops the lines."""
    if not (args.debug or args.verbose or args.log_file) and "logging" not in sys.modules:
        return
    from diag import logsetup
    logsetup.configure(args)


def _internal_error():
    import traceback
    print("allocdiag: internal error (re-run with --debug for the traceback):", file=sys.stderr)
    print("  " + traceback.format_exc().strip().splitlines()[-1], file=sys.stderr)
    return ExitCode.INTERNAL
