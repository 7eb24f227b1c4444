"""One module per command (memray's layout).

Each module in ``MODULES`` defines:

- ``NAME``: the sub-command word;
- ``add_parser(sub)``: adds its argparse sub-parser to ``sub`` (the object
  ``ArgumentParser.add_subparsers`` returned) and returns it;
- ``run(args) -> int``: does the work and returns an ``ExitCode``.

Errors are raised as ``diag.model.errors.AllocdiagError`` subclasses; the
dispatcher in ``diag.cli`` prints them and maps them to exit codes once.
Shared helpers for command modules live in ``diag.commands.common``.
"""

import importlib

# Order is the order of `allocdiag --help`.  Add a command by adding its module here.
MODULES = ("top", "watch", "record", "replay", "demo", "ps", "inspect", "preload", "explain",
           "release", "set", "compare", "heap", "wall", "exporter", "report", "serve")


def load():
    """The command modules, in help order."""
    return [module(m) for m in MODULES]


def module(name):
    """The module of the command NAME (a word of MODULES)."""
    return importlib.import_module(f"diag.commands.{name}")
