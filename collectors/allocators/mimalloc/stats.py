"""mimalloc statistics: ``mi_stats_print_out`` text, ``mi_process_info`` and
(newer versions only) ``mi_stats_get_json``.

Debian's mimalloc 2.0.9 (``MI_MALLOC_VERSION 209``) exports
``mi_stats_print_out(mi_output_fun*, void*)`` and ``mi_process_info`` but no
``mi_stats_get``/``mi_stats_get_json`` (those came with mimalloc-stats.h in
v2.2/v3.1).  Facts from mimalloc's src/stats.c:

* The text printer rounds: ``mi_printf_amount`` prints values >= 1024 (bytes)
  or >= 1000 (counts) as ``whole.frac`` where ``tens = n / (divider/10)``
  (integer division, truncation toward zero).  So "34.0 MiB" means
  ``340 * 104857 <= n < 341 * 104857``.  Parsed amounts carry ``min``/``max``.
* 2.0.9 columns: ``peak total freed current unit count``; newer versions
  drop ``freed``; the header line names the columns, the parser reads it.
* Release builds (MI_STAT 0, the Debian package) do not print the
  ``normal``/``huge``/``total``/``malloc requested`` rows: bytes allocated
  by the program are not tracked.  The OS-level ``reserved`` and
  ``committed`` counters are.
* ``mi_process_info`` on Linux: ``current_rss = current_commit`` (the
  committed-bytes counter, "estimate"), ``peak_rss = ru_maxrss * 1024``,
  ``current_commit/peak_commit`` = stats committed.current/peak.  So its
  "current_rss" is NOT the RSS; we label it committed.
* The text's last line ``process: ... rss: X, commit: Y`` prints peak_rss
  and peak_commit.
* ``mi_stats_get_json`` (v2.2+/v3): ``{"version"|"stat_version",
  "mimalloc_version", "process": {elapsed_msecs, user_msecs, system_msecs,
  page_faults, rss_current, rss_peak, commit_current, commit_peak},
  <MI_STAT_COUNT>: {"total","peak","current"}, <MI_STAT_COUNTER>: int, ...,
  "malloc_bins": [...], "page_bins": [...]}``.
"""

from __future__ import annotations

from typing import Any

import json
import re

from diag.model import Value
from diag.model.errors import MalformedData

_AMOUNT = re.compile(r"(-?\d+)(?:\.(\d))?(?:\s+([KMG])(i?)(B?)|\s+(B)\b)?")
_ROW = re.compile(r"^\s*(?P<name>-?[A-Za-z][A-Za-z _]*?)\s*:(?P<rest>.*)$")
_PROCESS = re.compile(
    r"user:\s*(?P<user>[\d.]+)\s*s,\s*system:\s*(?P<sys>[\d.]+)\s*s,\s*faults:\s*(?P<faults>\d+)"
    r"(?:,\s*rss:\s*(?P<rss>[^,]+?))?(?:,\s*commit:\s*(?P<commit>[^,]+?))?\s*$")
_STATUS = re.compile(r"\s+(ok|not all freed!|freed!)\s*$")

PROCESS_INFO_FIELDS = ("elapsed_msecs", "user_msecs", "system_msecs", "current_rss",
                       "peak_rss", "current_commit", "peak_commit", "page_faults")


def _amount(whole, frac, mag, binary, bunit, plain_b):
    """One printed amount -> {"value", "min", "max", "text"} (bytes/count)."""
    text = f"{whole}{'.' + frac if frac is not None else ''}"
    if mag is None:
        n = int(whole)
        return {"value": n, "min": n, "max": n, "text": text + (" B" if plain_b else "")}
    base = 1024 if binary else 1000
    divider = base ** ("KMG".index(mag) + 1)
    step = divider // 10
    tens = abs(int(whole)) * 10 + int(frac or 0)
    neg = whole.startswith("-")
    lo, hi = tens * step, (tens + 1) * step - 1
    if neg:
        lo, hi = -hi, -lo
    return {"value": lo if not neg else hi, "min": lo, "max": hi,
            "text": f"{text} {mag}{binary}{bunit}"}


def _amounts(text):
    out = []
    for m in _AMOUNT.finditer(text):
        try:
            out.append(_amount(m.group(1), m.group(2), m.group(3), m.group(4) or "",
                               m.group(5) or "", m.group(6)))
        except ValueError:  # more digits than int() takes (sys.get_int_max_str_digits)
            raise MalformedData(f"mimalloc stats: not an amount: {m.group(0)[:40]!r}...") \
                from None
    return out


def _num(conv, text, lineno, line):
    """CONV of the first word of TEXT, or MalformedData naming the line."""
    try:
        return conv(text.split()[0])
    except (ValueError, IndexError):
        raise MalformedData(f"mimalloc stats line {lineno}: not a number in "
                            f"{line[:80]!r}") from None


def parse_stats_text(text: Any) -> Any:
    """``mi_stats_print_out`` text -> native dict.

    ``{"columns": [...], "rows": {name: {column: amount}}, "counters":
    {name: amount}, "searches_avg", "numa_nodes", "elapsed_s",
    "process": {"user_s","system_s","page_faults","peak_rss","peak_commit"},
    "tracks_allocations": bool}``; amounts are {"value","min","max","text"}.
    Rows whose name starts with "-" are qualified by the row above them
    ("segments-abandoned", "pages-abandoned", "pages-extended").
    """
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise MalformedData(f"mimalloc stats: expected text, got {type(text).__name__}")
    columns = None
    rows: dict[str, Any] = {}
    counters: dict[str, Any] = {}
    out: dict[str, Any] = {"columns": None, "rows": rows, "counters": counters, "searches_avg": None,
           "numa_nodes": None, "elapsed_s": None, "process": None}
    parent = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _ROW.match(line)
        if not m:
            continue    # bin tables of debug builds, option dumps, ...
        name, rest = m.group("name").strip(), m.group("rest")
        if name == "heap stats":
            columns = rest.split()
            out["columns"] = columns
            continue
        if name == "process":
            pm = _PROCESS.search(rest)
            if not pm:
                raise MalformedData(f"mimalloc stats line {lineno}: cannot parse {line!r}")
            proc = {"user_s": _num(float, pm.group("user"), lineno, line),
                    "system_s": _num(float, pm.group("sys"), lineno, line),
                    "page_faults": _num(int, pm.group("faults"), lineno, line)}
            for key, grp in (("peak_rss", "rss"), ("peak_commit", "commit")):
                if pm.group(grp):
                    vals = _amounts(pm.group(grp))
                    if len(vals) != 1:
                        raise MalformedData(f"mimalloc stats line {lineno}: bad {grp} amount")
                    proc[key] = vals[0]
            out["process"] = proc
            continue
        if name == "elapsed":
            out["elapsed_s"] = _num(float, rest, lineno, line)
            continue
        if name == "numa nodes":
            out["numa_nodes"] = _num(int, rest, lineno, line)
            continue
        if rest.strip().endswith("avg"):
            out["searches_avg" if name == "searches" else name + "_avg"] = \
                _num(float, rest, lineno, line)
            continue
        if columns is None:
            raise MalformedData(f"mimalloc stats line {lineno}: data before the "
                                "'heap stats:' header (truncated or not mi_stats_print output?)")
        key = name
        if name.startswith("-"):
            key = (parent or "") + name
        else:
            parent = name
        body = _STATUS.sub("", rest)
        vals = _amounts(body)
        if not vals:
            raise MalformedData(f"mimalloc stats line {lineno}: no values in {line!r}")
        if len(vals) == 1:
            counters[key] = vals[0]
        else:
            if len(vals) > len(columns):
                raise MalformedData(f"mimalloc stats line {lineno}: {len(vals)} values for "
                                    f"{len(columns)} columns")
            rows[key] = dict(zip(columns, vals))
    if columns is None:
        raise MalformedData("mimalloc stats: no 'heap stats:' header (not mi_stats_print output?)")
    for needed in ("reserved", "committed"):
        if needed not in rows:
            raise MalformedData(f"mimalloc stats: no {needed!r} row (truncated output?)")
    if out["process"] is None:
        raise MalformedData("mimalloc stats: no 'process:' line (truncated output?)")
    out["tracks_allocations"] = any(k in rows for k in ("total", "normal", "malloc_normal"))
    out["format"] = "text"
    return out


def parse_stats_json(text: Any) -> Any:
    """``mi_stats_get_json`` output (mimalloc >= 2.2 / 3.1) -> native dict.

    ``{"stat_version", "mimalloc_version", "process": {...},
    "counts": {name: {"total","peak","current"}}, "counters": {name: int},
    "malloc_bins": [...], "page_bins": [...], "tracks_allocations": bool}``.
    """
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str) or not text.strip():
        raise MalformedData("mimalloc stats JSON: empty input")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedData(f"mimalloc stats JSON: {exc.msg} at line {exc.lineno} column "
                            f"{exc.colno} (truncated output?)") from None
    except (ValueError, RecursionError) as exc:     # a huge integer, deep nesting
        raise MalformedData(f"mimalloc stats JSON: {type(exc).__name__}: {exc}") from None
    if not isinstance(doc, dict) or "mimalloc_version" not in doc:
        raise MalformedData("mimalloc stats JSON: no \"mimalloc_version\" key "
                            "(not mi_stats_get_json output?)")
    version = doc.get("stat_version", doc.get("version"))   # renamed in later releases
    proc = doc.get("process")
    if not isinstance(proc, dict):
        raise MalformedData("mimalloc stats JSON: no \"process\" object")
    counts, counters = {}, {}
    for key, val in doc.items():
        if key in ("version", "stat_version", "mimalloc_version", "process",
                   "malloc_bins", "page_bins", "chunk_bins"):
            continue
        if isinstance(val, dict) and {"total", "peak", "current"} <= set(val):
            try:
                counts[key] = {k: int(val[k]) for k in ("total", "peak", "current")}
            except (ValueError, TypeError, OverflowError):      # null, text, 1e309
                raise MalformedData(f"mimalloc stats JSON: {key} holds a non-number: "
                                    f"{str(val)[:80]}") from None
        elif isinstance(val, int) and not isinstance(val, bool):
            counters[key] = val
    for needed in ("reserved", "committed"):
        if needed not in counts:
            raise MalformedData(f"mimalloc stats JSON: no {needed!r} count")
    bins = doc.get("malloc_bins") or []
    if not isinstance(bins, list):
        raise MalformedData("mimalloc stats JSON: malloc_bins is not a list")
    tracked = any(counts.get(k, {}).get("total") for k in ("malloc_normal", "malloc_huge")) or \
        any(isinstance(b, dict) and b.get("total") for b in bins)
    return {"format": "json", "stat_version": version,
            "mimalloc_version": doc.get("mimalloc_version"),
            "process": {k: proc.get(k) for k in proc}, "counts": counts, "counters": counters,
            "malloc_bins": bins, "page_bins": doc.get("page_bins") or [],
            "tracks_allocations": bool(tracked)}


def process_info_dict(values: Any) -> Any:
    """mi_process_info's eight out-parameters (in order) -> dict, with
    ``current_rss`` relabelled: on Linux it is the commit counter."""
    if len(values) != len(PROCESS_INFO_FIELDS):
        raise MalformedData(f"mi_process_info: expected 8 values, got {len(values)}")
    d = dict(zip(PROCESS_INFO_FIELDS, (int(v) for v in values)))
    d["current_rss_is_commit"] = True
    return d


def normalise_mimalloc(native: Any = None, process_info: Any = None,
                       stats_main: Any = None) -> Any:
    """Text/JSON native dict and/or mi_process_info dict (or the committed
    counter read from memory, STATS_MAIN) -> {field: Value}.

      allocated = malloc_normal.current + malloc_huge.current   (JSON, if tracked)
                | "total" row current (text, debug/MI_STAT builds only)
                | unknown (release builds do not count program allocations)
      committed = committed current bytes: mi_process_info current_commit
                  or _mi_stats_main.committed.current read from memory (the
                  same word: exact) | stats committed.current.  Not resident: committed
                  pages may be untouched or reset (MADV_FREE), so the host
                  view of a burst-then-idle process showed 160 MiB against an
                  RSS of 100.9 MiB.  mi_process_info's current_rss on Linux is
                  this same counter, not the RSS.
      resident  = unknown here; diag.snapshot measures it from the pages of
                  the segments (collectors.allocators.mimalloc.segments + pagemap).
      mapped    = reserved.current (address space reserved: OS allocations
                  incl. not-yet-committed parts of segments/arenas): exact
                  from _mi_stats_main, else the text's rounded amount
      active, retained, metadata, dirty, muzzy: unknown (not tracked, or
      only as cumulative counters).
    """
    out = {k: Value() for k in ("allocated", "active", "resident", "committed", "mapped",
                                "retained", "metadata", "dirty", "muzzy")}
    fmt = (native or {}).get("format")
    if fmt == "json":
        counts = native["counts"]
        if native.get("tracks_allocations"):
            normal = counts.get("malloc_normal", {}).get("current", 0)
            huge = counts.get("malloc_huge", {}).get("current", 0)
            out["allocated"] = Value.derived(normal + huge, "mi_stats_get_json malloc_normal.current"
                                                            " + malloc_huge.current")
        out["mapped"] = Value.measured(counts["reserved"]["current"],
                                       "mi_stats_get_json reserved.current")
        out["committed"] = Value.measured(counts["committed"]["current"],
                                          "mi_stats_get_json committed.current")
    elif fmt == "text":
        rows = native["rows"]

        def text_value(row, col, what):
            amt = rows[row].get(col)
            if amt is None:
                return Value()
            exact = amt["min"] == amt["max"]
            note = "" if exact else f"; printed as {amt['text']!r}: true value in [{amt['min']}, {amt['max']}]"
            return Value.measured(amt["min"] if amt["min"] >= 0 else amt["value"],
                                  f"mi_stats_print {row} {col}{note}{what}")
        if "total" in rows and native.get("tracks_allocations"):
            out["allocated"] = text_value("total", "current", "")
        out["mapped"] = text_value("reserved", "current", "")
        out["committed"] = text_value("committed", "current", "")
    exact = None
    if process_info is not None and process_info.get("current_commit") is not None:
        exact = "mi_process_info current_commit"
        out["committed"] = Value.measured(
            process_info["current_commit"],
            "mi_process_info current_commit (current_rss is the same counter on Linux)")
    elif stats_main is not None:
        out["committed"] = Value.measured(
            stats_main["committed"]["current"],
            f"_mi_stats_main.committed.current read from memory at {stats_main['address']} "
            "(what mi_process_info returns as current_commit; address checked against it)")
        out["mapped"] = Value.measured(
            stats_main["reserved"]["current"],
            f"_mi_stats_main.reserved.current read from memory at {stats_main['address']} "
            "(the count before committed; the text prints it rounded)")
    if exact is not None:
        amt = (native or {}).get("rows", {}).get("reserved", {}).get("current") \
            if fmt == "text" else None
        if amt is not None and amt["min"] < out["committed"].value <= amt["max"]:
            # The printed reserved is rounded; mimalloc commits only inside
            # what it reserved, so the exact committed bytes bound it below.
            out["mapped"] = Value.derived(
                out["committed"].value,
                f"mi_stats_print reserved current, printed as {amt['text']!r} (true value in "
                f"[{amt['min']}, {amt['max']}]): at least {exact}")
    return out
