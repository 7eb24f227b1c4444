"""Widgets that render the view-model of ``tui.layers``.  They only render:
data comes in through reactive attributes set by their screen."""

from rich.segment import Segment as RichSegment
from rich.style import Style
from rich.text import Text
from textual.containers import Vertical
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import DataTable, Label

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

def role_css(widget_type):
    return "\n".join(f"{widget_type} > .stack--{role} {{ color: {c}; }}"
                     for role, c in _COLOURS.items())


class StackPanel(Widget):
    """Horizontal stacked bars (one row each) with a legend.

    Each bar is a ``layers.Bar``; all bars of a panel share one scale so
    their lengths compare.  Separate bars are never implied to nest.
    """

    COMPONENT_CLASSES = {f"stack--{r}" for r in _COLOURS} | {"stack--note", "stack--frame"}
    DEFAULT_CSS = "StackPanel { height: auto; }\n" + role_css("StackPanel") + """
    StackPanel > .stack--note { color: $text-muted; text-style: italic; }
    StackPanel > .stack--frame { color: $text-muted; }
    """

    panel = reactive(None, layout=True)

    NAME_WIDTH = 9
    CAPTION_WIDTH = 19

    def __init__(self, empty="no data yet", **kwargs):
        super().__init__(**kwargs)
        self.empty = empty

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


class LayerHistory(Widget):
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

    def _window(self):
        n = max((len(v) for _, _, v in self.series), default=0)
        width = max(1, self.size.width)
        last = n - 1 if self.cursor is None else self.cursor
        start = max(0, last - width + 1)
        if self.cursor is None:
            start = max(0, n - width)
        return start, min(n, start + width), n

    def _scale(self, start, end):
        top = 0
        for _, _, values in self.series:
            for v in values[start:end]:
                if v is not None and v > top:
                    top = v
        return top

    def render_line(self, y):
        width = self.size.width
        rows = self.size.height
        start, end, _ = self._window()
        scale = self._scale(start, end)
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

    def legend(self):
        """Text of the legend: latest (or cursor) value and the scale."""
        start, end, n = self._window()
        at = (n - 1) if self.cursor is None else self.cursor
        text = Text()           # wraps: at 80 columns the legend takes two lines
        for role, lab, values in self.series:
            v = values[at] if 0 <= at < len(values) else None
            if text:
                text.append("  ")
            text.append("█ ", style=self.get_component_rich_style(f"stack--{role}"))
            text.append(f"{lab} {'unknown' if v is None else human_bytes(v)}")
        scale = self._scale(start, end)
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


class NativeTables(Vertical):
    """The allocator's native dict, rendered generically as DataTables."""

    DEFAULT_CSS = """
    NativeTables { height: auto; }
    NativeTables > Label { margin-top: 1; text-style: bold; }
    NativeTables > DataTable { height: auto; max-height: 16; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._shape = None

    def show(self, native, kind=None):
        tables = layers.native_tables(native or {}, kind=kind)
        shape = tuple((t.title, t.columns) for t in tables)
        if shape != self._shape:
            self.remove_children()
            widgets = []
            if not tables:
                widgets.append(Label("no native detail from this allocator (yet)"))
            for i, t in enumerate(tables):
                widgets.append(Label(t.title))
                widgets.append(DataTable(id=f"native-{i}", cursor_type="row",
                                         zebra_stripes=True))
            self.mount_all(widgets)
            self._shape = shape
            self.call_after_refresh(self._fill, tables)
        else:
            self._fill(tables)

    def _fill(self, tables):
        for i, t in enumerate(tables):
            try:
                table = self.query_one(f"#native-{i}", DataTable)
            except Exception:
                continue
            fill_table(table, t.columns, t.rows)
