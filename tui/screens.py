"""Where the TUI's screens live (split the way memray splits its TUI):

- tui/messages.py        the one message each worker posts, shared helpers
- tui/dialogs.py         confirm / input / result dialogs and the help screen
- tui/host_screen.py     the host table
- tui/process_screen.py  one process; its tabs are composed in ProcessScreen.compose
- tui/process_tabs.py    what those tabs draw from the screen's one view-model

Kept as an index so old imports keep working.
"""

from tui.dialogs import ConfirmDialog, HelpScreen, InputDialog, ResultDialog, binding_help  # noqa: F401
from tui.host_screen import HostScreen, filter_rows, host_row, sort_rows  # noqa: F401
from tui.messages import DEFAULT_INTERVAL, HISTORY_LIMIT, MIN_INTERVAL  # noqa: F401
from tui.process_screen import ProcessScreen  # noqa: F401
