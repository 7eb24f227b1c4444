"""The Time tab of the process view (issue 20): the allocation wall, live.

While the tab is open, a worker thread samples the process in windows of
WINDOW_S seconds (``source.wall``: perf_event_open through diag.wallsample,
no thread stopped for the sampling) and posts ONE ``WallTaken`` per window
with an immutable ``diag.model.wall.Wall``; the widgets only render it.  Leaving
the tab (or the view), or pausing the view, ends the window in progress and
stops sampling.

A replay shows the windows a ``record --wall`` recording holds, the one that
covers the sample under the cursor; a recording without them, and a view
started with --no-attach, say why there is nothing to show.

Figures and words come from the model (diag.model.wall) and its field rows
(diag.fields WALL_BY_NAME): what a share is of, what "unknown" means.
"""

import threading

from rich.text import Text
from textual import work
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import DataTable, Static

from diag.model import wall as W
from diag.fields import WALL_BY_NAME
from diag.render_wall import counters_left_out, counters_shown
from diag.wallfile import wall_at
from tui.messages import clock, error_text
from tui.widgets import Bound, fill_table

WINDOW_S = 3.0          # seconds per window: ~300 samples per busy thread at 99 Hz
BAR_WIDTH = 60          # cells of the CPU split bar (fewer on a narrow terminal)
TOP_FUNCTIONS = 4       # allocator functions drawn as their own segment; the rest "other"
TOP_SITES = 15
TOP_COUNTERS = 30
COUNTERS_TITLE = "the allocator's own counters over the window"
PREVIOUS_WAIT_S = 10.0  # at most this long for the previous worker's window to close

# roles of the CPU bar: (colour, glyph); the glyph tells them apart without colour
APPLICATION = ("#5f87ff", "█")
ALLOCATOR = ("#ff8700", "#d75f00", "#ffaf00", "#d7875f", "#af5f00")   # one per function
ALLOCATOR_GLYPH = "▓"
UNKNOWN = ("#808080", "░")
KERNEL = ("#d75fd7", "▒")
LOCK = ("#d70000", "▓")

RATE_COLUMNS = ("figure", "per second", "from allocator", "count", "stacks looked at")
RATE_RIGHT = (1, 2, 3, 4)
SITE_COLUMNS = ("call site", "allocator CPU", "lock wait", "entry", "called from")
SITE_RIGHT = (1, 2)
COUNTER_COLUMNS = ("counter", "Δ", "per second", "start", "end", "unit", "provenance")
COUNTER_RIGHT = (1, 2, 3, 4)

INTRO = ("The allocation wall: where this process's CPU and waiting go in its allocator.\n"
         f"Sampled with perf_event_open in windows of {WINDOW_S:g} s while this tab is open "
         "(no thread is stopped for it); leaving the tab stops it.")


class WallTaken(Message):
    """One window ended (WALL) or could not be sampled (ERROR); for the tab only."""

    bubble = False

    def __init__(self, wall=None, error=None, run=None):
        super().__init__()
        self.wall, self.error, self.run = wall, error, run


# -- texts and rows (pure functions of a Wall) ------------------------------------------

def pct(share):
    return "unknown" if share is None else f"{share * 100:.1f}%"


def secs(s):
    if s is None:
        return "unknown"
    return f"{s * 1000:.0f} ms" if abs(s) < 1 else f"{s:.2f} s"


def per_s(v):
    if v is None:
        return "unknown"
    return f"{v:,.0f}" if abs(v) >= 10 else f"{v:,.1f}"


def cpu_segments(cpu, top=TOP_FUNCTIONS):
    """[(label, share, (colour, glyph))] of the on-CPU split: application,
    the allocator by function (TOP named, the rest together), unknown.  They
    add up to 1 (the allocator's functions to its share)."""
    if cpu is None or not cpu.samples:
        return []
    segs = [("application", cpu.application_share or 0.0, APPLICATION)]
    named = 0.0
    for i, f in enumerate(cpu.by_function[:top]):
        segs.append((f.function, f.share, (ALLOCATOR[i % len(ALLOCATOR)], ALLOCATOR_GLYPH)))
        named += f.share
    rest = (cpu.allocator_share or 0.0) - named
    if rest > 1e-9:
        segs.append(("other allocator functions", rest, (ALLOCATOR[-1], ALLOCATOR_GLYPH)))
    segs.append(("unknown (walk stopped early)", cpu.unknown_share or 0.0, UNKNOWN))
    return segs


def bar(segments, width):
    """SEGMENTS [(label, share, (colour, glyph))] as WIDTH cells (largest
    remainder: the cells add up to WIDTH when the shares add up to 1)."""
    text = Text(no_wrap=True)
    done, acc = 0, 0.0
    for _label, share, (colour, glyph) in segments:
        acc += max(0.0, share)
        n = max(0, min(width, round(acc * width)) - done)
        text.append(glyph * n, style=colour)
        done += n
    text.append(" " * (width - done))
    return text


def legend(items, width):
    """ITEMS [(glyph, colour, text)] on as many lines of WIDTH as they need,
    never broken inside an item."""
    text, used = Text(), 0
    for glyph, colour, piece in items:
        need = 4 + len(piece)
        if used and used + need > width:
            text.append("\n")
            used = 0
        text.append(f"  {glyph} ", style=colour)
        text.append(piece)
        used += need
    return text


def header_text(w, number=None, recorded=False):
    """Which window, how dense, and how much of it could be read."""
    win = w.window
    text = Text()
    what = "recorded window" if recorded else (f"window {number}" if number else "window")
    text.append(f"{what} · {clock(win.start)} · {win.duration_s:.1f} s", style="bold")
    if win.ended != W.COMPLETE:
        text.append(f" ({win.ended})", style="bold")
    text.append(f" · {win.hz} Hz · {win.samples:,} CPU samples · "
                f"{win.switch_samples:,} switch-outs · {win.threads_seen} threads")
    if win.allocator:
        text.append(f" · allocator {win.allocator}")
    if win.lost:
        text.append(f" · {win.lost:,} records lost", style="bold red")
    if win.reader_cpu_s is not None and win.duration_s:
        text.append(f" · allocdiag used {win.reader_cpu_s / win.duration_s * 100:.1f}% "
                    "of a CPU", style="dim")
    return text


def _framed_bar(text, segs, width):
    """Append the bar of SEGS to TEXT between its dim end marks."""
    text.append("▕", style="dim")
    text.append_text(bar(segs, width))
    text.append("▏", style="dim")


def cpu_text(w, width=BAR_WIDTH):
    """The CPU split bar, its legend and the kernel-mode share."""
    cpu = w.cpu
    text = Text()
    text.append("on-CPU time", style="bold")
    if cpu is None or not cpu.samples:
        text.append("\n  no CPU samples in this window (the process did not run, or "
                    "sampling was refused: see missing figures)", style="dim")
        return text
    text.append(f"  {cpu.samples:,} samples = {secs(cpu.seconds)} of CPU · "
                f"{WALL_BY_NAME['cpu.allocator_share'].label} ")
    text.append(pct(cpu.allocator_share), style="bold")
    text.append(f" ({secs(cpu.allocator_s)})\n")
    segs = cpu_segments(cpu)
    _framed_bar(text, segs, width)
    text.append("\n")
    text.append_text(legend([(glyph, colour, f"{label} {pct(share)}")
                             for label, share, (colour, glyph) in segs], width + 2))
    # kernel-mode samples overlap the split above (each is charged to the user
    # stack that entered the kernel): their own bar, on the same scale
    text.append("\n")
    _framed_bar(text, [("in kernel", cpu.kernel_share or 0.0, KERNEL)], width)
    text.append(f" in kernel {pct(cpu.kernel_share)}\n")
    text.append("  kernel samples are charged to the user stack that entered the kernel (a "
                f"madvise inside free is allocator time) · unwound to the first frame "
                f"{pct(cpu.unwound_share)}", style="dim")
    if cpu.by_entry:
        text.append("\n  by entry point: " + ", ".join(
            f"{f.function} {pct(f.share)}" for f in cpu.by_entry[:6]), style="dim")
    return text


def lock_text(w, width=BAR_WIDTH):
    """Time blocked on allocator locks, next to all blocked and preempted time."""
    off = w.off_cpu
    text = Text()
    text.append("waiting", style="bold")
    if off is None:
        text.append("\n  not measured in this window (see missing figures)", style="dim")
        return text
    text.append(f"  thread time {secs(off.thread_s)} · "
                f"{WALL_BY_NAME['off_cpu.allocator_lock_s'].label} ")
    text.append(f"{secs(off.allocator_lock_s)} ({pct(off.allocator_lock_share)})", style="bold")
    text.append(f" in {off.allocator_lock_switches:,} switch-outs\n")
    _framed_bar(text, [("lock", off.allocator_lock_share or 0.0, LOCK)], width)
    text.append("\n")
    text.append(f"  blocked {secs(off.blocked_s)} ({pct(off.blocked_share)}, "
                f"{off.blocked_switches:,} switch-outs) · preempted {secs(off.preempted_s)} "
                f"({off.preempted_switches:,}): runnable but no CPU, not a lock wait", style="dim")
    if off.by_function:
        text.append("\n  waiting in: " + ", ".join(
            f"{f.function} {secs(f.seconds)}" for f in off.by_function[:4]), style="dim")
    return text


def rate_rows(w):
    """Faults and the mmap-family syscalls, per second, with the allocator's share."""
    rows = []
    f = w.faults
    if f is not None:
        rows.append(("minor page faults", per_s(f.minor_per_s), "", _n(f.minor), ""))
        rows.append(("major page faults", per_s(f.major_per_s), "", _n(f.major), ""))
    for name in W.SYSCALLS:
        s = w.syscalls.get(name)
        if s is None:
            continue
        rows.append((name, per_s(s.per_s), pct(s.from_allocator_share), _n(s.count),
                     f"{s.sampled:,}" + (f" ({s.unknown} unknown)" if s.unknown else "")))
    return rows


def _n(v):
    return "unknown" if v is None else f"{v:,}"


def site_rows(w, n=TOP_SITES):
    return [(s.function, secs(s.allocator_cpu_s), secs(s.lock_wait_s), s.entry or "",
             s.frames[1] if len(s.frames) > 1 else "") for s in w.sites[:n]]


def _count(v, unit):
    if v is None:
        return "unknown"
    if unit == "ns":
        return secs(v / 1e9)
    return f"{v:,.0f}" if isinstance(v, (int, float)) else str(v)


def shown_counters(w):
    """The allocator's own counters worth a row, by the text report's rule
    (diag.render_wall.counters_shown: the counts that moved, fastest first,
    then the levels not at 0), at most TOP_COUNTERS."""
    return counters_shown(w, TOP_COUNTERS)


def counter_rows(shown):
    """The table rows of SHOWN (shown_counters)."""
    return [(c.name, _count(c.delta, c.unit),
             per_s(c.per_s) if c.per_s is not None else "", _count(c.start, c.unit),
             _count(c.end, c.unit), c.unit + (" (level)" if c.kind == "gauge" else ""),
             c.provenance) for c in shown]


def counters_title(w, shown):
    """The counter table's title, with how many counters SHOWN left out."""
    left_out = counters_left_out(w, shown)
    return COUNTERS_TITLE + (f" ({left_out})" if left_out else "")


def notes_text(w):
    """Findings, then what could not be measured and how to fix it."""
    text = Text()
    for f in w.findings:
        text.append(f"{f.severity}: {f.title}", style="bold")
        if f.knob is not None:
            text.append(f" — knob {f.knob.name}"
                        + (f" → {f.knob.suggested}" if f.knob.suggested else ""))
        text.append("\n")
    if not w.counters:
        text.append("allocator counters: none in this window (the allocator has none, or "
                    "they were not read)\n", style="dim")
    for m in w.window.missing:
        text.append(f"missing {m.figure}: {m.reason}", style="yellow")
        if m.fix:
            text.append(f" — fix: {m.fix}", style="dim")
        text.append("\n")
    text.rstrip()
    return text


# -- the widget -----------------------------------------------------------------------------

class WallTab(Bound, VerticalScroll):
    """The Time tab.  SOURCE: the screen's source (``wall``, ``walls``,
    ``wall_unavailable``); LOCK: its one-call lock (the counter reads);
    RECORD(wall), called in the worker: the screen writes the window into
    the recording it is making, if any.
    ``start()``/``stop()`` follow the tab's activation; bound to the screen's
    view, a replay shows the recorded window of the sample under the cursor."""

    def __init__(self, source, lock=None, record=None, **kwargs):
        super().__init__(**kwargs)
        self.source, self.lock = source, lock
        self.record = record                # record(wall): the screen's recording, if any
        self.live = bool(getattr(source, "live", True))
        self.wall = None                    # the Wall on screen
        self.windows = 0                    # windows shown since the view opened
        self._stop = None                   # threading.Event of the running worker
        self._done = threading.Event()      # set when the last worker has returned
        self._done.set()
        self._run = 0                       # which start() a message belongs to
        self.state = Static(id="wall-state")
        self.cpu = Static(id="wall-cpu")
        self.lock = Static(id="wall-lock")
        self.rates = DataTable(id="wall-rates", cursor_type="none", zebra_stripes=True)
        self.sites = DataTable(id="wall-sites", cursor_type="row", zebra_stripes=True)
        self.counters = DataTable(id="wall-counters", cursor_type="row", zebra_stripes=True)
        self.notes = Static(id="wall-notes")

    def compose(self):
        yield self.state
        yield self.notes
        yield self.cpu
        yield self.lock
        yield Static("faults and syscalls (per second of the window; from allocator: share "
                     "of the calls whose stack holds an allocator frame)",
                     classes="wall-title", id="wall-rates-title")
        yield self.rates
        yield Static("call sites: the first frame outside the allocator",
                     classes="wall-title", id="wall-sites-title")
        yield self.sites
        yield Static(COUNTERS_TITLE, classes="wall-title", id="wall-counters-title")
        yield self.counters

    def on_mount(self):
        self.state.update(Text(self.unavailable() or INTRO))
        self._show_parts(False)

    def on_unmount(self):
        self.stop()

    def unavailable(self):
        why = getattr(self.source, "wall_unavailable", None)
        if why is None:
            return "this source cannot sample the allocation wall"
        return why()

    @property
    def sampling(self):
        return self._stop is not None

    # -- sampling while open ---------------------------------------------------------
    def start(self):
        """Sample window after window until ``stop()`` (the tab was left)."""
        if not self.live or self.sampling or self.unavailable():
            return
        self._run += 1
        self._stop = threading.Event()
        previous, self._done = self._done, threading.Event()
        if self.wall is None:
            self.state.update(Text(f"sampling the first {WINDOW_S:g} s window…", style="italic"))
        self._windows(self._stop, self._run, previous, self._done)

    def stop(self):
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    @work(thread=True, group="wall", exit_on_error=False)
    def _windows(self, stop, run, previous, done):
        # a worker stopped a moment ago may still be closing its window: one
        # sampling session on the process at a time
        previous.wait(PREVIOUS_WAIT_S)
        try:
            self._window_loop(stop, run)
        finally:
            done.set()

    def _window_loop(self, stop, run):
        while not stop.is_set():
            try:
                w = self.source.wall(WINDOW_S, stop=stop.is_set, lock=self.lock)
            except Exception as exc:        # shown in the tab; never a traceback
                self.post_message(WallTaken(error=exc, run=run))
                return
            if stop.is_set():
                return                      # left mid-window: nobody is looking
            if self.record is not None:
                self.record(w)
            self.post_message(WallTaken(w, run=run))
            if w.window.ended == W.EXITED:
                return

    def on_wall_taken(self, msg):
        if msg.run != self._run:
            return                          # from a worker stopped since
        if msg.error is not None:
            self._stop = None
            text = Text(f"cannot sample the allocation wall: {error_text(msg.error)}",
                        style="bold red")
            remedy = getattr(msg.error, "remediation", None)
            if remedy:
                text.append(f"\nhow: {remedy}", style="")
            self.state.update(text)
            return
        self.windows += 1
        self.show_wall(msg.wall, number=self.windows)
        if msg.wall.window.ended == W.EXITED:
            self._stop = None

    # -- replay ------------------------------------------------------------------------
    def show_view(self, view):
        if self.live:
            return
        walls = self.source.walls() if hasattr(self.source, "walls") else []
        t = view.snapshot.taken_at
        w = wall_at(walls, t) if walls and t is not None else None
        if w is None:
            self.state.update(Text(self.unavailable() or
                                   "no recorded wall window at or before this sample"))
            self._show_parts(False)
            self.wall = None
            return
        if w is not self.wall:
            self.show_wall(w, recorded=True)

    # -- drawing ------------------------------------------------------------------------
    def _show_parts(self, on):
        for w in (self.cpu, self.lock, self.rates, self.sites, self.counters, self.notes,
                  *self.query(".wall-title")):
            w.display = on

    def show_wall(self, w, number=None, recorded=False):
        self.wall = w
        width = max(20, min(BAR_WIDTH, (self.size.width or BAR_WIDTH + 4) - 4))
        self.state.update(header_text(w, number, recorded))
        self.cpu.update(cpu_text(w, width))
        self.lock.update(lock_text(w, width))
        fill_table(self.rates, RATE_COLUMNS, rate_rows(w), right=RATE_RIGHT)
        fill_table(self.sites, SITE_COLUMNS, site_rows(w), right=SITE_RIGHT)
        shown = shown_counters(w)
        fill_table(self.counters, COUNTER_COLUMNS, counter_rows(shown), right=COUNTER_RIGHT)
        self.query_one("#wall-counters-title", Static).update(counters_title(w, shown))
        notes = notes_text(w)
        self.notes.update(notes)
        self._show_parts(True)
        self.notes.display = bool(notes.plain)      # no empty lines where none are
        self.sites.display = self.query_one("#wall-sites-title").display = bool(w.sites)
        self.counters.display = self.query_one("#wall-counters-title").display = \
            bool(w.counters)
