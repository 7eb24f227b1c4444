"""``allocdiag serve``: the terminal UI in a browser, through textual-serve.

textual-serve runs one allocdiag process per browser connection (the same
command a terminal would run: ``allocdiag top``, ``watch PID``, ``replay
FILE``, ``demo``) and relays its screen over a websocket.  Bound to loopback
by default: the UI shows every process's memory and can call into them.
"""

import argparse
import ipaddress
import os
import shlex
import sys

from diag.model.errors import MissingExtra, NoSuchProcess
from diag.commands.common import UsageError, add_command
from diag.model.exitcodes import ExitCode

NAME = "serve"

INSTALL_HINT = "pip install 'allocdiag[serve]'"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# The views a browser can be given, and how many arguments each takes.
MODES = {"top": 0, "watch": 1, "replay": 1, "demo": 0}


def add_parser(sub):
    p = add_command(
        sub, NAME, help="serve the terminal UI (top, watch PID, replay FILE, demo) in a browser",
        description="Serve allocdiag's terminal UI as a web page with textual-serve: each "
                    "browser that opens the page gets its own allocdiag process running VIEW "
                    "(default top, the host view; or watch PID, replay FILE, demo), with the "
                    "same keys as in a terminal.  Listens on 127.0.0.1 only unless --host says "
                    "otherwise: the UI shows every readable process and its release/set actions "
                    "call into processes with allocdiag's rights, so expose it only behind "
                    "something that authenticates (an SSH tunnel: ssh -L 8000:127.0.0.1:8000 "
                    "HOST).  Ctrl-C stops the server and every view it started.\n\n"
                    f"Needs textual-serve: {INSTALL_HINT}.",
        examples=["allocdiag serve                         # http://127.0.0.1:8000/, host view",
                  "allocdiag serve --port 8080 replay incident.jsonl.gz",
                  "allocdiag serve watch 1234",
                  "allocdiag serve --host 0.0.0.0 --public-url http://box.example:8000 top"])
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}, loopback only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"TCP port (default {DEFAULT_PORT})")
    p.add_argument("--public-url", metavar="URL",
                   help="the URL browsers reach the server at, when it is not http://HOST:PORT "
                        "(the page connects its websocket there)")
    p.add_argument("view", nargs=argparse.REMAINDER, metavar="VIEW",
                   help="top (default) | watch PID | replay FILE | demo, with its options")
    return p


def _server_class():
    try:
        from textual_serve.server import Server
    except ImportError:
        raise MissingExtra("allocdiag serve", "textual-serve", "serve") from None
    return Server


def view_argv(view):
    """The allocdiag arguments of VIEW (checked), e.g. ["replay", "x.jsonl"]."""
    view = list(view)
    if view[:1] == ["--"]:
        view = view[1:]
    if not view:
        return ["top"]
    mode = view[0]
    if mode not in MODES:
        raise UsageError(f"cannot serve {mode!r}: the views are {', '.join(MODES)}")
    if len(view) < 1 + MODES[mode]:
        raise UsageError(f"serve {mode} needs {'a PID' if mode == 'watch' else 'a FILE'}")
    # The view's own options, by the parser a terminal's `allocdiag VIEW`
    # uses (an unknown one exits 2 with that view's usage): here, once,
    # rather than in every browser that connects.
    from diag.cli import build_parser, parse
    parse(build_parser(), view)
    if mode == "replay":
        # Fail here, once, rather than in every browser that connects.
        from diag.recording import read_recording
        read_recording(view[1])
    elif mode == "watch":
        pid = view[1]
        if not pid.isdigit() or not os.path.exists(f"/proc/{pid}"):
            raise NoSuchProcess(pid)
    return view


def _loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def command(view, proc="/proc"):
    """The shell command textual-serve runs per connection."""
    argv = [sys.executable, "-m", "diag"]
    if proc != "/proc":
        argv += ["--proc", proc]
    return shlex.join(argv + view)


def run(args):
    Server = _server_class()
    view = view_argv(args.view)
    if not 0 < args.port < 65536:
        raise UsageError(f"not a TCP port: {args.port}")
    if not _loopback(args.host):
        print(f"allocdiag serve: listening on {args.host}, not loopback: anyone who reaches "
              "this port sees the host's processes and can release memory in them",
              file=sys.stderr)
    server = Server(command(view, args.proc), host=args.host, port=args.port,
                    title="allocdiag " + " ".join(view), public_url=args.public_url)
    server.serve()
    return ExitCode.OK
