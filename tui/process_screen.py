"""One process: its layers, allocator tables, findings and history.

Tabs are composed in ProcessScreen.compose; a new tab (e.g. a heap profile
view in its own module) is one TabPane there.  Every widget that shows the
sample is bound (data_bind) to the screen's one ``view`` reactive, a
``layers.ProcessView`` built once per refresh, and draws itself from it."""

import logging
import threading
import time
from collections import deque

from rich.text import Text
from textual import on, work
from textual.css.query import NoMatches
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header, Label, Static, TabbedContent, TabPane

from diag.model.errors import AccessDenied, NoSuchProcess
from tui import layers
from tui import process_tabs as tabs
from tui.heap_tab import HeapTab
from tui.wall_tab import WallTab
from tui.process_tabs import FindingsPane
from tui.widgets import HistoryLegend, LayerHistory, NativeTables, StackPanel, ViewStatic, ViewTable

from tui.messages import ActionFinished, DEFAULT_INTERVAL, HISTORY_LIMIT, MIN_INTERVAL, SampleFailed, SampleTaken, clock, error_text
from tui.dialogs import ConfirmDialog, InputDialog, ResultDialog

log = logging.getLogger("tui")


class ProcessScreen(Screen):
    """One process: allocator stack, RSS split, cgroup, history, detail, actions.

    ``source.live`` True: sampled every ``interval`` seconds in a worker.
    False (replay): the whole series is known; left/right step through it.
    """

    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("space", "pause", "Pause"),
        Binding("space", "resume", "Resume"),
        Binding("i", "interval", "Interval"),
        Binding("r", "release", "Release"),
        Binding("k", "knob", "Knob"),
        Binding("w", "record_start", "Record"),
        Binding("w", "record_stop", "Stop rec"),
        Binding("left", "step(-1)", "Prev", priority=True),
        Binding("right", "step(1)", "Next", priority=True),
        Binding("home", "jump(0)", "First", priority=True),
        Binding("end", "jump(-1)", "Last", priority=True),
        Binding("1", "tab('overview')", "Overview", show=False),
        Binding("2", "tab('allocator')", "Allocator", show=False),
        Binding("3", "tab('findings')", "Findings", show=False),
        Binding("4", "tab('process')", "Process", show=False),
        Binding("5", "tab('heap')", "Heap", show=False),
        Binding("6", "tab('wall')", "Time", show=False),
        # the Heap tab's keys, offered while it is the active tab
        Binding("s", "heap('status')", "Heap start"),
        Binding("d", "heap('dump')", "Dump"),
        Binding("D", "heap('diff')", "Diff"),
        Binding("x", "heap('stop')", "Heap stop"),
    ]

    # The sample on screen and its history (layers.ProcessView); every widget
    # that shows it is bound to this one reactive.
    view = reactive(None, repaint=False)

    def __init__(self, source, interval=DEFAULT_INTERVAL, can_go_back=False):
        super().__init__(id=f"process-{source.pid}")
        self.source = source
        self.live = bool(getattr(source, "live", True))
        self.interval = float(interval)
        self.can_go_back = can_go_back
        self.history = deque(maxlen=HISTORY_LIMIT) if self.live else []
        self.cursor = None          # replay: index into history
        self.paused = False
        self.ended = None           # text when the process is gone / unreadable
        self.last_error = None
        self.errors_told = set()
        self.recorder = None
        self._rec_lock = threading.Lock()
        # One call into the target at a time: a sample and an action must never
        # ptrace the same process from two threads at once.
        self._source_lock = threading.Lock()
        self._busy = False
        self._timer = None
        self._closing = False

    def tell(self, message, **kw):
        """A notification; the text is shown as is (never parsed as markup)."""
        self.app.notify(message, markup=False, **kw)

    # layout: every widget that shows the sample is bound to ``view``
    def compose(self):
        bound = ProcessScreen.view
        yield Header()
        with TabbedContent(initial="overview", id="tabs"):
            with TabPane("Overview", id="overview"):
                with VerticalScroll(id="overview-scroll"):
                    yield StackPanel(id="alloc-panel", empty="allocator layer: no data yet",
                                     panel_of=layers.allocator_panel).data_bind(bound)
                    yield ViewStatic(tabs.extra_text, id="alloc-extra",
                                     classes="extra").data_bind(bound)
                    yield StackPanel(id="rss-panel", empty="process RSS: no data yet",
                                     panel_of=layers.rss_panel).data_bind(bound)
                    yield StackPanel(id="cgroup-panel", empty="no memory cgroup",
                                     panel_of=layers.cgroup_panel,
                                     hide_empty=True).data_bind(bound)
                    history = LayerHistory(id="history").data_bind(bound)
                    yield history
                    yield HistoryLegend(history, id="history-legend").data_bind(bound)
            with TabPane("Allocator", id="allocator"):
                with VerticalScroll():
                    yield Label("normalised allocator layer", classes="section")
                    yield ViewTable(tabs.STATS_COLUMNS, tabs.stats_rows, tabs.STATS_RIGHT,
                                    id="stats", cursor_type="row",
                                    zebra_stripes=True).data_bind(bound)
                    yield NativeTables(id="native").data_bind(bound)
            yield FindingsPane("Findings", id="findings").data_bind(bound)
            with TabPane("Process", id="process"):
                with VerticalScroll():
                    yield ViewStatic(tabs.process_text, id="process-info").data_bind(bound)
                    yield ViewTable(tabs.COLLECTORS_COLUMNS, tabs.collector_rows,
                                    tabs.COLLECTORS_RIGHT, id="collectors",
                                    cursor_type="none").data_bind(bound)
            with TabPane("Heap", id="heap"):
                yield HeapTab(self.source, self._source_lock, id="heap-tab")
            with TabPane("Time", id="wall"):
                yield WallTab(self.source, self._source_lock, record=self._record_wall,
                              id="wall-tab").data_bind(bound)
        yield Static("", id="proc-status", classes="status")
        yield Footer()

    def on_mount(self):
        self.app.sub_title = self.source.label
        self.history.extend(self.source.backlog())
        if self.history:
            if not self.live:
                self.cursor = len(self.history) - 1
            self.show(self.history[-1] if self.cursor is None else self.history[self.cursor])
        if self.live:
            self.take_sample()
            self._timer = self.set_interval(self.interval, self.take_sample)
        self.update_status()

    def on_unmount(self):
        self._closing = True
        self._stop_recording(quiet=True)
        try:
            self.source.close()
        except Exception:           # leaving the view must not fail; the at-exit reaper retries
            log.debug("closing the source of pid %s failed", self.source.pid, exc_info=True)

    def on_resize(self, event):
        self.set_class(event.size.height < 30, "short")

    # sampling
    def take_sample(self):
        if self.live and not self.paused and self.ended is None and not self._busy:
            self._busy = True
            self._sample()

    @work(thread=True, group="sample", exit_on_error=False)
    def _sample(self):
        try:
            with self._source_lock:
                snap = self.source.sample()
        except Exception as exc:
            log.debug("sample of pid %s failed", self.source.pid, exc_info=True)
            self.post_message(SampleFailed(exc))
            return
        recorded = None
        with self._rec_lock:
            if self.recorder is not None:
                try:
                    self.recorder.write(snap)
                    recorded = self.recorder.count
                except OSError as exc:
                    recorded = exc
        self.post_message(SampleTaken(snap, recorded))

    def _record_wall(self, wall):
        """A Time-tab window into the recording being made (a wall line, as
        ``record --wall`` writes); called in the tab's worker.  A write error
        shows with the next sample's write."""
        from diag import wallfile
        with self._rec_lock:
            if self.recorder is not None:
                try:
                    self.recorder.write_event(wallfile.EVENT, wallfile.wall_event(wall))
                except OSError:
                    pass

    def on_sample_taken(self, msg):
        self._busy = False
        if self._closing:
            return
        self.last_error = None
        self.history.append(msg.snapshot)
        if isinstance(msg.recorded, Exception):
            self.tell(f"recording failed: {msg.recorded}", severity="error")
            self._stop_recording(quiet=True)
        self.show(msg.snapshot)

    def on_sample_failed(self, msg):
        self._busy = False
        if self._closing:
            return
        exc = msg.error
        if isinstance(exc, NoSuchProcess):
            self.ended = f"process {self.source.pid} exited"
            self._stop_timer()
            self._stop_recording(quiet=False)
            self.tell(f"{self.ended}; showing its last sample", title="process gone",
                        severity="error", timeout=8)
        elif isinstance(exc, AccessDenied):
            self.ended = f"permission denied: {exc.msg}"
            self._stop_timer()
            help_text = (exc.remediation or "").splitlines()
            self.tell("\n".join([str(exc)] + help_text[:2]), title="permission denied",
                        severity="error", timeout=12)
        else:
            self.last_error = error_text(exc)
            if self.last_error not in self.errors_told:
                self.errors_told.add(self.last_error)
                self.tell(self.last_error, title="sample failed", severity="warning")
        self.update_status()

    def _stop_timer(self):
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self.refresh_bindings()

    # rendering: one assignment; the bound widgets draw themselves from it
    def show(self, snap):
        self.view = layers.process_view(snap, self.history, self.cursor)

    @property
    def snapshot(self):
        """The sample on screen (None before the first)."""
        return self.view.snapshot if self.view is not None else None

    def watch_view(self, view):
        if view is None:
            return
        snap = view.snapshot
        self.app.title = f"allocdiag · {snap.pid} {snap.comm or '?'}"
        self.app.sub_title = tabs.alloc_title(snap)
        self._tell_collector_errors(snap)
        self.update_status()

    def selected_finding(self):
        return self.query_one(FindingsPane).selected()

    def _tell_collector_errors(self, snap):
        if not self.live:
            return
        for name, s in snap.collectors.items():
            if not s.ok and s.error:
                key = f"{name}: {s.error}"
                if key not in self.errors_told:
                    self.errors_told.add(key)
                    self.tell(key, title="partial sample", severity="warning")

    def pause_us(self, snap):
        total = [s.pause_us for s in snap.collectors.values() if s.pause_us is not None]
        return sum(total) if total else None

    def update_status(self):
        parts = []
        snap = self.snapshot
        if not self.live:
            n = len(self.history)
            parts.append(f"replay {self.cursor + 1 if self.cursor is not None else 0}/{n}")
            if snap is not None and self.history and self.history[0].taken_at is not None \
                    and snap.taken_at is not None:
                parts.append(f"{clock(snap.taken_at)} (+{snap.taken_at - self.history[0].taken_at:.1f} s)")
        else:
            if self.ended:
                parts.append(f"■ {self.ended}")
            elif self.paused:
                parts.append("⏸ paused")
            else:
                parts.append(f"● every {self.interval:g} s")
            if snap is not None:
                pause = self.pause_us(snap)
                if pause is not None:
                    parts.append(f"pause {pause / 1000:.1f} ms "
                                 f"({pause / 1e6 / self.interval * 100:.2f}%)")
                n = len(self.history)
                parts.append(f"{n} sample{'' if n == 1 else 's'} · last {clock(snap.taken_at)}")
            if getattr(self.source, "no_attach", False):
                parts.append("no-attach")
            if self.recorder is not None:
                parts.append(f"● REC {self.recorder.path} ({self.recorder.count})")
        if self.last_error:
            parts.append(f"error: {self.last_error}")
        failed = [n for n, s in (snap.collectors.items() if snap else ()) if not s.ok]
        if failed:
            parts.append("partial: " + ", ".join(failed))
        self.query_one("#proc-status", Static).update(Text(" · ".join(parts)))

    # bindings that depend on state
    def check_action(self, action, parameters):
        live_ok = self.live and self.ended is None
        if action == "back":
            return self.can_go_back
        if action == "pause":
            return live_ok and not self.paused
        if action == "resume":
            return live_ok and self.paused
        if action in ("interval", "release", "knob"):
            return live_ok
        if action == "record_start":
            return live_ok and self.recorder is None
        if action == "record_stop":
            return self.live and self.recorder is not None
        if action in ("step", "jump"):
            return not self.live
        if action == "heap":
            return live_ok and self._active_tab() == "heap"
        return True

    def _active_tab(self):
        try:
            return self.query_one("#tabs", TabbedContent).active
        except NoMatches:          # not composed yet
            return None

    @on(TabbedContent.TabActivated, "#tabs")
    def _tab_activated(self, event):
        self.refresh_bindings()     # the Heap tab's keys come and go with it
        self._follow_wall()

    def _follow_wall(self):
        """The Time tab samples only while it is open and the view is not paused."""
        wall = self.query_one(WallTab)
        if self._active_tab() == "wall" and self.ended is None and not self.paused:
            wall.start()
        else:
            wall.stop()

    def action_heap(self, what):
        self.query_one(HeapTab).request(what)

    def action_back(self):
        self.app.pop_screen()

    def action_tab(self, name):
        self.query_one("#tabs", TabbedContent).active = name

    def action_pause(self):
        self.paused = True
        if self._timer:
            self._timer.pause()
        self._follow_wall()
        self.refresh_bindings()
        self.update_status()

    def action_resume(self):
        self.paused = False
        if self._timer:
            self._timer.resume()
        self._follow_wall()
        self.refresh_bindings()
        self.take_sample()
        self.update_status()

    def action_interval(self):
        def done(value):
            if value is None:
                return
            try:
                seconds = float(value)
            except ValueError:
                self.tell(f"not a number of seconds: {value!r}", severity="error")
                return
            if seconds < MIN_INTERVAL:
                self.tell(f"interval must be at least {MIN_INTERVAL} s", severity="error")
                return
            self.set_sampling_interval(seconds)
        self.app.push_screen(InputDialog("Sampling interval in seconds:", f"{self.interval:g}"),
                             done)

    def set_sampling_interval(self, seconds):
        self.interval = float(seconds)
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_interval(self.interval, self.take_sample)
        if self.paused:
            self._timer.pause()
        self.tell(f"sampling every {self.interval:g} s")
        self.update_status()

    # step through a replay
    def action_step(self, delta):
        if self.live or not self.history:
            return
        self.cursor = max(0, min(len(self.history) - 1, (self.cursor or 0) + delta))
        self.show(self.history[self.cursor])

    def action_jump(self, index):
        if self.live or not self.history:
            return
        self.cursor = index % len(self.history)
        self.show(self.history[self.cursor])

    # actions on the target
    def action_release(self):
        def confirmed(yes):
            if yes:
                self._run_action("release")
        self.app.push_screen(ConfirmDialog(
            f"Release free memory of {self.source.pid} now?\n\nallocdiag calls the "
            "allocator's own purge/trim function inside the process (one thread stops "
            "for a few ms) and shows the numbers before and after.", yes="Release"),
            confirmed)

    def action_knob(self):
        f = next((f for f in ([self.selected_finding()] if self.selected_finding() else [])
                  + list(self.snapshot.findings if self.snapshot else ()) if f.knob), None)
        value = f"{f.knob.name}={f.knob.suggested or ''}" if f is not None else ""

        def entered(text):
            if not text:
                return
            name, sep, val = text.partition("=")
            name, val = name.strip(), val.strip()
            if not sep or not name:
                self.tell("write it as name=value, e.g. arenas.dirty_decay_ms=1000",
                            severity="error")
                return

            def confirmed(yes):
                if yes:
                    self._run_action("set_knob", name, val)
            self.app.push_screen(ConfirmDialog(
                f"Set {name} to {val} in process {self.source.pid}?\n\nThis changes the "
                "allocator's behaviour in the running process until it exits.", yes="Set"),
                confirmed)
        self.app.push_screen(InputDialog("Runtime knob (name=value):", value,
                                         "arenas.dirty_decay_ms=1000"), entered)

    @work(thread=True, group="action", exit_on_error=False)
    def _run_action(self, action, *args):
        try:
            fn = getattr(self.source, action)
            with self._source_lock:
                result = fn(*args)
            self.post_message(ActionFinished(action, result=(args, result)))
        except Exception as exc:
            log.debug("action %s on pid %s failed", action, self.source.pid, exc_info=True)
            self.post_message(ActionFinished(action, error=exc))

    def on_action_finished(self, msg):
        if self._closing:
            return
        if msg.error is not None:
            exc = msg.error
            title = {"release": "release failed", "set_knob": "knob not set"}[msg.action]
            self.tell(error_text(exc), title=title, severity="error", timeout=8)
            return
        args, result = msg.result
        if msg.action == "release":
            self.app.push_screen(ResultDialog(
                f"released memory of {self.source.pid}",
                ("", "before", "after", "change"), layers.release_rows(result)))
        else:
            if isinstance(result, dict):
                result = (result.get("old"), result.get("new"))
            old, new = result
            self.tell(f"{args[0]}: {old} → {new}", title="knob set")
        self.take_sample()

    # recording
    def action_record_start(self):
        default = time.strftime(f"allocdiag-{self.source.pid}-%Y%m%d-%H%M%S.jsonl.gz")

        def entered(path):
            if not path:
                return
            from diag.recording import Recorder
            try:
                rec = Recorder(path)
            except OSError as exc:
                self.tell(f"cannot record to {path}: {exc.strerror or exc}", severity="error")
                return
            with self._rec_lock:
                self.recorder = rec
                if self.snapshot is not None:
                    rec.write(self.snapshot)
            self.refresh_bindings()
            self.tell(f"recording to {path}")
            self.update_status()
        self.app.push_screen(InputDialog("Record samples to (.gz: compressed):", default),
                             entered)

    def action_record_stop(self):
        self._stop_recording(quiet=False)

    def _stop_recording(self, quiet):
        with self._rec_lock:
            rec, self.recorder = self.recorder, None
            if rec is not None:
                rec.close()
        if rec is not None and not quiet:
            self.tell(f"recorded {rec.count} samples to {rec.path}", title="recording stopped")
        if not self._closing:
            self.refresh_bindings()
            self.update_status()
        return rec
