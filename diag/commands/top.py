"""``allocdiag top`` (also plain ``allocdiag``): the host view."""

from diag.commands.common import add_command, need_terminal

NAME = "top"
# without a terminal
INSTEAD = ("`allocdiag ps` (the same table once), "
           "`allocdiag serve top` (in a browser)")


def add_parser(sub):
    p = add_command(
        sub, NAME, help="the host view (terminal UI); also what plain `allocdiag` runs",
        description="A live table of every readable process: allocator, preload verdict, RSS, "
                    "anonymous RSS, LazyFree and the top finding; sortable, filterable with /; "
                    "Enter opens the process view.  Nothing is stopped for the table; the process "
                    "view borrows one idle thread of its target per sample (--no-attach: never).",
        keys="? help, q quit")
    p.add_argument("--no-attach", action="store_true", help="never stop a thread of any target")
    return p


def run(args):
    from tui import app
    return app.run_host(no_attach=args.no_attach,
                        before_ui=lambda: need_terminal(NAME, INSTEAD))
