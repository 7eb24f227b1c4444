"""``allocdiag set``: change a runtime knob of the allocator (old -> new)."""

import sys

from diag.commands.common import UsageError, add_command, confirm, dump_json, pid_arg
from diag.model.exitcodes import ExitCode

NAME = "set"


def add_parser(sub):
    p = add_command(
        sub, NAME, help="change a runtime knob of the allocator (shows old and new value)",
        description="Change an allocator knob that the allocator lets a running program change: "
                    "jemalloc dirty_decay_ms, muzzy_decay_ms (every arena and the default for new "
                    "ones), background_thread; glibc mallopt parameters (arena_max, trim_threshold, "
                    "top_pad, mmap_threshold, mmap_max, arena_test); gperftools "
                    "max_total_thread_cache_bytes; mimalloc options (mi_option_set).  Asks first "
                    "unless --yes.",
        examples=["allocdiag set 1234 dirty_decay_ms=1000",
                  "allocdiag set --yes 1234 background_thread=true"])
    p.add_argument("pid", type=pid_arg)
    p.add_argument("assignment", metavar="KNOB=VALUE")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    return p


def run(args):
    from diag import actions
    name, sep, value = args.assignment.partition("=")
    if not sep or not name:
        raise UsageError(f"expected KNOB=VALUE, got {args.assignment!r}")
    if not confirm(f"set {name}={value} in pid {args.pid}?", args):
        print("nothing done", file=sys.stderr)
        return ExitCode.OK
    r = actions.set_knob(args.pid, name, value)
    if args.json:
        dump_json({"pid": args.pid, **r})
    else:
        print(f"pid {args.pid} ({r['allocator']}): {name} "
              f"{r['old'] if r['old'] is not None else '?'} -> {r['new']}")
        print(f"  via {r['detail']}")
    return ExitCode.OK
