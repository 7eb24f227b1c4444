"""``allocdiag release``: make the allocator give free memory back now,
with before/after figures so the gain is measured."""

import sys

from diag.model.errors import Unsupported
from diag.commands.common import add_command, confirm, dump_json, pid_arg
from diag.model.exitcodes import ExitCode

NAME = "release"


def add_parser(sub):
    p = add_command(
        sub, NAME, help="make the allocator give free memory back now; measure before/after",
        description="Call the allocator's own release function in the target -- glibc "
                    "malloc_trim(0), jemalloc arena.4096.purge, tcmalloc "
                    "MallocExtension_ReleaseFreeMemory, mimalloc mi_collect(true) -- and print RSS, "
                    "anonymous RSS, LazyFree and the allocator stack before and after, so what it "
                    "gave back is measured.  Changes the target's allocator state: asks first "
                    "unless --yes.",
        examples=["allocdiag release 1234", "allocdiag release --yes --json 1234",
                  "allocdiag release --yes --record incident.jsonl 1234"])
    p.add_argument("pid", type=pid_arg)
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--record", metavar="FILE",
                   help="also append the before/after as an event line to the recording FILE "
                        "(`allocdiag record`; `allocdiag report` shows it)")
    return p


def run(args):
    from diag import actions, render, render_text   # the command's own, not start-up's
    kind, call = actions.describe_release(args.pid)
    if call is None:
        raise Unsupported(f"{kind}: allocdiag knows no release call for this allocator", pid=args.pid)
    if not confirm(f"call {call} in pid {args.pid} ({kind})?", args):
        print("nothing done", file=sys.stderr)
        return ExitCode.OK
    r = actions.release(args.pid)
    before, after = r["before"], r["after"]
    if args.record:
        from diag import recording
        recording.append_event(args.record, "release", recording.release_event(r))
    if args.json:
        dump_json({"pid": args.pid, "call": r["call"], "return": r["return"],
                   "pause_us": r["pause_us"], "skipped_syscalls": r["skipped_syscalls"],
                   "before": before.to_json(), "after": after.to_json()})
        return ExitCode.OK
    from diag.recording import returned_words
    print(f"pid {args.pid}: {r['call']} {returned_words(r['return'])} "
          f"(thread stopped {max(r['pause_us'] or [0])} us)")
    for line in skipped_lines(r["skipped_syscalls"]):
        print(line)
    b, a = dict(render_text.stack_rows(before)), dict(render_text.stack_rows(after))
    rows = []
    for name, _ in render_text.stack_rows(before):
        if name in a:
            delta = (a[name] or 0) - (b[name] or 0)
            rows.append([name, render.human_bytes(b[name]), render.human_bytes(a[name]),
                         ("-" if delta < 0 else "+") + render.human_bytes(abs(delta))])
    render.table(rows, ["", "before", "after", "change"], right={1, 2, 3})
    return ExitCode.OK


def skipped_lines(skipped):
    """One line per kind of syscall the call was made to skip, with its count."""
    from collectors.engine import seccomp
    return [f"  skipped {n} {name} syscall{'s' if n > 1 else ''} of it (each returned ENOSYS): "
            f"{why}" for name, why, n in seccomp.tally(skipped)]
