"""The terminal's width, found without importing ``shutil``.

``shutil.get_terminal_size`` is the one thing the CLI needs from ``shutil``,
whose import also imports ``bz2``, ``lzma`` and ``fnmatch``: ~3 ms of every
run's start-up on a slow machine (issue 23).  argparse asks for the width
each time it makes a help formatter, which it does for every ``add_argument``.
"""

import argparse
import os
import sys
from typing import Any


def columns(fallback: int = 80) -> int:
    """What ``shutil.get_terminal_size((FALLBACK, ...)).columns`` says: $COLUMNS
    when it is a positive number, else the width of the terminal on the
    interpreter's stdout, else FALLBACK."""
    try:
        n = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        n = 0
    out = sys.__stdout__            # None without a stdout at start-up
    if n <= 0 and out is not None:
        try:
            n = os.get_terminal_size(out.fileno()).columns
        except (AttributeError, ValueError, OSError):
            n = 0
    return n if n > 0 else fallback


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's RawDescriptionHelpFormatter, its width from ``columns``
    (argparse's own default: the terminal's, less 2)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None, **later: Any) -> None:
        # LATER: what a newer argparse may pass besides (it grows keywords)
        super().__init__(prog, indent_increment, max_help_position,
                         columns() - 2 if width is None else width, **later)
