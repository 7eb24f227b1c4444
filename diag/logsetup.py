"""The CLI's logging set-up (diag.cli.setup_logging imports this module,
and with it ``logging``, only when a line can be written or ``logging`` is
already there: collectors.lazylog)."""

import logging
import sys

from diag.model.errors import BadPath


# One logger per package; these are the roots the options turn on.
LOGGERS = ("collectors", "diag", "tui")


class _CurrentStderr(logging.StreamHandler):
    """A handler that writes to whatever ``sys.stderr`` is when a line is
    logged: the TUI redirects it while it owns the screen, so no line lands
    in the middle of the picture."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


# The handler configure() put on LOGGERS, replaced by its next call (main()
# runs more than once in one process: tests, `compare` variants).
_handler = None


def configure(args):
    """-v (or --log-file alone): INFO lines; --debug: every line with its
    logger's name; --log-file FILE: to FILE, not stderr.  Without any of them
    nothing is logged, not even warnings (a NullHandler on each root)."""
    global _handler
    level = logging.DEBUG if args.debug else logging.INFO if args.verbose or args.log_file else None
    if level is None:
        handler = logging.NullHandler()
    elif args.log_file:
        try:
            handler = logging.FileHandler(args.log_file)
        except OSError as exc:
            raise BadPath.from_oserror(exc, args.log_file) from None
    else:
        handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter(
        "%(asctime)s %(name)s: %(message)s" if args.debug else "allocdiag: %(message)s"))
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _handler is not None:
            logger.removeHandler(_handler)
        logger.setLevel(level if level is not None else logging.NOTSET)
        logger.addHandler(handler)
    if _handler is not None:
        _handler.close()
    _handler = handler
