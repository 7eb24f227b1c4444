"""The snapshot model: immutable values that collectors fill and views render.

This module imports nothing of allocdiag's own (DESIGN.md: collectors import
the model, the model imports no one).  Every field that is a number of bytes
is an ``int`` in bytes, or ``None`` when unknown: never a made-up zero.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from diag.model.records import field, field_names, record

JSON = dict[str, Any]           # a JSON object as json.dumps takes it

SCHEMA_VERSION = 1

MEASURED = "measured"   # the allocator or the kernel said it
DERIVED = "derived"     # computed from measured numbers; the formula is named
ADJUSTED = "adjusted"   # changed to agree with the kernel; ``raw`` keeps the original
UNKNOWN = "unknown"     # nobody said it; the value is None


@record(frozen=True)
class Value:
    """One allocator-layer number with its provenance.

    ``source`` names where a measured number came from (``mallctl
    stats.allocated``) or, for a derived one, the formula.  An ``adjusted``
    number was lowered to what the kernel says; ``raw`` is the figure before
    (with its own provenance in ``raw_provenance``) and ``source`` says why.
    """

    value: Optional[int] = None
    provenance: str = UNKNOWN
    source: Optional[str] = None
    raw: Optional[int] = None
    raw_provenance: Optional[str] = None

    @classmethod
    def measured(cls, value: Optional[int], source: str) -> Value:
        return cls(int(value), MEASURED, source) if value is not None else cls()

    @classmethod
    def derived(cls, value: Optional[int], formula: str) -> Value:
        return cls(int(value), DERIVED, formula) if value is not None else cls()

    @classmethod
    def adjusted(cls, value: int, raw: Value, why: str) -> Value:
        """VALUE in place of RAW (a Value), lowered to agree with the kernel;
        WHY names the kernel's figure and the reason the two differ."""
        return cls(int(value), ADJUSTED, why, raw.value, raw.provenance)

    def to_json(self) -> JSON:
        out: JSON = {"value": self.value, "provenance": self.provenance, "source": self.source}
        if self.raw is not None:
            out.update(raw=self.raw, raw_provenance=self.raw_provenance)
        return out


# Leaves _plain returns as they are, tested first: most of a snapshot's
# ~400 values are these, and hasattr() on them raises and catches twice.
_SCALARS = frozenset({int, str, float, bool, type(None)})


def _plain(obj: Any) -> Any:
    """Dataclass -> JSON-ready dict, recursively (tuples become lists)."""
    if type(obj) in _SCALARS:
        return obj
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if hasattr(obj, "__record_fields__"):
        return _plain_fields(obj)
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    return obj


@record(frozen=True)
class ProcessMemory:
    """The kernel's view of one process (see diag.fields for each meaning)."""

    rss: Optional[int] = None
    rss_anon: Optional[int] = None
    rss_file: Optional[int] = None
    rss_shmem: Optional[int] = None
    lazyfree: Optional[int] = None
    anon_thp: Optional[int] = None
    swap: Optional[int] = None
    pss: Optional[int] = None
    private: Optional[int] = None
    shared: Optional[int] = None
    vm_size: Optional[int] = None
    threads: Optional[int] = None
    # "smaps_rollup", "smaps" (summed, rollup missing/refused) or "status"
    # (neither readable): which source the smaps-only fields came from.
    source: Optional[str] = None

    def to_json(self) -> JSON:
        return _plain_fields(self)


@record(frozen=True)
class CgroupMemory:
    version: Optional[int] = None          # 1 or 2
    path: Optional[str] = None             # as in /proc/PID/cgroup
    usage: Optional[int] = None
    limit: Optional[int] = None            # None = unlimited
    inactive_file: Optional[int] = None
    working_set: Optional[int] = None      # max(0, usage - inactive_file)
    error: Optional[str] = None

    def to_json(self) -> JSON:
        return _plain_fields(self)


@record(frozen=True)
class AllocatorRef:
    """One allocator found in the process."""

    kind: str = "unknown"       # glibc|jemalloc|tcmalloc|tcmalloc-google|mimalloc|go|musl|unknown
    version: Optional[str] = None
    linkage: Optional[str] = None   # dynamic|static|preload
    path: Optional[str] = None
    prefix: Optional[str] = None    # symbol prefix: "je_", "_rjem_", "" for none
    variant: Optional[str] = None   # e.g. "minimal" for libtcmalloc_minimal
    evidence: tuple[str, ...] = ()

    def to_json(self) -> JSON:
        return _plain_fields(self)


@record(frozen=True)
class Allocator(AllocatorRef):
    """The allocator that serves ``malloc``, plus the others that are loaded."""

    others: tuple[AllocatorRef, ...] = ()


@record(frozen=True)
class Binding:
    """Where one GOT slot (``malloc`` in some object) points right now."""

    object: str             # the object whose GOT holds the slot
    symbol: str             # malloc, free
    slot: Optional[int] = None        # address of the GOT slot
    target: Optional[int] = None      # the address it holds
    target_path: Optional[str] = None  # the mapping that address lies in
    resolved: Optional[bool] = None    # False: lazy binding still points at the PLT

    def to_json(self) -> JSON:
        return _plain_fields(self)


@record(frozen=True)
class Preload:
    requested: tuple[str, ...] = ()            # paths, from LD_PRELOAD and /etc/ld.so.preload
    effective: Optional[bool] = None  # None: nothing requested, or cannot tell
    verdict: str = "none requested"
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    bindings: tuple[Binding, ...] = ()

    def to_json(self) -> JSON:
        return _plain_fields(self)


@record(frozen=True)
class CollectorStatus:
    ok: bool = True
    error: Optional[str] = None
    duration_s: float = 0.0
    pause_us: Optional[int] = None

    def to_json(self) -> JSON:
        return _plain_fields(self)


@record(frozen=True)
class Knob:
    name: str
    current: Optional[str] = None
    source: Optional[str] = None
    suggested: Optional[str] = None
    how: Optional[str] = None

    def to_json(self) -> JSON:
        return _plain_fields(self)


@record(frozen=True)
class Finding:
    id: str
    severity: str          # info|warning|critical
    title: str
    evidence: dict[str, Any] = field(default_factory=dict)
    knob: Optional[Knob] = None
    expected_effect_bytes: Optional[int] = None
    confidence: str = "medium"   # low|medium|high

    def to_json(self) -> JSON:
        return _plain_fields(self)


@record(frozen=True)
class Runtime:
    """A language runtime's own heap inside the process (CPython's pymalloc),
    read from its structures.  ``values``: field name -> Value (the
    "runtime" layer of diag.fields).  ``reason`` says why the values are
    unknown; ``missed`` lists what the numbers do not cover."""

    kind: str = "unknown"            # cpython-pymalloc | cpython-malloc
    version: Optional[str] = None
    path: Optional[str] = None       # the object that holds the interpreter
    values: dict[str, Value] = field(default_factory=dict)
    located_by: Optional[str] = None
    reason: Optional[str] = None
    missed: tuple[str, ...] = ()

    def to_json(self) -> JSON:
        out: JSON = {"kind": self.kind, "version": self.version, "path": self.path}
        for name, v in self.values.items():
            out[name] = v.to_json()
        out.update(located_by=self.located_by, reason=self.reason, missed=list(self.missed))
        return out


@record(frozen=True)
class Snapshot:
    pid: int
    comm: Optional[str] = None
    exe: Optional[str] = None
    taken_at: Optional[float] = None      # unix time, seconds
    allocator: Allocator = field(default_factory=Allocator)
    preload: Preload = field(default_factory=Preload)
    process: ProcessMemory = field(default_factory=ProcessMemory)
    cgroup: CgroupMemory = field(default_factory=CgroupMemory)
    stats: dict[str, Value] = field(default_factory=dict)
    native: dict[str, Any] = field(default_factory=dict)  # allocator's own names
    findings: tuple[Finding, ...] = ()
    collectors: dict[str, CollectorStatus] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    runtime: Optional[Runtime] = None     # pymalloc etc.; absent from JSON when None

    def to_json(self) -> JSON:
        out = self._head_json()
        for name in _SNAPSHOT_BODY:
            out[name] = _plain(getattr(self, name))
        if self.runtime is not None:
            # Only when the process has a runtime heap: recordings made
            # before this key existed round-trip unchanged.
            out["runtime"] = self.runtime.to_json()
        return out

    def _head_json(self) -> JSON:
        import datetime
        out: JSON = {"schema_version": self.schema_version, "pid": self.pid,
                     "comm": self.comm, "exe": self.exe}
        out["taken_at"] = (datetime.datetime.fromtimestamp(
            self.taken_at, datetime.timezone.utc).isoformat()
            if self.taken_at is not None else None)
        return out

    def json_text(self, kept: dict[str, tuple[Any, str]] | None = None) -> str:
        """``json.dumps(self.to_json(), separators=(",", ":"))``, the same
        text.  KEPT (a dict the caller keeps from one snapshot to the next,
        e.g. a recording's): the text of each _SNAPSHOT_SHARED field by the
        object it was made from, made again only when the field holds
        another object.  A Session's snapshots share those records while
        the process's mappings stay the same, and immutable, the same object
        has the same text: a recording's line no longer converts and
        encodes them every time (redis-server: 45 % of the line's bytes,
        mostly the preload bindings)."""
        if kept is None:
            return _compact(self.to_json())
        parts = [_compact(self._head_json())[1:-1]]
        for name in _SNAPSHOT_BODY:
            value = getattr(self, name)
            if name in _SNAPSHOT_SHARED:
                old = kept.get(name)
                if old is not None and old[0] is value:
                    text = old[1]
                else:
                    text = _compact(_plain(value))
                    kept[name] = (value, text)
            else:
                text = _compact(_plain(value))
            parts.append(f'"{name}":{text}')
        if self.runtime is not None:
            parts.append(f'"runtime":{_compact(self.runtime.to_json())}')
        return "{" + ",".join(parts) + "}"


# Snapshot's keys after the head's, in document order.
_SNAPSHOT_BODY = ("allocator", "preload", "process", "cgroup", "stats", "native", "findings",
                  "collectors")
# ... of which these hold frozen records (nothing in them can change) that a
# Session keeps from one snapshot to the next (Snapshot.json_text).
_SNAPSHOT_SHARED = frozenset({"allocator", "preload"})


def _compact(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"))


def _plain_fields(obj: Any) -> JSON:
    return {name: _plain(getattr(obj, name)) for name in field_names(obj)}


# -- invariants -------------------------------------------------------------------
# Which orderings of the normalised stats each allocator's own source
# guarantees (``a <= b`` for every pair listed; a pair with an unknown side
# is skipped).  They are not the same everywhere (DESIGN.md "Ordering"):
#
# jemalloc (src/ctl.c ctl_refresh, 5.3): resident = base resident + metadata
#   THP + (pactive + pdirty) pages, so active <= resident; mapped counts
#   active extents only (dirty ones are left out), so active <= mapped but
#   resident and mapped are NOT nested.
# glibc (malloc.c int_mallinfo): allocated = uordblks + hblkhd, active adds
#   the free fastbin chunks, mapped = arena + hblkhd, all from one read.
#   resident is the kernel's Rss of the heaps and chunks, read after that
#   call: a heap that grew in between puts it above mapped (seen with 32
#   threads still allocating), and allocated chunks may be untouched, so
#   resident is ordered with neither.
# gperftools (tcmalloc.cc ExtractStats): active = heap - free - unmapped,
#   resident = total_physical_bytes = heap - unmapped + metadata = mapped.
# google/tcmalloc: resident and mapped are both physical_memory_used.
# mimalloc (os.c stats): resident (pagemap of the segments) <= committed <=
#   reserved (mapped); active (carved blocks of live pages) <= committed.
ORDERINGS: dict[str, tuple[tuple[str, str], ...]] = {
    "jemalloc": (("allocated", "active"), ("active", "resident"), ("active", "mapped")),
    "glibc": (("allocated", "active"), ("active", "mapped")),
    "tcmalloc": (("allocated", "active"), ("active", "resident"), ("resident", "mapped")),
    "tcmalloc-google": (("allocated", "active"), ("active", "resident"), ("resident", "mapped")),
    "mimalloc": (("allocated", "active"), ("active", "committed"), ("resident", "committed"),
                 ("committed", "mapped")),
}


def invariant_violations(snap: Snapshot) -> list[str]:
    """Broken promises of one Snapshot, as sentences that name both numbers:
    the allocator's orderings (ORDERINGS) and the kernel bound: what the
    allocator says is resident never exceeds the process's resident
    anonymous memory (none of the allocators read here maps files, so its
    file-backed share is 0).  Empty when all hold."""
    out: list[str] = []
    stats = snap.stats or {}

    def val(name: str) -> Optional[int]:
        v = stats.get(name)
        return v.value if v is not None else None

    def own(name: str) -> Optional[int]:
        # The orderings are promises among the allocator's own figures: a
        # figure adjusted to the kernel's is compared by its raw value.
        v = stats.get(name)
        return None if v is None else (v.raw if v.raw is not None else v.value)

    for lo, hi in ORDERINGS.get(snap.allocator.kind, ()):
        a, b = own(lo), own(hi)
        if a is not None and b is not None and a > b:
            out.append(f"{snap.allocator.kind}: {lo} {a} > {hi} {b}")
    res, anon = val("resident"), snap.process.rss_anon
    if res is not None and anon is not None and res > anon:
        out.append(f"{snap.allocator.kind}: resident {res} > RSS anon {anon} "
                   f"(kernel, {snap.process.source or 'status'}) + its file-backed share 0")
    return out
