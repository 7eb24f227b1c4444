"""One parser for legacy heap profiles (issue 10).

Formats:
- gperftools unsampled ``heap profile: ... @ heapprofile`` (no scaling),
- gperftools/pprof ``heap profile: ... @ heap_v2/<period>`` (pprof scaling),
- jemalloc threaded ``heap_v2/<period>`` with ``t*:`` totals and ``tN:`` rows.

Scaling is pprof's ``scaleHeapSample`` (profile/legacy_profile.go) and jeprof's
``AdjustSamples``: ``scale = 1 / (1 - exp(-(size/count)/rate))`` applied to both
count and size, separately for the in-use and the cumulative pair; rate 1 or
count 0 means no scaling.  Old ``heap`` (no _v2) uses rate period/2 in pprof;
we follow that.  Malformed input raises ``MalformedData``, never anything else.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from collectors.errors import MalformedData

HEADER_RE = re.compile(
    r"^heap profile: *(\d+): *(\d+) *\[ *(\d+): *(\d+) *\] *@ *(heap[_a-z0-9]*)/?(\d*)\s*$")
SAMPLE_RE = re.compile(
    r"^\s*(-?\d+): *(-?\d+) *\[ *(\d+): *(\d+) *\] *@([ x0-9a-fA-F]*)$")
JE_HEADER_RE = re.compile(r"^heap_v2/(\d+)\s*$")
JE_ROW_RE = re.compile(r"^\s*t(\*|\d+): *(\d+): *(\d+) *\[ *(\d+): *(\d+) *\]\s*$")
JE_STACK_RE = re.compile(r"^@((?: +0x[0-9a-fA-F]+)*)\s*$")
MAPS_RE = re.compile(
    r"^([0-9a-fA-F]+)-([0-9a-fA-F]+) +([-rwxps]{4}) +([0-9a-fA-F]+) +\S+ +\d+ *(.*)$")


@dataclass
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    path: str


@dataclass
class Sample:
    stack: list            # raw return addresses as in the file, top first
    inuse_objects: float
    inuse_bytes: float
    alloc_objects: float
    alloc_bytes: float
    threads: dict = field(default_factory=dict)   # jemalloc: tid -> (co, cb, ao, ab) scaled


@dataclass
class HeapProfile:
    format: str            # heapprofile | heap_v2 | heap | jemalloc_heap_v2
    period: int
    samples: list
    mappings: list
    warnings: list
    totals: tuple          # as written in the header (unscaled)


def _scale(count: int, size: int, rate: int):
    if count == 0 or size == 0 or rate <= 1:
        return float(count), float(size)
    avg = size / count
    denom = 1.0 - math.exp(-avg / rate)
    if denom <= 0:
        return float(count), float(size)
    s = 1.0 / denom
    return count * s, size * s


def _addrs(text: str, lineno: int):
    out = []
    for tok in text.split():
        try:
            out.append(int(tok, 16))
        except ValueError:
            raise MalformedData(f"heap profile line {lineno}: bad address {tok!r}") from None
    return out


def _parse_maps(lines, start):
    maps = []
    for ln in lines[start:]:
        ln = ln.rstrip("\n")
        if not ln.strip():
            continue
        m = MAPS_RE.match(ln)
        if not m:
            continue            # pprof skips lines it does not understand here
        maps.append(Mapping(int(m.group(1), 16), int(m.group(2), 16), m.group(3),
                            int(m.group(4), 16), m.group(5).strip()))
    return maps


def parse(data) -> HeapProfile:
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            data = data.decode("latin-1")
    if not isinstance(data, str):
        raise MalformedData("heap profile: not text")
    lines = data.splitlines()
    warnings = []
    i = 0
    while i < len(lines) and (lines[i].startswith("%warn") or not lines[i].strip()):
        if lines[i].startswith("%warn"):
            warnings.append(lines[i][5:].strip())
        i += 1
    if i >= len(lines):
        raise MalformedData("heap profile: empty")
    head = lines[i]
    if JE_HEADER_RE.match(head):
        return _parse_jemalloc(lines, i, warnings)
    m = HEADER_RE.match(head)
    if not m:
        raise MalformedData(f"heap profile: unknown header {head[:80]!r}")
    kind, per = m.group(5), m.group(6)
    period = int(per) if per else 0
    if kind == "heapprofile":
        rate = 1
    elif kind in ("heap_v2", "heapz_v2"):
        rate = period
    elif kind == "heap":
        rate = period // 2 if period else 1
    else:
        raise MalformedData(f"heap profile: unknown kind {kind!r}")
    samples = []
    j = i + 1
    while j < len(lines):
        ln = lines[j]
        if ln.startswith("MAPPED_LIBRARIES:") or ln.startswith("--- Memory map:"):
            break
        if ln.startswith("%warn"):
            warnings.append(ln[5:].strip())
        elif ln.strip():
            sm = SAMPLE_RE.match(ln)
            if not sm:
                raise MalformedData(f"heap profile line {j + 1}: {ln[:80]!r}")
            co, cb, ao, ab = (int(sm.group(k)) for k in range(1, 5))
            stack = _addrs(sm.group(5), j + 1)
            co_s, cb_s = _scale(co, cb, rate)
            ao_s, ab_s = _scale(ao, ab, rate)
            samples.append(Sample(stack, co_s, cb_s, ao_s, ab_s))
        j += 1
    maps = _parse_maps(lines, j + 1) if j < len(lines) else []
    return HeapProfile(kind, period, samples, maps, warnings,
                       tuple(int(m.group(k)) for k in range(1, 5)))


def _parse_jemalloc(lines, i, warnings):
    period = int(JE_HEADER_RE.match(lines[i]).group(1))
    rate = period
    j = i + 1
    totals = None
    samples = []
    cur = None

    def row(ln, lineno):
        rm = JE_ROW_RE.match(ln)
        if not rm:
            raise MalformedData(f"jemalloc heap profile line {lineno}: {ln[:80]!r}")
        return rm.group(1), tuple(int(rm.group(k)) for k in range(2, 6))

    while j < len(lines):
        ln = lines[j]
        if ln.startswith("MAPPED_LIBRARIES:"):
            break
        if ln.startswith("%warn"):
            warnings.append(ln[5:].strip())
        elif ln.startswith("@"):
            sm = JE_STACK_RE.match(ln)
            if not sm:
                raise MalformedData(f"jemalloc heap profile line {j + 1}: bad stack")
            cur = Sample(_addrs(sm.group(1), j + 1), 0.0, 0.0, 0.0, 0.0)
            cur._have_total = False
            samples.append(cur)
        elif ln.strip():
            tid, vals = row(ln, j + 1)
            co, cb = _scale(vals[0], vals[1], rate)
            ao, ab = _scale(vals[2], vals[3], rate)
            if cur is None:
                if tid == "*":
                    if totals is not None:
                        raise MalformedData("jemalloc heap profile: two process totals")
                    totals = vals
            elif tid == "*":
                if cur._have_total:
                    raise MalformedData(f"jemalloc heap profile line {j + 1}: two t* rows")
                cur._have_total = True
                cur.inuse_objects, cur.inuse_bytes = co, cb
                cur.alloc_objects, cur.alloc_bytes = ao, ab
            else:
                cur.threads[int(tid)] = (co, cb, ao, ab)
        j += 1
    if totals is None:
        raise MalformedData("jemalloc heap profile: no t* totals line")
    for s in samples:
        if not s._have_total:
            raise MalformedData("jemalloc heap profile: stack without a t* row")
        del s._have_total
    maps = _parse_maps(lines, j + 1) if j < len(lines) else []
    return HeapProfile("jemalloc_heap_v2", period, samples, maps, warnings, totals)
