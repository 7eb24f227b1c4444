"""glibc ptmalloc2 statistics: ``malloc_info`` XML and ``struct mallinfo2``.

Everything here is derived from glibc's own ``malloc/malloc.c``
(``__malloc_info`` and ``int_mallinfo``, identical in 2.33 ... 2.42 apart
from the fastbin removal in master, commit 7447efa962):

``int_mallinfo`` (per arena, summed by ``__libc_mallinfo2``)::

    avail    = chunksize(top) + fastbin chunks + chunks in bins 1..NBINS-1
    fordblks += avail            fsmblks += fastbin bytes   smblks += fastbin count
    uordblks += system_mem - avail                           ordblks += 1 + bin chunks
    arena    += system_mem
    hblks = mp_.n_mmaps, hblkhd = mp_.mmapped_mem, keepcost = chunksize(top)  (main arena)

So mmapped chunks are only in ``hblkhd`` and chunks parked in tcache are
counted as in use (tcache is never walked).

``__malloc_info`` prints per arena ``<total type="fast">`` (fastbins:
count, count*chunksize), ``<total type="rest">`` (top + every regular bin
including the unsorted bin), ``<system type="current|max">`` (system_mem,
max_system_mem) and ``<aspace>``; then global totals including
``<total type="mmap" count=n_mmaps size=mmapped_mem>``.  The ``<size>`` /
``<unsorted>`` rows of regular bins sum ``chunksize_nomask()``, i.e. the
chunk size *with its flag bits*: every free chunk in a regular bin has
PREV_INUSE set (a free chunk's predecessor is always in use, or it would
have been coalesced), so each such chunk adds 1 to ``from``/``to``/
``total`` and to the arena's "rest" size.  The top chunk is added with
``chunksize()`` (no flags).  We detect and remove that excess (``flag_bytes``)
so that ``rest`` matches ``int_mallinfo``'s numbers exactly; see
``tests/test_stats_parsers.py::test_glibc_xml_matches_mallinfo2``.
"""

from __future__ import annotations

from typing import Any

import struct

from diag.model import Value
from diag.model.errors import MalformedData

# struct mallinfo2 (malloc/malloc.h, glibc >= 2.33): ten size_t, in this
# order.  Units and meanings: collectors/allocators/glibc/__init__.py MALLINFO2.
MALLINFO2_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                    "uordblks", "fordblks", "keepcost")
_MALLINFO2 = struct.Struct("@10N")   # native size_t; 80 bytes on x86-64
MALLINFO2_SIZE = _MALLINFO2.size

MALLOC_ALIGNMENT = 16   # x86-64 (and every 64-bit glibc target; i386 too since 2.26)


def parse_mallinfo2(raw_bytes: Any) -> Any:
    """The raw bytes of a ``struct mallinfo2`` -> {field: int}."""
    if not isinstance(raw_bytes, (bytes, bytearray, memoryview)):
        raise MalformedData(f"mallinfo2: expected bytes, got {type(raw_bytes).__name__}")
    raw = bytes(raw_bytes)
    if len(raw) != MALLINFO2_SIZE:
        raise MalformedData(f"mallinfo2: expected {MALLINFO2_SIZE} bytes "
                            f"(10 x size_t), got {len(raw)}")
    return dict(zip(MALLINFO2_FIELDS, _MALLINFO2.unpack(raw)))


# --------------------------------------------------------------------------
# malloc_info XML
# --------------------------------------------------------------------------

def _parser():
    from lxml import etree
    return etree, etree.XMLParser(resolve_entities=False, no_network=True,
                                  huge_tree=False, load_dtd=False, dtd_validation=False)


def _int(elem, attr, where):
    text = elem.get(attr)
    if text is None:
        raise MalformedData(f"malloc_info: <{elem.tag}> in {where} (line {elem.sourceline}) "
                            f"has no {attr}= attribute")
    try:
        value = int(text, 10)
    except ValueError:
        raise MalformedData(f"malloc_info: <{elem.tag} {attr}={text!r}> in {where} "
                            f"(line {elem.sourceline}) is not an integer") from None
    if value < 0:
        raise MalformedData(f"malloc_info: negative {attr}={value} in {where}")
    return value


def _size_row(elem, where):
    row = {k: _int(elem, k, where) for k in ("from", "to", "total", "count")}
    if elem.tag == "unsorted":
        row["kind"] = "unsorted"
    elif row["to"] - row["from"] == MALLOC_ALIGNMENT - 1 and row["to"] % MALLOC_ALIGNMENT == 0:
        # fastbin rows: from = chunksize - (MALLOC_ALIGNMENT-1), to = chunksize,
        # total = count * to.  Regular-bin rows are min/max of real chunk sizes
        # (multiples of 16, +1 for the PREV_INUSE flag), never 15 apart.
        row["kind"] = "fast"
    else:
        row["kind"] = "bin"
    # Flag bits included by chunksize_nomask() in regular-bin rows.
    row["flag_bytes"] = 0 if row["kind"] == "fast" else row["count"] * (row["from"] & 7)
    return row


def _typed_children(parent, tag, where, allowed):
    out = {}
    for elem in parent.findall(tag):
        kind = elem.get("type")
        if kind is None:
            raise MalformedData(f"malloc_info: <{tag}> without type= in {where} "
                                f"(line {elem.sourceline})")
        if kind in out:
            raise MalformedData(f"malloc_info: duplicate <{tag} type={kind!r}> in {where}")
        if allowed and kind not in allowed:
            continue    # a type we do not know: ignore, the format may grow
        out[kind] = elem
    return out


def _count_size(elem, where):
    return {"count": _int(elem, "count", where), "size": _int(elem, "size", where)}


def _require(d, key, tag, where):
    if key not in d:
        raise MalformedData(f"malloc_info: missing <{tag} type=\"{key}\"/> in {where} "
                            "(truncated or not malloc_info output?)")
    return d[key]


def parse_malloc_info(xml_bytes: Any) -> Any:
    """glibc ``malloc_info(0, fp)`` output -> native dict.

    ::

      {"version": "1", "has_fast": bool,
       "arenas": [{"nr", "sizes": [{"from","to","total","count","kind","flag_bytes"}],
                   "unsorted": row|None, "fast": {"count","size"}|None,
                   "rest": {"count","size"}, "flag_bytes", "free_bytes", "top_bytes",
                   "system": {"current","max"},
                   "aspace": {"total","mprotect","subheaps"?}}],
       "totals": {"fast"|None, "rest", "mmap": {"count","size"}, "flag_bytes",
                  "system": {...}, "aspace": {...}}}

    ``free_bytes`` = fast.size + rest.size - flag_bytes = int_mallinfo's
    ``avail`` for that arena; ``top_bytes`` = rest.size - the regular-bin
    totals = chunksize(top).  Accepts glibc <= 2.42 (with ``type="fast"``)
    and the newer format without fastbins.
    """
    if isinstance(xml_bytes, str):
        xml_bytes = xml_bytes.encode("utf-8")
    if not isinstance(xml_bytes, (bytes, bytearray)):
        raise MalformedData(f"malloc_info: expected bytes, got {type(xml_bytes).__name__}")
    if not xml_bytes.strip():
        raise MalformedData("malloc_info: empty input")
    etree, parser = _parser()
    try:
        root = etree.fromstring(bytes(xml_bytes), parser)
    except etree.XMLSyntaxError as exc:
        raise MalformedData(f"malloc_info: not well-formed XML ({exc}); "
                            "truncated or corrupted output?") from None
    except Exception as exc:   # lxml raises other subclasses for odd input
        raise MalformedData(f"malloc_info: cannot parse ({exc.__class__.__name__}: {exc})") from None
    tree = root.getroottree()
    if tree.docinfo.doctype or tree.docinfo.internalDTD is not None:
        # glibc never writes a DOCTYPE; one here can only carry entities.
        raise MalformedData("malloc_info: unexpected DOCTYPE/DTD (glibc never emits one); "
                            "refusing to interpret entity declarations")
    if root.tag != "malloc":
        raise MalformedData(f"malloc_info: root element is <{root.tag}>, expected <malloc>")

    arenas = []
    for heap in root.findall("heap"):
        where = f"<heap nr={heap.get('nr')!r}>"
        nr = _int(heap, "nr", "<heap>")
        sizes_elem = heap.find("sizes")
        if sizes_elem is None:
            raise MalformedData(f"malloc_info: {where} has no <sizes> element")
        rows, unsorted = [], None
        for child in sizes_elem:
            if not isinstance(child.tag, str):
                continue   # comments, processing instructions
            if child.tag == "size":
                rows.append(_size_row(child, where))
            elif child.tag == "unsorted":
                unsorted = _size_row(child, where)
        totals = _typed_children(heap, "total", where, ("fast", "rest"))
        system = _typed_children(heap, "system", where, ("current", "max"))
        aspace = _typed_children(heap, "aspace", where, ("total", "mprotect", "subheaps"))
        fast = _count_size(totals["fast"], where) if "fast" in totals else None
        rest = _count_size(_require(totals, "rest", "total", where), where)
        flag_bytes = sum(r["flag_bytes"] for r in rows) + (unsorted["flag_bytes"] if unsorted else 0)
        # rest = chunksize(top) + every regular bin's total (__malloc_info),
        # and the printed rows are exactly the non-empty regular bins.
        bin_totals = sum(r["total"] for r in rows if r["kind"] != "fast") + \
            (unsorted["total"] if unsorted else 0)
        arena = {
            "nr": nr,
            "sizes": rows,
            "unsorted": unsorted,
            "fast": fast,
            "rest": rest,
            "flag_bytes": flag_bytes,
            "free_bytes": (fast["size"] if fast else 0) + rest["size"] - flag_bytes,
            "top_bytes": rest["size"] - bin_totals,
            "system": {k: _int(_require(system, k, "system", where), "size", where)
                       for k in ("current", "max")},
            "aspace": {k: _int(e, "size", where) for k, e in aspace.items()},
        }
        if arena["top_bytes"] < 0:
            raise MalformedData(f"malloc_info: {where} bins hold more than its rest total")
        arenas.append(arena)
    if not arenas:
        raise MalformedData("malloc_info: no <heap> element (truncated output?)")

    where = "the global totals"
    totals = _typed_children(root, "total", where, ("fast", "rest", "mmap"))
    system = _typed_children(root, "system", where, ("current", "max"))
    aspace = _typed_children(root, "aspace", where, ("total", "mprotect"))
    has_fast = "fast" in totals
    if any((a["fast"] is not None) != has_fast for a in arenas):
        raise MalformedData("malloc_info: type=\"fast\" totals present in some places only")
    out_totals = {
        "fast": _count_size(totals["fast"], where) if has_fast else None,
        "rest": _count_size(_require(totals, "rest", "total", where), where),
        "mmap": _count_size(_require(totals, "mmap", "total", where), where),
        "flag_bytes": sum(a["flag_bytes"] for a in arenas),
        "system": {k: _int(_require(system, k, "system", where), "size", where)
                   for k in ("current", "max")},
        "aspace": {k: _int(e, "size", where) for k, e in aspace.items()},
    }
    # The global totals are sums over the arenas (see __malloc_info); a
    # mismatch means the document was edited or spliced.
    if out_totals["system"]["current"] != sum(a["system"]["current"] for a in arenas):
        raise MalformedData("malloc_info: global system current != sum over heaps")
    if out_totals["rest"]["size"] != sum(a["rest"]["size"] for a in arenas):
        raise MalformedData("malloc_info: global rest size != sum over heaps")
    return {"version": root.get("version"), "has_fast": has_fast,
            "arenas": arenas, "totals": out_totals}


def mallinfo2_from_malloc_info(native: Any) -> Any:
    """``struct mallinfo2`` as ``__libc_mallinfo2`` would return it at the
    moment of this malloc_info output, derived exactly (glibc 2.33 ... 2.42
    malloc/malloc.c; both walk the same arenas under the same locks, and
    int_mallinfo uses chunksize() where __malloc_info's bins use
    chunksize_nomask(), hence flag_bytes):

      arena    = totals.system.current            (sum of system_mem)
      ordblks  = totals.rest.count                (1 top + bin chunks per arena)
      smblks   = totals.fast.count                fsmblks = totals.fast.size
      hblks    = totals.mmap.count                hblkhd  = totals.mmap.size
      fordblks = fast.size + rest.size - flag_bytes   (sum of avail)
      uordblks = arena - fordblks                 usmblks = 0
      keepcost = top_bytes of arena 0 (the main arena's top chunk)

    So one heap walk (malloc_info) gives what two (mallinfo2 + malloc_info)
    gave."""
    t = native["totals"]
    fast_count = t["fast"]["count"] if t["fast"] else 0
    fast_size = t["fast"]["size"] if t["fast"] else 0
    fordblks = fast_size + t["rest"]["size"] - t["flag_bytes"]
    main = [a for a in native["arenas"] if a["nr"] == 0]
    if not main:
        raise MalformedData("malloc_info: no <heap nr=\"0\"> (the main arena)")
    return {
        "arena": t["system"]["current"],
        "ordblks": t["rest"]["count"],
        "smblks": fast_count,
        "hblks": t["mmap"]["count"],
        "hblkhd": t["mmap"]["size"],
        "usmblks": 0,
        "fsmblks": fast_size,
        "uordblks": t["system"]["current"] - fordblks,
        "fordblks": fordblks,
        "keepcost": main[0]["top_bytes"],
    }


# --------------------------------------------------------------------------
# normalisation
# --------------------------------------------------------------------------

def normalise_glibc(native: Any = None, mallinfo2: Any = None) -> Any:
    """malloc_info native dict and/or mallinfo2 dict -> {field: Value}.

    mallinfo2 (taken by the caller at the same moment) wins where both exist.
    Formulas (glibc malloc/malloc.c int_mallinfo, __malloc_info):

      allocated = uordblks + hblkhd
                = system.current - (fast.size + rest.size - flag_bytes) + mmap.size
          in-use chunk bytes: includes the 8-byte chunk headers, alignment
          padding and chunks parked in tcache (never walked); mmapped chunks
          only appear in hblkhd / mmap.size.
      active    = uordblks + fsmblks + hblkhd
                = system.current - (rest.size - flag_bytes) + mmap.size
          allocated plus fastbin chunks (free but kept unconsolidated, a cache).
      mapped    = arena + hblkhd = system.current + mmap.size
          sbrk/heap memory made R/W for the arenas plus mmapped chunks.  The
          PROT_NONE reserve of non-main heaps (64 MiB each) is not included.
      dirty     = fordblks - fsmblks = rest.size - flag_bytes
          free bytes in the top chunk and the regular bins; an upper bound,
          because malloc_trim's MADV_DONTNEED does not change this bookkeeping.
      muzzy     = 0: glibc's malloc/ never calls madvise(MADV_FREE).
      resident, retained, metadata: unknown (glibc does not say).
    """
    if native is None and mallinfo2 is None:
        return {name: Value() for name in ("allocated", "active", "resident", "committed", "mapped",
                                           "retained", "metadata", "dirty", "muzzy")}
    out = {}
    if mallinfo2 is not None:
        m = mallinfo2
        # allocated: in-use chunk bytes in arenas plus mmapped chunks.
        out["allocated"] = Value.derived(m["uordblks"] + m["hblkhd"],
                                         "mallinfo2 uordblks + hblkhd")
        # active: + free fastbin chunks (not coalesced, a cache).
        out["active"] = Value.derived(m["uordblks"] + m["fsmblks"] + m["hblkhd"],
                                      "mallinfo2 uordblks + fsmblks + hblkhd")
        # mapped: arena system memory plus mmapped chunks.
        out["mapped"] = Value.derived(m["arena"] + m["hblkhd"], "mallinfo2 arena + hblkhd")
        # dirty: free top chunk + bins (fastbins are in active).
        out["dirty"] = Value.derived(
            m["fordblks"] - m["fsmblks"],
            "mallinfo2 fordblks - fsmblks (free top + bins; upper bound: "
            "malloc_trim madvise does not change it)")
    else:
        t = native["totals"]
        fast = t["fast"]["size"] if t["fast"] else 0
        rest = t["rest"]["size"] - t["flag_bytes"]
        system = t["system"]["current"]
        mmap = t["mmap"]["size"]
        fast_txt = "fast.size + " if t["fast"] else ""
        # allocated: system current - free (fast + rest) + mmapped chunks.
        out["allocated"] = Value.derived(
            system - fast - rest + mmap,
            f"malloc_info system.current - ({fast_txt}rest.size - flag_bytes) + mmap.size")
        # active: allocated + fastbin chunks.
        out["active"] = Value.derived(
            system - rest + mmap, "malloc_info system.current - (rest.size - flag_bytes) + mmap.size")
        out["mapped"] = Value.derived(system + mmap, "malloc_info system.current + mmap.size")
        out["dirty"] = Value.derived(
            rest, "malloc_info rest.size - flag_bytes (free top + bins; upper bound: "
                  "malloc_trim madvise does not change it)")
    out["muzzy"] = Value.derived(0, "0: glibc malloc never uses MADV_FREE (malloc/malloc.c, arena.c)")
    out["resident"] = Value()
    out["committed"] = Value()      # glibc keeps no committed counter
    out["retained"] = Value()
    out["metadata"] = Value()
    return out
