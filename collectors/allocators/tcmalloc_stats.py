"""tcmalloc statistics: gperftools (2.x) and google/tcmalloc.

gperftools (src/tcmalloc.cc DumpStats / GetNumericProperty; the meanings
are confirmed on the packaged 2.10 by tests/targets/capture_tcmalloc.c):

    system_bytes  = every byte the page heap got from the OS (incl. unmapped)
    generic.heap_size               = system_bytes            (INCLUDES unmapped)
    generic.current_allocated_bytes = system_bytes - thread - central - transfer
                                      - pageheap free - pageheap unmapped
    generic.total_physical_bytes    = system_bytes + metadata - unmapped
                                    = GetStats "Actual memory used (physical + swap)"
    tcmalloc.pageheap_free_bytes    = free, mapped page-heap spans
    tcmalloc.pageheap_unmapped_bytes= free spans released with madvise (still mapped)
    GetStats "Virtual address space used" = system_bytes + metadata

google/tcmalloc (tcmalloc/global_stats.cc GetNumericProperty):

    generic.heap_size        = system_bytes - unmapped   (EXCLUDES unmapped)
    generic.physical_memory_used = virtual - unmapped (metadata and arena incl.)
    generic.virtual_memory_used  = system + metadata + arena unallocated/unavailable/nonresident
    tcmalloc.metadata_bytes  exists (gperftools has no metadata property)
    tcmalloc.pageheap_unmapped_bytes also counts arena non-resident bytes
"""

from __future__ import annotations

from typing import Any

import re

from diag.model import Value
from diag.model.errors import MalformedData

# The property names each flavour answers, with units and meanings, are
# declared in collectors/allocators/gperftools.py and google_tcmalloc.py.

_MALLOC_LINE = re.compile(
    r"^MALLOC:\s*(?P<op>[+=])?\s*(?P<num>-?\d+(?:\.\d+)?)(?=\s|$)\s*"
    r"(?:\(\s*-?[\d.]+\s*MiB\))?\s*(?P<label>\S.*?)\s*$")
_CLASS_LINE = re.compile(
    r"^class\s+(?P<cl>\d+)\s+\[\s*(?P<size>\d+)\s+bytes\s*\]\s*:\s*(?P<objs>\d+)\s+objs;"
    r"\s*(?P<mib>[\d.]+)\s+MiB;\s*(?P<cum>[\d.]+)\s+cum MiB")
_PAGEHEAP_LINE = re.compile(
    r"^PageHeap:\s*(?P<sizes>\d+)\s+sizes;\s*(?P<free>[\d.]+)\s+MiB free;"
    r"\s*(?P<unmapped>[\d.]+)\s+MiB unmapped")
_SPANS_LINE = re.compile(
    r"^\s*(?P<pages>>?\s*\d+)\s+(?:pages|large)\s+\*\s+(?P<spans>\d+)\s+spans\s+~\s*"
    r"(?P<mib>[\d.]+)\s+MiB;\s*(?P<cum>[\d.]+)\s+MiB cum;\s*unmapped:\s*(?P<unm>[\d.]+)\s+MiB;"
    r"\s*(?P<unmcum>[\d.]+)\s+MiB cum")


MiB = 1 << 20


def _mib(lineno, text):
    """A "%6.1f MiB" amount of the level-2 sections, in bytes (to the
    0.1 MiB the text has: these lines are detail, the summary is exact)."""
    try:
        return round(float(text) * MiB)
    except (ValueError, OverflowError):
        raise MalformedData(f"tcmalloc stats line {lineno}: not an amount: {text[:40]!r}") from None


def _int(lineno, text):
    try:
        return int(text)
    except ValueError:      # more digits than int() takes (sys.get_int_max_str_digits)
        raise MalformedData(f"tcmalloc stats line {lineno}: not a number: "
                            f"{text[:40]!r}...") from None


def _float(lineno, text):
    try:
        return float(text)
    except ValueError:
        raise MalformedData(f"tcmalloc stats line {lineno}: not a number: {text[:40]!r}") from None


def _slug(label):
    s = re.sub(r"\(.*?\)", "", label).strip().lower()
    s = re.sub(r"[^a-z0-9]+", "_", s).strip("_")
    return s


def parse_getstats(text: Any) -> Any:
    """``MallocExtension_GetStats`` / ``TCMalloc_Internal_GetStats`` text ->
    native dict.

    ``summary``: every ``MALLOC:`` line, keyed by its label slug, e.g.
    ``bytes_in_use_by_app``, ``bytes_in_page_heap_freelist``,
    ``bytes_in_malloc_metadata``, ``actual_memory_used``,
    ``bytes_released_to_os``, ``virtual_address_space_used``,
    ``spans_in_use``, ``tcmalloc_page_size``.  ``size_classes`` and
    ``pageheap`` hold the level-2 sections when present.

    The summary block is checked: every ``=`` line must equal the sum of the
    lines above it (since the previous ``=``); a cut-off or edited block
    raises MalformedData.
    """
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise MalformedData(f"tcmalloc stats: expected text, got {type(text).__name__}")
    summary, labels, order = {}, {}, []
    size_classes, spans, pageheap = [], [], None
    running, sums_checked = 0, 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("MALLOC:"):
            body = line[len("MALLOC:"):].strip()
            if not body or set(body) <= set("-"):
                continue
            m = _MALLOC_LINE.match(line)
            if not m:
                raise MalformedData(f"tcmalloc stats line {lineno}: cannot parse {line!r}")
            label = m.group("label")
            if "." in m.group("num"):
                value = _float(lineno, m.group("num"))   # google's "Realized fragmentation (%)"
            else:
                value = _int(lineno, m.group("num"))
            key = _slug(label)
            if key.startswith("bytes_in_use_by_application"):
                key = "bytes_in_use_by_app"
            elif key.startswith("actual_memory_used"):
                key = "actual_memory_used"
            elif key.startswith("bytes_released_to_os"):
                key = "bytes_released_to_os"
            summary[key] = value
            labels[key] = label
            order.append(key)
            op = m.group("op")
            if op == "=":
                if value != running:
                    raise MalformedData(
                        f"tcmalloc stats line {lineno}: {label!r} = {value} but the lines "
                        f"above it sum to {running} (edited or truncated output?)")
                sums_checked += 1
                running = value
            elif op == "+":
                running += value
            elif key == "bytes_in_use_by_app":
                running = value
            continue
        m = _CLASS_LINE.match(line)
        if m:
            size, objs = _int(lineno, m.group("size")), _int(lineno, m.group("objs"))
            size_classes.append({"class": _int(lineno, m.group("cl")), "size": size,
                                 "objects": objs, "bytes": objs * size})
            continue
        m = _PAGEHEAP_LINE.match(line)
        if m:
            pageheap = {"sizes": _int(lineno, m.group("sizes")),
                        "free_bytes": _mib(lineno, m.group("free")),
                        "unmapped_bytes": _mib(lineno, m.group("unmapped"))}
            continue
        m = _SPANS_LINE.match(line)
        if m:
            spans.append({"pages": m.group("pages").replace(" ", ""),
                          "spans": _int(lineno, m.group("spans")),
                          "bytes": _mib(lineno, m.group("mib")),
                          "unmapped_bytes": _mib(lineno, m.group("unm"))})
    if "bytes_in_use_by_app" not in summary:
        raise MalformedData("tcmalloc stats: no 'MALLOC: ... Bytes in use by application' line "
                            "(not GetStats output?)")
    for needed in ("actual_memory_used", "bytes_released_to_os", "virtual_address_space_used"):
        if needed not in summary:
            raise MalformedData(f"tcmalloc stats: summary line for {needed!r} missing "
                                "(truncated output? GetStats needs a buffer of >= 10000 "
                                "bytes for the full report)")
    flavor = ("google" if any(k.startswith("bytes_in_per_cpu") or k == "realized_fragmentation"
                              for k in summary) else "gperftools")
    if pageheap is not None:
        pageheap["spans"] = spans
    return {"flavor": flavor, "summary": summary, "labels": labels, "order": order,
            "size_classes": size_classes, "pageheap": pageheap}


def _num(props, name):
    val = props.get(name) if props else None
    if val is None:
        return None
    if isinstance(val, bool) or not isinstance(val, int) or val < 0:
        raise MalformedData(f"tcmalloc property {name}: not a non-negative integer ({val!r})")
    return val


def normalise_tcmalloc(props: Any = None, stats: Any = None, flavor: Any = None) -> Any:
    """Numeric properties and/or a parse_getstats() dict -> {field: Value}.

    gperftools (default; ``flavor="google"`` for google/tcmalloc, which is
    also detected from the property names or the GetStats text):

      allocated = generic.current_allocated_bytes               (measured)
                  | GetStats "Bytes in use by application"
      active    = generic.heap_size - pageheap_free - pageheap_unmapped (derived)
                = allocated + central + transfer + thread cache freelists
      resident  = generic.total_physical_bytes                  (measured)
                  | GetStats "Actual memory used (physical + swap)"
                  an upper bound: counts untouched pages and swap.
      mapped    = heap_size - pageheap_unmapped + metadata      (derived)
                = "Actual memory used": like jemalloc's stats.mapped this
                  excludes retained (madvised) bytes; tcmalloc cannot tell
                  mapped from resident, so the two are equal.
      retained  = tcmalloc.pageheap_unmapped_bytes              (measured)
      metadata  = GetStats "Bytes in malloc metadata"           (measured)
                  | total_physical_bytes - heap_size + pageheap_unmapped (derived)
      dirty     = tcmalloc.pageheap_free_bytes                  (measured)
      muzzy     = unknown: whether released spans use MADV_FREE is a build
                  option (TCMALLOC_USE_MADV_FREE, system-alloc.cc).

    google/tcmalloc:
      allocated = generic.current_allocated_bytes; active = generic.heap_size -
      tcmalloc.pageheap_free_bytes (heap_size already excludes unmapped);
      resident = mapped = generic.physical_memory_used; retained =
      tcmalloc.pageheap_unmapped_bytes; metadata = tcmalloc.metadata_bytes;
      dirty = tcmalloc.pageheap_free_bytes.
    """
    props = props or {}
    summary = (stats or {}).get("summary", {})
    if flavor is None:
        if "generic.physical_memory_used" in props or "tcmalloc.metadata_bytes" in props:
            flavor = "google"
        elif stats is not None:
            flavor = stats.get("flavor", "gperftools")
        else:
            flavor = "gperftools"
    out = {"committed": Value()}      # tcmalloc keeps no separate committed counter
    cur = _num(props, "generic.current_allocated_bytes")
    heap = _num(props, "generic.heap_size")
    free = _num(props, "tcmalloc.pageheap_free_bytes")
    unmapped = _num(props, "tcmalloc.pageheap_unmapped_bytes")

    def from_stats(key, label):
        if key in summary:
            return Value.measured(summary[key], f"GetStats {label!r}")
        return Value()

    # allocated
    out["allocated"] = (Value.measured(cur, "generic.current_allocated_bytes")
                        if cur is not None else
                        from_stats("bytes_in_use_by_app", "Bytes in use by application"))
    # retained, dirty
    out["retained"] = (Value.measured(unmapped, "tcmalloc.pageheap_unmapped_bytes")
                       if unmapped is not None else
                       from_stats("bytes_released_to_os", "Bytes released to OS (aka unmapped)"))
    out["dirty"] = (Value.measured(free, "tcmalloc.pageheap_free_bytes") if free is not None
                    else from_stats("bytes_in_page_heap_freelist", "Bytes in page heap freelist"))
    out["muzzy"] = Value()

    if flavor == "google":
        phys = _num(props, "generic.physical_memory_used")
        meta = _num(props, "tcmalloc.metadata_bytes")
        out["active"] = (Value.derived(heap - free, "generic.heap_size - tcmalloc.pageheap_free_bytes "
                                                    "(google heap_size excludes unmapped)")
                         if heap is not None and free is not None else Value())
        out["resident"] = (Value.measured(phys, "generic.physical_memory_used (upper bound)")
                           if phys is not None else
                           from_stats("actual_memory_used", "Actual memory used (physical + swap)"))
        out["mapped"] = (Value.measured(phys, "generic.physical_memory_used (= virtual - unmapped; "
                                              "excludes retained)")
                         if phys is not None else
                         from_stats("actual_memory_used", "Actual memory used (physical + swap)"))
        out["metadata"] = (Value.measured(meta, "tcmalloc.metadata_bytes") if meta is not None
                           else from_stats("bytes_in_malloc_metadata", "Bytes in malloc metadata"))
        return out

    phys = _num(props, "generic.total_physical_bytes")
    # active: page-heap spans in use = heap_size - free - unmapped.
    if heap is not None and free is not None and unmapped is not None:
        out["active"] = Value.derived(heap - free - unmapped,
                                      "generic.heap_size - tcmalloc.pageheap_free_bytes - "
                                      "tcmalloc.pageheap_unmapped_bytes")
    elif summary:
        parts = [k for k in ("bytes_in_use_by_app", "bytes_in_central_cache_freelist",
                             "bytes_in_transfer_cache_freelist",
                             "bytes_in_thread_cache_freelists") if k in summary]
        out["active"] = (Value.derived(sum(summary[k] for k in parts),
                                       "GetStats in use + central + transfer + thread cache "
                                       "freelists")
                         if len(parts) == 4 else Value())
    else:
        out["active"] = Value()
    # resident: total_physical_bytes (includes metadata; physical + swap).
    out["resident"] = (Value.measured(phys, "generic.total_physical_bytes (upper bound: "
                                            "physical + swap, untouched pages included)")
                       if phys is not None else
                       from_stats("actual_memory_used", "Actual memory used (physical + swap)"))
    # metadata
    if "bytes_in_malloc_metadata" in summary:
        out["metadata"] = from_stats("bytes_in_malloc_metadata", "Bytes in malloc metadata")
    elif phys is not None and heap is not None and unmapped is not None:
        out["metadata"] = Value.derived(phys - heap + unmapped,
                                        "generic.total_physical_bytes - generic.heap_size + "
                                        "tcmalloc.pageheap_unmapped_bytes")
    else:
        out["metadata"] = Value()
    # mapped: heap_size - unmapped + metadata (= Actual memory used).
    meta_v = out["metadata"].value
    if heap is not None and unmapped is not None and meta_v is not None:
        out["mapped"] = Value.derived(heap - unmapped + meta_v,
                                      "generic.heap_size - tcmalloc.pageheap_unmapped_bytes + "
                                      "metadata (excludes retained, like jemalloc stats.mapped)")
    elif "actual_memory_used" in summary:
        out["mapped"] = Value.derived(summary["actual_memory_used"],
                                      "GetStats 'Actual memory used' (= virtual - unmapped; "
                                      "excludes retained)")
    else:
        out["mapped"] = Value()
    return out
