"""allocdiag's terminal UI (textual).  Renders diag's model only: its data
comes from diag.source, never from collectors (docs/architecture.md).

- tui/app.py             the App and the entry points (host, watch, replay)
- tui/messages.py        the one message each worker posts, shared helpers
- tui/dialogs.py         confirm / input / result dialogs and the help screen
- tui/host_screen.py     the host table
- tui/process_screen.py  one process; its tabs are composed in ProcessScreen.compose
- tui/process_tabs.py    what those tabs draw from the screen's one view-model
- tui/heap_tab.py, tui/wall_tab.py, tui/layers.py, tui/widgets.py  the tabs' parts
"""
