"""jemalloc's ``malloc_stats_print`` table output (no "J"), read into the
shape :func:`collectors.allocators.jemalloc.stats.parse_stats_json` gives.

Why a second format: in JSON, the general section prints one object per
size class (``arenas.bin``: four mallctls each, ``arenas.lextent``: one;
232 classes on x86-64), the table does not ("We do enough mallctls in a
loop that we actually want to omit them", src/stats.c
stats_general_print).  In-process, libjemalloc2 5.3.0 on this project's
Debian 12 box: "Jdablxeh" 77-91 us, "dablxeh" 35-49 us, for the same
values; a first stop of a process prints the general section, so it prints
the table (``gather``), and the snapshots after it print JSON without
the general section ("Jgdablxeh", 15-21 us).

Layout (src/stats.c and src/emitter.h of 5.3, emitter_output_table): one
``label: value`` per line, strings quoted, booleans ``true``/``false``, a
mutable option with its current value as a note, ``opt.NAME: V (ALT: W)``;
the merged arena's decay and allocation counters as column tables.  The
value names here are the JSON's, so ``stats.mallctls`` reads either.
"""

from __future__ import annotations

import re
from typing import Any

from diag.model.errors import MalformedData

BEGIN = "___ Begin jemalloc statistics ___"
END = "--- End jemalloc statistics ---"

# section titles (emitter_dict_begin's table title) -> JSON object
SECTIONS = {"Build-time option settings": "config", "Run-time option settings": "opt",
            "Profiling settings": "prof"}
# general "arenas" lines: table label -> JSON key (stats_general_print)
ARENAS_LABELS = {"Arenas": "narenas", "Quantum size": "quantum", "Page size": "page",
                 "Hugepage size": "hugepage", "Maximum thread-cached size class": "tcache_max",
                 "Number of bin size classes": "nbins",
                 "Number of thread-cache bin size classes": "nhbins",
                 "Number of large size classes": "nlextents"}
# opt notes that are the "arenas" defaults in JSON (OPT_WRITE_SSIZE_T_MUTABLE)
ARENAS_NOTES = {"arenas.dirty_decay_ms": "dirty_decay_ms",
                "arenas.muzzy_decay_ms": "muzzy_decay_ms"}
# stats_print_helper's summary lines
TOTALS = re.compile(r"Allocated: (\d+), active: (\d+), metadata: (\d+) \(n_thp (\d+)\), "
                    r"resident: (\d+), mapped: (\d+), retained: (\d+)$")
TOTALS_KEYS = ("allocated", "active", "metadata", "metadata_thp", "resident", "mapped",
               "retained")
ZERO_REALLOCS = re.compile(r"Count of realloc\(non-null-ptr, 0\) calls: (\d+)$")
BACKGROUND = re.compile(r"Background threads: (\d+), num_runs: (\d+), run_interval: (\d+) ns$")
MERGED = "Merged arenas stats:"
# stats_arena_print, merged arena: label -> JSON key
ARENA_LABELS = {"assigned threads": "nthreads", "uptime": "uptime_ns",
                "dss allocation precedence": "dss"}
ARENA_BYTES = ("mapped", "retained", "base", "internal", "metadata_thp", "tcache_bytes",
               "tcache_stashed_bytes", "resident", "abandoned_vm", "extent_avail")
# "decaying:  time  npages  sweeps  madvises  purged": a row per page state
DECAY_ROWS = ("dirty", "muzzy")
DECAY_COLUMNS = ("decay_ms", "npages", "npurge", "nmadvise", "purged")
# "allocated nmalloc (#/sec) ndalloc (#/sec) nrequests (#/sec) nfill (#/sec) nflush (#/sec)"
ALLOC_ROWS = ("small", "large")
ALLOC_COLUMNS = ("allocated", "nmalloc", None, "ndalloc", None, "nrequests", None,
                 "nfills", None, "nflushes", None)
NOT_SET = "N/A"          # a negative decay time (the merged arena's -1)
KV = re.compile(r"([^:]+): (.*)$")
NOTE = re.compile(r"(.*) \(([a-z_.]+): (.*)\)$")


class CutString(MalformedData):
    """A quoted value with no closing quote: the emitter cuts every value
    at 255 bytes (emitter.h BUF_SIZE), so JSON, which quotes the same way,
    is cut there too."""


def parse_stats_table(text: Any) -> dict[str, Any]:
    """``malloc_stats_print(cb, arg, "dablxeh")`` output (jemalloc 5.3) ->
    the tree parse_stats_json builds from JSON, before its checks
    (stats.checked).  MalformedData for anything else,
    a cut output included."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    lines = text.splitlines()
    try:
        first, last = lines.index(BEGIN), lines.index(END)
    except ValueError:
        raise MalformedData("jemalloc stats table: no begin or end line (truncated output?)") \
            from None
    tree: dict[str, Any] = {"version": None, "config": {}, "opt": {}, "prof": {}, "arenas": {},
                            "stats": {}, "arenas_stats": {}}
    merged: dict[str, Any] | None = None
    section = None
    columns: tuple[str | None, ...] | None = None
    for number, line in enumerate(lines[first + 1:last], first + 2):
        try:
            section, columns, merged = _line(tree, line, section, columns, merged)
        except CutString:
            raise CutString(f"jemalloc stats table: line {number} holds a string cut at "
                            f"255 bytes: {line[:80]!r}") from None
        except (ValueError, KeyError, IndexError):
            raise MalformedData(f"jemalloc stats table: line {number} not understood: "
                                f"{line[:80]!r}") from None
    if merged is not None:
        merged["pactive"] = _pages(merged.pop("active", None), tree["arenas"].get("page"))
        tree["arenas_stats"]["merged"] = merged
    tree["merged_from"] = "stats.arenas.merged" if merged is not None else None
    return tree


def _line(tree, line, section, columns, merged):
    """Read LINE into TREE; the (section, table columns, merged arena) the
    next line is read in."""
    stripped = line.strip()
    if not stripped:
        return section, None, merged
    if line in SECTIONS:
        return SECTIONS[line], None, merged
    if line == MERGED:
        return None, None, {}
    if merged is not None:
        return None, _arena_line(merged, line, stripped, columns), merged
    if line.startswith("  ") and section is not None:
        name, value = _kv(stripped)
        group, _, key = name.partition(".")
        if group != section:
            raise ValueError(name)
        note = NOTE.match(value) if not value.startswith('"') else None   # notes are numbers
        if note is not None:
            value, alt, alt_value = note.groups()
            if alt in ARENAS_NOTES:
                tree["arenas"][ARENAS_NOTES[alt]] = _value(alt_value)
        tree[section][key] = _value(value)
        return section, None, merged
    for pattern, keys, into in ((TOTALS, TOTALS_KEYS, tree["stats"]),
                                (ZERO_REALLOCS, ("zero_reallocs",), tree["stats"]),
                                (BACKGROUND, ("num_threads", "num_runs", "run_interval"),
                                 tree["stats"].setdefault("background_thread", {}))):
        m = pattern.match(line)
        if m:
            into.update(zip(keys, map(int, m.groups())))
            return None, None, merged
    label, value = _kv(line)
    if label == "Version":
        tree["version"] = _value(value)
    else:
        tree["arenas"][ARENAS_LABELS[label]] = _value(value)
    return None, None, merged


def _arena_line(merged, line, stripped, columns):
    """One line of the merged arena's section; the columns of the table it
    opens, if it is a header."""
    if stripped.startswith("decaying:"):
        return DECAY_COLUMNS
    if stripped.startswith("allocated "):
        return ALLOC_COLUMNS
    head, _, rest = stripped.partition(":")
    if columns is DECAY_COLUMNS and head in DECAY_ROWS:
        cells = rest.split()
        if len(cells) != len(DECAY_COLUMNS):
            raise ValueError(line)
        row = dict(zip(DECAY_COLUMNS, cells))
        merged[f"{head}_decay_ms"] = -1 if row["decay_ms"] == NOT_SET else int(row["decay_ms"])
        merged[f"p{head}"] = int(row["npages"])
        for key in ("npurge", "nmadvise", "purged"):
            merged[f"{head}_{key}"] = int(row[key])
        return columns
    if columns is ALLOC_COLUMNS and head in ALLOC_ROWS + ("total",):
        cells = rest.split()
        if len(cells) != len(ALLOC_COLUMNS):
            raise ValueError(line)
        if head != "total":         # small + large, printed in table mode only
            merged[head] = {key: int(cell) for key, cell in zip(ALLOC_COLUMNS, cells) if key}
        return columns
    label, value = _kv(line)
    label = label.strip()
    if label == "active" or label in ARENA_BYTES:
        merged[label] = int(value)
    else:
        merged[ARENA_LABELS[label]] = _value(value)
    return None


def _kv(line):
    """(label, value) of a ``label: value`` line; ValueError if it is not one."""
    m = KV.match(line)
    if m is None:
        raise ValueError(line)
    return m.groups()


def _value(text):
    """A table value as JSON has it: quoted string, boolean or integer."""
    text = text.strip()
    if text.startswith('"'):
        if len(text) < 2 or not text.endswith('"'):
            raise CutString(text)
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    return int(text)


def _pages(active, page):
    """The merged arena's pactive from the bytes the table prints
    (pactive * page, stats_arena_print)."""
    if not isinstance(active, int) or not isinstance(page, int) or page <= 0 or active % page:
        raise MalformedData(f"jemalloc stats table: active {active!r} is not a whole number "
                            f"of {page!r}-byte pages")
    return active // page
