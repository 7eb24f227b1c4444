"""Views of a heap profile (issue 10): top sites, call tree, collapsed stacks,
the legacy text written back out, and the diff of two profiles next to the
allocator and kernel layers at the same two moments.

``load`` parses (``collectors.heapprofile``) and symbolizes
(``collectors.binary.symbolize``) one dump; every view works on the resulting
``ProfileView``.  Values are the scaled estimates pprof/jeprof print (the
numbers as written for gperftools' unsampled ``heapprofile``); JSON byte and
object values are integers.

A *site* is one distinct symbolized stack after the allocator's own frames
are dropped from its top; its ``function`` is the first frame outside the
allocator.  ``render_top`` is pprof's ``-top``: per function, ``flat`` (the
function is the site) and ``cum`` (it is anywhere on the stack, counted once
per stack).

JSON (``ProfileView.to_json``, what ``heap show --json`` prints)::

    {"path": str, "format": "heapprofile"|"heap_v2"|"heapz_v2"|"heap"|"jemalloc_heap_v2",
     "period": int (as in the header; 0 when absent), "rate": int (1 = not scaled),
     "has_alloc": bool (false: jemalloc without prof_accum, alloc_* are 0),
     "totals": {inuse_bytes, inuse_objects, alloc_bytes, alloc_objects},   scaled sums
     "header_totals": {same keys},      the header as written (unscaled)
     "warnings": [str],                 %warn lines, then symbolizer warnings
     "threads": [{"thread": int, "name": str|null, the four values}]   jemalloc tN rows
     "sites": [{"function": str, "object": path|null, "inuse_bytes": int,
                "inuse_objects": int, "alloc_bytes": int, "alloc_objects": int,
                "stack": [str, ...] (top first, allocator frames dropped)}, ...]}

``diff_json`` (``heap diff --json``)::

    {"a": {path, format, totals}, "b": {...}, "delta": {the four keys: b - a},
     "sites": [{"function", "object", "stack", "a": {4 keys}, "b": {4 keys},
                "delta": {4 keys}}, ...]   biggest in-use growth first, shrinking last,
     "layers": [{"layer": allocated|active|resident|retained|rss|rss_anon|lazyfree,
                 "a": int|null, "b": int|null, "delta": int|null}]   ([] without sidecars),
     "verdict": "growth is live objects"|"allocator retention"|
                "kernel not reclaiming (LazyFree)"|"no growth",
     "verdict_parts": {verdict name: bytes}, "warnings": [str]}

Frame strings: a function name (C++ demangled), ``object+0xVADDR`` when the
object has no symbol there, ``0xADDR`` when no mapping holds the address.
"""
from __future__ import annotations

import io
import json
import os
from collections import defaultdict

from diag.model.records import field, record
from collectors import heapprofile
from diag.model.errors import AccessDenied, BadInput, BadPath, MalformedData, Unsupported
from collectors.binary.symbolize import DEBUG_ROOT, Symbolizer, drop_allocator_frames
from diag.render import human_bytes, table

VALUE_KEYS = ("inuse_bytes", "inuse_objects", "alloc_bytes", "alloc_objects")
SIDECAR_SUFFIX = ".snapshot.json"
# The call tree hides nodes below this share of the total (pprof -nodefraction default).
NODE_FRACTION = 0.005
FRAME_SEPARATOR = ";"          # collapsed-stack (flame graph) frame separator
# The layers a diff compares, from the inspect --json document: (label, section, field).
LAYERS = (
    ("allocated", "stats", "allocated"),
    ("active", "stats", "active"),
    ("resident", "stats", "resident"),
    ("retained", "stats", "retained"),
    ("rss", "process", "rss"),
    ("rss_anon", "process", "rss_anon"),
    ("lazyfree", "process", "lazyfree"),
)
VERDICT_LIVE = "growth is live objects"
VERDICT_RETENTION = "allocator retention"
VERDICT_LAZYFREE = "kernel not reclaiming (LazyFree)"
VERDICT_NONE = "no growth"
VERDICT_PART_LABELS = {VERDICT_LIVE: "live", VERDICT_RETENTION: "retention",
                       VERDICT_LAZYFREE: "lazyfree"}


@record
class ProfileView:
    path: str | None
    profile: heapprofile.HeapProfile
    stacks: list              # [(frames after the allocator's, Sample)]
    warnings: list = field(default_factory=list)
    _sites: list | None = field(default=None, repr=False, compare=False)

    @property
    def format(self):
        return self.profile.format

    def totals(self):
        """Scaled sums (integers): the sum of the sites, so a JSON reader
        adding up ``sites`` gets exactly ``totals``."""
        rows = sites(self)
        return {k: sum(e[k] for e in rows) for k in VALUE_KEYS}

    def to_json(self):
        p = self.profile
        return {
            "path": self.path,
            "format": p.format,
            "period": p.period,
            "rate": p.rate,
            "has_alloc": p.has_alloc,
            "totals": self.totals(),
            "header_totals": dict(p.totals._asdict()),
            "warnings": [heapprofile.printable(w) for w in list(p.warnings) + list(self.warnings)],
            "threads": threads(self),
            "sites": sites(self),
        }


# -- loading -------------------------------------------------------------------

def _os_error(exc, path):
    what = f"{path}: {exc.strerror or exc}"
    if isinstance(exc, PermissionError):
        return AccessDenied(None, msg=what, remediation=None)
    return BadPath.from_oserror(exc, path)


def load(path, root=None, pid=None, debug_root=DEBUG_ROOT):
    """Parse and symbolize the heap profile at PATH.  ROOT: read the mapped
    objects under this directory (``/proc/PID/root``); PID: also check them
    against ``/proc/PID/map_files``.  Raises BadInput on bad input,
    AccessDenied/Unsupported when the file cannot be read."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise _os_error(exc, path) from None
    try:
        prof = heapprofile.parse(data)
    except MalformedData as exc:
        # the user named a file that is not a heap profile: a usage error
        raise BadInput(f"{path}: {exc.msg} (expected a gperftools or jemalloc heap "
                       "profile, e.g. from allocdiag heap dump)") from None
    return view_of(prof, path=path, root=root, pid=pid, debug_root=debug_root)


def view_of(prof, path=None, root=None, pid=None, debug_root=DEBUG_ROOT):
    sym = Symbolizer(prof.mappings, root=root, pid=pid, debug_root=debug_root)
    stacks = [(drop_allocator_frames(sym.stack(s.stack)), s) for s in prof.samples]
    if not prof.mappings:
        sym.warnings.append("no MAPPED_LIBRARIES in the profile: frames stay addresses")
    return ProfileView(path, prof, stacks, sym.warnings)


# -- sites and top -------------------------------------------------------------

def _site_key(frames):
    return tuple(f.text for f in frames)


def sites(view):
    """One dict per distinct stack (allocator frames dropped), biggest in-use
    bytes first: function, object, the four values, stack (top first).
    Computed once per view; each call returns fresh dicts."""
    if view._sites is None:
        view._sites = _sites(view)
    return [dict(e, stack=list(e["stack"])) for e in view._sites]


def _sites(view):
    acc = {}
    for frames, s in view.stacks:
        key = _site_key(frames)
        e = acc.get(key)
        if e is None:
            top = frames[0] if frames else None
            e = acc[key] = {"function": key[0] if key else "?",
                            "object": heapprofile.printable(top.object) if top and top.object
                            else None,
                            **{k: 0.0 for k in VALUE_KEYS}, "stack": list(key)}
        for k in VALUE_KEYS:
            e[k] += getattr(s, k)
    out = list(acc.values())
    for e in out:
        for k in VALUE_KEYS:
            e[k] = int(round(e[k]))
    out.sort(key=lambda e: (-e["inuse_bytes"], -e["alloc_bytes"], e["function"]))
    return out


def threads(view):
    """jemalloc's per-thread totals (the header's ``tN:`` rows), scaled like
    jeprof's per-thread profiles: [{thread, name, the four values}]; [] for
    the other formats."""
    out = []
    for tid, (raw, name) in sorted(view.profile.thread_totals.items()):
        scaled = view.profile.scale(raw)
        out.append({"thread": tid, "name": heapprofile.printable(name) if name else name,
                    **{k: int(round(getattr(scaled, k))) for k in VALUE_KEYS}})
    return out


def _fmt(v, by):
    return human_bytes(v) if by.endswith("_bytes") else str(v)


def _pct(part, whole):
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _summary(view):
    t = view.totals()
    p = view.profile
    sampling = "unsampled" if p.rate <= 1 else f"sampled 1 in {p.rate} bytes, scaled"
    lines = [f"{view.path or 'profile'}: {p.format} ({sampling}), {len(p.samples)} stacks",
             f"in use: {human_bytes(t['inuse_bytes'])} in {t['inuse_objects']} objects"
             + (f"; allocated since start: {human_bytes(t['alloc_bytes'])} in "
                f"{t['alloc_objects']} objects" if p.has_alloc else "")]
    per_thread = threads(view)
    if len(per_thread) > 1:
        lines.append("threads (in use): " + ", ".join(
            f"t{t['thread']}{' ' + t['name'] if t['name'] else ''} {human_bytes(t['inuse_bytes'])}"
            for t in sorted(per_thread, key=lambda t: -t["inuse_bytes"])))
    lines += [f"warning: {heapprofile.printable(w)}" for w in list(p.warnings) + list(view.warnings)]
    return lines


def _check_by(view, by):
    if by not in VALUE_KEYS:
        raise Unsupported(f"unknown value {by!r}: one of {', '.join(VALUE_KEYS)}")


def top_rows(view, by="inuse_bytes"):
    """[(function, object, flat, cum)] by flat then cum, pprof -top style."""
    _check_by(view, by)
    flat, cum, obj = defaultdict(int), defaultdict(int), {}
    for e in sites(view):
        v = e[by]
        flat[e["function"]] += v
        obj.setdefault(e["function"], e["object"])
        for fn in set(e["stack"]):
            cum[fn] += v
    rows = [(fn, obj.get(fn), flat.get(fn, 0), c) for fn, c in cum.items()]
    rows.sort(key=lambda r: (-r[2], -r[3], r[0]))
    return rows


def render_top(view, n=20, by="inuse_bytes"):
    rows = top_rows(view, by)
    total = view.totals()[by]
    out = io.StringIO()
    for ln in _summary(view):
        print(ln, file=out)
    if by.startswith("alloc_") and not view.profile.has_alloc:
        print("note: this profile carries no allocation counts (jemalloc writes them "
              "only with prof_accum:true)", file=out)
    print(f"top {min(n, len(rows))} by {by}:", file=out)
    running, body = 0, []
    for fn, objpath, fl, c in rows[:n]:
        running += fl
        body.append([_fmt(fl, by), _pct(fl, total), _pct(running, total), _fmt(c, by),
                     _pct(c, total), fn + (f"  ({os.path.basename(objpath)})" if objpath else "")])
    table(body, ["flat", "flat%", "sum%", "cum", "cum%", "function"],
          right=(0, 1, 2, 3, 4), out=out)
    return out.getvalue()


# -- tree and collapsed stacks ---------------------------------------------------

def _trie(view, by):
    root = {"value": 0, "self": 0, "children": {}}
    for e in sites(view):
        v = e[by]
        if not v:
            continue
        node = root
        node["value"] += v
        for fn in reversed(e["stack"]):          # root (main) first
            node = node["children"].setdefault(fn, {"value": 0, "self": 0, "children": {}})
            node["value"] += v
        node["self"] += v
    return root


def render_tree(view, by="inuse_bytes", node_fraction=NODE_FRACTION):
    """The call tree from the outermost caller down to the allocation sites,
    each node with its cumulative value; nodes under NODE_FRACTION of the
    total are summarised per parent."""
    _check_by(view, by)
    root = _trie(view, by)
    total = root["value"]
    out = io.StringIO()
    for ln in _summary(view):
        print(ln, file=out)
    print(f"call tree by {by} (cumulative; nodes under {node_fraction:.1%} hidden):", file=out)

    def line(depth, value, text):
        print(f"{'  ' * depth}{_fmt(value, by):>10} {_pct(value, total):>6}  {text}", file=out)

    # depth-first without recursion: a stack can be deeper than Python's limit
    todo = [(root, 0, None)]
    while todo:
        node, depth, name = todo.pop()
        if node is None:                      # the "[N smaller]" line of a parent
            line(depth, *name)
            continue
        if name is not None:
            line(depth - 1, node["value"], name + (
                f" (self {_fmt(node['self'], by)})" if node["self"] else ""))
        shown, hidden, hidden_n = [], 0, 0
        for child_name, child in sorted(node["children"].items(),
                                        key=lambda kv: (-kv[1]["value"], kv[0])):
            if total and child["value"] < node_fraction * total:
                hidden += child["value"]
                hidden_n += 1
            else:
                shown.append((child, depth + 1, child_name))
        if hidden_n:
            todo.append((None, depth, (hidden, f"[{hidden_n} smaller]")))
        todo.extend(reversed(shown))
    return out.getvalue()


def render_collapsed(view, by="inuse_bytes"):
    """Brendan Gregg's collapsed stacks (``root;...;site VALUE`` per line),
    for flamegraph.pl, speedscope, inferno."""
    _check_by(view, by)
    lines = []
    for e in sites(view):
        if e[by] <= 0:
            continue
        frames = [f.replace(FRAME_SEPARATOR, ":").replace("\n", " ") for f in reversed(e["stack"])]
        lines.append(f"{FRAME_SEPARATOR.join(frames)} {e[by]}")
    return "".join(ln + "\n" for ln in lines)


def write_legacy(view, path):
    """The profile as legacy ``.heap`` text (its own format, the numbers as
    written, the original MAPPED_LIBRARIES), which pprof and jeprof read."""
    text = heapprofile.unparse(view.profile)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", **heapprofile.TEXT_ENCODING) as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise _os_error(exc, path) from None


# -- diff ------------------------------------------------------------------------

@record
class DiffView:
    a: ProfileView
    b: ProfileView
    entries: list             # per site: function, object, stack, a, b, delta
    context_a: dict | None = None   # the inspect --json documents at dump time
    context_b: dict | None = None
    warnings: list = field(default_factory=list)

    def contexts(self, context_a=None, context_b=None):
        """The contexts to show: the ones given, else the sidecars."""
        if context_a is None and context_b is None:
            return self.context_a, self.context_b
        return context_a, context_b


def diff(a_view, b_view):
    """Per site (same symbolized stack) what grew and what shrank from A to B.
    Sites present on one side only count as 0 on the other; shrinking
    entries are kept (negative deltas, like pprof -diff_base)."""
    sa = {tuple(e["stack"]): e for e in sites(a_view)}
    sb = {tuple(e["stack"]): e for e in sites(b_view)}
    entries = []
    for key in set(sa) | set(sb):
        ea, eb = sa.get(key), sb.get(key)
        va = {k: ea[k] if ea else 0 for k in VALUE_KEYS}
        vb = {k: eb[k] if eb else 0 for k in VALUE_KEYS}
        delta = {k: vb[k] - va[k] for k in VALUE_KEYS}
        if not any(delta.values()):
            continue
        ref = eb or ea
        entries.append({"function": ref["function"], "object": ref["object"],
                        "stack": list(key), "a": va, "b": vb, "delta": delta})
    entries.sort(key=lambda e: (-e["delta"]["inuse_bytes"], -e["delta"]["inuse_objects"],
                                e["function"]))
    d = DiffView(a_view, b_view, entries)
    for side, view in (("a", a_view), ("b", b_view)):
        if not view.path:
            continue
        try:
            setattr(d, f"context_{side}", load_context(view.path))
        except (MalformedData, AccessDenied, Unsupported) as exc:
            d.warnings.append(f"sidecar ignored: {exc}")
    if d.context_a and d.context_b and d.context_a.get("pid") != d.context_b.get("pid"):
        d.warnings.append(f"the two snapshots are of different processes "
                          f"({d.context_a.get('pid')} and {d.context_b.get('pid')})")
    return d


def _layer_value(ctx, section, name):
    if not ctx:
        return None
    sec = ctx.get(section) or {}
    v = sec.get(name)
    if isinstance(v, dict):          # stats fields are {value, provenance, source}
        v = v.get("value")
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def layer_deltas(context_a, context_b):
    """[{layer, a, b, delta}] for the allocator and kernel layers (None when
    either side does not know)."""
    out = []
    for label, section, name in LAYERS:
        va, vb = _layer_value(context_a, section, name), _layer_value(context_b, section, name)
        out.append({"layer": label, "a": va, "b": vb,
                    "delta": vb - va if va is not None and vb is not None else None})
    return out


def verdict(d, context_a=None, context_b=None):
    """One line saying where the growth between the two moments went.

    Rule: the growth is split into three parts and the largest names it:
      live      = allocated delta (the allocator's live bytes; without
                  allocator numbers, the profile's in-use delta);
      retention = resident delta - allocated delta (pages the allocator holds
                  but the program freed; active stands in for an unknown
                  resident), capped by the RSS growth that live and lazyfree
                  do not explain: jemalloc's resident is an upper bound
                  (measured: +54 MiB resident for +22 MiB RSS after freeing
                  20 MB of small blocks);
      lazyfree  = the kernel's LazyFree delta (pages given back with
                  MADV_FREE that stay in RSS until memory pressure).
    When none of them grew, there is no growth to explain.  Without sidecars
    only the profile speaks, so the verdict is about live objects or none.
    """
    layers = {row["layer"]: row["delta"] for row in layer_deltas(context_a, context_b)}
    live = layers.get("allocated")
    if live is None:
        live = d.b.totals()["inuse_bytes"] - d.a.totals()["inuse_bytes"]
    held = layers.get("resident") if layers.get("resident") is not None else layers.get("active")
    lazy = layers.get("lazyfree") or 0
    retention = held - live if held is not None else 0
    if layers.get("rss") is not None:
        retention = min(retention, max(layers["rss"] - max(live, 0) - max(lazy, 0), 0))
    parts = {VERDICT_LIVE: live, VERDICT_RETENTION: retention, VERDICT_LAZYFREE: lazy}
    name, size = max(parts.items(), key=lambda kv: kv[1])
    if size <= 0:
        return VERDICT_NONE, parts
    return name, parts


def diff_json(d, context_a=None, context_b=None):
    context_a, context_b = d.contexts(context_a, context_b)
    ta, tb = d.a.totals(), d.b.totals()
    name, parts = verdict(d, context_a, context_b)
    return {
        "a": {"path": d.a.path, "format": d.a.format, "totals": ta},
        "b": {"path": d.b.path, "format": d.b.format, "totals": tb},
        "delta": {k: tb[k] - ta[k] for k in VALUE_KEYS},
        "sites": d.entries,
        "layers": layer_deltas(context_a, context_b) if (context_a and context_b) else [],
        "verdict": name,
        "verdict_parts": parts,
        "warnings": list(d.warnings),
    }


def _site_label(e):
    """function (object) <- caller: sites with one function differ by caller."""
    label = e["function"] + (f"  ({os.path.basename(e['object'])})" if e["object"] else "")
    return label + (f"  <- {e['stack'][1]}" if len(e["stack"]) > 1 else "")


def _signed_bytes(v):
    if v is None:
        return "-"
    return ("+" if v > 0 else "-" if v < 0 else "") + human_bytes(abs(v))


def render_diff(d, context_a=None, context_b=None, n=20):
    context_a, context_b = d.contexts(context_a, context_b)
    out = io.StringIO()
    ta, tb = d.a.totals(), d.b.totals()
    print(f"A: {d.a.path or 'profile A'} ({d.a.format})", file=out)
    print(f"B: {d.b.path or 'profile B'} ({d.b.format})", file=out)
    print(f"in use: {human_bytes(ta['inuse_bytes'])} -> {human_bytes(tb['inuse_bytes'])} "
          f"({_signed_bytes(tb['inuse_bytes'] - ta['inuse_bytes'])}, "
          f"{tb['inuse_objects'] - ta['inuse_objects']:+d} objects)", file=out)
    grew = [e for e in d.entries if e["delta"]["inuse_bytes"] > 0][:n]
    shrank = [e for e in reversed(d.entries) if e["delta"]["inuse_bytes"] < 0][:n]
    for title, rows in (("grew", grew), ("shrank", shrank)):
        print(f"\n{title} ({len(rows)} sites shown):", file=out)
        if not rows:
            print("  (none)", file=out)
            continue
        body = [[_signed_bytes(e["delta"]["inuse_bytes"]), f"{e['delta']['inuse_objects']:+d}",
                 human_bytes(e["a"]["inuse_bytes"]), human_bytes(e["b"]["inuse_bytes"]),
                 _site_label(e)] for e in rows]
        table(body, ["bytes", "objects", "A", "B", "site"], right=(0, 1, 2, 3), out=out)
    if context_a and context_b:
        print("\nlayers between the same two moments (inspect snapshots):", file=out)
        body = [[row["layer"], human_bytes(row["a"]), human_bytes(row["b"]),
                 _signed_bytes(row["delta"]),
                 "" if row["delta"] is None else f"{row['delta']:+d} B"]
                for row in layer_deltas(context_a, context_b)]
        table(body, ["layer", "A", "B", "delta", "bytes"], right=(1, 2, 3, 4), out=out)
    else:
        print("\nno snapshot sidecars (FILE" + SIDECAR_SUFFIX + "): allocator and kernel "
              "layers not compared", file=out)
    name, parts = verdict(d, context_a, context_b)
    detail = ", ".join(f"{VERDICT_PART_LABELS[k]} {_signed_bytes(v)}" for k, v in parts.items())
    print(f"\nverdict: {name}  [{detail}]", file=out)
    for w in d.warnings:
        print(f"warning: {w}", file=out)
    return out.getvalue()


def load_context(profile_path):
    """The ``inspect --json`` document saved next to PROFILE_PATH at dump
    time (``PROFILE_PATH.snapshot.json``), or None when there is none.
    Raises MalformedData when it exists but is not a snapshot."""
    from diag.recording import snapshot_from_json
    side = profile_path + SIDECAR_SUFFIX
    try:
        with open(side, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _os_error(exc, side) from None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise MalformedData(f"{side}: not JSON ({exc})") from None
    snapshot_from_json(doc)          # validates; raises MalformedData
    return doc
