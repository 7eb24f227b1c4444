"""Loggers that need the ``logging`` module only once a line can be written.

Importing ``logging`` brings ``traceback``, ``linecache``, ``tokenize`` and
``string`` with it: ~6 ms of every CLI run on the slow guest (issue 23), and
a run without -v, --debug or --log-file writes no line at all
(diag.cli.setup_logging).  ``getLogger(name)`` gives a ``Logger`` whose
``debug`` and ``info`` hand the line to ``logging.getLogger(name)`` when the
``logging`` module has been imported (by setup_logging, a test, a library)
and drop it otherwise: without ``logging`` imported, no handler exists and
no logger has a level below WARNING, so the standard module would drop it
too.  Only what allocdiag's code calls is here (``debug`` and ``info``
with logging's keywords, such as ``exc_info``, and ``isEnabledFor``); a
warning would go through ``logging`` itself.  The TUI's modules use
``logging``: textual imports it anyway.
"""

from __future__ import annotations

import sys
from typing import Any

DEBUG = 10      # logging.DEBUG
INFO = 20       # logging.INFO


class Logger:
    """``logging.getLogger(name)``, looked up when ``logging`` is there."""

    __slots__ = ("name", "_real")

    def __init__(self, name: str) -> None:
        self.name = name
        self._real: Any = None

    def _logger(self) -> Any:
        real = self._real
        if real is None:
            logging = sys.modules.get("logging")
            if logging is None:
                return None
            real = self._real = logging.getLogger(self.name)
        return real

    def isEnabledFor(self, level: int) -> bool:
        real = self._logger()
        return real is not None and bool(real.isEnabledFor(level))

    def debug(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._emit(DEBUG, msg, args, kwargs)

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._emit(INFO, msg, args, kwargs)

    def _emit(self, level: int, msg: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        real = self._logger()
        if real is not None:
            # stacklevel: the record names the caller of debug()/info(), not this module
            kwargs.setdefault("stacklevel", 3)
            real.log(level, msg, *args, **kwargs)


def getLogger(name: str) -> Logger:
    """The Logger of NAME (one per call: they hold no state but the lookup)."""
    return Logger(name)
