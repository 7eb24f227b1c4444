"""Where a process's RSS goes, as one list of layers that add up.

RSS = rss_anon + rss_file + rss_shmem (kernel).  Inside rss_anon:
LazyFree (MADV_FREE pages, still counted), what the allocator holds
(its ``resident``; for glibc, which has no resident figure, ``mapped`` =
arena system bytes + mmapped chunks, an upper bound), and the rest:
runtime heaps, stacks, other mappings; of that rest, CPython's pymalloc
arenas (mmapped by the interpreter itself, outside malloc) are carved out
as "Python arenas" when the runtime layer read them.  Inside the allocator's share:
live ``allocated``, ``active - allocated`` (fragmentation and caches), and
the remainder (dirty free pages, metadata).  Every layer says whether it
is measured or derived; a layer that cannot be computed is left out rather
than guessed.  A layer lowered to fit the kernel's figure (an allocator's
resident above anon - LazyFree, allocated above what is held resident)
says so: its note is ``adjusted`` and ``raw`` keeps the figure before.
"""

from collections import namedtuple

from collectors.allocators.registry import for_kind
from diag.model import ADJUSTED

# note: how the bytes are known (measured|derived|adjusted); raw: the
# figure before an adjustment, else None.
Layer = namedtuple("Layer", "name label bytes depth note raw", defaults=(None,))


def allocator_held(snap):
    """(bytes, label) of what the allocator holds resident, or (None, None)."""
    res = snap.stats.get("resident")
    if res is not None and res.value is not None:
        return res.value, f"{snap.allocator.kind} resident"
    vocab = for_kind(snap.allocator.kind).vocabulary
    if vocab.held_fallback is not None:
        m = snap.stats.get(vocab.held_fallback)
        if m is not None and m.value is not None:
            return m.value, vocab.held_fallback_label
    return None, None


def _provenance(snap):
    res = snap.stats.get("resident")
    if res is not None and res.value is not None:
        return res.provenance
    return "derived"      # glibc's mapped, an upper bound


def _fit(layer, bound):
    """LAYER, lowered to BOUND when above it and then labelled adjusted
    with its figure kept as raw (the raw of an already adjusted one)."""
    if layer.bytes <= bound:
        return layer
    return layer._replace(bytes=bound, note=ADJUSTED,
                          raw=layer.raw if layer.raw is not None else layer.bytes)


def to_json(snap):
    """The layers as JSON rows (``explain --json``'s ``breakdown``)."""
    return [{"name": x.name, "label": x.label, "bytes": x.bytes, "depth": x.depth,
             "provenance": x.note, **({"raw": x.raw} if x.raw is not None else {})}
            for x in layers(snap)]


def python_arenas(snap):
    """(resident, allocated) of CPython's pymalloc arenas, or None when the
    process has none or they could not be read (allocated may be None)."""
    rt = snap.runtime
    if rt is None or rt.kind != "cpython-pymalloc":
        return None
    res = rt.values.get("resident")
    if res is None or res.value is None:
        return None
    alloc = rt.values.get("allocated")
    return res.value, (alloc.value if alloc is not None else None)


def layers(snap):
    p = snap.process
    if not p.rss:
        return []
    out = []
    anon = p.rss_anon or 0
    lazy = p.lazyfree or 0
    held, held_label = allocator_held(snap)
    if held is not None:
        res = snap.stats.get("resident")
        out.append(_fit(Layer("allocator", f"allocator-held ({held_label})", held, 0,
                              _provenance(snap), res.raw if res is not None else None),
                        max(anon - lazy, 0)))
        held = out[-1].bytes
        alloc = snap.stats.get("allocated")
        active = snap.stats.get("active")
        if alloc is not None and alloc.value is not None:
            out.append(_fit(Layer("allocated", "live (allocated)", alloc.value, 1,
                                  alloc.provenance), held))
            rest = held - out[-1].bytes
            if active is not None and active.value is not None and active.value > alloc.value:
                frag = min(active.value - alloc.value, rest)
                out.append(Layer("fragmentation", "fragmentation and caches (active - allocated)",
                                 frag, 1, "derived"))
                rest -= frag
            if rest > 0:
                out.append(Layer("held_free", "free pages held, metadata", rest, 1, "derived"))
    if lazy:
        out.append(Layer("lazyfree", "LazyFree (kernel reclaims under pressure)", lazy, 0, "measured"))
    other = anon - lazy - (held or 0)
    py = python_arenas(snap)
    if py is not None and other > 0:
        res, alloc = py
        res = min(res, other)
        out.append(Layer("python_arenas", "Python arenas (pymalloc, outside malloc)", res, 0,
                         "measured"))
        if alloc is not None:
            a = min(alloc, res)
            out.append(Layer("python_allocated", "live Python objects (<= 512 B)", a, 1,
                             "derived"))
            if res > a:
                out.append(Layer("python_free", "free blocks and unused pools in arenas",
                                 res - a, 1, "derived"))
        other -= res
    if other > 0:
        label = "other anonymous (runtime heaps, stacks, mmaps)" if held is not None else \
            "anonymous (allocator share unknown)"
        out.append(Layer("other_anon", label, other, 0, "derived"))
    if p.rss_file:
        out.append(Layer("file", "file-backed (code, mapped files)", p.rss_file, 0, "measured"))
    if p.rss_shmem:
        out.append(Layer("shmem", "shared memory", p.rss_shmem, 0, "measured"))
    return out
