"""``allocdiag replay``: open a recording in the process view."""

from diag.commands.common import add_command, need_terminal

NAME = "replay"
# without a terminal
INSTEAD = ("`allocdiag report FILE -o OUT.html` (one HTML page), "
           "`allocdiag serve replay FILE` (in a browser)")


def add_parser(sub):
    p = add_command(
        sub, NAME, help="open a recording in the process view, with time navigation",
        description="Open a recording made by `allocdiag record` (or the TUI's w key) in the "
                    "process view; left/right step through samples, Home/End jump.",
        examples=["allocdiag replay incident.jsonl.gz"])
    p.add_argument("file")
    return p


def run(args):
    from tui import app
    return app.run_replay(args.file,
                          before_ui=lambda: need_terminal(NAME, INSTEAD))
