"""google/tcmalloc: plan, gather, parse and normalise; the native fields.

Native document::

    {"properties": {name: int | None},   # exactly the names of PROPERTIES
     "getstats_text": str | None}        # its own format, kept verbatim
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diag.model import Value

from collectors.allocators import common
from collectors.allocators.gperftools import reader as gperftools
from collectors.allocators import tcmalloc_stats
from collectors.allocators.native import BYTES, FLAG, NativeField, RATIO, TEXT

_SRC = "google/tcmalloc tcmalloc/global_stats.cc GetNumericProperty"

PROPERTIES = (
    ("generic.current_allocated_bytes", BYTES, "bytes in use by the application"),
    ("generic.bytes_in_use_by_app", BYTES, "bytes in use by the application"),
    ("generic.heap_size", BYTES, "system bytes - unmapped (excludes unmapped)"),
    ("generic.physical_memory_used", BYTES, "virtual - unmapped (metadata and arena included)"),
    ("generic.virtual_memory_used", BYTES, "system + metadata + arena reserved"),
    ("generic.peak_memory_usage", BYTES, "sampled peak heap"),
    ("generic.realized_fragmentation", RATIO, "realized fragmentation, percent"),
    ("tcmalloc.pageheap_free_bytes", BYTES, "free, mapped page-heap bytes"),
    ("tcmalloc.pageheap_unmapped_bytes", BYTES, "page-heap bytes released to the OS"),
    ("tcmalloc.central_cache_free", BYTES, "bytes in the central freelists"),
    ("tcmalloc.cpu_free", BYTES, "bytes in the per-CPU caches"),
    ("tcmalloc.sharded_transfer_cache_free", BYTES, "bytes in the sharded transfer caches"),
    ("tcmalloc.transfer_cache_free", BYTES, "bytes in the transfer caches"),
    ("tcmalloc.thread_cache_free", BYTES, "bytes in the per-thread caches"),
    ("tcmalloc.metadata_bytes", BYTES, "bytes of allocator metadata"),
    ("tcmalloc.external_fragmentation_bytes", BYTES, "free bytes held outside the application"),
    ("tcmalloc.required_bytes", BYTES, "bytes needed to satisfy current allocations"),
    ("tcmalloc.slack_bytes", BYTES, "pageheap free + unmapped"),
    ("tcmalloc.local_bytes", BYTES, "bytes in local (CPU/thread) caches"),
    ("tcmalloc.per_cpu_caches_active", FLAG, "per-CPU caches in use"),
    ("tcmalloc.max_total_thread_cache_bytes", BYTES, "limit on thread cache size"),
    ("tcmalloc.desired_usage_limit_bytes", BYTES, "soft memory limit (0: none)"),
    ("tcmalloc.hard_usage_limit_bytes", BYTES, "hard memory limit (0: none)"),
    ("tcmalloc.num_released_total_bytes", BYTES, "bytes released to the OS, cumulative"),
)

FIELDS = tuple(NativeField("properties:" + n, u, m, _SRC) for n, u, m in PROPERTIES) + (
    NativeField("getstats_text", TEXT, "TCMalloc_Internal_GetStats output, verbatim",
                "google/tcmalloc tcmalloc/global_stats.cc DumpStats"),
)


# -- plan, gather, parse, normalise -------------------------------------------------

def plan(res: Any, obj: Any, alloc: Any, opts: dict[str, Any]) -> dict[str, Any]:
    get = "MallocExtension_Internal_GetNumericProperty"
    return {"get": common.need(res.address(obj, get), get, "tcmalloc-google"),
            "stats": res.address(obj, "TCMalloc_Internal_GetStats")}


def gather(c: Any, a: Any, opts: Any) -> Any:
    # Its getter takes the name's length too: (name, length, &value).
    raw = {"properties": gperftools.properties(c, a["get"], [n for n, _, _ in PROPERTIES],
                                               with_length=True)}
    if a["stats"]:
        raw["getstats"] = gperftools.stats_text(c, a["stats"])
    return raw


def parse(raw: Any, alloc: Any) -> Any:
    text = raw["getstats"].decode(errors="replace") if "getstats" in raw else None
    return {"properties": {n: raw["properties"].get(n) for n, _, _ in PROPERTIES},
            "getstats_text": text, "side_effects": [],
            "gathered_by": "MallocExtension_Internal_GetNumericProperty per property"
                           + (" + TCMalloc_Internal_GetStats" if text is not None else "")}


def normalise(native: dict[str, Any]) -> dict[str, Value]:
    props = {k: v for k, v in native["properties"].items() if v is not None}
    return tcmalloc_stats.normalise_tcmalloc(props, None, flavor="google")


def parse_file(data: bytes) -> dict[str, Any]:
    text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else data
    return {"properties": {n: None for n, _, _ in PROPERTIES}, "getstats_text": text,
            "side_effects": [], "gathered_by": "file: TCMalloc_Internal_GetStats text"}
