"""Widgets that render the view-model of ``tui.layers``.  They only render:
data comes in through reactive attributes set by their screen.

A ``Bound`` widget has a ``view`` reactive that its screen binds to its own
(``widget.data_bind(ProcessScreen.view)``): one assignment on the screen
reaches every bound widget, each of which draws its own part of the view
(memray's pattern; no ``query_one`` per widget per refresh)."""

from rich.segment import Segment as RichSegment
from rich.style import Style
from rich.text import Text
from textual.containers import Vertical
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import DataTable, Label, Static

from diag.render import human_bytes
from tui import layers

_COLOURS = {
    "allocated": "#5fd75f", "active": "#d7d75f", "resident": "#ff8700",
    "mapped": "#5f87ff", "retained": "#808080",
    "held": "#5fd75f", "lazyfree": "#d75fd7", "anon": "#5fd7d7", "file": "#5f87ff",
    "shmem": "#af87ff", "working_set": "#5fd75f", "inactive_file": "#d75fd7",
    "usage": "#d0d0d0", "limit": "#d0d0d0", "rss": "#5f87ff",
    "extra": "#ffd75f",     # an RSS layer diag.breakdown knows and this view does not name
}

class Bound:
    """Mixin of a widget drawn from its screen's view-model (``layers.ProcessView``).

    ``view`` is set through a data binding; ``show_view`` draws the widget's
    part of it.  A view given before the widget is mounted is drawn when the
    binding is made (data_bind initialises with the screen's current value).
    """

    view = reactive(None, repaint=False)

    def watch_view(self, view):
        if view is not None:
            self.show_view(view)

    def show_view(self, view):
        raise NotImplementedError


class ViewStatic(Bound, Static):
    """A text made from the view by TEXT_OF(view)."""

    def __init__(self, text_of, **kwargs):
        super().__init__("", **kwargs)
        self.text_of = text_of

    def show_view(self, view):
        self.update(self.text_of(view))


class ViewTable(Bound, DataTable):
    """A table whose rows are ROWS_OF(view); RIGHT: right-aligned column indexes."""

    def __init__(self, headers, rows_of, right=(), **kwargs):
        super().__init__(**kwargs)
        self.headers, self.rows_of, self.right = tuple(headers), rows_of, tuple(right)

    def show_view(self, view):
        fill_table(self, self.headers, self.rows_of(view), right=self.right)


def role_css(widget_type):
    return "\n".join(f"{widget_type} > .stack--{role} {{ color: {c}; }}"
                     for role, c in _COLOURS.items())


class StackPanel(Bound, Widget):
    """Horizontal stacked bars (one row each) with a legend.

    Each bar is a ``layers.Bar``; all bars of a panel share one scale so
    their lengths compare.  Separate bars are never implied to nest.
    Bound to a view, ``panel`` is PANEL_OF(view.snapshot); with HIDE_EMPTY
    the widget is hidden while that is None (no cgroup).
    """

    COMPONENT_CLASSES = {f"stack--{r}" for r in _COLOURS} | {"stack--note", "stack--frame"}
    DEFAULT_CSS = "StackPanel { height: auto; }\n" + role_css("StackPanel") + """
    StackPanel > .stack--note { color: $text-muted; text-style: italic; }
    StackPanel > .stack--frame { color: $text-muted; }
    """

    panel = reactive(None, layout=True)

    NAME_WIDTH = 9
    CAPTION_WIDTH = 19

    def __init__(self, empty="no data yet", panel_of=None, hide_empty=False, **kwargs):
        super().__init__(**kwargs)
        self.empty = empty
        self.panel_of, self.hide_empty = panel_of, hide_empty

    def show_view(self, view):
        panel = self.panel_of(view.snapshot)
        if self.hide_empty:
            self.display = panel is not None
        self.panel = panel

    def _style(self, role):
        try:
            return self.get_component_rich_style(f"stack--{role}")
        except KeyError:
            return Style()

    def _bar_text(self, bar, scale, width):
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(bar.name[:self.NAME_WIDTH].ljust(self.NAME_WIDTH), style="bold")
        frame = self._style("frame")
        text.append("▕", style=frame)
        cells_total = max(1, width)
        done, acc = 0, 0
        for seg in bar.segments:
            acc += max(0, seg.value)
            end = round(acc / scale * cells_total) if scale else 0
            n = max(0, min(cells_total, end) - done)
            if n:
                text.append(layers.GLYPHS.get(seg.role, "█") * n, style=self._style(seg.role))
            done += n
        text.append(" " * (cells_total - done))
        text.append("▏", style=frame)
        text.append(" " + bar.caption[:self.CAPTION_WIDTH - 1])
        return text

    def _legend_text(self, items, width):
        lines, line, used = [], Text(no_wrap=True, overflow="ellipsis"), 0
        for item in items:
            value = "unknown" if item.value is None else human_bytes(item.value)
            share = f" {item.share * 100:.0f}%" if item.share is not None else ""
            piece = f"{item.label} {value}{share}"
            need = 2 + len(piece) + (2 if used else 0)
            if used and used + need > width:
                lines.append(line)
                line, used = Text(no_wrap=True, overflow="ellipsis"), 0
            if used:
                line.append("  ")
                used += 2
            glyph = layers.GLYPHS.get(item.role, "■") if item.value is not None else "?"
            line.append(glyph + " ", style=self._style(item.role))
            line.append(piece, style="" if item.value is not None else "dim")
            used += 2 + len(piece)
        if used:
            lines.append(line)
        return lines

    def render(self):
        panel = self.panel
        width = self.size.width or 80
        if panel is None:
            return Text(self.empty, style="dim")
        out = []
        bar_width = max(8, width - self.NAME_WIDTH - 2 - self.CAPTION_WIDTH)
        for bar in panel.bars:
            out.append(self._bar_text(bar, panel.scale, bar_width))
        stacked = [i for i in panel.legend
                   if not (i.value is not None and any(
                       b.name == i.label and len(b.segments) == 1 for b in panel.bars))]
        out.extend(self._legend_text(stacked, width))
        for note in panel.notes:
            out.append(Text(note, style=self._style("note"), no_wrap=True, overflow="ellipsis"))
        if not out:
            out.append(Text(self.empty, style="dim"))
        return Text("\n").join(out)


class LayerHistory(Bound, Widget):
    """Overlaid areas of the layers over the session, one column per sample.

    Each series is an area from zero; a smaller one is drawn over a larger
    one, so the top edge of each colour is that series' value (the areas are
    overlaid, not stacked).  Unknown samples leave a gap.  In replay the
    column of the current sample is marked.  Line API: only the rows are
    rendered, from the series set by the screen.
    """

    COMPONENT_CLASSES = {f"stack--{r}" for r in _COLOURS} | {"history--cursor"}
    DEFAULT_CSS = "LayerHistory { height: 5; }\n" + role_css("LayerHistory") + """
    LayerHistory > .history--cursor { color: $text; background: $boost; }
    """

    series = reactive((), layout=False)
    cursor = reactive(None)

    def show_view(self, view):
        self.series = view.series
        self.cursor = view.cursor

    def _window(self, series, cursor):
        """(start, end, n) of the samples of SERIES that fit the width, ending
        at CURSOR (None: at the newest)."""
        n = max((len(v) for _, _, v in series), default=0)
        width = max(1, self.size.width)
        last = n - 1 if cursor is None else cursor
        start = max(0, last - width + 1)
        if cursor is None:
            start = max(0, n - width)
        return start, min(n, start + width), n

    def _scale(self, start, end, series):
        top = 0
        for _, _, values in series:
            for v in values[start:end]:
                if v is not None and v > top:
                    top = v
        return top

    def render_line(self, y):
        width = self.size.width
        rows = self.size.height
        start, end, _ = self._window(self.series, self.cursor)
        scale = self._scale(start, end, self.series)
        if not self.series or scale <= 0 or rows <= 0:
            if y == rows // 2:
                return Strip([RichSegment("no samples yet".center(width)[:width],
                                          Style(dim=True))])
            return Strip.blank(width, Style())
        styles = {role: self.get_component_rich_style(f"stack--{role}")
                  for role, _, _ in self.series}
        bottom = (rows - 1 - y) / rows * scale
        top = (rows - y) / rows * scale
        cell = top - bottom
        segs = []
        for x in range(width):
            i = start + x
            if i >= end:
                segs.append(RichSegment(" ", Style()))
                continue
            known = sorted(((v[i], role) for role, _, v in self.series
                            if i < len(v) and v[i] is not None))
            lower = next(((v, r) for v, r in known if v > bottom), None)
            upper = next(((v, r) for v, r in known if v >= top), None)
            cursor = self.cursor is not None and i == self.cursor
            if lower is None:
                segs.append(RichSegment("│" if cursor else " ",
                                        self.get_component_rich_style("history--cursor")
                                        if cursor else Style()))
                continue
            frac = min(1.0, (lower[0] - bottom) / cell)
            eighths = round(frac * 8)
            fg = styles[lower[1]].color
            bg = styles[upper[1]].color if upper is not None and upper is not lower else None
            if eighths >= 8:
                char, style = "█", Style(color=fg)
            elif eighths <= 0:
                char, style = ("█", Style(color=bg)) if bg else (" ", Style())
            else:
                char, style = " ▁▂▃▄▅▆▇"[eighths], Style(color=fg, bgcolor=bg)
            if cursor:
                style = style + Style(underline=True, bold=True)
            segs.append(RichSegment(char, style))
        return Strip(segs, width).simplify()

    def legend(self, view=None):
        """Text of the legend: latest (or cursor) value and the scale, of VIEW
        (a ProcessView) or of the widget's own series; the window is this
        widget's width."""
        series, cursor = (self.series, self.cursor) if view is None else (view.series,
                                                                          view.cursor)
        start, end, n = self._window(series, cursor)
        at = (n - 1) if cursor is None else cursor
        text = Text()           # wraps: at 80 columns the legend takes two lines
        for role, lab, values in series:
            v = values[at] if 0 <= at < len(values) else None
            if text:
                text.append("  ")
            text.append("█ ", style=self.get_component_rich_style(f"stack--{role}"))
            text.append(f"{lab} {'unknown' if v is None else human_bytes(v)}")
        scale = self._scale(start, end, series)
        if scale:
            text.append(f"  (top {human_bytes(scale)}, {end - start} of {n} "
                        f"sample{'' if n == 1 else 's'})",
                        style="dim")
        return text


def fill_table(table, columns, rows, right=()):
    """Replace TABLE's content; columns rebuilt only when they changed.

    The cursor row is kept when the row count allows it.
    """
    cols = tuple(str(c) for c in columns)
    if getattr(table, "_allocdiag_columns", None) != cols:
        table.clear(columns=True)
        for i, c in enumerate(cols):
            table.add_column(c, key=f"c{i}")
        table._allocdiag_columns = cols
    else:
        table.clear()
    for r in rows:
        cells = [Text(str(c), justify="right") if i in right else str(c)
                 for i, c in enumerate(r)]
        table.add_row(*cells)


class HistoryLegend(Bound, Static):
    """The legend of HISTORY (a LayerHistory) for the view: values at the
    cursor and the scale of the samples that fit the history's width."""

    def __init__(self, history, **kwargs):
        super().__init__("", **kwargs)
        self.history = history

    def show_view(self, view):
        self.update(self.history.legend(view))


class NativeTables(Bound, Vertical):
    """The allocator's native dict, rendered generically as DataTables."""

    DEFAULT_CSS = """
    NativeTables { height: auto; }
    NativeTables > Label { margin-top: 1; text-style: bold; }
    NativeTables > DataTable { height: auto; max-height: 16; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._shape = None
        self._tables = []       # the DataTables of the current shape, in order

    def show_view(self, view):
        snap = view.snapshot
        self.show(snap.native, kind=snap.allocator.kind if snap.allocator else None)

    def show(self, native, kind=None):
        tables = layers.native_tables(native or {}, kind=kind)
        shape = tuple((t.title, t.columns) for t in tables)
        if shape != self._shape:
            # A new shape (another allocator, a replay across a change): new
            # widgets, held by reference (the old ones leave asynchronously, so
            # ids would clash while both exist).
            self.remove_children()
            widgets = []
            if not tables:
                widgets.append(Label("no native detail from this allocator (yet)"))
            self._tables = []
            for t in tables:
                widgets.append(Label(t.title))
                self._tables.append(DataTable(cursor_type="row", zebra_stripes=True))
                widgets.append(self._tables[-1])
            self.mount_all(widgets)
            self._shape = shape
            self.call_after_refresh(self._fill, self._tables, tables)
        else:
            self._fill(self._tables, tables)

    @staticmethod
    def _fill(widgets, tables):
        for table, t in zip(widgets, tables):
            fill_table(table, t.columns, t.rows)
