"""Charts of the HTML report, drawn by matplotlib and returned as inline SVG.

matplotlib renders with no JavaScript and, with ``svg.fonttype = "path"``,
draws every glyph as a path: the page needs no font and makes no request.
Each chart is one ``<svg>`` element (the XML prologue, DOCTYPE and metadata
are dropped, its ids prefixed so several charts share one page).  Labels
and units come from diag.fields.
"""

import io
import itertools
import re

from diag.model.errors import MissingExtra
from diag.fields import BY_NAME


KiB = 1 << 10
# Byte axes are drawn in the largest binary unit the data reaches at least
# this many of, so tick labels stay short (1.5 GiB, not 1536 MiB).
_AXIS_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", KiB), ("B", 1))
_MIN_UNITS_ON_AXIS = 1
_ZERO_AXIS_UNIT = ("MiB", 1 << 20)      # an all-zero series (LazyFree under glibc)

# One colour per field, the same in every chart of a page.
COLORS = {
    "rss": "#222222", "rss_anon": "#1f77b4", "lazyfree": "#ff7f0e",
    "working_set": "#2ca02c", "allocated": "#9467bd", "active": "#8c564b",
    "resident": "#d62728", "mapped": "#7f7f7f", "retained": "#bcbd22",
    "dirty": "#17becf", "muzzy": "#e377c2",
}
# mapped is address space, not memory: dashed so it never reads as a layer.
DASHED = ("mapped", "retained")
# The outer field of a pair that often coincides (RSS ~ anon, active ~
# allocated) is drawn wider, so the inner one shows on top of it.
WIDE = ("rss", "allocated")
LINE_WIDTH, WIDE_LINE_WIDTH = 1.6, 3.2
WIDTH_IN = 11.0          # chart width in inches (at 100 dpi: the page's 1100 px column)
PANEL_HEIGHT_IN = 3.0
BAR_ROW_IN = 0.32        # height per bar group in horizontal bar charts
FONT_SIZE = 9
SINGLE_SAMPLE_PAD_S = 0.05
BAR_LABEL_ROOM = 0.22    # share of the bar axis kept free for the value labels
PAIR_COLORS = ("#d62728", "#1f77b4")     # peak/settled
_counter = itertools.count(1)


def _matplotlib():
    """(Figure, rc_context), or MissingExtra naming the extra to install."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingExtra("the HTML report", "matplotlib", "report") from None
    return Figure, matplotlib.rc_context


def check_available():
    """Raise MissingExtra (with the pip command) when matplotlib is missing."""
    _matplotlib()


def label(name):
    f = BY_NAME.get(name)
    return f.label if f is not None else name


def axis_unit(values):
    """(unit name, divisor) for a byte axis whose largest value is max(VALUES)."""
    top = max((abs(v) for v in values if v is not None), default=0)
    if not top:
        return _ZERO_AXIS_UNIT
    for name, div in _AXIS_UNITS:
        if top >= _MIN_UNITS_ON_AXIS * div:
            return name, div
    return "B", 1


def _figure(height_in):
    Figure, rc_context = _matplotlib()
    ctx = rc_context({"svg.fonttype": "path", "font.size": FONT_SIZE,
                      "axes.spines.top": False, "axes.spines.right": False,
                      "svg.hashsalt": "allocdiag"})
    ctx.__enter__()
    fig = Figure(figsize=(WIDTH_IN, height_in), layout="constrained")
    return fig, ctx


def to_svg(fig, ctx, title):
    """FIG as one inline <svg> element with ids unique on the page."""
    buf = io.StringIO()
    try:
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None,
                                                 "Format": None, "Type": None})
    finally:
        ctx.__exit__(None, None, None)
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    prefix = f"c{next(_counter)}-"
    text = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', text)
    text = re.sub(r'(href="#|url\(#)([^")]+)', lambda m: f"{m.group(1)}{prefix}{m.group(2)}", text)
    # an accessible name; the element keeps matplotlib's width/height in pt
    return text.replace("<svg ", f'<svg role="img" aria-label="{_attr(title)}" ', 1)


def _attr(text):
    import html
    return html.escape(text, quote=True)


def _series_axes(ax, t, series, unit, marks):
    """Lines of SERIES {field: [bytes or None]} over T on AX, in UNIT."""
    name, div = unit
    for field, values in series.items():
        pts = [(x, v / div) for x, v in zip(t, values) if v is not None]
        if not pts:
            continue
        xs, ys = zip(*pts)
        ax.plot(xs, ys, label=label(field), color=COLORS.get(field),
                linestyle="--" if field in DASHED else "-",
                linewidth=WIDE_LINE_WIDTH if field in WIDE else LINE_WIDTH,
                marker="o" if len(pts) == 1 else None)
    for x, text in marks:
        ax.axvline(x, color="#555555", linestyle=":", linewidth=1.2)
        ax.annotate(text, (x, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(3, -10), textcoords="offset points", fontsize=FONT_SIZE - 1,
                    color="#333333")
    ax.set_ylabel(name)
    _from_zero(ax)
    ax.grid(True, color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def time_panels(t, panels, marks=(), title="over time"):
    """One SVG with a panel per (heading, {field: values}) of PANELS, sharing
    the time axis T (seconds); MARKS: (t, text) vertical lines (releases)."""
    panels = [(h, s) for h, s in panels if any(v is not None for vs in s.values() for v in vs)]
    if not panels:
        return None
    fig, ctx = _figure(PANEL_HEIGHT_IN * len(panels))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (heading, series) in zip(axes, panels):
        unit = axis_unit([v for vs in series.values() for v in vs])
        _series_axes(ax, t, series, unit, marks)
        ax.set_title(heading, loc="left", fontsize=FONT_SIZE + 1)
    axes[-1].set_xlabel("seconds since the first sample")
    if t and max(t) == min(t):
        # one sample: a one-second axis that starts at it, not ±0.05 s around it
        axes[-1].set_xlim(min(t) - SINGLE_SAMPLE_PAD_S, min(t) + 1)
    return to_svg(fig, ctx, title)


def variant_panels(panels, title="per variant over time"):
    """Small multiples: one panel per (heading, {variant: (t, values)})."""
    panels = [(h, s) for h, s in panels
              if any(v is not None for _t, vs in s.values() for v in vs)]
    if not panels:
        return None
    cols = 2
    rows = (len(panels) + cols - 1) // cols
    fig, ctx = _figure(PANEL_HEIGHT_IN * rows)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (heading, series) in zip(axes, panels):
        unit = axis_unit([v for _t, vs in series.values() for v in vs])
        for i, (variant, (t, values)) in enumerate(series.items()):
            pts = [(x, v / unit[1]) for x, v in zip(t, values) if v is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=variant, color=f"C{i % 10}", linewidth=1.5)
        ax.set_title(heading, loc="left", fontsize=FONT_SIZE + 1)
        ax.set_ylabel(unit[0])
        ax.set_xlabel("seconds since the variant started")
        _from_zero(ax)
        ax.grid(True, color="#e5e5e5", linewidth=0.8)
        ax.legend(loc="best", frameon=False, fontsize=FONT_SIZE - 1)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    return to_svg(fig, ctx, title)


def _bar_axes(ax, groups, pair_labels, colors):
    """Two horizontal bars per (label, (a, b)) of GROUPS on AX, in bytes."""
    unit_name, div = axis_unit([v for _g, ab in groups for v in ab])
    height = 0.38
    labelled = set()        # each of the pair once in the legend
    for i, (_g, ab) in enumerate(groups):
        for j, v in enumerate(ab):
            if v is None:
                continue
            y = i + (j - 0.5) * height
            ax.barh(y, v / div, height=height * 0.95, color=colors[j],
                    label=None if j in labelled else pair_labels[j])
            labelled.add(j)
            ax.annotate(f"{v / div:,.1f} {unit_name}", (v / div, y), xytext=(3, 0),
                        textcoords="offset points", va="center", fontsize=FONT_SIZE - 1)
    ax.set_yticks(range(len(groups)), [g for g, _ab in groups])
    ax.invert_yaxis()
    ax.set_xlabel(unit_name)
    top = max((v for _g, ab in groups for v in ab if v is not None), default=0) / div
    ax.set_xlim(0, max(top * (1 + BAR_LABEL_ROOM), 1))
    ax.grid(True, axis="x", color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)


def _from_zero(ax):
    """Start the byte axis at 0; an all-zero axis still spans one unit."""
    ax.set_ylim(0, max(ax.get_ylim()[1], 1))


def paired_bars(groups, pair_labels, title, colors=PAIR_COLORS):
    """Horizontal bars: per group (its label, (a, b)) two bars labelled
    PAIR_LABELS (peak/settled, before/after), values in bytes."""
    return bar_panels([(None, groups)], pair_labels, title, colors, cols=1)


def bar_panels(panels, pair_labels, title, colors=PAIR_COLORS, cols=2):
    """PANELS: (heading, groups) as in ``paired_bars``, COLS per row."""
    panels = [(h, [(g, ab) for g, ab in groups if any(v is not None for v in ab)])
              for h, groups in panels]
    panels = [(h, groups) for h, groups in panels if groups]
    if not panels:
        return None
    cols = min(cols, len(panels))
    rows = (len(panels) + cols - 1) // cols
    per_row = max(len(g) for _h, g in panels)
    fig, ctx = _figure(rows * max(1.5, BAR_ROW_IN * 2 * per_row + 0.9))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (heading, groups) in zip(axes, panels):
        _bar_axes(ax, groups, pair_labels, colors)
        if heading:
            ax.set_title(heading, loc="left", fontsize=FONT_SIZE + 1)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper right", frameon=False, ncols=2)
    return to_svg(fig, ctx, title)


# -- the allocation wall (record --wall) ---------------------------------------------------

SHARE_COLORS = {"cpu.allocator_share": "#d62728", "off_cpu.allocator_lock_share": "#1f77b4",
                "cpu.unknown_share": "#7f7f7f"}
ICICLE_ROW_IN = 0.26        # height of one frame level
ICICLE_MAX_DEPTH = 24       # deeper frames are left out (their width is in their parent)
ICICLE_MIN_LABEL = 0.04     # share of the width a frame needs for its name to be written
ICICLE_CHAR_SHARE = 0.0075  # share of the width one character of a label takes (at 11 in)
ICICLE_LEVEL_COLORS = ("#c6dbef", "#9ecae1", "#deebf7", "#bdd7e7")    # the program's frames
ICICLE_ALLOCATOR_COLORS = ("#fc8d59", "#ef6548", "#fdbb84")           # the allocator's


def share_lines(t, series, title="over time", labels=None):
    """Lines of SERIES {wall field: [share 0..1 or None]} over T (seconds),
    in percent; labels from diag.fields' wall rows unless LABELS names them."""
    from diag.fields import WALL_BY_NAME
    if not any(v is not None for vs in series.values() for v in vs):
        return None
    fig, ctx = _figure(PANEL_HEIGHT_IN)
    ax = fig.subplots()
    for name, values in series.items():
        pts = [(x, v * 100) for x, v in zip(t, values) if v is not None]
        if not pts:
            continue
        xs, ys = zip(*pts)
        text = (labels or {}).get(name) or WALL_BY_NAME[name].label
        ax.plot(xs, ys, label=text, color=SHARE_COLORS.get(name), linewidth=LINE_WIDTH,
                marker="o", markersize=3)
    ax.set_ylabel("%")
    ax.set_ylim(0, max(ax.get_ylim()[1], 10))
    ax.set_xlabel("seconds since the first sample (each point: the end of a window)")
    ax.grid(True, color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return to_svg(fig, ctx, title)


def icicle_tree(stacks, max_depth=ICICLE_MAX_DEPTH):
    """{frame: [weight, children]} of STACKS [(frames outermost first, weight)]."""
    root = {}
    for frames, weight in stacks:
        level = root
        for f in frames[:max_depth]:
            node = level.setdefault(f, [0, {}])
            node[0] += weight
            level = node[1]
    return root


def _icicle_rects(tree, x0, depth, total, out):
    x = x0
    for name, (weight, children) in sorted(tree.items(), key=lambda kv: -kv[1][0]):
        w = weight / total
        out.append((x, depth, w, name, not children))
        _icicle_rects(children, x, depth + 1, total, out)
        x += w
    return out


def icicle(stacks, title="icicle", is_allocator=None, unit="samples"):
    """A flame graph drawn top-down (icicle): STACKS [(frames outermost
    first, weight)], each frame a box as wide as its share of the total
    weight, its callees below it.  Frames for which IS_ALLOCATOR(name) is
    true are drawn in the allocator's colour, the rest by depth."""
    total = sum(w for _f, w in stacks)
    if not total:
        return None
    rects = _icicle_rects(icicle_tree(stacks), 0.0, 0, total, [])
    depth = max(d for _x, d, _w, _n, _leaf in rects) + 1
    fig, ctx = _figure(ICICLE_ROW_IN * depth + 0.6)
    ax = fig.subplots()
    for x, d, w, name, _leaf in rects:
        colours = (ICICLE_ALLOCATOR_COLORS if is_allocator is not None and is_allocator(name)
                   else ICICLE_LEVEL_COLORS)
        colour = colours[d % len(colours)]
        ax.add_patch(_rectangle(x, d, w, colour))
        if w >= ICICLE_MIN_LABEL:
            room = int(w / ICICLE_CHAR_SHARE) - 1
            text = name if len(name) <= room else name[:max(1, room - 1)] + "…"
            ax.text(x + 0.003, d + 0.5, text, va="center", ha="left",
                    fontsize=FONT_SIZE - 1, clip_on=True)
    ax.set_xlim(0, 1)
    ax.set_ylim(depth, 0)
    ax.set_yticks([])
    ax.set_xticks([i / 10 for i in range(11)], [f"{i * 10}%" for i in range(11)])
    ax.set_xlabel(f"share of {total:,} {unit}")
    for side in ("left", "top", "right"):
        ax.spines[side].set_visible(False)
    return to_svg(fig, ctx, title)


def _rectangle(x, depth, width, colour):
    from matplotlib.patches import Rectangle
    return Rectangle((x, depth), width, 1, facecolor=colour, edgecolor="white", linewidth=0.6)
