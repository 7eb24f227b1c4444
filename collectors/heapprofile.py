"""One parser (and writer) for legacy text heap profiles (issue 10).

Formats:

- gperftools heap profiler, unsampled: ``heap profile: ... @ heapprofile``
  (``HeapProfileTable::SaveProfile``; every allocation after the start is
  counted, so nothing is scaled);
- gperftools ``MallocExtension::GetHeapSample``: ``heap profile: ... @
  heap_v2/<period>`` (may start with ``%warn`` lines); also the older
  ``heap/<period>`` and Google's ``heapz_v2``;
- jemalloc threaded ``heap_v2/<period>`` (``src/prof_data.c``
  ``prof_dump_header``/``prof_dump_gctx``): a ``t*:`` process total and one
  ``tN:`` row per thread (optionally followed by the thread's name), then per
  stack an ``@ addr...`` line, its ``t*:`` total and its per-thread rows.

All end with ``MAPPED_LIBRARIES:`` (or ``--- Memory map: ---``) and a copy of
``/proc/self/maps`` at dump time, which the symbolizer uses.

Verified against upstream source (mirrors of github:google/pprof,
github:jemalloc/jemalloc, github:gperftools/gperftools, read with git show):

- pprof ``profile/legacy_profile.go`` ``parseHeapHeader``: ``heapprofile`` →
  rate 1 (no scaling); ``heap_v2``/``heapz_v2`` → rate = period;
  ``heap`` → rate = period/2 (integer division) and, unlike jeprof, the same
  Poisson formula.  ``scaleHeapSample``: count 0 or size 0 → (0, 0); rate <= 1
  → unchanged; else ``scale = 1/(1 - exp(-(size/count)/rate))`` applied to
  count and size, each truncated to int64.  ``parseHeapSample``: a count of 0
  with a non-zero size is an error; the in-use count may be negative.  The
  alloc pair is only a sample type when the header's alloc pair differs from
  the in-use pair and is not 0 (``hasAlloc``).  Blank and ``#`` lines are
  skipped; parsing stops at a line containing ``MAPPED_LIBRARIES:`` or
  ``--- Memory map: ---``.  Every address is decremented by 1 (done by the
  symbolizer, not here).
- jemalloc ``bin/jeprof.in`` ``ReadThreadedHeapProfile``: header
  ``heap_v2/(\\d+)`` → ``AdjustSamples`` with algorithm 2 and adjustment =
  period: the same formula, applied whenever the count and the period are
  non-zero (so ``heap_v2/1`` is scaled too, unlike pprof's rate <= 1 rule),
  the result kept as a float (Perl numbers); the rows before the first ``@`` are
  "just a per-thread summary"; ``t*`` rows make the profile, ``tN`` rows the
  per-thread profiles.  (jeprof's old ``heap`` handling — algorithm 1, divide
  by ``ratio`` when below 1 — is not pprof's; for gperftools formats we follow
  pprof, the tool that reads them today.)
- jemalloc ``prof_tdata_dump_iter`` appends ``" " thread_name`` to header
  thread rows when the thread was named (``prof.thread_name``).
- gperftools ``UnparseBucket``: ``"%6d: %8d [%6d: %8d] @"`` then
  ``" 0x%08x"`` per frame; ``kProcSelfMapsHeader`` is ``"\\nMAPPED_LIBRARIES:\\n"``.

Checked by running the references (tests/test_heapprof_parse.py): every
sample of a real gperftools ``heap_v2/524288`` capture equals ``go tool
pprof -raw`` (also relabelled ``heap/…``, ``heapz_v2/…``, ``heapprofile``),
and ``jeprof --text --show_bytes`` totals (in use and alloc) equal ours on
real jemalloc captures to the byte.

Malformed input raises ``MalformedData`` naming the line (exit 2 for a file the user
named: diag.heapview makes it BadInput), never any
other exception.  ``unparse`` writes a profile back out in its own format from
the numbers as written (unscaled), so pprof/jeprof read it exactly as the
original and ``parse(unparse(p)) == p``.
"""
from __future__ import annotations

import math
import re
from collections import namedtuple

from diag.model.records import field, record
from collectors.proc.maps import parse_maps
from diag.model.errors import MalformedData

# pprof's heapHeaderRE / heapSampleRE, anchored (we refuse trailing junk).
HEADER_RE = re.compile(
    r"heap profile: *(\d+): *(\d+) *\[ *(\d+): *(\d+) *\] *@ *(heap[_a-z0-9]*)/?(\d*)")
SAMPLE_RE = re.compile(
    r"(-?\d+): *(-?\d+) *\[ *(\d+): *(\d+) *\] *@([ x0-9a-fA-F]*)")
JE_HEADER_RE = re.compile(r"heap_v2/(\d+)")
# jeprof: t(\*|\d+):\s+(\d+):\s+(\d+)\s+\[\s*(\d+):\s+(\d+)\]  (+ an optional thread name)
JE_ROW_RE = re.compile(r"t(\*|\d+): *(\d+): *(\d+) *\[ *(\d+): *(\d+) *\](?: (.*))?")
JE_STACK_RE = re.compile(r"@((?: +0x[0-9a-fA-F]+)*)")
MAP_SENTINELS = ("MAPPED_LIBRARIES:", "--- Memory map: ---")
WARN_PREFIX = "%warn"
TEXT_ENCODING = {"encoding": "utf-8", "errors": "surrogateescape"}

INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1
INT64_DIGITS = len(str(INT64_MAX))

# format names (HeapProfile.format)
HEAPPROFILE = "heapprofile"
JEMALLOC = "jemalloc_heap_v2"
PPROF, JEPROF = "pprof", "jeprof"      # scaling modes

Counts = namedtuple("Counts", "inuse_objects inuse_bytes alloc_objects alloc_bytes")
ZERO = Counts(0, 0, 0, 0)


@record
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    path: str


@record
class Sample:
    stack: list            # raw return addresses as in the file, top first
    raw: Counts            # as written
    scaled: Counts         # after pprof/jeprof scaling
    threads: dict = field(default_factory=dict)   # jemalloc: thread uid -> raw Counts

    # scaled values under their pprof sample-type names
    inuse_objects = property(lambda self: self.scaled.inuse_objects)
    inuse_bytes = property(lambda self: self.scaled.inuse_bytes)
    alloc_objects = property(lambda self: self.scaled.alloc_objects)
    alloc_bytes = property(lambda self: self.scaled.alloc_bytes)


@record
class HeapProfile:
    format: str            # heapprofile | heap_v2 | heapz_v2 | heap | jemalloc_heap_v2
    period: int            # as written in the header (0 when absent)
    rate: int              # the rate the formula uses (pprof: <= 1 means no scaling)
    samples: list
    mappings: list
    warnings: list
    totals: Counts         # header totals as written (unscaled)
    has_alloc: bool = True  # pprof hasAlloc: the alloc pair carries data
    thread_totals: dict = field(default_factory=dict)   # jemalloc: uid -> (Counts, name)
    maps_text: str = ""    # the trailer after the sentinel, verbatim
    sentinel: str = MAP_SENTINELS[0]
    label: str = ""        # gperftools: the header's "@ LABEL" as written ("heap_v2/0")

    def scale(self, raw):
        """RAW Counts scaled the way this profile's reader (pprof/jeprof) does."""
        return _scale_counts(raw, self.rate, _mode(self.format))


def _mode(fmt):
    """How the reader of FMT scales: jeprof for jemalloc's threaded format,
    pprof's scaleHeapSample for sampled gperftools formats, none for the
    unsampled heap profiler (pprof never calls scaleHeapSample for it)."""
    return JEPROF if fmt == JEMALLOC else None if fmt == HEAPPROFILE else PPROF


def _scale_pair(count, size, rate, mode):
    if mode is None:
        return count, size
    if mode == PPROF:
        if count == 0 or size == 0:
            return 0, 0                  # scaleHeapSample
        if rate <= 1:
            return count, size
    elif count == 0 or rate == 0 or size == 0:
        # AdjustSamples scales when the count is non-zero and the rate is set;
        # a zero size would make Perl divide by zero: keep it as written.
        return count, size
    denom = -math.expm1(-(size / count) / rate)     # 1 - exp(-x), exact for small x
    if not denom > 0:
        raise MalformedData(f"heap profile: sample {count}: {size} cannot be scaled "
                            f"at rate {rate}")
    s = 1.0 / denom
    if not math.isfinite(count * s):
        raise MalformedData(f"heap profile: sample {count}: {size} scales to infinity")
    if mode == PPROF:
        return int(count * s), int(size * s)       # Go int64(float64 * scale)
    return count * s, size * s                     # Perl keeps the float


def _scale_counts(raw, rate, mode):
    co, cb = _scale_pair(raw.inuse_objects, raw.inuse_bytes, rate, mode)
    ao, ab = _scale_pair(raw.alloc_objects, raw.alloc_bytes, rate, mode)
    return Counts(co, cb, ao, ab)


def _int64(text, lineno):
    # checked before int(): Python refuses to convert over 4300 digits (ValueError)
    if len(text.lstrip("-")) > INT64_DIGITS:
        raise MalformedData(f"heap profile line {lineno}: number {text[:30]}... out of int64 range")
    v = int(text)
    if not -INT64_MAX - 1 <= v <= INT64_MAX:
        raise MalformedData(f"heap profile line {lineno}: number {text[:30]} out of int64 range")
    return v


def _counts(groups, lineno):
    c = Counts(*(_int64(g, lineno) for g in groups))
    for cnt, size, what in ((c.inuse_objects, c.inuse_bytes, "in-use"),
                            (c.alloc_objects, c.alloc_bytes, "allocation")):
        if cnt == 0 and size != 0:      # pprof parseHeapSample rejects this too
            raise MalformedData(f"heap profile line {lineno}: {what} count 0 but {size} bytes")
    return c


def _addrs(text, lineno):
    toks = text.split()
    if not toks:
        raise MalformedData(f"heap profile line {lineno}: empty stack")
    try:
        out = [int(t, 16) for t in toks]
    except ValueError:
        bad = next((t for t in toks if not re.fullmatch(r"(0[xX])?[0-9a-fA-F]+", t)), toks[0])
        raise MalformedData(f"heap profile line {lineno}: bad address {bad[:40]!r}") from None
    if min(out) <= 0 or max(out) > UINT64_MAX:
        raise MalformedData(f"heap profile line {lineno}: address out of range")
    return out


def _parse_maps(text):
    """The Mappings of a heap profile's maps trailer (/proc/self/maps text as
    the program copied it): lines that are not a mapping are skipped, as
    pprof and jeprof do."""
    return [Mapping(m.start, m.end, m.perms, m.offset, m.maps_path)
            for m in parse_maps(text.encode(**TEXT_ENCODING), strict=False)]


def printable(text):
    """TEXT for a terminal or JSON: undecodable bytes (kept as surrogates)
    shown as backslash escapes."""
    return text.encode(**TEXT_ENCODING).decode("utf-8", "backslashreplace")


def _decode(data):
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data)
        if b"\0" in data:
            raise MalformedData("heap profile: binary data (NUL byte)")
        # paths in the maps may be any bytes: surrogateescape keeps them as
        # the OS spells them (open() takes them back) and the text byte-exact
        return data.decode("utf-8", "surrogateescape")
    if not isinstance(data, str):
        raise MalformedData("heap profile: not text")
    if "\0" in data:
        raise MalformedData("heap profile: binary data (NUL character)")
    return data


def _split_trailer(text):
    """(body lines, sentinel, trailer text).  The trailer starts after the
    first line that contains a sentinel (pprof: strings.Contains)."""
    lines = text.split("\n")
    for i, ln in enumerate(lines):
        for s in MAP_SENTINELS:
            if s in ln:
                return lines[:i], s, "\n".join(lines[i + 1:])
    return lines, MAP_SENTINELS[0], ""


def parse(data) -> HeapProfile:
    """Parse one legacy heap profile (bytes or str).  Raises MalformedData."""
    text = _decode(data).replace("\r", "")
    body, sentinel, trailer = _split_trailer(text)
    warnings = []
    i = 0
    while i < len(body):
        ln = body[i].strip()
        if ln.startswith(WARN_PREFIX):
            warnings.append(ln[len(WARN_PREFIX):].strip())
        elif ln:
            break
        i += 1
    if i >= len(body):
        raise MalformedData("heap profile: no header line")
    head = body[i].strip()
    if JE_HEADER_RE.fullmatch(head):
        prof = _parse_jemalloc(body, i, warnings)
    else:
        prof = _parse_gperf(body, i, warnings)
    prof.maps_text = trailer
    prof.sentinel = sentinel
    prof.mappings = _parse_maps(trailer)
    return prof


def _parse_gperf(body, i, warnings):
    head = body[i].strip()
    m = HEADER_RE.fullmatch(head)
    if not m:
        raise MalformedData(f"heap profile: unknown header {head[:80]!r}")
    kind, per = m.group(5), m.group(6)
    period = _int64(per, i + 1) if per else 0
    if kind == "heapprofile":
        rate = 1
    elif kind in ("heap_v2", "heapz_v2"):
        rate = period
    elif kind == "heap":
        rate = period // 2
    else:
        raise MalformedData(f"heap profile: unknown kind {kind!r}")
    totals = Counts(*(_int64(m.group(k), i + 1) for k in range(1, 5)))
    # pprof's hasAlloc guesses from the totals (gperftools 2.10's sampled
    # heap_v2 writes the in-use pair twice).  The unsampled heapprofile always
    # counts allocations since the start: equal pairs there mean nothing was
    # freed, not "no data".
    has_alloc = kind == "heapprofile" or (
        (totals.alloc_objects != totals.inuse_objects and totals.alloc_objects != 0)
        or (totals.alloc_bytes != totals.inuse_bytes and totals.alloc_bytes != 0))
    mode = _mode(kind)
    samples = []
    for j in range(i + 1, len(body)):
        ln = body[j].strip()
        if not ln or ln.startswith("#"):
            continue
        if ln.startswith(WARN_PREFIX):
            warnings.append(ln[len(WARN_PREFIX):].strip())
            continue
        sm = SAMPLE_RE.fullmatch(ln)
        if not sm:
            raise MalformedData(f"heap profile line {j + 1}: not a sample: {ln[:80]!r}")
        raw = _counts(sm.groups()[:4], j + 1)
        samples.append(Sample(_addrs(sm.group(5), j + 1), raw,
                              _scale_counts(raw, rate, mode)))
    return HeapProfile(kind, period, rate, samples, [], warnings, totals, has_alloc,
                       label=kind + (f"/{per}" if per else ""))


def _parse_jemalloc(body, i, warnings):
    period = _int64(JE_HEADER_RE.fullmatch(body[i].strip()).group(1), i + 1)
    totals = None
    thread_totals = {}
    samples = []
    cur = None
    have_total = False
    for j in range(i + 1, len(body)):
        ln = body[j].strip()
        if not ln:
            continue
        if ln.startswith(WARN_PREFIX):
            warnings.append(ln[len(WARN_PREFIX):].strip())
            continue
        if ln.startswith("@"):
            if cur is not None and not have_total:
                raise MalformedData(f"jemalloc heap profile line {j + 1}: stack without a t* row")
            sm = JE_STACK_RE.fullmatch(ln)
            if not sm:
                raise MalformedData(f"jemalloc heap profile line {j + 1}: bad stack line")
            cur = Sample(_addrs(sm.group(1), j + 1), ZERO, ZERO)
            samples.append(cur)
            have_total = False
            continue
        rm = JE_ROW_RE.fullmatch(ln)
        if not rm:
            raise MalformedData(f"jemalloc heap profile line {j + 1}: {ln[:80]!r}")
        tid, name = rm.group(1), rm.group(6)
        vals = _counts(rm.groups()[1:5], j + 1)
        if cur is None:                          # header: process and per-thread totals
            if tid == "*":
                if totals is not None:
                    raise MalformedData(f"jemalloc heap profile line {j + 1}: two t* totals")
                totals = vals
            elif totals is None:
                raise MalformedData(f"jemalloc heap profile line {j + 1}: thread row before t*")
            else:
                thread_totals[_int64(tid, j + 1)] = (vals, name)
            continue
        if name is not None:
            raise MalformedData(f"jemalloc heap profile line {j + 1}: junk after a stack row")
        if tid == "*":
            if have_total:
                raise MalformedData(f"jemalloc heap profile line {j + 1}: two t* rows")
            have_total = True
            cur.raw = vals
            cur.scaled = _scale_counts(vals, period, JEPROF)
        elif not have_total:
            raise MalformedData(f"jemalloc heap profile line {j + 1}: thread row before t*")
        else:
            cur.threads[_int64(tid, j + 1)] = vals
    if totals is None:
        raise MalformedData("jemalloc heap profile: no t* totals line")
    if cur is not None and not have_total:
        raise MalformedData("jemalloc heap profile: last stack has no t* row")
    # jemalloc writes [0: 0] unless opt.prof_accum: then there is no alloc data
    has_alloc = bool(totals.alloc_objects or totals.alloc_bytes)
    return HeapProfile(JEMALLOC, period, period, samples, [], warnings, totals, has_alloc,
                       thread_totals)


# -- writing -------------------------------------------------------------------

def _bucket(c):
    # gperftools UnparseBucket / PrintCountAndSize
    return "%6d: %8d [%6d: %8d] @" % tuple(c)


def _je_cnts(c):
    # jemalloc prof_dump_print_cnts
    return "%d: %d [%d: %d]" % tuple(c)


def _warn_lines(warnings):
    return ["%s %s\n" % (WARN_PREFIX, w) if w else WARN_PREFIX + "\n" for w in warnings]


def unparse(prof: HeapProfile) -> str:
    """The profile as text in its own format, numbers as written (unscaled),
    so pprof and jeprof scale it again exactly as they did the original.
    Encode with ``TEXT_ENCODING`` to get the original bytes back."""
    out = []
    if prof.format == JEMALLOC:
        out.append("heap_v2/%d\n" % prof.period)
        # jemalloc writes no %warn; jeprof skips unknown lines after its header line
        out.extend(_warn_lines(prof.warnings))
        out.append("  t*: %s\n" % _je_cnts(prof.totals))
        for tid, (c, name) in prof.thread_totals.items():
            out.append("  t%d: %s%s\n" % (tid, _je_cnts(c), f" {name}" if name is not None else ""))
        for s in prof.samples:
            out.append("@" + "".join(" %#x" % a for a in s.stack) + "\n")
            out.append("  t*: %s\n" % _je_cnts(s.raw))
            for tid, c in s.threads.items():
                out.append("  t%d: %s\n" % (tid, _je_cnts(c)))
    else:
        out.extend(_warn_lines(prof.warnings))
        label = prof.label or prof.format + (f"/{prof.period}" if prof.period else "")
        out.append("heap profile: %s %s\n" % (_bucket(prof.totals), label))
        for s in prof.samples:
            out.append(_bucket(s.raw) + "".join(" 0x%08x" % a for a in s.stack) + "\n")
    out.append("\n%s\n" % prof.sentinel)
    out.append(prof.maps_text)
    return "".join(out)
