"""The host table: every readable process, sorted, filtered, opened."""

import logging
import time
from collections import namedtuple

from rich.text import Text
from textual import on, work
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static

from diag.hostscan import unreadable_hint
from diag.render import human_bytes
from tui import layers

from tui.messages import HostScanned, error_text

log = logging.getLogger("tui")

HostRow = namedtuple("HostRow", "pid comm allocator preload rss anon lazyfree held finding")


HOST_COLUMNS = (
    # (attribute, header, numeric)
    ("pid", "PID", True),
    ("comm", "command", False),
    ("allocator", "allocator", False),
    ("preload", "preload", False),
    ("rss", layers.label("rss"), True),
    ("anon", layers.label("rss_anon"), True),
    ("lazyfree", layers.label("lazyfree"), True),
    ("held", layers.held_label(), True),
    ("finding", "top finding", False),
)
_LINKAGE = {"preload": "pre", "static": "st"}


def _preload_short(pre):
    eff = (pre or {}).get("effective")
    verdict = (pre or {}).get("verdict") or ""
    if eff is True:
        return "yes"
    if eff is False:
        return "NO"
    return "?" if verdict.startswith("unknown") else "-"


def host_row(d):
    """ScanResult row dict -> HostRow (values kept raw for sorting)."""
    a = d.get("allocator") or {}
    kind = a.get("kind") or "unknown"
    link = _LINKAGE.get(a.get("linkage"))
    alloc = f"{kind} ({link})" if link else kind
    stats = d.get("stats") or {}
    held = stats.get("resident")
    if isinstance(held, dict):
        held = held.get("value")
    if held is None:
        held = d.get("resident")
    finding = d.get("top_finding") or ""
    if not finding and d.get("findings"):
        first = d["findings"][0]
        finding = first.get("title", "") if isinstance(first, dict) else str(first)
    return HostRow(d.get("pid"), d.get("comm") or "?", alloc,
                   _preload_short(d.get("preload")), d.get("rss"), d.get("rss_anon"),
                   d.get("lazyfree"), held, finding)


def sort_rows(rows, column, reverse):
    """Sort by COLUMN; unknown (None) values always last."""
    known = [r for r in rows if getattr(r, column) is not None]
    unknown = [r for r in rows if getattr(r, column) is None]
    key = (lambda r: getattr(r, column)) if column in ("pid", "rss", "anon", "lazyfree", "held") \
        else (lambda r: str(getattr(r, column)).lower())
    known.sort(key=lambda r: (key(r), r.pid), reverse=reverse)
    return known + unknown


def filter_rows(rows, text):
    text = (text or "").strip().lower()
    if not text:
        return list(rows)
    return [r for r in rows if text in str(r.pid) or text in r.comm.lower()
            or text in r.allocator.lower() or text in r.finding.lower()]


class HostScreen(Screen):
    """Every readable process; Enter opens one."""

    BINDINGS = [
        Binding("enter", "open", "Open", show=True),
        Binding("slash", "filter", "Filter"),
        Binding("s", "sort_next", "Sort"),
        Binding("S", "sort_reverse", "Reverse", show=False),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("g", "refresh_now", "Refresh", show=False),
    ]

    def __init__(self, source, interval=5.0, open_process=None):
        super().__init__(id="host")
        self.source = source
        self.interval = interval
        self.open_process = open_process
        self.rows = ()
        self.sort_column = "rss"
        self.sort_reverse = True
        self.filter_text = ""
        self.denied = self.vanished = 0
        self.scanned_at = None
        self.error = None
        self._busy = False
        self._timer = None

    def compose(self):
        yield Header()
        yield Input(placeholder="filter: pid, command, allocator…", id="filter")
        yield DataTable(id="procs", cursor_type="row", zebra_stripes=True)
        yield Static("scanning…", id="host-status", classes="status")
        yield Footer()

    def tell(self, message, **kw):
        """A notification; the text is shown as is (never parsed as markup)."""
        self.app.notify(message, markup=False, **kw)

    def on_mount(self):
        self.query_one("#filter").display = False
        table = self.query_one("#procs", DataTable)
        for attr, header, numeric in HOST_COLUMNS:
            table.add_column(Text(header, justify="right") if numeric else header, key=attr)
        table.focus()
        self.refresh_scan()
        self._timer = self.set_interval(self.interval, self.refresh_scan)

    def on_screen_suspend(self):
        if self._timer:
            self._timer.pause()

    def on_screen_resume(self):
        self.app.title, self.app.sub_title = "allocdiag", "host"
        if self._timer:
            self._timer.resume()

    def refresh_scan(self):
        if not self._busy:
            self._busy = True
            self._scan()

    @work(thread=True, exclusive=True, group="scan", exit_on_error=False)
    def _scan(self):
        try:
            result = self.source.scan()
            rows = tuple(host_row(d) for d in result.rows)
            msg = HostScanned(rows, getattr(result, "denied", 0), getattr(result, "vanished", 0))
        except Exception as exc:   # the UI reports it; the next scan retries
            log.debug("host scan failed", exc_info=True)
            msg = HostScanned((), 0, 0, error=error_text(exc))
        self.post_message(msg)

    def on_host_scanned(self, msg):
        self._busy = False
        if msg.error:
            self.error = msg.error
            self.tell(msg.error, title="host scan failed", severity="error")
        else:
            self.error = None
            self.rows, self.denied, self.vanished = msg.rows, msg.denied, msg.vanished
            self.scanned_at = time.time()
        self.render_rows()

    def visible_rows(self):
        return sort_rows(filter_rows(self.rows, self.filter_text), self.sort_column,
                         self.sort_reverse)

    def render_rows(self):
        table = self.query_one("#procs", DataTable)
        current = None
        if table.row_count:
            try:
                current = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
            except Exception:
                current = None
        rows = self.visible_rows()
        table.clear()
        cursor = 0
        for i, r in enumerate(rows):
            cells = []
            for attr, _, numeric in HOST_COLUMNS:
                v = getattr(r, attr)
                if attr == "pid":
                    cells.append(Text(str(v), justify="right"))
                elif numeric:
                    cells.append(Text(human_bytes(v), justify="right",
                                      style="dim" if v is None else ""))
                else:
                    cells.append(str(v))
            table.add_row(*cells, key=str(r.pid))
            if current == str(r.pid):
                cursor = i
        if rows:
            table.move_cursor(row=cursor, animate=False)
        self._update_status(len(rows))

    def _update_status(self, shown):
        header = dict((a, h) for a, h, _ in HOST_COLUMNS)[self.sort_column]
        parts = [f"{shown} of {len(self.rows)} processes"]
        if self.denied:
            parts.append(f"{self.denied} unreadable ({unreadable_hint(short=True)})")
        parts.append(f"sort: {header} {'↓' if self.sort_reverse else '↑'}")
        if self.filter_text:
            parts.append(f"filter: {self.filter_text!r}")
        if self.error:
            parts.append(f"scan failed: {self.error}")
        parts.append("enter: open · - = unknown")
        self.query_one("#host-status", Static).update(Text(" · ".join(parts)))

    # actions
    def selected_pid(self):
        table = self.query_one("#procs", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return int(key)

    def action_open(self):
        pid = self.selected_pid()
        if pid is not None and self.open_process is not None:
            self.open_process(pid)

    @on(DataTable.RowSelected, "#procs")
    def _row_selected(self, event):
        if self.open_process is not None:
            self.open_process(int(event.row_key.value))

    @on(DataTable.HeaderSelected, "#procs")
    def _header_selected(self, event):
        column = event.column_key.value
        if column == self.sort_column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_column = column
            self.sort_reverse = column in ("rss", "anon", "lazyfree", "held")
        self.render_rows()

    def action_sort_next(self):
        names = [a for a, _, _ in HOST_COLUMNS]
        self.sort_column = names[(names.index(self.sort_column) + 1) % len(names)]
        self.sort_reverse = self.sort_column in ("rss", "anon", "lazyfree", "held")
        self.render_rows()

    def action_sort_reverse(self):
        self.sort_reverse = not self.sort_reverse
        self.render_rows()

    def action_filter(self):
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event):
        self.filter_text = event.value
        self.render_rows()

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event):
        box = self.query_one("#filter", Input)
        if not box.value:
            box.display = False
        self.query_one("#procs", DataTable).focus()

    def action_clear_filter(self):
        box = self.query_one("#filter", Input)
        box.value = ""
        box.display = False
        self.filter_text = ""
        self.query_one("#procs", DataTable).focus()
        self.render_rows()

    def action_refresh_now(self):
        self.refresh_scan()


# -- process view -------------------------------------------------------------------
