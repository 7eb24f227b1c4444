"""Parsers of outside data never crash (issue 21, item 7).

Property-based (hypothesis): every parser of data allocdiag reads from
outside -- malloc_info XML, jemalloc stats JSON and table, gperftools and mimalloc stats
text, heap profiles, recordings (plain and gzip), captured /proc trees, ELF
notes and ``.eh_frame`` -- gives a parsed result or the project's error
(diag.model.errors; ``UnwindError`` for the unwinder, whose API stays) with a
message, never another exception, never a hang.

Inputs are seeded from real captures (tests/fixtures, a /proc tree and an ELF
executable captured from a real target here): byte- and number-level
mutations of them, splices of two of them, and random bytes.  Each property
runs twice: a bounded, derandomized run by default (CI; the file takes well
under a minute), and a long random one under the ``fuzz`` marker
(``pytest -m fuzz tests/test_fuzz_parsers.py``).  pytest-timeout bounds a
hang; hypothesis's deadline flags an input that is merely slow.

Complements tests/test_heapprof_parse.py::test_fuzz (random line-level
mutations of each heap capture, checked with the writer): here hypothesis
shrinks what it finds, splices gperftools and jemalloc profiles, and mutates
numbers and headers.
"""

import functools
import gzip
import io
import json
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diag.model.errors import AllocdiagError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")

# (max_examples, deadline ms) per budget.  "ci" is derandomized: the same
# inputs every run.  "long" draws new ones each run.
BUDGETS = {"ci": (200, 5000), "long": (5000, 5000)}
# pytest-timeout ends a hang (the deadline only flags a slow input after it returns).
BUDGET = pytest.mark.parametrize("budget", [
    pytest.param("ci", marks=pytest.mark.timeout(120)),
    pytest.param("long", marks=[pytest.mark.fuzz, pytest.mark.timeout(1200)])])

# Numbers a mutation writes over a number of the input.
NUMBERS = (b"0", b"-1", b"18446744073709551615", b"18446744073709551616",
           b"99999999999999999999999999999", b"1e309", b"NaN", b"-0", b"0x10", b"", b"1.5",
           b"9" * 5000)


# Hostile inputs no mutation of a capture reaches quickly: deep nesting
# (RecursionError in json), an integer past Python's 4300-digit limit, NULs.
HOSTILE = (b"[" * 100000 + b"\n", b'{"jemalloc": ' * 5000 + b"\n", b"9" * 5000 + b"\n",
           b"\0" * 64, b"\xff\xfe" * 32)


def fixture(name):
    with open(os.path.join(FIXTURES, name), "rb") as f:
        return f.read()


def _apply(seed, edits, other):
    """SEED with EDITS applied: (op, position, blob) each."""
    b = bytearray(seed)
    for op, pos, blob in edits:
        i = pos % (len(b) + 1)
        if op == "flip" and b:
            b[i % len(b)] ^= (blob[:1] or b"\xff")[0] or 0x80
        elif op == "delete":
            del b[i:i + 1 + 8 * len(blob)]
        elif op == "insert":
            b[i:i] = blob
        elif op == "duplicate" and b:
            j = (pos // 7) % len(b)
            b[i:i] = b[j:j + 1 + 32 * len(blob)]
        elif op == "truncate":
            del b[i:]
        elif op == "number":
            # the next run of digits at or after I becomes an extreme number
            j = i
            while j < len(b) and not chr(b[j]).isdigit():
                j += 1
            k = j
            while k < len(b) and chr(b[k]).isdigit():
                k += 1
            b[j:k] = NUMBERS[(blob[:1] or b"\0")[0] % len(NUMBERS)]
        elif op == "splice" and other:
            j = (pos // 3) % len(other)
            b[i:] = other[j:]
    return bytes(b)


OPS = st.sampled_from(("flip", "delete", "insert", "duplicate", "truncate", "number", "splice"))


def mutations(seeds, max_edits=6):
    """Mutations of the real inputs SEEDS, plus random bytes."""
    seeds = list(seeds)
    edits = st.lists(st.tuples(OPS, st.integers(0, 1 << 30), st.binary(max_size=12)),
                     min_size=1, max_size=max_edits)
    mutated = st.builds(_apply, st.sampled_from(seeds), edits, st.sampled_from(seeds))
    return st.one_of(mutated, mutated, mutated, st.sampled_from(seeds), st.binary(max_size=2048),
                     st.sampled_from(HOSTILE))


def check(budget, strategy):
    """Decorator: run the decorated property over STRATEGY within BUDGET."""
    examples, deadline = BUDGETS[budget]

    def deco(prop):
        wrapped = settings(max_examples=examples, deadline=deadline, database=None,
                           derandomize=budget == "ci", print_blob=True,
                           suppress_health_check=list(HealthCheck))(given(strategy)(prop))
        wrapped()
        return wrapped
    return deco


def project_error(exc, *allowed):
    """EXC is one of the project's errors, with a message."""
    assert isinstance(exc, (AllocdiagError,) + allowed), repr(exc)
    assert str(exc).strip() and len(str(exc)) > 8, repr(exc)


def outcome(fn, *args, allowed=()):
    """FN(*ARGS), or None when it raised one of the project's errors (or
    ALLOWED ones); any other exception fails the property."""
    try:
        return fn(*args)
    except Exception as exc:
        project_error(exc, *allowed)
        return None


# -- allocator stats -----------------------------------------------------------------------

STATS = {
    "glibc": ("malloc_info-glibc-2.36.xml", "malloc_info-glibc-nofast.hand-edited.xml",
              "malloc_info-glibc-2.36.truncated.xml"),
    "jemalloc": ("jemalloc-5.3.0-stats.json", "jemalloc-5.3.0-stats-one-arena.json",
                 "jemalloc-5.3.0-stats.truncated.json"),
    "tcmalloc": ("tcmalloc-2.10-getstats.txt", "tcmalloc-2.10-getstats.truncated.txt"),
    "mimalloc": ("mimalloc-2.0.9-stats.txt", "mimalloc-2.0.9-stats.truncated.txt",
                 "mimalloc-2.4-stats.SYNTHETIC.json"),
}


@BUDGET
@pytest.mark.parametrize("kind", sorted(STATS))
def test_stats_file_parsers(kind, budget):
    """parse_file + normalise of each allocator module (the --from path and
    the shape the live path parses into), and inspect --from's detection."""
    from collectors import allocators
    from diag import filemode
    mod = allocators.module(kind)
    seeds = [fixture(n) for n in STATS[kind]]

    @check(budget, mutations(seeds))
    def prop(data):
        filemode.detect_format(data)
        native = outcome(mod.parse_file, data)
        stats = outcome(mod.normalise, native) if native is not None else None
        if stats is not None:
            json.dumps(native)                   # what inspect --json prints
            for v in stats.values():
                assert v.value is None or isinstance(v.value, int)


@BUDGET
@pytest.mark.parametrize("kind, name", [("jemalloc", "jemalloc-5.3.0-stats.json"),
                                        ("mimalloc", "mimalloc-2.4-stats.SYNTHETIC.json")])
def test_stats_json_documents(kind, name, budget):
    """The JSON stats with any value anywhere replaced by any JSON value
    (a structure byte mutations rarely reach)."""
    from collectors import allocators
    mod = allocators.module(kind)
    doc = json.loads(fixture(name))

    @check(budget, st.lists(st.tuples(JSON_PATHS, JSON_VALUES), min_size=1, max_size=4))
    def prop(edits):
        text = json.dumps(_json_edits(json.loads(json.dumps(doc)), edits)).encode()
        native = outcome(mod.parse_file, text)
        if native is not None:
            outcome(mod.normalise, native)


@BUDGET
def test_jemalloc_stats_table(budget):
    """The table form a first live snapshot prints (jemalloc's parse of
    raw["table"]): the values, or MalformedData (a Retry: print JSON)."""
    from collectors import allocators
    mod = allocators.module("jemalloc")
    capture = fixture("jemalloc-5.3.0-stats.dablxeh.txt")
    seed = capture.split(b"=== BEGIN jemalloc_stats_table_dablxeh\n")[1].split(b"=== END")[0]

    @check(budget, mutations([seed]))
    def prop(data):
        native = outcome(mod.parse, {"table": data, "mallctl": {}}, None)
        if native is not None:
            json.dumps(native)
            for v in (outcome(mod.normalise, native) or {}).values():
                assert v.value is None or isinstance(v.value, int)


@BUDGET
def test_mallinfo2_struct(budget):
    from collectors.allocators.glibc import stats as glibc_stats

    @check(budget, st.binary(max_size=200))
    def prop(raw):
        d = outcome(glibc_stats.parse_mallinfo2, raw)
        if d is not None:
            glibc_stats.normalise_glibc(None, d)


@BUDGET
def test_stats_file_through_filemode(budget, tmp_path):
    """inspect --from: any file is a Snapshot or BadInput (exit 2)."""
    from diag.model.errors import BadInput
    from diag import filemode
    seeds = [fixture(n) for names in STATS.values() for n in names]
    path = tmp_path / "stats"

    @check(budget, mutations(seeds))
    def prop(data):
        path.write_bytes(data)
        try:
            filemode.snapshot_from_file(str(path))
        except Exception as exc:
            assert isinstance(exc, BadInput), repr(exc)
            project_error(exc)


# -- heap profiles --------------------------------------------------------------------------

HEAPS = ("heap-tcmalloc-python.heap", "heap-jemalloc-python.heap",
         "heap-jemalloc-threads-accum-python.heap", "heap-tcmalloc-sampled.heap",
         "heap-tcmalloc-sampling-off.heap")


@functools.lru_cache(maxsize=None)
def _heap_seeds():
    # The captures are large (thousands of lines): the first 120 lines and
    # the maps trailer keep every construct and keep examples fast.
    out = []
    for name in HEAPS:
        data = fixture(name)
        lines = data.split(b"\n")
        cut = next((i for i, ln in enumerate(lines) if ln.startswith(b"MAPPED_LIBRARIES")),
                   len(lines))
        out.append(b"\n".join(lines[:min(cut, 120)] + lines[cut:cut + 40]))
    return out


@BUDGET
def test_heap_profile_parser(budget):
    from collectors import heapprofile

    @check(budget, mutations(_heap_seeds()))
    def prop(data):
        p = outcome(heapprofile.parse, data)
        if p is not None:
            assert heapprofile.parse(heapprofile.unparse(p)) == p


# -- recordings -------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _recording():
    return gzip.decompress(fixture("recording-jemalloc-burst-release.jsonl.gz"))


def _json_edits(doc, edits):
    """DOC (a real snapshot line) with values at chosen paths replaced."""
    for path_pick, value in edits:
        parent, key, node = None, None, doc
        for step in path_pick:
            if isinstance(node, dict) and node:
                k = sorted(node)[step % len(node)]
            elif isinstance(node, list) and node:
                k = step % len(node)
            else:
                break
            parent, key, node = node, k, node[k]
        if parent is not None:
            parent[key] = value
    return doc


JSON_PATHS = st.lists(st.integers(0, 1000), min_size=1, max_size=6)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                   max_size=4),
    max_leaves=8)


@BUDGET
def test_snapshot_documents(budget):
    """snapshot_from_json: a real recording line with any value anywhere
    replaced by any JSON value."""
    from diag.recording import snapshot_from_json
    lines = [json.loads(ln) for ln in _recording().splitlines() if b'"event"' not in ln[:20]]
    strategy = st.builds(lambda i, e: _json_edits(json.loads(json.dumps(lines[i % len(lines)])), e),
                         st.integers(0, 100), st.lists(st.tuples(JSON_PATHS, JSON_VALUES),
                                                       max_size=4))

    @check(budget, strategy)
    def prop(doc):
        snap = outcome(snapshot_from_json, doc)
        if snap is not None:
            json.dumps(snap.to_json())


@BUDGET
@pytest.mark.parametrize("form", ["plain", "gzip", "gzip-bytes"])
def test_recording_files(budget, form, tmp_path):
    """read_recording_events on mutated recordings: plain text, the mutation
    gzip-compressed, and the gzip bytes themselves mutated."""
    from diag.model.errors import BadInput
    from diag.recording import read_recording_events
    plain = _recording()
    seeds = [plain, plain.split(b"\n", 2)[0] + b"\n", b""]
    if form == "gzip-bytes":
        seeds = [gzip.compress(s) for s in seeds]
    path = tmp_path / ("r.jsonl" if form == "plain" else "r.jsonl.gz")

    @check(budget, mutations(seeds))
    def prop(data):
        path.write_bytes(gzip.compress(data) if form == "gzip" else data)
        try:
            read_recording_events(str(path))
        except Exception as exc:
            assert isinstance(exc, BadInput), repr(exc)
            project_error(exc)


# -- captured /proc trees ---------------------------------------------------------------------

PROC_FILES = ("status", "stat", "smaps_rollup", "smaps", "maps", "environ", "cmdline", "cgroup",
              "auxv")


@functools.lru_cache(maxsize=None)
def _proc_capture():
    """The /proc files of a real target (idle.c under jemalloc, with a known
    environment), captured once."""
    from targets import build_c, start
    out = {}
    with start([build_c("idle.c"), "1"], allocator="jemalloc",
               env={"MALLOC_CONF": "dirty_decay_ms:1000", "PATH": "/usr/bin"}) as t:
        for name in PROC_FILES:
            with open(f"/proc/{t.pid}/{name}", "rb") as f:
                out[name] = f.read()
    return out


def _proc_tree_strategy():
    cap = _proc_capture()
    files = {name: mutations([data] + [d for n, d in cap.items() if n != name], max_edits=4)
             for name, data in cap.items()}
    # most files stay as captured; one to three are mutated
    return st.builds(lambda picks, new: {n: (new[n] if n in picks else cap[n]) for n in cap},
                     st.sets(st.sampled_from(sorted(cap)), min_size=1, max_size=3),
                     st.fixed_dictionaries(files))


CGROUP_SEEDS = {"memory.current": b"123731968\n", "memory.max": b"max\n",
                "memory.stat": None}


@BUDGET
def test_captured_proc_tree(budget):
    from collectors.proc.cgroup import cgroup_memory
    from collectors.proc.procfs import ProcFS
    pid = 4242
    with open("/sys/fs/cgroup/memory.stat", "rb") if os.path.exists(
            "/sys/fs/cgroup/memory.stat") else io.BytesIO(b"anon 1\ninactive_file 4096\n") as f:
        stat = f.read()

    @check(budget, st.tuples(_proc_tree_strategy(), mutations([stat, b"inactive_file 1\n"])))
    def prop(case):
        tree, cg_stat = case
        root = tempfile.mkdtemp(prefix="fuzzproc")
        try:
            d = os.path.join(root, "proc", str(pid))
            os.makedirs(d)
            for name, data in tree.items():
                with open(os.path.join(d, name), "wb") as f:
                    f.write(data)
            cg = os.path.join(root, "cg", "x")
            os.makedirs(cg)
            for name, data in (("memory.current", b"123731968\n"), ("memory.max", b"max\n"),
                               ("memory.stat", cg_stat)):
                with open(os.path.join(cg, name), "wb") as f:
                    f.write(data)
            fs = ProcFS(os.path.join(root, "proc"))
            for call in (fs.memory, fs.status, fs.maps, fs.auxv, fs.environ, fs.cmdline,
                         fs.cgroup_paths, fs.is_kernel_thread, fs.check_user_process,
                         fs.smaps_rollup):
                outcome(call, pid)
            cgroup_memory({"": "/x"}, os.path.join(root, "cg"))
        finally:
            shutil.rmtree(root)


PROC_PARTS_SEEDS = ("proc-maps-deleted-spaces.txt", "proc-stat-comm-parens.txt",
                    "smaps-glibc-two-arenas.txt")


@BUDGET
def test_maps_and_stat_parsers(budget):
    """The one maps parser: strict gives mappings or MalformedData; lenient
    (heap profile trailers) never raises and keeps only well-formed ranges.
    smaps' Rss per mapping: pairs or MalformedData.  The stat reader gives
    an int or None."""
    from collectors.proc.maps import parse_maps
    from collectors.proc.smaps import rss_by_mapping
    from collectors.proc.stat import parse_start_time, parse_state
    seeds = []
    for name in PROC_PARTS_SEEDS:
        with open(os.path.join(FIXTURES, name), "rb") as f:
            seeds.append(f.read())

    @check(budget, mutations(seeds))
    def prop(data):
        outcome(parse_maps, data)
        for m, rss in outcome(rss_by_mapping, data) or ():
            assert m.start < m.end and rss >= 0
        for m in parse_maps(data, strict=False):
            assert m.start < m.end <= (1 << 64) - 1 and len(m.perms) == 4
        st = parse_start_time(data)
        assert st is None or isinstance(st, int)
        assert parse_state(data) is None or isinstance(parse_state(data), bytes)


# -- ELF notes and .eh_frame --------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _elf_seed():
    """A real executable and the (offset, size) of its note, .eh_frame and
    .eh_frame_hdr sections and of its headers."""
    from elftools.elf.elffile import ELFFile
    from targets import build_c
    with open(build_c("idle.c"), "rb") as f:
        data = f.read()
    elf = ELFFile(io.BytesIO(data))
    spans = {"headers": [(0, 64), (elf["e_phoff"], elf["e_phnum"] * elf["e_phentsize"]),
                         (elf["e_shoff"], elf["e_shnum"] * elf["e_shentsize"])],
             "notes": [], "eh_frame": []}
    for sec in elf.iter_sections():
        span = (sec["sh_offset"], sec["sh_size"])
        if sec["sh_type"] == "SHT_NOTE":
            spans["notes"].append(span)
        elif sec.name in (".eh_frame", ".eh_frame_hdr"):
            spans["eh_frame"].append(span)
    return data, spans


def elf_mutations(region):
    """The real executable with bytes flipped or set inside REGION's sections
    (or the headers), plus random bytes."""
    data, spans = _elf_seed()
    targets = spans[region] + spans["headers"][:1] * (region == "notes")

    def apply(edits):
        b = bytearray(data)
        for which, off, value in edits:
            start, size = targets[which % len(targets)]
            if size:
                b[start + off % size] = value
        return bytes(b)
    edit = st.tuples(st.integers(0, 16), st.integers(0, 1 << 20), st.integers(0, 255))
    return st.one_of(st.builds(apply, st.lists(edit, min_size=1, max_size=12)),
                     st.binary(max_size=4096).map(lambda r: data[:64] + r))


@BUDGET
def test_elf_notes(budget, tmp_path):
    from collectors.binary.elf import ElfObject
    path = tmp_path / "fuzz.elf"

    @check(budget, elf_mutations("notes"))
    def prop(data):
        path.write_bytes(data)
        with open(path, "rb") as f:         # a real file, as the objects a process maps
            obj = outcome(ElfObject, str(path), f)
        assert obj is None or obj.build_id is None or isinstance(obj.build_id, str)


@BUDGET
def test_eh_frame(budget, tmp_path):
    from collectors.binary.unwind import CfiTable, UnwindError
    data, _ = _elf_seed()
    good = CfiTable("seed", io.BytesIO(data))
    pcs = [good._fde(i)[0] + 1 for i in range(len(good))][:20]
    path = tmp_path / "fuzz.elf"

    @check(budget, elf_mutations("eh_frame"))
    def prop(blob):
        path.write_bytes(blob)
        with open(path, "rb") as f:
            table = outcome(CfiTable, str(path), f, allowed=(UnwindError,))
            for pc in pcs if table is not None else ():
                outcome(table.row, pc, allowed=(UnwindError,))


# -- the crashes the properties found, kept as fixed inputs ---------------------------------

def _first_fde_pointing_at_itself(data, spans):
    """The executable with .eh_frame_hdr disabled (version 2: every FDE is
    parsed up front) and its first FDE's CIE pointer aimed at the FDE itself."""
    import struct
    b = bytearray(data)
    (hdr_off, _), (eh_off, eh_size) = sorted(spans["eh_frame"], key=lambda s: s[1])
    b[hdr_off] = 2
    off = eh_off
    while off < eh_off + eh_size:
        length, cie_id = struct.unpack_from("<II", b, off)
        if cie_id != 0:                      # an FDE: CIE_pointer = 4 leads back to it
            struct.pack_into("<I", b, off + 4, 4)
            return bytes(b)
        off += 4 + length
    raise AssertionError("no FDE in .eh_frame")


def test_found_crashes_stay_fixed(tmp_path):
    from collectors import allocators
    from collectors.allocators import tcmalloc_stats
    from collectors.binary.elf import ElfObject
    from diag.model.errors import MalformedData
    from collectors.proc.maps import parse_maps
    from collectors.proc.procfs import ProcFS
    from collectors.binary.unwind import CfiTable, UnwindError
    mi_text = fixture("mimalloc-2.0.9-stats.txt")
    cases = [
        # mimalloc stats text: int()/float() of a damaged number, IndexError on an empty one
        lambda: allocators.module("mimalloc").parse_file(
            mi_text.replace(b"elapsed:       0.011 s", b"elapsed: 1.5.0 s")),
        lambda: allocators.module("mimalloc").parse_file(
            mi_text.replace(b"numa nodes:       1", b"numa nodes:")),
        # past int()'s 4300-digit limit
        lambda: tcmalloc_stats.parse_getstats(fixture("tcmalloc-2.10-getstats.txt").replace(
            b"MALLOC:     ", b"MALLOC: " + b"9" * 5000 + b" ", 1).decode()),
        lambda: allocators.module("jemalloc").parse_file(b'{"jemalloc": ' + b"9" * 5000 + b"}"),
        # mimalloc JSON: a count of 1e309
        lambda: allocators.module("mimalloc").parse_file(fixture(
            "mimalloc-2.4-stats.SYNTHETIC.json").replace(b'"current": ', b'"current": 1e309, '
                                                         b'"x": ', 1)),
        # /proc maps with a damaged line
        lambda: parse_maps(b"zz-10 r-xp 00000000 fd:01 1 /bin/x\n"),
    ]
    for case in cases:
        with pytest.raises(MalformedData):
            case()
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "status").write_bytes(b"Name:\tx\nVmRSS:\t 12x kB\n")
    with pytest.raises(MalformedData, match="VmRSS"):
        ProcFS(str(tmp_path)).memory(7)
    data, spans = _elf_seed()
    import struct
    bad_phoff = bytearray(data)
    struct.pack_into("<Q", bad_phoff, 32, 1 << 63)     # e_phoff: seek() fails with EINVAL
    for blob in (bytes(bad_phoff), data[:64] + b"\0" * 64):
        (tmp_path / "x.elf").write_bytes(blob)
        with open(tmp_path / "x.elf", "rb") as f, pytest.raises(MalformedData):
            ElfObject("x.elf", f)
    (tmp_path / "loop.elf").write_bytes(_first_fde_pointing_at_itself(data, spans))
    with open(tmp_path / "loop.elf", "rb") as f, pytest.raises(UnwindError, match="unreadable"):
        CfiTable("loop.elf", f)
