"""allocdiag's terminal UI.

Entry points for the CLI:

- ``run_host(no_attach=False)``: every process on the host; Enter opens one.
- ``run_watch(pid, interval=2.0, no_attach=False)``: one live process.
- ``run_replay(path)``: a recording made with ``diag.recording``.

Each returns the process exit code (0).  ``run_watch`` takes one sample
before the UI starts, so a missing or unreadable process raises
NoSuchProcess / AccessDenied to the caller (exit codes 3 / 4) instead of
opening an empty screen; ``run_replay`` raises MalformedData likewise.

The app never reads /proc or ptrace itself: it asks a source
(``diag.source``).  ``python -m tui.app host|watch PID|replay FILE`` runs it
without the CLI.
"""

import argparse
import sys

from textual.app import App
from textual.binding import Binding

from tui.dialogs import HelpScreen, binding_help
from tui.host_screen import HostScreen
from tui.messages import DEFAULT_INTERVAL
from tui.process_screen import ProcessScreen
from diag.source import HostSource, ProcessSource, ReplaySource


class AllocdiagApp(App):
    """Host view or process view over injected sources."""

    CSS_PATH = "allocdiag.tcss"
    TITLE = "allocdiag"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
    ]

    def __init__(self, host_source=None, process_source=None, process_source_factory=None,
                 interval=DEFAULT_INTERVAL, host_interval=5.0):
        super().__init__()
        if host_source is None and process_source is None:
            raise ValueError("AllocdiagApp needs a host_source or a process_source")
        self.host_source = host_source
        self.process_source = process_source
        self.process_source_factory = process_source_factory
        self.interval = interval
        self.host_interval = host_interval

    def on_mount(self):
        if self.process_source is not None:
            self.push_screen(ProcessScreen(self.process_source, self.interval,
                                           can_go_back=False))
        else:
            self.push_screen(HostScreen(self.host_source, self.host_interval,
                                        open_process=self.open_process))

    def open_process(self, pid):
        """Open the process view of PID over the host view."""
        if self.process_source_factory is None:
            self.notify("no process source configured", severity="error", markup=False)
            return
        try:
            source = self.process_source_factory(pid)
        except Exception as exc:   # e.g. the factory checks the pid
            self.notify(str(exc), title=f"cannot open {pid}", severity="error", markup=False)
            return
        self.push_screen(ProcessScreen(source, self.interval, can_go_back=True))

    def action_help(self):
        if isinstance(self.screen, HelpScreen):
            return
        self.push_screen(HelpScreen(binding_help(self.screen, self)))


def run_host(no_attach=False, pids=None, host_interval=None, live_options=None,
             before_ui=None):
    """The host view.  Unless NO_ATTACH, its "allocator resident" and "top
    finding" columns are filled in the background by diag.hostlive, within a
    pause budget ("allocator not read: REASON" where it cannot borrow).
    BEFORE_UI (here and in run_watch/run_replay): called once the input is
    checked, just before the UI starts (the CLI's terminal check)."""
    import contextlib
    if before_ui is not None:
        before_ui()
    from diag.hostlive import HostLive
    live_cm = contextlib.nullcontext() if no_attach else HostLive(**(live_options or {}))
    kw = {} if host_interval is None else {"host_interval": host_interval}
    with live_cm as live:
        app = AllocdiagApp(host_source=HostSource(pids=pids, live=live),
                           process_source_factory=lambda pid: ProcessSource(pid, no_attach), **kw)
        app.run()
    return app.return_code or 0


class _Primed:
    """A source whose first sample was already taken (before the UI started)."""

    def __init__(self, source, first):
        self._source, self._first = source, first

    def __getattr__(self, name):
        return getattr(self._source, name)

    def backlog(self):
        first, self._first = self._first, None
        return [first] if first is not None else []


def run_watch(pid, interval=DEFAULT_INTERVAL, no_attach=False, before_ui=None):
    source = ProcessSource(pid, no_attach=no_attach)
    first = source.sample()          # NoSuchProcess / AccessDenied reach the CLI
    if before_ui is not None:
        before_ui()
    app = AllocdiagApp(process_source=_Primed(source, first), interval=interval)
    app.run()
    return app.return_code or 0


def run_replay(path, before_ui=None):
    source = ReplaySource(path)      # MalformedData reaches the CLI
    if before_ui is not None:
        before_ui()
    app = AllocdiagApp(process_source=source)
    app.run()
    return app.return_code or 0


def main(argv=None):
    from diag.model.errors import AllocdiagError
    p = argparse.ArgumentParser(prog="python -m tui.app", description="allocdiag TUI")
    sub = p.add_subparsers(dest="mode")
    sub.add_parser("host")
    w = sub.add_parser("watch")
    w.add_argument("pid", type=int)
    w.add_argument("--interval", type=float, default=DEFAULT_INTERVAL)
    w.add_argument("--no-attach", action="store_true")
    r = sub.add_parser("replay")
    r.add_argument("path")
    args = p.parse_args(argv)
    try:
        if args.mode == "watch":
            return run_watch(args.pid, args.interval, args.no_attach)
        if args.mode == "replay":
            return run_replay(args.path)
        return run_host()
    except AllocdiagError as exc:
        print(f"allocdiag: {exc}", file=sys.stderr)
        if exc.remediation:
            print(exc.remediation, file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
