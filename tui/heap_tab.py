"""The Heap tab of the process view (issue 10): the allocator's own heap
profiler in the watched process -- status, start (asked first: it changes
the target's behaviour and costs it time), dump with the top sites, the diff
of the last two dumps next to the allocator and kernel layers of the same
two moments, stop.

Every call goes through the source (``diag.source`` ``heap_*``, which
delegate to ``collectors.heapcontrol``) in a worker thread, under the
screen's one-call-at-a-time lock; nothing is called in the process until
the user presses a key.  An allocator without a heap profiler gets
heapcontrol's reason and its recipe ("not possible, here is how").
"""

import os
from collections import deque, namedtuple

from rich.text import Text
from textual import on, work
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Button, DataTable, Static

from diag.model.errors import AllocdiagError
from diag import heapview
from diag.allocators import for_kind
from diag.render import human_bytes
from tui.dialogs import ConfirmDialog
from tui.layers import signed_bytes
from tui.messages import HeapFinished, clock, error_text
from diag.source import NEEDS_LIVE_PROCESS
from tui.widgets import fill_table

TOP_SITES = 100         # rows of the sites table (heapview.sites: biggest in-use first)
DIFF_ROWS = 50          # rows each of the sites that grew and that shrank
SITE_COLUMNS = ("in use", "objects", "allocated", "function", "called from", "object")
SITE_RIGHT = (0, 1, 2)
DIFF_COLUMNS = ("site", "in use Δ", "objects Δ", "A", "B", "function", "called from", "object")
DIFF_RIGHT = (1, 2, 3, 4)
LAYER_COLUMNS = ("layer", "A", "B", "Δ")
LAYER_RIGHT = (1, 2, 3)

KEYS = "s: status, then start · d: dump now · D: diff of the last two dumps · x: stop"
INTRO = ("Heap profiles through the allocator's own profiler: gperftools (full "
         "libtcmalloc.so.4) or jemalloc started with prof:true.\n" + KEYS + "\n"
         "Nothing is called in the process until you press one of these keys.")
NO_ATTACH = ("heap profiles call into the process: this view was started with --no-attach")
GROWTH = ("It sees only allocations after start: the growth from now on, never what is "
          "already allocated.")
WORKING = {"status": "asking the allocator", "start": "starting the profiler",
           "dump": "taking a profile", "diff": "comparing the last two dumps",
           "stop": "stopping the profiler"}

Dump = namedtuple("Dump", "number view snapshot sites info")


def _caller(stack):
    return stack[1] if len(stack) > 1 else ""


def _object(path):
    return os.path.basename(path) if path else ""


def alloc_known(view):
    """Whether the profile counts allocations since the start.  jemalloc
    writes zeros without prof_accum.  (pprof's has_alloc also says no when
    the counts equal the in-use ones, which a gperftools profile of a program
    that freed nothing since the start legitimately has.)"""
    t = view.totals()
    return bool(t["alloc_objects"] or t["alloc_bytes"])


def site_rows(view, sites, n=TOP_SITES):
    """Rows of the sites table; allocation totals '-' when the profile has
    none (jemalloc without prof_accum)."""
    has_alloc = alloc_known(view)
    return [(human_bytes(e["inuse_bytes"]), f"{e['inuse_objects']:,}",
             human_bytes(e["alloc_bytes"]) if has_alloc else "-",
             e["function"], _caller(e["stack"]), _object(e["object"])) for e in sites[:n]]


def diff_rows(doc, n=DIFF_ROWS):
    """Grew (largest first) then shrank (largest first) rows of diff_json's sites."""
    grew = [e for e in doc["sites"] if e["delta"]["inuse_bytes"] > 0][:n]
    shrank = [e for e in reversed(doc["sites"]) if e["delta"]["inuse_bytes"] < 0][:n]
    return [(word, signed_bytes(e["delta"]["inuse_bytes"]), f"{e['delta']['inuse_objects']:+,}",
             human_bytes(e["a"]["inuse_bytes"]), human_bytes(e["b"]["inuse_bytes"]),
             e["function"], _caller(e["stack"]), _object(e["object"]))
            for word, rows in (("grew", grew), ("shrank", shrank)) for e in rows]


def layer_rows(doc):
    return [(row["layer"], human_bytes(row["a"]), human_bytes(row["b"]),
             signed_bytes(row["delta"]) if row["delta"] is not None else "unknown")
            for row in doc["layers"]]


def status_text(doc):
    """heapcontrol.status as the tab shows it: possible or not, why, and how."""
    text = Text()
    a = doc["allocator"]
    text.append(f"{a['kind']}{' ' + a['variant'] if a.get('variant') else ''}"
                f"{' ' + a['version'] if a.get('version') else ''}: ")
    if doc["possible"]:
        text.append("heap profiling possible", style="bold green")
    else:
        text.append("heap profiling NOT possible", style="bold red")
    text.append(f" — {doc['reason']}\n")
    if doc["possible"]:
        text.append(f"through {doc['how']}\n")
        text.append("running now: ")
        text.append("yes" if doc["running"] else "no", style="bold")
        text.append("\n")
    for note in doc["notes"]:
        text.append(f"note: {note}\n", style="dim")
    for f in doc.get("files") or ():
        text.append(f"on disk: {f['path']} ({human_bytes(f['bytes'])}, {f['source']})\n",
                    style="dim")
    if doc["remedy"]:
        text.append("how: ", style="bold")
        text.append(doc["remedy"])
    text.rstrip()
    return text


def _pause(info):
    pauses = info.get("pause_us") or ()
    return f", target paused {max(pauses) / 1000:.1f} ms" if pauses else ""


def dump_title(d, shown=()):
    """The dump's totals, format, call and pause, and the notes not already
    SHOWN (the status above says the growth note once)."""
    t = d.view.totals()
    p = d.view.profile
    sampling = "every allocation" if p.rate <= 1 else f"sampled 1 in {p.rate} bytes, scaled"
    ts = d.snapshot.taken_at if d.snapshot is not None else None
    text = Text()
    text.append(f"dump {d.number} · {clock(ts)} · in use {human_bytes(t['inuse_bytes'])} in "
                f"{t['inuse_objects']:,} objects", style="bold")
    if alloc_known(d.view):
        text.append(f" · allocated since start {human_bytes(t['alloc_bytes'])} in "
                    f"{t['alloc_objects']:,}")
    text.append(f"\n{p.format} ({sampling}) · {len(d.sites)} sites"
                f"{' (top ' + str(TOP_SITES) + ')' if len(d.sites) > TOP_SITES else ''}"
                f" · {d.info.get('call') or ''}{_pause(d.info)}", style="dim")
    for note in list(d.info.get("notes") or ()) + list(p.warnings) + list(d.view.warnings):
        if note not in shown:
            text.append(f"\nnote: {note}", style="dim")
    return text


def diff_title(a, b, doc):
    delta = doc["delta"]
    grew = sum(1 for e in doc["sites"] if e["delta"]["inuse_bytes"] > 0)
    shrank = sum(1 for e in doc["sites"] if e["delta"]["inuse_bytes"] < 0)
    text = Text()
    text.append(f"diff dump {a.number} → dump {b.number} · in use "
                f"{human_bytes(doc['a']['totals']['inuse_bytes'])} → "
                f"{human_bytes(doc['b']['totals']['inuse_bytes'])} "
                f"({signed_bytes(delta['inuse_bytes'])}, {delta['inuse_objects']:+,} objects)",
                style="bold")
    text.append(f"\n{grew} sites grew, {shrank} shrank", style="dim")
    for w in doc["warnings"]:
        text.append(f"\nwarning: {w}", style="dim")
    return text


def verdict_text(doc):
    parts = ", ".join(f"{heapview.VERDICT_PART_LABELS[k]} {signed_bytes(v)}"
                      for k, v in doc["verdict_parts"].items())
    text = Text()
    text.append("verdict: ", style="bold")
    text.append(f"{doc['verdict']}  [{parts}]")
    if not doc["layers"]:
        text.append("\nno snapshot of the process at one of the dumps: allocator and kernel "
                    "layers not compared", style="dim")
    return text


def compare(a, b):
    """diag.heapview's diff of two Dumps, as JSON, with the inspect
    documents of the two moments as the layers' context."""
    ctx = [d.snapshot.to_json() if d.snapshot is not None else None for d in (a, b)]
    return heapview.diff_json(heapview.diff(a.view, b.view), *ctx)


class HeapTab(VerticalScroll):
    """Status/start, dump, diff and stop of the watched process's heap
    profiler.  SOURCE: the screen's source; LOCK: its one-call lock."""

    def __init__(self, source, lock, **kwargs):
        super().__init__(**kwargs)
        self.source, self.lock = source, lock
        self.status = None                  # the last heapcontrol.status document
        self.dumps = deque(maxlen=2)        # the last two Dumps, for the diff
        self.dumped = 0
        self.busy = False
        self.after_status = None            # 'start' or 'stop': what a status leads to
        # A profiler this view started (and not stopped): it costs the target
        # time, so leaving the view stops it.  Set when the start is confirmed,
        # before the call: a view closed during the start still stops it.
        self.started_here = False
        self.state = Static(id="heap-state")
        self.sites_title = Static(id="heap-sites-title", classes="heap-title")
        self.sites = DataTable(id="heap-sites", cursor_type="row", zebra_stripes=True)
        self.diff_title = Static(id="heap-diff-title", classes="heap-title")
        self.diff = DataTable(id="heap-diff", cursor_type="row", zebra_stripes=True)
        self.layers_table = DataTable(id="heap-layers", cursor_type="none")
        self.verdict = Static(id="heap-verdict")

    def compose(self):
        with Horizontal(id="heap-buttons"):
            yield Button("s status/start", id="heap-status", compact=True)
            yield Button("d dump", id="heap-dump", compact=True)
            yield Button("D diff", id="heap-diff-button", compact=True)
            yield Button("x stop", id="heap-stop", compact=True)
        yield self.state
        yield self.sites_title
        yield self.sites
        yield self.diff_title
        yield self.diff
        yield self.layers_table
        yield self.verdict

    def on_mount(self):
        self.state.update(Text(self.unavailable() or INTRO))
        for w in (self.sites_title, self.sites, self.diff_title, self.diff, self.layers_table,
                  self.verdict):
            w.display = False
        if self.unavailable():
            self.query_one("#heap-buttons").display = False

    def on_unmount(self):
        """Stop the profiler this view started: leaving it on would keep
        slowing the target down after the view is gone.  Waits for a call in
        flight (the lock), then one short stop of the target."""
        if not self.started_here:
            return
        self.started_here = False
        try:
            with self.lock:
                self.source.heap_stop()
        except Exception:       # the process may be gone; nothing to show any more
            pass

    def unavailable(self):
        """Why this source cannot profile (a recording; --no-attach), or None."""
        if not getattr(self.source, "live", True):
            return NEEDS_LIVE_PROCESS
        if getattr(self.source, "no_attach", False):
            return NO_ATTACH
        return None

    def tell(self, message, **kw):
        self.app.notify(message, markup=False, **kw)

    # requests (keys on the screen, buttons here)
    def request(self, action):
        """ACTION: 'status' (then start, asked first), 'dump', 'diff', 'stop'."""
        why = self.unavailable()
        if why:
            self.tell(why, severity="warning")
            return
        if self.busy:
            self.tell("a heap call is still running", severity="warning")
            return
        if action == "diff" and len(self.dumps) < 2:
            self.tell("dump twice (d) to see what grew between the two", severity="warning")
            return
        if action == "status":
            self.after_status = "start"
        elif action == "stop":
            # whose profiler it is decides how to stop it: ask the process first
            self.after_status, action = "stop", "status"
        self._run(action)

    @staticmethod
    def _not_ours(doc):
        """The last status shows a gperftools profile running that allocdiag
        did not start (the program's own HEAPPROFILE): heapcontrol leaves it
        alone unless forced."""
        return bool(doc and doc["running"]
                    and for_kind(doc["allocator"]["kind"]).vocabulary.program_starts_profiler
                    and not doc["work_dir"])

    def _force_question(self):
        return (f"The heap profiler in process {self.source.pid} was not started by allocdiag "
                f"(the program's own HEAPPROFILE or HeapProfilerStart).\n\nStop it anyway? "
                f"HeapProfilerStop drops its data and the program writes no more profiles.")

    def _force_confirmed(self, yes):
        if yes:
            self._run("stop", force=True)

    @on(Button.Pressed, "#heap-buttons Button")
    def _button(self, event):
        event.stop()
        self.request({"heap-status": "status", "heap-dump": "dump",
                      "heap-diff-button": "diff", "heap-stop": "stop"}[event.button.id])

    def _run(self, action, **kwargs):
        self.busy = True
        self.state.update(Text(f"{WORKING[action]}…", style="italic"))
        self._call(action, tuple(self.dumps), kwargs)

    @work(thread=True, group="heap", exit_on_error=False)
    def _call(self, action, dumps, kwargs):
        try:
            if action == "diff":
                a, b = dumps[-2:]
                result = (a, b, compare(a, b))
            else:
                with self.lock:
                    result = getattr(self.source, f"heap_{action}")(**kwargs)
                if action == "dump":
                    result = dict(result, sites=heapview.sites(result["view"]))
            self.post_message(HeapFinished(action, result=result))
        except Exception as exc:    # shown in the tab; never a traceback
            self.post_message(HeapFinished(action, error=exc))

    # results
    def on_heap_finished(self, msg):
        self.busy = False
        if msg.error is not None:
            self._failed(msg.action, msg.error)
            return
        getattr(self, f"_{msg.action}_done")(msg.result)

    def _failed(self, action, exc):
        self.after_status = None
        text = Text(f"heap {action} failed: {error_text(exc)}", style="bold red")
        remedy = getattr(exc, "remediation", None) if isinstance(exc, AllocdiagError) else None
        if remedy:
            text.append(f"\nhow: {remedy}", style="")
        self.state.update(text)
        self.tell(error_text(exc), title=f"heap {action} failed", severity="error", timeout=8)

    def _status_done(self, doc):
        self.status = doc
        self.state.update(status_text(doc))
        then, self.after_status = self.after_status, None
        if then == "start" and doc["possible"] and not doc["running"]:
            self.app.push_screen(ConfirmDialog(self._start_question(doc), yes="Start"),
                                 self._confirmed)
        elif then == "stop" and self._not_ours(doc):
            self.app.push_screen(ConfirmDialog(self._force_question(), yes="Stop it"),
                                 self._force_confirmed)
        elif then == "stop" and doc["possible"]:
            self._run("stop")

    def _start_question(self, doc):
        kind = doc["allocator"]["kind"]
        return (f"Start the heap profiler in process {self.source.pid}?\n\n"
                f"{doc['how']}.\n{GROWTH}\n{for_kind(kind).vocabulary.heap_profile_cost or ''}\n"
                f"It stays on until x stops it or you leave this view.")

    def _confirmed(self, yes):
        if yes:
            self.started_here = True
            self._run("start")

    def _start_done(self, result):
        self.started_here = not result["was_running"]       # someone else's: left alone
        self.tell(f"{result['call']}{_pause(result)}", title="heap profiler started")
        self._run("status")

    def _stop_done(self, result):
        self.started_here = False
        self.tell(f"{result['call'] or 'not running'}; "
                  + "; ".join(result.get("notes") or ()), title="heap profiler stopped")
        self._run("status")

    def _dump_done(self, result):
        self.dumped += 1
        info = {k: v for k, v in result.items() if k not in ("view", "snapshot", "sites")}
        d = Dump(self.dumped, result["view"], result["snapshot"], result["sites"], info)
        self.dumps.append(d)
        self.state.update(status_text(self.status) if self.status else Text(KEYS, style="dim"))
        self.sites_title.update(dump_title(d, self.status["notes"] if self.status else ()))
        fill_table(self.sites, SITE_COLUMNS, site_rows(d.view, d.sites), right=SITE_RIGHT)
        self.sites_title.display = self.sites.display = True
        self._show(self.sites_title)

    def _diff_done(self, result):
        a, b, doc = result
        self.state.update(status_text(self.status) if self.status else Text(KEYS, style="dim"))
        self.diff_title.update(diff_title(a, b, doc))
        fill_table(self.diff, DIFF_COLUMNS, diff_rows(doc), right=DIFF_RIGHT)
        fill_table(self.layers_table, LAYER_COLUMNS, layer_rows(doc), right=LAYER_RIGHT)
        self.verdict.update(verdict_text(doc))
        for w in (self.diff_title, self.diff, self.verdict):
            w.display = True
        self.layers_table.display = bool(doc["layers"])
        self._show(self.diff_title)

    def _show(self, widget):
        """Scroll so the new result starts at the top (as far as the content
        allows) once it is laid out."""
        self.call_after_refresh(self.scroll_to_widget, widget, top=True, animate=False)
