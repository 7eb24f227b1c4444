"""The HTML incident report: one self-contained page from a recording (or a
``compare`` document).

A recording (``allocdiag record``, JSON Lines, .gz allowed) gives:

- the stack over time: the kernel's view (RSS, anon, LazyFree, cgroup
  working set) and the allocator's layers (allocated, active, resident,
  mapped: drawn as separate lines, never stacked, as they are not nested);
- peak vs settled per field.  ``peak`` is the largest sample; ``settled``
  the median of the last ``SETTLED_FRACTION`` of the samples (at least
  one), so one late outlier does not decide it;
- the findings: every finding any snapshot carried (latest occurrence, how
  many samples had it) plus the trend findings over the whole series, with
  knob and evidence (bytes as exact bytes, binary units and share of RSS;
  units from diag.fields);
- the process and allocator identity and the preload verdict;
- every ``release`` event (``record --release-at``, ``release --record``):
  before/after per field;
- the allocation wall when the recording has wall lines (``record --wall``,
  diag.wallfile): the allocator's CPU share and lock-wait share per window
  over time, the totals over every window, the call sites, and an icicle
  (a flame graph drawn top-down) of the allocator's CPU samples by stack.

A compare document (``compare --json``) gives per-variant RSS, anon,
LazyFree and allocator resident over time and peak vs settled bars (compare's
own definitions, stated on the page).

The page has no script, no external stylesheet, font or image: charts are
inline SVG drawn by matplotlib (diag.report_charts) with glyphs as paths.
"""

import datetime
import gzip
import html
import json
import os
import statistics
import zlib

from diag.model.errors import BadInput
from diag import findings as findings_mod
from diag import report_charts as charts
from diag import wallfile
from diag.model.wall import SYSCALLS
from diag.fields import BY_NAME
from diag.recording import open_text, read_recording_events, returned_words
from diag.render import evidence_text, evidence_unit, human_bytes

SETTLED_FRACTION = 0.2     # settled = median of the last 20% of the samples

KERNEL_FIELDS = ("rss", "rss_anon", "lazyfree", "working_set")
ALLOCATOR_FIELDS = ("allocated", "active", "resident", "mapped")
RELEASE_FIELDS = KERNEL_FIELDS + ALLOCATOR_FIELDS + ("dirty", "muzzy", "retained")
# compare's sample keys drawn per variant (its "resident" is the allocator's)
COMPARE_PANELS = (("rss", "RSS"), ("rss_anon", "anon"), ("lazyfree", "LazyFree"),
                  ("resident", "allocator resident"))
COMPARE_BARS = ("rss", "rss_anon", "lazyfree", "working_set", "allocated", "resident")

# -- numbers ------------------------------------------------------------------------

def field_value(snap, name):
    """Bytes of the field NAME (diag.fields) in SNAP, or None when unknown."""
    layer = BY_NAME[name].layer
    if layer == "stats":
        v = snap.stats.get(name)
        return v.value if v is not None else None
    return getattr(snap.process if layer == "process" else snap.cgroup, name, None)


def peak_settled(values, fraction=SETTLED_FRACTION):
    """(peak, settled) of VALUES (None = unknown, skipped): peak the maximum,
    settled the median of the last FRACTION of the known values (at least one)."""
    known = [v for v in values if v is not None]
    if not known:
        return None, None
    tail = known[-max(1, round(len(known) * fraction)):]
    return max(known), int(statistics.median(tail))


# -- input ----------------------------------------------------------------------------

EXPECTED = ("expected a recording made by allocdiag record (JSON Lines, .gz allowed) or a "
            "document saved with allocdiag compare --json")

def load(path):
    """("compare", document) for a ``compare --json`` file, else ("recording",
    (snapshots, events)).  BadInput for anything else (OSError when it
    cannot be opened)."""
    try:
        with open_text(path) as f:
            first = next((line for line in f if line.strip()), None)
            if first is not None:
                try:
                    doc = json.loads(first)
                except (ValueError, RecursionError):
                    doc = None
                if doc is None and first.strip() == "{":
                    # an indented document (compare --json): read it whole
                    f.seek(0)
                    try:
                        doc = json.load(f)
                    except (ValueError, RecursionError) as exc:
                        raise BadInput(f"{path}: not a compare document or a recording "
                                       f"({EXPECTED}): {exc}") from None
                if isinstance(doc, dict) and doc.get("kind") == "compare":
                    if not isinstance(doc.get("variants"), list):
                        raise BadInput(f"{path}: compare document without variants")
                    return "compare", doc
    except (EOFError, OSError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError) as exc:
        if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
            raise
        raise BadInput(f"{path}: not a readable recording ({EXPECTED}; "
                       f"{exc.__class__.__name__}: {exc})") from None
    return "recording", read_recording_events(path)


# -- HTML pieces -------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
 margin:0 auto;max-width:1120px;padding:16px 20px;color:#1a1a1a;background:#fff}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.2em;margin-top:1.6em;
 border-bottom:1px solid #ddd;padding-bottom:.2em}h3{font-size:1.05em;margin:1em 0 .3em}
table{border-collapse:collapse;margin:.4em 0;font-size:.92em}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.muted{color:#666}.chart svg{max-width:100%;height:auto;display:block}
.sev-warning{color:#a35200}.sev-critical{color:#b00020}.sev-info{color:#1f5fa0}
code{background:#f4f4f4;padding:0 3px}dl{display:grid;grid-template-columns:max-content auto;
 gap:2px 14px}dt{font-weight:600}dd{margin:0}
"""


def esc(x):
    return html.escape("" if x is None else str(x), quote=True)


def _table(headers, rows, numeric=()):
    out = ["<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr>"]
    for r in rows:
        out.append("<tr>" + "".join(
            f'<td class="n">{esc(c)}</td>' if i in numeric else f"<td>{esc(c)}</td>"
            for i, c in enumerate(r)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _dl(pairs):
    return "<dl>" + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in pairs
                            if v not in (None, "", [], ())) + "</dl>"


def _chart(svg, missing="no data for this chart"):
    if svg is None:
        return f'<p class="muted">{esc(missing)}</p>'
    return f'<div class="chart">{svg}</div>'


def _page(title, body):
    made = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>\n"
            f"<h1>{esc(title)}</h1>\n{body}\n"
            f'<p class="muted">made by allocdiag report, {made}</p>\n</body></html>\n')


def _when(ts):
    if ts is None:
        return "unknown"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC")


def _bytes_cell(v):
    return "unknown" if v is None else f"{human_bytes(v)} ({v:,} B)"


# -- recording page ------------------------------------------------------------------------

def _times(snaps):
    t0 = snaps[0].taken_at
    return [round(s.taken_at - t0, 3) if s.taken_at is not None and t0 is not None else float(i)
            for i, s in enumerate(snaps)]


def _identity(snaps, source):
    last = snaps[-1]
    a, p, c = last.allocator, last.preload, last.cgroup
    span = (snaps[-1].taken_at - snaps[0].taken_at
            if snaps[-1].taken_at is not None and snaps[0].taken_at is not None else None)
    pairs = [("recording", source), ("process", f"pid {last.pid} {last.comm or '?'}"),
             ("executable", last.exe),
             ("samples", f"{len(snaps)} from {_when(snaps[0].taken_at)}" +
              (f" over {span:.1f} s" if span is not None else "")),
             ("allocator", " ".join(x for x in (a.kind, a.version, a.linkage) if x)),
             ("allocator library", a.path), ("symbol prefix", a.prefix),
             ("how it was identified", "; ".join(a.evidence)),
             ("also loaded (not serving malloc)", ", ".join(
                 f"{o.kind} {o.path or ''}".strip() for o in a.others)),
             ("preload requested", ", ".join(p.requested)),
             ("preload verdict", p.verdict), ("preload reasons", "; ".join(p.reasons)),
             ("cgroup", f"v{c.version} {c.path}" if c.path else None),
             ("cgroup limit", human_bytes(c.limit) if c.limit is not None else
              ("unlimited" if c.path else None)),
             ("threads", last.process.threads)]
    if last.runtime is not None:
        pairs.append(("runtime heap", f"{last.runtime.kind} {last.runtime.version or ''}"))
    failed = {n: s.error for s in snaps for n, s in s.collectors.items() if not s.ok}
    if failed:
        pairs.append(("collectors that failed", "; ".join(f"{n}: {e}" for n, e in failed.items())))
    return "<h2>Process and allocator</h2>\n" + _dl(pairs)


def _stack_section(snaps, events):
    t = _times(snaps)
    t0 = snaps[0].taken_at
    marks = [(round(e["taken_at"] - t0, 3), "release") for e in events
             if e.get("event") == "release" and e.get("taken_at") is not None and t0 is not None]
    panels = [("kernel: RSS, anon, LazyFree, cgroup working set",
               {f: [field_value(s, f) for s in snaps] for f in KERNEL_FIELDS}),
              ("allocator: allocated, active, resident, mapped (separate lines: "
               "mapped and resident are not nested)",
               {f: [field_value(s, f) for s in snaps] for f in ALLOCATOR_FIELDS})]
    svg = charts.time_panels(t, panels, marks, title="memory over time")
    note = ("Dotted vertical lines: a release.  Unknown values are left out, never drawn as "
            "zero; the working set is the whole cgroup's, not only this process's.")
    if not any(field_value(s, f) is not None for s in snaps for f in ALLOCATOR_FIELDS):
        remote = snaps[-1].collectors.get("remote")
        why = remote.error if remote is not None and remote.error else \
            "not read (recorded with --no-attach?)"
        note = f"The allocator's layers are unknown: {why}.  " + note
    return ("<h2>The stack over time</h2>\n" + _chart(svg) +
            f'<p class="muted">{esc(note)}</p>')


def _peak_section(snaps):
    rows, bars = [], []
    for f in KERNEL_FIELDS + ALLOCATOR_FIELDS:
        peak, settled = peak_settled([field_value(s, f) for s in snaps])
        if peak is None:
            continue
        rows.append((charts.label(f), _bytes_cell(peak), _bytes_cell(settled),
                     human_bytes(peak - settled), BY_NAME[f].meaning))
        bars.append((charts.label(f), (peak, settled)))
    n = max(1, round(len(snaps) * SETTLED_FRACTION))
    defn = (f"peak = the largest sample; settled = the median of the last "
            f"{SETTLED_FRACTION:.0%} of the samples (here the last {n} of {len(snaps)}).")
    svg = charts.paired_bars(bars, ("peak", "settled"), "peak vs settled")
    return ("<h2>Peak vs settled</h2>\n" + f"<p>{esc(defn)}</p>\n" + _chart(svg) +
            _table(("field", "peak", "settled", "peak − settled", "meaning"), rows,
                   numeric={1, 2, 3}))


def _collect_findings(snaps):
    """[(Finding, samples that had it, snapshot it was last seen in)], most
    bytes at stake first; then the trend findings over the whole series."""
    seen = {}
    for s in snaps:
        for f in s.findings:
            count = seen[f.id][1] + 1 if f.id in seen else 1
            seen[f.id] = (f, count, s)
    out = sorted(seen.values(), key=lambda x: -(x[0].expected_effect_bytes or 0))
    trend = [(f, None, snaps[-1]) for f in findings_mod.trends(snaps)]
    return out + trend


def _finding_html(f, count, snap, total, current):
    seen = ("computed over the whole recording" if count is None else
            f"in {count} of {total} samples; last at {_when(snap.taken_at)}" +
            ("" if current else " (gone by the last sample)"))
    return _finding_block(f, seen, snap.process.rss)


def _finding_block(f, seen, rss):
    """One finding: title, id, confidence, SEEN (where it was found), knob,
    evidence (bytes also as a share of RSS)."""
    parts = [f'<h3 class="sev-{esc(f.severity)}">{esc(f.severity)}: {esc(f.title)}</h3>',
             f'<p class="muted">{esc(f.id)} · confidence {esc(f.confidence)} · {esc(seen)}'
             + (f" · at stake {esc(_bytes_cell(f.expected_effect_bytes))}"
                if f.expected_effect_bytes else "") + "</p>"]
    if f.knob is not None:
        k = f.knob
        parts.append(_dl([("knob", k.name), ("current", f"{k.current or 'unset'} "
                                                       f"({k.source or 'default'})"),
                          ("suggested", k.suggested), ("how", k.how)]))
    rows = [(k, evidence_text(k, v, rss), evidence_unit(k) or "") for k, v in f.evidence.items()]
    if rows:
        parts.append(_table(("evidence", "value", "unit"), rows, numeric={1}))
    return "\n".join(parts)


def _findings_section(snaps):
    found = _collect_findings(snaps)
    if not found:
        return "<h2>Findings</h2>\n<p>None: no rule fired in any sample.</p>"
    return ("<h2>Findings</h2>\n<p class=\"muted\">Evidence in bytes also as a share of the "
            "RSS of the sample the finding was last seen in.</p>\n" +
            "\n".join(_finding_html(f, c, s, len(snaps), s is snaps[-1]) for f, c, s in found))


def _release_html(e, t0):
    when = _when(e.get("taken_at"))
    if t0 is not None and e.get("taken_at") is not None:
        when += f" ({e['taken_at'] - t0:+.1f} s into the recording)"
    head = f"<h3>{esc(e.get('call') or 'release')} at {esc(when)}</h3>"
    if e.get("error"):
        return head + f"<p class=\"sev-warning\">failed: {esc(e['error'])}</p>"
    before, after = e.get("before"), e.get("after")
    if before is None or after is None:
        return head + "<p class=\"muted\">no before/after figures in the event</p>"
    pause = e.get("pause_us")
    pause = max(pause) if isinstance(pause, list) and pause else pause
    rows, bars = [], []
    for f in RELEASE_FIELDS:
        b, a = field_value(before, f), field_value(after, f)
        if b is None and a is None:
            continue
        change = (("−" if a < b else "+") + human_bytes(abs(a - b))) \
            if a is not None and b is not None else "unknown"
        rows.append((charts.label(f), _bytes_cell(b), _bytes_cell(a), change))
        bars.append((charts.label(f), (b, a)))
    svg = charts.paired_bars(bars, ("before", "after"), "release before/after",
                             colors=("#7f7f7f", "#2ca02c"))
    return (head + f"<p>{esc(returned_words(e.get('return')))}; thread stopped "
            f"{esc(pause)} µs</p>\n" + _chart(svg) +
            _table(("field", "before", "after", "change"), rows, numeric={1, 2, 3}))


def _releases_section(snaps, events):
    rel = [e for e in events if e.get("event") == "release"]
    if not rel:
        return ("<h2>Release</h2>\n<p class=\"muted\">No release in this recording (record with "
                "<code>--release-at S</code>, or <code>allocdiag release --record FILE "
                "PID</code>).</p>")
    return "<h2>Release</h2>\n" + "\n".join(_release_html(e, snaps[0].taken_at) for e in rel)


# -- the allocation wall ---------------------------------------------------------------------

WALL_SITES = 20         # rows of the call-site table


def _ratio(part, whole):
    return None if not whole else part / whole


def wall_totals(walls):
    """The figures of every window together: shares weighted by samples
    (CPU) or thread time (lock wait), rates over the summed durations."""
    cpu = [w.cpu for w in walls if w.cpu is not None]
    off = [w.off_cpu for w in walls if w.off_cpu is not None]
    dur = sum(w.window.duration_s for w in walls)
    samples = sum(c.samples for c in cpu)
    minor = [w.faults.minor for w in walls if w.faults is not None and w.faults.minor is not None]
    out = {"windows": len(walls), "seconds": dur, "samples": samples,
           "lost": sum(w.window.lost for w in walls),
           "allocator_share": _ratio(sum(c.allocator_samples for c in cpu), samples),
           "unknown_share": _ratio(sum(c.unknown_samples for c in cpu), samples),
           "allocator_s": sum(c.allocator_s for c in cpu),
           "lock_s": sum(o.allocator_lock_s for o in off) if off else None,
           "lock_share": _ratio(sum(o.allocator_lock_s for o in off),
                                sum(o.thread_s for o in off)) if off else None,
           "minor_per_s": _ratio(sum(minor), dur) if minor else None, "syscalls": {}}
    for name in SYSCALLS:
        rates = [w.syscalls[name] for w in walls if name in w.syscalls
                 and w.syscalls[name].count is not None]
        if rates:
            known = sum(r.sampled - r.unknown for r in rates)
            out["syscalls"][name] = (_ratio(sum(r.count for r in rates), dur),
                                     _ratio(sum(r.from_allocator for r in rates), known))
    return out


def _pct(share):
    return "unknown" if share is None else f"{share * 100:.1f}%"


def _wall_sites(walls):
    """[(function, allocator CPU s, lock wait s, entry)] over every window, largest first."""
    sites = {}
    for w in walls:
        for s in w.sites:
            cpu, lock, entry = sites.get(s.function, (0.0, 0.0, s.entry))
            sites[s.function] = (cpu + s.allocator_cpu_s, lock + s.lock_wait_s, entry or s.entry)
    return sorted(((f, c, l, e) for f, (c, l, e) in sites.items()),
                  key=lambda r: -(r[1] + r[2]))


def _allocator_frames(walls, stacks):
    """Names of the frames inside the allocator: the entry points and
    functions the windows name, and every frame below an entry point."""
    entries = {f.function for w in walls if w.cpu for f in w.cpu.by_entry}
    names = entries | {f.function for w in walls if w.cpu for f in w.cpu.by_function}
    for frames, _weight in stacks:
        i = next((i for i, f in enumerate(frames) if f in entries), None)
        if i is not None:
            names.update(frames[i:])
    return names


def _wall_findings(walls):
    """The windows' findings: each once (its last occurrence), with the
    number of windows that had it."""
    seen = {}
    for taken_at, w in walls:
        for f in w.findings:
            seen[f.id] = (f, seen[f.id][1] + 1 if f.id in seen else 1, taken_at)
    if not seen:
        return "<h3>Findings of the windows</h3>\n<p>None: no wall rule fired.</p>"
    return "<h3>Findings of the windows</h3>\n" + "\n".join(
        _finding_block(f, f"in {n} of {len(walls)} windows; last at {_when(t)}", None)
        for f, n, t in seen.values())


def _wall_section(snaps, events):
    walls = wallfile.walls_of(events)
    if not walls:
        return ("<h2>The allocation wall</h2>\n<p class=\"muted\">No wall figures in this "
                "recording (record with <code>--wall</code> to sample where the process's CPU "
                "and waiting go in its allocator).</p>")
    t0 = snaps[0].taken_at
    t = [round(ts - t0, 3) if ts is not None and t0 is not None else float(i)
         for i, (ts, _w) in enumerate(walls)]
    ws = [w for _ts, w in walls]
    over_time = charts.share_lines(t, {
        "cpu.allocator_share": [w.cpu.allocator_share if w.cpu else None for w in ws],
        "off_cpu.allocator_lock_share": [w.off_cpu.allocator_lock_share if w.off_cpu else None
                                         for w in ws],
        "cpu.unknown_share": [w.cpu.unknown_share if w.cpu else None for w in ws]},
        title="allocator share over time",
        labels={"cpu.allocator_share": "allocator share of CPU samples",
                "off_cpu.allocator_lock_share": "allocator lock wait, share of thread time",
                "cpu.unknown_share": "unknown (stack walk stopped early)"})
    tot = wall_totals(ws)
    pairs = [("windows", f"{tot['windows']} covering {tot['seconds']:.1f} s, "
                         f"{tot['samples']:,} CPU samples at {ws[0].window.hz} Hz"
                         + (f", {tot['lost']:,} records lost" if tot["lost"] else "")),
             ("allocator share of CPU", f"{_pct(tot['allocator_share'])} "
                                        f"({tot['allocator_s']:.2f} CPU s)"),
             ("not attributed (walk stopped early)", _pct(tot["unknown_share"])),
             ("allocator lock wait", None if tot["lock_s"] is None else
              f"{tot['lock_s']:.2f} s ({_pct(tot['lock_share'])} of thread time)"),
             ("minor page faults per second", None if tot["minor_per_s"] is None else
              f"{tot['minor_per_s']:,.0f}")]
    pairs += [(f"{n} per second", f"{r:,.1f} ({_pct(a)} from the allocator)")
              for n, (r, a) in tot["syscalls"].items() if r]
    missing = {(m.figure, m.reason, m.fix) for w in ws for m in w.window.missing}
    pairs += [(f"missing: {f}", f"{r}" + (f" (fix: {x})" if x else "")) for f, r, x in
              sorted(missing, key=lambda m: m[0])]
    stacks = [(s.frames, s.weight) for w in ws for s in w.stacks
              if s.kind == "cpu" and s.allocator]
    names = _allocator_frames(ws, stacks)
    flame = charts.icicle(stacks, "allocator CPU by call stack",
                          is_allocator=names.__contains__, unit="allocator CPU samples")
    rows = [(f, f"{c * 1000:,.0f} ms", f"{lk * 1000:,.0f} ms", e or "")
            for f, c, lk, e in _wall_sites(ws)[:WALL_SITES]]
    note = ("Each point is one window, sampled with perf_event_open between two snapshots. "
            "Shares of CPU are of the process's on-CPU samples; the lock wait is time threads "
            "were blocked with an allocator frame on the stack, as a share of their time.")
    flame_note = ("Icicle: the outermost frame on top, each box as wide as its share of the "
                  "allocator's CPU samples of every window; the allocator's frames in orange "
                  "and red, the program's in blue.  The blue frame above the first orange one "
                  "is the call site.")
    return ("<h2>The allocation wall</h2>\n" + _chart(over_time) +
            f'<p class="muted">{esc(note)}</p>\n' + _dl(pairs) + _wall_findings(walls) +
            "<h3>Call sites</h3>\n" +
            _table(("call site (first frame outside the allocator)", "allocator CPU",
                    "lock wait", "entry point"), rows, numeric={1, 2}) +
            "<h3>Allocator time by call stack</h3>\n" +
            _chart(flame, "no allocator samples in the recorded windows") +
            f'<p class="muted">{esc(flame_note)}</p>')


def recording_html(snaps, events, source="recording"):
    last = snaps[-1]
    title = f"allocdiag report: pid {last.pid} {last.comm or ''}".strip()
    body = "\n".join((_identity(snaps, source), _stack_section(snaps, events),
                      _peak_section(snaps), _findings_section(snaps),
                      _releases_section(snaps, events), _wall_section(snaps, events)))
    return _page(title, body)


# -- compare page ------------------------------------------------------------------------------

def _variant_series(entry, key):
    """(t, values) of KEY over the variant's runs (run 1, then later runs shifted)."""
    ts, vs = [], []
    for run in entry.get("runs") or ():
        for s in run.get("samples") or ():
            ts.append(s.get("t"))
            vs.append(s.get(key))
        break       # repeats overlap in time: the first run draws the line
    return ts, vs


def compare_html(doc, source="compare"):
    entries = [e for e in doc["variants"] if e.get("runs")]
    panels = [(heading, {e["name"]: _variant_series(e, key) for e in entries})
              for key, heading in COMPARE_PANELS]
    over_time = charts.variant_panels(panels, title="per variant over time")
    s = doc.get("settings") or {}
    bars = charts.bar_panels(
        [(charts.label(key), [(e["name"], ((e.get("peak") or {}).get(key),
                                          (e.get("settled") or {}).get(key))) for e in entries])
         for key in COMPARE_BARS], ("peak", "settled"), "peak vs settled per variant")
    rows = []
    for e in doc["variants"]:
        pk, st = e.get("peak") or {}, e.get("settled") or {}
        rows.append((e.get("rank") if e.get("rank") is not None else "-", e["name"],
                     {True: "yes", False: "NO", None: "n/a"}[e.get("preload_effective")],
                     human_bytes(pk.get("rss")), human_bytes(st.get("rss")),
                     human_bytes(st.get("lazyfree")), human_bytes(st.get("resident")),
                     e.get("excluded_reason") or (e.get("finding") or {}).get("title") or ""))
    cmd = " ".join(doc.get("command") or ())
    defn = ("compare's definitions: peak = the maximum over the run (RSS: the kernel's VmHWM "
            "when larger); settled = the last sample of the idle phase, or the last before the "
            "command exited; with repeats, medians over the runs.  Lines: the first run.")
    body = (_dl([("source", source), ("command", cmd), ("taken", _when(doc.get("taken_at"))),
                 ("phases", f"warm-up {s.get('warmup_s')} s, idle {s.get('idle_s')} s, "
                            f"sampled every {s.get('interval_s')} s, {s.get('repeat')} run(s)"),
                 ("ranked by", (doc.get("ranking") or {}).get("by"))]) +
            f"<p>{esc(defn)}</p>\n<h2>Over time</h2>\n" + _chart(over_time) +
            "\n<h2>Peak vs settled</h2>\n" + _chart(bars) +
            "\n<h2>Variants</h2>\n" +
            _table(("rank", "variant", "preload", "peak RSS", "settled RSS", "settled LazyFree",
                    "settled allocator resident", "excluded / finding"), rows,
                   numeric={3, 4, 5, 6}))
    return _page("allocdiag compare: " + (cmd[:80] or "variants"), body)


# -- files -------------------------------------------------------------------------------------

def write_html(text, out):
    """Write TEXT to OUT atomically (a reader never sees half a page)."""
    tmp = f"{out}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, out)


def write_compare(doc, out, source="allocdiag compare"):
    """The chart page of a compare DOC (``compare --html OUT``)."""
    charts.check_available()
    write_html(compare_html(doc, source), out)


def render_file(path, out):
    """The report of the recording or compare document at PATH, written to
    OUT.  Returns "recording" or "compare"."""
    charts.check_available()
    kind, data = load(path)
    name = os.path.basename(str(path))
    text = compare_html(data, name) if kind == "compare" else recording_html(*data, source=name)
    write_html(text, out)
    return kind
