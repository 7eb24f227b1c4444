"""Pure view-model: turn a Snapshot into the bars, legends and tables the
widgets draw.  No textual here, so every rule about what may be drawn as
nested is testable on its own.

Rules (DESIGN.md):
- ``allocated <= active <= resident`` is drawn as one stacked bar only when
  the known values really are in that order; otherwise each is its own bar.
- ``mapped`` and ``retained`` are never part of that stack: each gets its own
  bar on the same scale (they are address space, not resident memory).
- An unknown value (``Value.value is None``) is listed as unknown and never
  drawn, never shown as 0.

Labels and meanings come from ``diag.fields``.
"""

import json
from collections import namedtuple

from diag.model.records import record
from diag.fields import BY_NAME
from diag.render import human_bytes, native_page_size, native_value

Segment = namedtuple("Segment", "role label value meaning")
Bar = namedtuple("Bar", "name segments total caption")
Panel = namedtuple("Panel", "bars scale legend notes")
LegendItem = namedtuple("LegendItem", "role label value share meaning")
Table = namedtuple("Table", "title columns rows")

# Glyph per role: distinct even without colour (NO_COLOR).
GLYPHS = {
    "allocated": "█", "active": "▓", "resident": "▒",
    "mapped": "░", "retained": "·",
    "held": "█", "lazyfree": "▒", "anon": "▓", "file": "░", "shmem": "▚",
    "working_set": "█", "inactive_file": "▒", "extra": "▞",
}
ROLES = tuple(GLYPHS)


def label(name):
    return BY_NAME[name].label


def meaning(name):
    return BY_NAME[name].meaning


def stat(snap, name):
    v = snap.stats.get(name)
    return v.value if v is not None else None


def held_label():
    """The allocator-held part of RSS: the allocator's ``resident``."""
    return f"allocator {label('resident')}"


def _share(value, total):
    if value is None or not total:
        return None
    return value / total


def allocator_panel(snap):
    """Bars for the allocator layer of SNAP."""
    chain = [(n, stat(snap, n)) for n in ("allocated", "active", "resident")]
    known = [(n, v) for n, v in chain if v is not None]
    unknown = [n for n, v in chain if v is None]
    bars, legend, notes = [], [], []
    nested = all(a[1] <= b[1] for a, b in zip(known, known[1:]))
    if known and nested:
        segs, prev = [], None
        for name, value in known:
            if prev is None:
                segs.append(Segment(name, label(name), value, meaning(name)))
            else:
                segs.append(Segment(name, f"{label(name)}−{label(prev[0])}", value - prev[1],
                                    f"{label(name)} minus {label(prev[0])}"))
            prev = (name, value)
        top = known[-1]
        bars.append(Bar("held", tuple(segs), top[1], f"{label(top[0])} {human_bytes(top[1])}"))
        for s in segs:
            legend.append(LegendItem(s.role, s.label, s.value, _share(s.value, top[1]),
                                     s.meaning))
    elif known:
        order = " ≤ ".join(label(n) for n, _ in known)
        notes.append(f"{order} does not hold here: drawn as separate bars")
        for name, value in known:
            bars.append(Bar(label(name), (Segment(name, label(name), value, meaning(name)),),
                            value, human_bytes(value)))
            legend.append(LegendItem(name, label(name), value, None, meaning(name)))
    for name in ("mapped", "retained"):
        value = stat(snap, name)
        if value is None:
            unknown.append(name)
            continue
        bars.append(Bar(label(name), (Segment(name, label(name), value, meaning(name)),),
                        value, human_bytes(value)))
        legend.append(LegendItem(name, label(name), value, None, meaning(name)))
    if stat(snap, "mapped") is not None and stat(snap, "resident") is not None:
        notes.append(f"{label('mapped')} and {label('resident')} are not nested")
    for name in unknown:
        legend.append(LegendItem(name, label(name), None, None, meaning(name)))
    scale = max((b.total for b in bars if b.total), default=0)
    return Panel(tuple(bars), scale, tuple(legend), tuple(notes))


def extra_stats(snap):
    """(label, value) of the allocator numbers outside the bars."""
    return tuple((label(n), stat(snap, n)) for n in ("metadata", "dirty", "muzzy")
                 if n in snap.stats)


def rss_panel(snap):
    """RSS split: allocator-held / LazyFree / other anon / file / shmem."""
    p = snap.process
    held = stat(snap, "resident")
    notes, legend, segs = [], [], []
    anon_rest = p.rss_anon
    if p.rss_anon is not None:
        lazy = p.lazyfree
        room = p.rss_anon - (lazy or 0)
        if held is not None:
            drawn = held
            if held > room:
                drawn = max(0, room)
                notes.append(f"{held_label()} exceeds {label('rss_anon')} − {label('lazyfree')} "
                             f"by {human_bytes(held - room)}: it is an upper bound")
            segs.append(Segment("held", held_label(), drawn, meaning("resident")))
            legend.append(LegendItem("held", held_label(), held, _share(held, p.rss),
                                     meaning("resident")))
            room -= drawn
        else:
            legend.append(LegendItem("held", held_label(), None, None, meaning("resident")))
        if lazy is not None:
            segs.append(Segment("lazyfree", label("lazyfree"), lazy, meaning("lazyfree")))
            legend.append(LegendItem("lazyfree", label("lazyfree"), lazy, _share(lazy, p.rss),
                                     meaning("lazyfree")))
        else:
            legend.append(LegendItem("lazyfree", label("lazyfree"), None, None,
                                     meaning("lazyfree")))
        # Layers of anonymous memory that diag.breakdown identifies beyond the
        # allocator and LazyFree (e.g. CPython's pymalloc arenas): drawn from
        # its list as they come, so a new layer needs no change here.
        for extra in _extra_anon_layers(snap):
            drawn = min(extra.bytes, max(0, room))
            segs.append(Segment("extra", extra.label, drawn, extra.note or ""))
            legend.append(LegendItem("extra", extra.label, extra.bytes, _share(extra.bytes, p.rss),
                                     extra.note or ""))
            room -= drawn
        anon_rest = max(0, room)
        other = "other " + label("rss_anon") if (held is not None or lazy is not None) \
            else label("rss_anon")
        segs.append(Segment("anon", other, anon_rest, meaning("rss_anon")))
        legend.append(LegendItem("anon", other, anon_rest, _share(anon_rest, p.rss),
                                 meaning("rss_anon")))
    else:
        legend.append(LegendItem("anon", label("rss_anon"), None, None, meaning("rss_anon")))
    for name, role in (("rss_file", "file"), ("rss_shmem", "shmem")):
        v = getattr(p, name)
        if v is not None:
            segs.append(Segment(role, label(name), v, meaning(name)))
        legend.append(LegendItem(role, label(name), v, _share(v, p.rss), meaning(name)))
    total = p.rss if p.rss is not None else (sum(s.value for s in segs) if segs else None)
    bars = (Bar(label("rss"), tuple(segs), total, human_bytes(p.rss)),) if segs else ()
    if p.rss is None:
        notes.append(f"{label('rss')} unknown")
    return Panel(bars, total or 0, tuple(legend), tuple(notes))


# diag.breakdown's top-level layers this panel already draws under its own roles.
_RSS_NAMED = frozenset(("allocator", "lazyfree", "other_anon", "file", "shmem"))


def _extra_anon_layers(snap):
    from diag.breakdown import layers as rss_layers
    return [layer for layer in rss_layers(snap) if layer.depth == 0 and layer.name not in _RSS_NAMED]


def cgroup_panel(snap):
    """Working set | inactive file, out of the limit; None without a cgroup."""
    c = snap.cgroup
    if c.usage is None and c.error is None:
        return None
    notes = []
    if c.error:
        notes.append(c.error)
    legend = [LegendItem("usage", label("usage"), c.usage, _share(c.usage, c.limit),
                         meaning("usage")),
              LegendItem("working_set", label("working_set"), c.working_set,
                         _share(c.working_set, c.limit), meaning("working_set"))]
    bars = ()
    if c.limit is not None and c.usage is not None:
        segs = []
        if c.working_set is not None:
            segs.append(Segment("working_set", label("working_set"), c.working_set,
                                meaning("working_set")))
            segs.append(Segment("inactive_file", label("inactive_file"),
                                max(0, c.usage - c.working_set), meaning("inactive_file")))
        else:
            segs.append(Segment("inactive_file", label("usage"), c.usage, meaning("usage")))
        bars = (Bar(label("usage"), tuple(segs), c.limit,
                    f"{label('limit')} {human_bytes(c.limit)}"),)
        legend.append(LegendItem("limit", label("limit"), c.limit, None, meaning("limit")))
    else:
        notes.append(f"no {label('limit')}")
    return Panel(bars, c.limit or 0, tuple(legend), tuple(notes))


# -- time series --------------------------------------------------------------

HISTORY_SERIES = (
    ("rss", "process", "rss"),
    ("resident", "stats", "held"),
    ("allocated", "stats", "allocated"),
    ("lazyfree", "process", "lazyfree"),
)


def series_value(snap, name, layer):
    if layer == "stats":
        return stat(snap, name)
    return getattr(snap.process, name)


def history_series(snaps):
    """[(role, label, [value or None per snap])] for the series that are known somewhere."""
    out = []
    for name, layer, role in HISTORY_SERIES:
        values = [series_value(s, name, layer) for s in snaps]
        if any(v is not None for v in values):
            lab = held_label() if name == "resident" else label(name)
            out.append((role, lab, values))
    return out


# -- the process screen's view-model --------------------------------------------

@record(frozen=True, eq=False)
class ProcessView:
    """What every widget of the process screen draws, built once per refresh.

    The screen holds one of these in a reactive; each widget is bound to it
    and renders its own part (a panel, a table, a text) from ``snapshot``.
    Compared by identity (``eq=False``): every refresh is a new view, and
    comparing two histories element by element would cost more than drawing.
    """

    snapshot: object            # diag.model.Snapshot (frozen)
    series: tuple               # history_series of the samples up to now
    cursor: object = None       # replay: index of the sample shown; live: None


def process_view(snap, snaps, cursor=None):
    """The ProcessView of SNAP, with the history of SNAPS (oldest first)."""
    return ProcessView(snap, tuple(history_series(list(snaps))), cursor)


# -- native detail, rendered generically ----------------------------------------

MAX_COLUMNS = 12


def _is_scalar(v):
    return v is None or isinstance(v, (str, int, float, bool))


class _Units:
    """Where a native value's unit comes from: the allocator KIND's schema
    (collectors.schema via diag.render) and the page size its
    document declares.  No kind -> bare numbers, never a guessed unit."""

    def __init__(self, kind=None, native=None):
        self.kind = kind
        self.page = native_page_size(kind, native)

    def text(self, path, v):
        return native_value(self.kind, path, v, self.page)


_BARE = _Units()


def cell(key, v, units=_BARE, path=None):
    """Text of one native value at PATH (keys into the native document)."""
    path = tuple(path) if path is not None else (key,)
    if isinstance(v, dict):
        if "text" in v and _is_scalar(v["text"]):
            return str(v["text"])
        if "value" in v and _is_scalar(v["value"]):
            return cell(key, v["value"], units, path + ("value",))
        if _is_chunk_range(v):
            return (f"{_chunks(v['count'])}, {units.text(path + ('total',), v['total'])}"
                    f" ({v['from']:,}–{v['to']:,} B)")
        if set(v) == {"count", "size"} and all(_is_int(x) for x in v.values()):
            # malloc_info <total type="fast|rest|mmap" count= size=>
            return f"{_chunks(v['count'])}, {units.text(path + ('size',), v['size'])}"
        if v and all(_is_scalar(x) for x in v.values()):
            # a small record (malloc_info <system type=current|max>): each in its unit
            return " · ".join(f"{k} {cell(k, x, units, path + (k,))}" for k, x in v.items())
        return _compact(v)
    if isinstance(v, list):
        if all(_is_scalar(x) for x in v):
            return ", ".join(cell(key, x, units, path + (i,)) for i, x in enumerate(v)) or "[]"
        if v and all(_is_chunk_range(x) for x in v):
            total = sum(x["total"] for x in v)
            return (f"{len(v)} size ranges: {_chunks(sum(x['count'] for x in v))}, "
                    f"{units.text(path + (0, 'total'), total)}")
        return _compact(v)
    return units.text(path, v)


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _chunks(n):
    return f"{n:,} chunk" + ("" if n == 1 else "s")


def _is_chunk_range(v):
    """glibc malloc_info's <size from= to= total= count=>: free chunks of one
    size range (total in bytes).  A cell shows their sum, not the raw list."""
    return isinstance(v, dict) and all(_is_int(v.get(k)) for k in ("from", "to", "total", "count"))


def _compact(v, limit=60):
    text = json.dumps(v, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _records_table(title, items, units, path):
    """items: [(name, dict)] -> Table with a column per scalar-ish key."""
    columns = []
    for _, rec in items:
        for k in rec:
            if k not in columns:
                columns.append(k)
    columns = columns[:MAX_COLUMNS]
    rows = [(str(name),) + tuple(cell(k, rec.get(k), units, path + (name, k)) if k in rec
                                 else "" for k in columns)
            for name, rec in items]
    return Table(title, ("",) + tuple(str(c) for c in columns), tuple(rows))


def native_tables(native, title="", depth=0, kind=None, units=None, path=()):
    """A generic rendering of an allocator's native dict as tables, units from
    KIND's schema (collectors.schema).

    Scalars -> one key/value table; a dict of dicts or a list of dicts -> a
    table with one row per entry; other nested dicts -> recursed into
    (titles joined with '.').
    """
    if units is None:
        units = _Units(kind, native)
    tables = []
    if not isinstance(native, dict):
        return [Table(title or "value", ("", "value"), (("", cell(title, native, units, path)),))]
    kv, nested = [], []
    for k, v in native.items():
        if _is_scalar(v) or (isinstance(v, list) and all(_is_scalar(x) for x in v)) \
                or (isinstance(v, dict) and ("text" in v or "value" in v)
                    and all(_is_scalar(x) for x in v.values())):
            kv.append((str(k), cell(k, v, units, path + (k,))))
        else:
            nested.append((k, v))
    if kv:
        tables.append(Table(title or "summary", ("key", "value"), tuple(kv)))
    for k, v in nested:
        sub = f"{title}.{k}" if title else str(k)
        here = path + (k,)
        if isinstance(v, list):
            if all(isinstance(x, dict) for x in v):
                tables.append(_records_table(sub, [(i, x) for i, x in enumerate(v)], units, here))
            else:
                tables.append(Table(sub, ("", "value"),
                                    tuple((str(i), cell(k, x, units, here + (i,)))
                                          for i, x in enumerate(v))))
        elif isinstance(v, dict):
            if v and all(isinstance(x, dict) for x in v.values()):
                tables.append(_records_table(sub, list(v.items()), units, here))
            elif depth < 3:
                tables.extend(native_tables(v, sub, depth + 1, units=units, path=here))
            else:
                tables.append(Table(sub, ("", "value"), ((str(k), _compact(v)),)))
    return tables


def stats_rows(snap):
    """Rows (label, value, provenance, source, meaning) for the normalised stats."""
    rows = []
    for name, v in snap.stats.items():
        f = BY_NAME.get(name)
        lab = f.label if f else name
        text = human_bytes(v.value) if v.value is not None else "unknown"
        rows.append((lab, text, v.provenance, v.source or "", f.meaning if f else ""))
    return rows


RELEASE_FIELDS = (("process", "rss"), ("process", "rss_anon"), ("process", "lazyfree"),
                  ("stats", "allocated"), ("stats", "active"), ("stats", "resident"),
                  ("stats", "mapped"), ("stats", "retained"), ("stats", "dirty"),
                  ("stats", "muzzy"), ("cgroup", "working_set"))


def snapshot_numbers(snap):
    """{field: bytes or None} of the numbers a release can change."""
    out = {}
    for layer, name in RELEASE_FIELDS:
        if layer == "stats":
            if name in snap.stats:
                out[name] = stat(snap, name)
        else:
            out[name] = getattr(getattr(snap, layer), name)
    return out


def release_rows(result):
    """Rows (what, before, after, change) of a release action's result.

    ``before``/``after`` may be Snapshots (diag.actions) or dicts of numbers.
    """
    if not isinstance(result, dict):
        return [("result", str(result), "", "")]
    before, after = result.get("before"), result.get("after")
    if hasattr(before, "process"):
        before = snapshot_numbers(before)
    if hasattr(after, "process"):
        after = snapshot_numbers(after)
    if isinstance(before, dict) and isinstance(after, dict):
        rows = []
        for k in list(before) + [k for k in after if k not in before]:
            b, a = before.get(k), after.get(k)
            if isinstance(b, dict):
                b = b.get("value")
            if isinstance(a, dict):
                a = a.get("value")
            lab = BY_NAME[k].label if k in BY_NAME else str(k)
            if isinstance(b, int) and isinstance(a, int):
                rows.append((lab, human_bytes(b), human_bytes(a), signed_bytes(a - b)))
            elif b is None and a is None:
                continue
            else:
                def show(v):
                    if v is None:
                        return "unknown"
                    return human_bytes(v) if isinstance(v, int) and not isinstance(v, bool) \
                        else cell(k, v)
                rows.append((lab, show(b), show(a), ""))
        for k, v in result.items():
            if k not in ("before", "after"):
                rows.append((str(k), _pause(v) if k == "pause_us" else cell(k, v), "", ""))
        return rows
    return [(str(k), cell(k, v), "", "") for k, v in result.items()]


def signed_bytes(n):
    """A change in bytes: +1.0 MiB, −1.0 MiB, 0 B."""
    if n == 0:
        return human_bytes(0)
    return ("+" if n > 0 else "−") + human_bytes(abs(n))


def _pause(v):
    if isinstance(v, (list, tuple)) and all(isinstance(x, int) for x in v):
        return f"{sum(v)} µs ({len(v)} stops)"
    return f"{v} µs" if isinstance(v, int) else cell("pause_us", v)
