"""jemalloc statistics: mallctl names/types and ``malloc_stats_print("J")``.

Meanings are jemalloc's (doc/jemalloc.xml.in, src/ctl.c, src/stats.c of
5.2/5.3):

* ``stats.allocated``: bytes allocated by the application.
* ``stats.active``: bytes in active pages (a page multiple >= allocated);
  excludes pdirty/pmuzzy pages and metadata.
* ``stats.metadata``: base + internal allocations.
* ``stats.resident``: *maximum* bytes in physically resident data pages
  (metadata, active and unused dirty pages); an upper bound.
* ``stats.mapped``: bytes in active extents; no strict ordering with resident.
* ``stats.retained``: virtual memory kept (decommitted/purged) instead of
  unmapped; excluded from mapped.
* ``stats.arenas.<i>.pdirty`` / ``pmuzzy``: unused pages not yet purged /
  purged lazily (MADV_FREE), in **pages** (x ``arenas.page``).
  ``<i> = 4096`` (MALLCTL_ARENAS_ALL) is the merged view.

Every stats mallctl is a cached snapshot: write ``epoch`` first.
``malloc_stats_print`` writes epoch itself; the JSON's "stats.arenas" has a
"merged" entry only when more than one arena is initialised (or per-arena
output is disabled), see stats_print_helper in src/stats.c.
"""

from __future__ import annotations

from typing import Any

import json

from diag.model import Value
from diag.model.errors import MalformedData

MALLCTL_ARENAS_ALL = 4096        # include/jemalloc/jemalloc_macros.h.in
MALLCTL_ARENAS_DESTROYED = 4097

# The mallctls normalise_jemalloc reads (and the parse result's "mallctl"
# holds).  The full list allocdiag reports, with types, units and meanings,
# is collectors/allocators/jemalloc/__init__.py MALLCTLS.
_NORMALISED = ("version", "config.stats", "opt.background_thread", "opt.narenas",
               "opt.dirty_decay_ms", "opt.muzzy_decay_ms", "opt.retain", "arenas.narenas",
               "arenas.page", "arenas.dirty_decay_ms", "arenas.muzzy_decay_ms",
               "stats.allocated", "stats.active", "stats.metadata", "stats.metadata_thp",
               "stats.resident", "stats.mapped", "stats.retained", "stats.zero_reallocs",
               "stats.background_thread.num_threads", "stats.background_thread.num_runs",
               "stats.background_thread.run_interval")
_ARENA_SUMMABLE = ("pactive", "pdirty", "pmuzzy", "tcache_bytes")

_REQUIRED = ("stats.allocated", "stats.active", "stats.metadata", "stats.resident",
             "stats.mapped", "stats.retained")


def parse_stats_json(text: Any) -> Any:
    """``malloc_stats_print(cb, arg, "J")`` output -> native dict.

    Returns ``{"version", "config", "opt", "arenas" (general, without the
    bin/lextent tables), "stats" (global), "arenas_stats": {"merged"?,
    "destroyed"?, "<i>": {...}}, "mallctl": {mallctl name: value}}``.
    ``mallctl`` holds the values allocdiag normalises, under their mallctl
    names, so :func:`normalise_jemalloc` works on either source.
    """
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedData(f"jemalloc stats JSON: not UTF-8 ({exc})") from None
    if not isinstance(text, str):
        raise MalformedData(f"jemalloc stats JSON: expected text, got {type(text).__name__}")
    if not text.strip():
        raise MalformedData("jemalloc stats JSON: empty input")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedData(f"jemalloc stats JSON: {exc.msg} at line {exc.lineno} column "
                            f"{exc.colno} (truncated output?)") from None
    except RecursionError:
        raise MalformedData("jemalloc stats JSON: nested too deeply") from None
    except ValueError as exc:       # an integer of more than sys.get_int_max_str_digits()
        raise MalformedData(f"jemalloc stats JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("jemalloc"), dict):
        raise MalformedData("jemalloc stats JSON: no top-level \"jemalloc\" object "
                            "(not malloc_stats_print \"J\" output?)")
    je = doc["jemalloc"]
    stats = je.get("stats")
    if not isinstance(stats, dict):
        raise MalformedData("jemalloc stats JSON: no \"stats\" object (printed with "
                            "config.stats off, or options that omit it?)")
    general = je.get("arenas") if isinstance(je.get("arenas"), dict) else {}
    arenas_stats = je.get("stats.arenas") if isinstance(je.get("stats.arenas"), dict) else {}
    for key, val in arenas_stats.items():
        if not isinstance(val, dict):
            raise MalformedData(f"jemalloc stats JSON: stats.arenas.{key} is not an object")

    merged_from = None
    if "merged" in arenas_stats:
        merged_from = "stats.arenas.merged"
    elif any(k.isdigit() for k in arenas_stats):
        merged_from = "sum of stats.arenas.<i> (no merged entry: one arena initialised)"
    out = {
        "version": je.get("version"),
        "config": je.get("config", {}),
        "opt": je.get("opt", {}),
        "arenas": {k: v for k, v in general.items() if k not in ("bin", "lextent")},
        "stats": {k: v for k, v in stats.items() if k != "mutexes"},
        "arenas_stats": {k: {kk: vv for kk, vv in v.items()
                             if kk not in ("bins", "lextents", "extents", "mutexes", "hpa_shard")}
                         for k, v in arenas_stats.items()},
        "merged_from": merged_from,
    }
    return checked(out, "JSON")


def checked(out: dict[str, Any], form: str) -> dict[str, Any]:
    """OUT (a parsed stats print, FORM "JSON" or "table") with its
    ``mallctl`` values, once the ones every snapshot needs are there and
    sane; MalformedData if not."""
    names = _NORMALISED + tuple(f"stats.arenas.{MALLCTL_ARENAS_ALL}.{k}" for k in _ARENA_SUMMABLE)
    mallctl = mallctls(out, names)
    for name in _REQUIRED:
        val = mallctl.get(name)
        if not isinstance(val, int) or isinstance(val, bool) or val < 0:
            raise MalformedData(f"jemalloc stats {form}: {name} missing or not a "
                                f"non-negative integer ({val!r})")
    for key in ("pdirty", "pmuzzy", "pactive"):
        val = mallctl.get(f"stats.arenas.{MALLCTL_ARENAS_ALL}.{key}")
        if val is not None and (not isinstance(val, int) or val < 0):
            raise MalformedData(f"jemalloc stats {form}: {key} is not a non-negative integer")
    out["mallctl"] = mallctl
    return out


def mallctls(parsed: Any, names: Any) -> Any:
    """{mallctl name: value} for each of NAMES found in a parse_stats_json()
    result.  The JSON's paths are the mallctl names (src/stats.c), with the
    merged pseudo-arena under "merged" for index 4096 (MALLCTL_ARENAS_ALL);
    without a merged entry (one arena, printed per arena) the additive
    per-arena values are summed.  Names the JSON does not print (e.g. the
    runtime ``background_thread``) are left out."""
    tree = {"version": parsed.get("version"), "config": parsed.get("config") or {},
            "opt": parsed.get("opt") or {}, "arenas": parsed.get("arenas") or {},
            "stats": parsed.get("stats") or {}}
    arenas_stats = parsed.get("arenas_stats") or {}
    merged = arenas_stats.get("merged")
    numbered = [v for k, v in arenas_stats.items() if k.isdigit()]
    prefix = f"stats.arenas.{MALLCTL_ARENAS_ALL}."
    out = {}
    for name in names:
        if name.startswith(prefix):
            parts = name[len(prefix):].split(".")
            if merged is not None:
                val = _walk(merged, parts)
            else:
                vals = [_walk(a, parts) for a in numbered]
                val = sum(vals) if vals and all(isinstance(v, int) and not isinstance(v, bool)
                                                 for v in vals) else None
        else:
            val = _walk(tree, name.split("."))
        if val is not None and not isinstance(val, (dict, list)):
            out[name] = val
    return out


def _walk(node, parts):
    for part in parts:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def mallctl_values(source: Any) -> Any:
    """{mallctl name: value} from either such a dict, a parse_stats_json()
    result, or a raw parsed JSON document ({"jemalloc": ...})."""
    if isinstance(source, dict) and "mallctl" in source and isinstance(source["mallctl"], dict):
        return source["mallctl"], source.get("merged_from")
    if isinstance(source, dict) and "jemalloc" in source:
        parsed = parse_stats_json(json.dumps(source))
        return parsed["mallctl"], parsed.get("merged_from")
    return source, None


def normalise_jemalloc(values: Any) -> Any:
    """mallctl values (or a parsed stats JSON) -> {field: Value}.

      allocated = stats.allocated                       (measured)
      active    = stats.active                          (measured)
      metadata  = stats.metadata                        (measured)
      resident  = stats.resident                        (measured; an upper bound)
      mapped    = stats.mapped                          (measured; excludes retained)
      retained  = stats.retained                        (measured)
      dirty     = stats.arenas.4096.pdirty x arenas.page (derived)
      muzzy     = stats.arenas.4096.pmuzzy x arenas.page (derived)
    """
    vals, merged_from = mallctl_values(values)
    origin = "JSON" if merged_from is not None or (isinstance(values, dict) and
                                                    ("mallctl" in values or "jemalloc" in values)) \
        else "mallctl"
    out = {}
    for field in ("allocated", "active", "metadata", "resident", "mapped", "retained"):
        name = f"stats.{field}"
        val = vals.get(name)
        note = " (maximum: pages may be untouched)" if field == "resident" else ""
        out[field] = Value.measured(val, f"{origin} {name}{note}") if val is not None else Value()
    page = vals.get("arenas.page")
    for field, key in (("dirty", "pdirty"), ("muzzy", "pmuzzy")):
        pages = vals.get(f"stats.arenas.{MALLCTL_ARENAS_ALL}.{key}")
        if pages is None or page is None:
            out[field] = Value()
            continue
        where = f" [{merged_from}]" if merged_from else ""
        out[field] = Value.derived(pages * page,
                                   f"stats.arenas.4096.{key} x arenas.page{where}")
    out["committed"] = Value()      # jemalloc keeps no committed counter
    return out
