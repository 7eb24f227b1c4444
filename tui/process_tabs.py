"""What the process screen's tabs draw from a ``layers.ProcessView``: the
texts and rows its bound widgets show, and the Findings pane (a table and
the detail of its highlighted row, drawn together so they always agree)."""

from rich.text import Text
from textual import on
from textual.widgets import DataTable, Static, TabPane

from diag.render import evidence_text, human_bytes
from tui import layers
from tui.widgets import Bound, fill_table

STATS_COLUMNS = ("field", "value", "provenance", "source", "meaning")
STATS_RIGHT = (1,)
FINDINGS_COLUMNS = ("severity", "finding", "knob", "current", "source", "suggested", "effect")
FINDINGS_RIGHT = (6,)
COLLECTORS_COLUMNS = ("collector", "status", "took", "target paused", "note")
COLLECTORS_RIGHT = (2, 3)
PROCESS_FIELDS = ("pss", "swap", "anon_thp", "vm_size")


def alloc_title(snap):
    """'jemalloc 5.3.0 (preload)': the allocator, as the header's sub-title."""
    a = snap.allocator
    version = (a.version or "").split("-g")[0] or None
    return " ".join(x for x in (a.kind, version, f"({a.linkage})" if a.linkage else None) if x)


def extra_text(view):
    """The allocator numbers outside the bars, on one dim line."""
    extra = layers.extra_stats(view.snapshot)
    text = " · ".join(f"{k} {'unknown' if v is None else human_bytes(v)}" for k, v in extra)
    return Text(text, style="dim", no_wrap=True, overflow="ellipsis")


def stats_rows(view):
    return layers.stats_rows(view.snapshot)


def finding_rows(snap):
    rows = []
    for f in snap.findings:
        k = f.knob
        rows.append((f.severity, f.title, k.name if k else "", (k.current or "") if k else "",
                     (k.source or "") if k else "", (k.suggested or "") if k else "",
                     human_bytes(f.expected_effect_bytes)
                     if f.expected_effect_bytes is not None else ""))
    return rows


def finding_text(f, rss=None):
    """The detail of finding F: evidence (units from diag.render.evidence_text,
    bytes also as a share of RSS), knob and how to set it."""
    text = Text()
    text.append(f"{f.title}\n", style="bold")
    text.append(f"confidence {f.confidence}")
    if f.expected_effect_bytes is not None:
        text.append(f" · expected effect {human_bytes(f.expected_effect_bytes)}")
    text.append("\n")
    for k, v in f.evidence.items():
        text.append(f"  {k}: {evidence_text(k, v, rss)}\n", style="dim")
    if f.knob is not None:
        text.append(f"knob {f.knob.name} = {f.knob.current or 'unset'}"
                    f" (from {f.knob.source or 'default'})")
        if f.knob.suggested:
            text.append(f" → suggested {f.knob.suggested}")
        if f.knob.how:
            text.append(f"\nhow: {f.knob.how}")
        text.append("\npress k to set it at runtime")
    return text


def process_text(view):
    """Identity, allocator evidence, preload verdict and kernel numbers."""
    snap = view.snapshot
    p = snap.preload
    text = Text()
    text.append(f"{snap.pid} {snap.comm or '?'}", style="bold")
    text.append(f"  {snap.exe or ''}\n")
    a = snap.allocator
    text.append(f"allocator: {a.kind} {a.version or ''} {a.linkage or ''} "
                f"{a.path or ''}\n")
    for e in a.evidence:
        text.append(f"  · {e}\n", style="dim")
    if a.others:
        text.append("also loaded (not serving malloc): "
                    + ", ".join(o.kind for o in a.others) + "\n")
    text.append(f"preload: {p.verdict}\n")
    for r in p.reasons:
        text.append(f"  · {r}\n", style="dim")
    pm = snap.process
    text.append(" · ".join(f"{layers.label(n)} {human_bytes(getattr(pm, n))}"
                           for n in PROCESS_FIELDS))
    text.append(f" · {layers.label('threads')} {pm.threads if pm.threads is not None else '-'}")
    if snap.cgroup.path:
        text.append(f"\ncgroup v{snap.cgroup.version}: {snap.cgroup.path}")
    return text


def collector_rows(view):
    return [(name, "ok" if s.ok else "FAILED", f"{s.duration_s * 1000:.1f} ms",
             f"{s.pause_us} µs" if s.pause_us is not None else "", s.error or "")
            for name, s in view.snapshot.collectors.items()]


class FindingsPane(Bound, TabPane):
    """The Findings tab: every finding of the view's snapshot, and the
    detail of the highlighted one."""

    def __init__(self, title, **kwargs):
        super().__init__(title, **kwargs)
        self.table = DataTable(id="findings-table", cursor_type="row", zebra_stripes=True)
        self.detail = Static("", id="finding-detail")

    def compose(self):
        yield self.table
        yield self.detail

    def show_view(self, view):
        fill_table(self.table, FINDINGS_COLUMNS, finding_rows(view.snapshot),
                   right=FINDINGS_RIGHT)
        self._show_detail()

    def selected(self):
        """The highlighted finding, or None."""
        findings = self.view.snapshot.findings if self.view is not None else ()
        row = self.table.cursor_row if self.table.row_count else 0
        if 0 <= row < len(findings):
            return findings[row]
        return None

    def _show_detail(self):
        f = self.selected()
        if f is None:
            self.detail.update("no findings" if self.view is not None else "")
        else:
            self.detail.update(finding_text(f, self.view.snapshot.process.rss))

    @on(DataTable.RowHighlighted, "#findings-table")
    def _highlighted(self, event):
        self._show_detail()
