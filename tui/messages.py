"""What the TUI's workers post and the helpers every screen shares.

A thread worker asks the source for data, builds an immutable result and
posts ONE of these messages; the handler sets one reactive on its screen
(the process screen's ``view``), to which the widgets are bound; widgets
only render (memray's pattern)."""

import time

from textual.message import Message

from diag.model.errors import AllocdiagError


HISTORY_LIMIT = 1800            # samples kept for the time series
DEFAULT_INTERVAL = 2.0          # seconds; a ~2 ms stop every 2 s is ~0.1% of wall time
MIN_INTERVAL = 0.2


def clock(ts):
    """Wall-clock text of a sample time (local time)."""
    if ts is None:
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.localtime(ts))


def error_text(exc):
    if isinstance(exc, AllocdiagError):
        return str(exc)
    return f"{exc.__class__.__name__}: {exc}"


# -- messages (past tense, posted by workers) -----------------------------------

class HostScanned(Message):
    def __init__(self, rows, denied, vanished, error=None):
        super().__init__()
        self.rows, self.denied, self.vanished, self.error = rows, denied, vanished, error


class SampleTaken(Message):
    def __init__(self, snapshot, recorded=None):
        super().__init__()
        self.snapshot = snapshot
        self.recorded = recorded


class SampleFailed(Message):
    def __init__(self, error):
        super().__init__()
        self.error = error


class ActionFinished(Message):
    def __init__(self, action, result=None, error=None):
        super().__init__()
        self.action, self.result, self.error = action, result, error


class HeapFinished(Message):
    """One Heap tab call (status/start/dump/diff/stop) ended; for the tab only."""

    bubble = False

    def __init__(self, action, result=None, error=None):
        super().__init__()
        self.action, self.result, self.error = action, result, error


# -- dialogs -------------------------------------------------------------------------
