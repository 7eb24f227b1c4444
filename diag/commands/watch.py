"""``allocdiag watch``: the live process view."""

from diag.commands.common import add_command, pid_arg, need_terminal, sample_interval

NAME = "watch"
# without a terminal
INSTEAD = ("`allocdiag inspect PID` (one snapshot), "
           "`allocdiag record PID -o FILE` (a series), "
           "`allocdiag serve watch PID` (in a browser)")


def add_parser(sub):
    p = add_command(
        sub, NAME, help="live process view: allocator stacks, history, findings, actions",
        description="The process view of the terminal UI for PID: the allocator stack "
                    "(allocated / active / resident, mapped shown apart), the RSS split "
                    "(allocator-held / LazyFree / other anon / file / shmem), cgroup usage and "
                    "working set, a history of the layers, the allocator's own tables, findings "
                    "with their knobs, and actions (release now, set a knob, pause, interval, "
                    "record).  Each sample borrows one idle thread of the target for about a "
                    "millisecond; the default interval keeps that far below 1% of wall time.",
        examples=["allocdiag watch 1234", "allocdiag watch --interval 5 --no-attach 1234"],
        keys="? help, space pause, i interval, r release, k knob, w record, q quit")
    p.add_argument("pid", type=pid_arg)
    p.add_argument("--interval", type=sample_interval, default=2.0, metavar="S",
                   help="seconds between samples (default 2, at least 0.2)")
    p.add_argument("--no-attach", action="store_true", help="read /proc only; never stop a thread")
    return p


def run(args):
    from tui import app
    return app.run_watch(args.pid, interval=args.interval, no_attach=args.no_attach,
                         before_ui=lambda: need_terminal(NAME, INSTEAD))
