"""The detection cache on disk (collectors.binary.diskcache): a second run
reads what the first learnt from the ELF files, a replaced or rewritten
file is parsed again, a damaged or foreign entry is ignored and rewritten,
ALLOCDIAG_NO_CACHE bypasses it, an unusable directory never fails a command,
and what comes back equals what a parse gives.

The CLI runs as a subprocess with its own XDG_CACHE_HOME; what the cache did
is read from its --debug lines ("disk cache hit: PATH PART", "ELF PATH parsed
from ..."), never from timing."""

import json
import marshal
import os
import re
import shutil
import stat
import subprocess
import sys
import time

import pytest

from collectors.binary import diskcache, elf, unwind
from targets import LIBDIR, build_c, require_file, start

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBC = f"{LIBDIR}/libc.so.6"
LIBM = f"{LIBDIR}/libm.so.6"
JEMALLOC = f"{LIBDIR}/libjemalloc.so.2"
TCMALLOC_MINIMAL = f"{LIBDIR}/libtcmalloc_minimal.so.4"
# the document's parts that do not move between two runs on an idle target
STABLE_KEYS = ("schema_version", "pid", "comm", "exe", "allocator", "preload")
CACHE_LINE = re.compile(r"disk cache (hit|miss|stored|entry ignored): (\S+) (\w+)")
NOBODY = 65534


def allocdiag(cache, *args, env=None):
    full = {k: v for k, v in os.environ.items() if k != diskcache.ENV_DISABLE}
    full.update(PYTHONPATH=ROOT, XDG_CACHE_HOME=str(cache))
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "diag", "--debug", *args], capture_output=True,
                          text=True, env=full, cwd="/", timeout=120)


def events(r, what):
    """{(path, part)} of the run's disk cache lines of kind WHAT."""
    return {(path, part) for kind, path, part in CACHE_LINE.findall(r.stderr) if kind == what}


def parsed(r):
    """Paths the run parsed with pyelftools (no cache entry used)."""
    return set(re.findall(r"ELF (\S+) parsed from", r.stderr))


def inspect_json(cache, pid, env=None):
    r = allocdiag(cache, "inspect", "--json", "--no-attach", str(pid), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    return r, {k: doc[k] for k in STABLE_KEYS}


def entries(cache):
    """{name: path} of the store's entries (not its eviction marker)."""
    d = os.path.join(cache, diskcache.DIR_NAME)
    if not os.path.isdir(d):
        return {}
    return {n: os.path.join(d, n) for n in os.listdir(d) if n != diskcache.EVICT_MARKER}


def test_second_run_reads_the_cache_and_agrees(tmp_path):
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        r1, doc1 = inspect_json(tmp_path, t.pid)
        r2, doc2 = inspect_json(tmp_path, t.pid)
        r3, doc3 = inspect_json(tmp_path / "unused", t.pid, env={diskcache.ENV_DISABLE: "1"})
    stored = {e for e in events(r1, "stored") if e[1] == "elf"}
    assert (JEMALLOC, "elf") in stored and (LIBC, "elf") in stored
    assert not events(r1, "hit") and JEMALLOC in parsed(r1)
    # the second run parses nothing: every object's facts come from disk,
    # and each object's signature; it unpacks the symbols of only the
    # objects it looks into (the allocator's and libc's, not libm's)
    assert events(r2, "hit") >= stored and not parsed(r2) and not events(r2, "stored")
    assert {(p, "signature") for p, _part in stored} <= events(r2, "hit")
    unpacked = set(re.findall(r"ELF (\S+) symbols unpacked", r2.stderr))
    assert unpacked and len(unpacked) < len(stored)
    assert (LIBM, "elf") in stored and LIBM not in unpacked
    assert doc1 == doc2 == doc3
    assert doc2["allocator"]["kind"] == "jemalloc" and doc2["allocator"]["version"]
    d = os.path.join(tmp_path, diskcache.DIR_NAME)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert {stat.S_IMODE(os.stat(p).st_mode) for p in entries(tmp_path).values()} == {0o600}


def test_stack_judged_from_cached_cfi(tmp_path):
    """A thread parked in pthread_cond_timedwait is borrowed only after an
    .eh_frame walk proves it outside the allocator: the second run walks
    with the CFI rows the first decoded, and judges the same."""
    exe = build_c("one_wait.c", "-pthread")
    with start([exe, "condwait", "600000"]) as t:
        runs = [allocdiag(tmp_path, "-v", "inspect", str(t.pid)) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
        assert "futex condition-variable/semaphore wait" in r.stdout
    for part in ("cfi", "libcfuncs"):
        assert (LIBC, part) in events(runs[0], "stored")
        assert (LIBC, part) in events(runs[1], "hit")


def test_replaced_library_is_parsed_again(tmp_path):
    """A library replaced at the same path (new inode, size, mtime) is read
    afresh: the second target preloads a different allocator."""
    lib = tmp_path / "lib" / "liballoc.so"
    lib.parent.mkdir()
    shutil.copy(require_file(JEMALLOC), lib)
    cache = tmp_path / "cache"
    with start([build_c("idle.c"), "1"], preload=str(lib)) as t:
        r1, doc1 = inspect_json(cache, t.pid)
    assert doc1["allocator"]["kind"] == "jemalloc" and str(lib) in parsed(r1)
    new = tmp_path / "lib" / "new.so"
    shutil.copy(require_file(TCMALLOC_MINIMAL), new)
    os.replace(new, lib)
    with start([build_c("idle.c"), "1"], preload=str(lib)) as t:
        r2, doc2 = inspect_json(cache, t.pid)
    assert doc2["allocator"]["kind"] == "tcmalloc" and str(lib) in parsed(r2)
    assert (LIBC, "elf") in events(r2, "hit")


def _build_id_span(path):
    """(offset, length) of the GNU build-id note's descriptor in PATH."""
    with open(path, "rb") as f:
        want = bytes.fromhex(elf.read_build_id(f))
    data = path.read_bytes()
    assert data.count(want) == 1
    return data.index(want), len(want)


def test_file_rewritten_in_place_with_same_stat_is_parsed_again(tmp_path):
    """Same inode, size and mtime (rewritten in place, mtime put back), but
    another build-id: the key's build-id tells the two files apart."""
    lib = tmp_path / "liballoc.so"
    shutil.copy(require_file(JEMALLOC), lib)
    cache = tmp_path / "cache"
    with start([build_c("idle.c"), "1"], preload=str(lib)) as t:
        r1, _ = inspect_json(cache, t.pid)
    assert str(lib) in parsed(r1)
    before = os.stat(lib)
    off, n = _build_id_span(lib)
    with open(lib, "r+b") as f:
        f.seek(off)
        old = f.read(n)
        f.seek(off)
        f.write(bytes(b ^ 0xFF for b in old))
    os.utime(lib, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(lib)
    assert elf.stat_key(after) == elf.stat_key(before)
    with start([build_c("idle.c"), "1"], preload=str(lib)) as t:
        r2, doc2 = inspect_json(cache, t.pid)
    assert str(lib) in parsed(r2) and (str(lib), "elf") in events(r2, "stored")
    assert doc2["allocator"]["kind"] == "jemalloc"


def test_damaged_or_foreign_entries_are_ignored_and_rewritten(tmp_path):
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        r1, doc1 = inspect_json(tmp_path, t.pid)
        files = sorted(entries(tmp_path).values())
        assert len(files) >= 3
        damaged = {}
        for i, path in enumerate(files):
            data = open(path, "rb").read()
            if i % 3 == 0:
                new = data[:len(data) // 2]                      # truncated
            elif i % 3 == 1:
                new = b"\x00garbage" + data[8:]                   # corrupt bytes
            else:                                                 # another version's entry
                (fmt, _producer, key, part), payload = marshal.loads(data)
                new = marshal.dumps(((fmt, "00000000-0", key, part), payload))
            with open(path, "wb") as f:
                f.write(new)
            damaged[path] = new
        r2, doc2 = inspect_json(tmp_path, t.pid)
        r3, doc3 = inspect_json(tmp_path, t.pid)
    assert doc1 == doc2 == doc3
    assert len(events(r2, "entry ignored")) == len(damaged)
    for path, bad in damaged.items():
        assert open(path, "rb").read() != bad                    # rewritten
    assert not events(r3, "entry ignored") and not parsed(r3)


def test_no_cache_variable_reads_and_writes_nothing(tmp_path):
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        inspect_json(tmp_path, t.pid)
        before = {n: (os.stat(p).st_mtime_ns, open(p, "rb").read())
                  for n, p in entries(tmp_path).items()}
        r, _ = inspect_json(tmp_path, t.pid, env={diskcache.ENV_DISABLE: "1"})
        empty = tmp_path / "empty"
        empty.mkdir()
        inspect_json(empty, t.pid, env={diskcache.ENV_DISABLE: "1"})
    assert "disk cache" not in r.stderr and JEMALLOC in parsed(r)
    assert {n: (os.stat(p).st_mtime_ns, open(p, "rb").read())
            for n, p in entries(tmp_path).items()} == before
    assert os.listdir(empty) == []


def test_no_cache_option_reads_and_writes_nothing(tmp_path):
    # allocdiag --no-cache: the same as the variable, and passed on to the
    # allocdiag processes a command starts (it sets the variable)
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        inspect_json(tmp_path, t.pid)
        before = {n: (os.stat(p).st_mtime_ns, open(p, "rb").read())
                  for n, p in entries(tmp_path).items()}
        r = allocdiag(tmp_path, "--no-cache", "inspect", "--json", "--no-attach", str(t.pid))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert before and "disk cache" not in r.stderr and JEMALLOC in parsed(r)
    assert {n: (os.stat(p).st_mtime_ns, open(p, "rb").read())
            for n, p in entries(tmp_path).items()} == before


def test_unusable_cache_directory_never_fails_a_command(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("not a directory\n")
    foreign = tmp_path / "foreign"
    (foreign / diskcache.DIR_NAME).mkdir(parents=True)
    os.chown(foreign / diskcache.DIR_NAME, NOBODY, NOBODY)
    others_home = tmp_path / "others"                  # root under sudo, the user's HOME
    others_home.mkdir()
    os.chown(others_home, NOBODY, NOBODY)
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        _, want = inspect_json(tmp_path / "fine", t.pid)
        for cache in (a_file, foreign, others_home):
            r, doc = inspect_json(cache, t.pid)
            assert doc == want
            assert "disk cache off" in r.stderr and JEMALLOC in parsed(r)
    assert os.listdir(foreign / diskcache.DIR_NAME) == [] and os.listdir(others_home) == []


# -- in process: what comes back equals what a parse gives ---------------------------

@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(diskcache.ENV_DISABLE, raising=False)
    diskcache.reset()
    yield tmp_path
    diskcache.reset()


def _open(path):
    return elf.ObjectFile("/nonexistent-proc", None, 0, 0, path)


@pytest.mark.parametrize("path", [LIBC, JEMALLOC, sys.executable])
def test_restored_object_equals_parsed(store, path):
    _forget_objects()
    path = os.path.realpath(require_file(path))
    parsed_obj = elf.load(_open(path))                     # parsed, stored
    assert parsed_obj.key is not None and parsed_obj.build_id == parsed_obj.key[-1]
    want_symtab = parsed_obj.symtab(_open(path).open)
    want_banners = {k: parsed_obj.rodata_version(k, _open(path).open) for k in elf.VERSION_PATTERNS}
    before = diskcache.counts()["hit"]
    restored = elf.load(_open(path))
    assert diskcache.counts()["hit"] == before + 1
    # defines() on the still-packed symbols: a name in the blob's bytes
    # (a prefix of another, an undefined reference) is looked up exactly
    undefined = next(s.name for s in parsed_obj.dynsym if s.name and not s.defined)
    for name in ("malloc", "mallo", "free", "mallctl", "_PyRuntime", undefined, "\u00e9t\u00e9"):
        assert restored.defines(name) == parsed_obj.defines(name), name
    assert restored._dynsym is None                         # still packed
    fresh = elf.load(_open(path))                          # a name not in the blob's bytes:
    assert not fresh.defines("no_such_symbol_here") and not fresh.defines("no_such_symbol_here")
    assert fresh._defined == {"no_such_symbol_here": False} and fresh._exports is None
    assert restored.facts() == parsed_obj.facts() and restored.dynsym == parsed_obj.dynsym
    assert restored.exports == parsed_obj.exports
    assert restored.symtab() == want_symtab                 # from disk: no opener needed
    assert {k: restored.rodata_version(k, None) for k in elf.VERSION_PATTERNS} == want_banners
    for name in ("malloc", "free", "mallctl", "_PyRuntime"):
        assert restored.dynamic(name) == parsed_obj.dynamic(name)
        assert restored.defines(name) == parsed_obj.defines(name)
    # lookups in a table still packed rank a name seen twice (libc's
    # versioned definitions) as the parsed table does
    packed_lookups = elf.load(_open(path))
    want = parsed_obj._by_name()
    assert {n: packed_lookups.dynamic(n) for n in want} == dict(want)
    assert packed_lookups._dynsym is None and len(packed_lookups._by_name()) == len(want)


def _forget_objects():
    unwind.clear_cache()
    elf.CACHE._objects.clear()
    elf.CACHE._recent.clear()


def test_restored_cfi_rows_equal_parsed(store):
    """Rows decoded in the first run come back from disk without pyelftools;
    an FDE never decoded before is parsed from the restored table."""
    _forget_objects()
    cold = unwind.cfi_table(_open(LIBC))
    pcs = [start + 1 for start in cold._starts[::len(cold) // 40]]
    seen, unseen = pcs[::2], pcs[1::2]
    want = {pc: cold.row(pc) for pc in seen}
    unwind.flush()                                  # what exit would write
    want.update({pc: cold.row(pc) for pc in unseen})
    _forget_objects()
    warm = unwind.cfi_table(_open(LIBC))
    assert warm is not cold and len(warm) == len(cold)
    assert {pc: warm.row(pc) for pc in seen} == {pc: want[pc] for pc in seen}
    assert warm._cfi is None                        # no FDE parsed: all from disk
    assert {pc: warm.row(pc) for pc in unseen} == {pc: want[pc] for pc in unseen}
    assert warm._cfi is not None
    _forget_objects()


def test_libc_functions_built_once_per_file_and_restored(store, monkeypatch):
    """The stack judge's libc function ranges are a fact of the file: built
    once for every load address that maps it (a rehearsal on allocdiag's
    own understudy and the target's stop), stored, read back equal in the
    next run without being built; a stored part of another shape is built
    again."""
    from types import SimpleNamespace
    from collectors.engine import safepoints
    built = []
    real = safepoints._libc_functions
    monkeypatch.setattr(safepoints, "_libc_functions",
                        lambda obj, opener: built.append(obj) or real(obj, opener))

    def facts_at(bias):
        obj = elf.load(_open(LIBC))
        return obj, safepoints._libc_facts_of(obj, bias, SimpleNamespace(path=LIBC,
                                                                         opener=_open(LIBC)))

    def fresh_run():
        _forget_objects()
        safepoints._LIBC_RANGES.clear()

    fresh_run()
    obj, here = facts_at(0x7F00_0000_0000)
    _, there = facts_at(0x5500_0000_0000)
    assert len(built) == 1
    for name, table in (("malloc", 2), ("pthread_cond_wait", 1), ("nanosleep", 3)):
        st_value = obj.dynamic(name).st_value
        assert here[table](0x7F00_0000_0000 + st_value).startswith(name)
        assert there[table](0x5500_0000_0000 + st_value).startswith(name)
        assert here[table](st_value) is None
    want, complete = real(obj, _open(LIBC))
    assert complete and any("tail call" in w[2] for w in want[0])   # sem_wait's slow path

    fresh_run()
    obj, again = facts_at(0x7F00_0000_0000)
    assert len(built) == 1 and obj.load_part(safepoints.LIBC_PART) == want
    malloc = 0x7F00_0000_0000 + obj.dynamic("malloc").st_value
    assert again[2](malloc) == here[2](malloc) == "malloc"

    obj.store_part(safepoints.LIBC_PART, ["not", "the", "rows"])
    fresh_run()
    _, rebuilt = facts_at(0x7F00_0000_0000)
    assert len(built) == 2 and rebuilt[2](malloc) == "malloc"

    # a wait function's code unreadable: built without its tail calls, not kept
    unreadable = elf.ObjectFile("/nonexistent-proc", None, 0, 0, "/nonexistent/libc.so.6")
    (waits, _, _), complete = real(obj, unreadable)
    assert not complete and waits and not any("tail call" in w[2] for w in waits)
    obj.store_part(safepoints.LIBC_PART, ["not", "the", "rows"])
    fresh_run()
    obj = elf.load(_open(LIBC))
    safepoints._libc_ranges(obj, unreadable)
    assert len(built) == 3 and obj.load_part(safepoints.LIBC_PART) == ["not", "the", "rows"]
    _forget_objects()


def test_eviction_removes_the_oldest(store):
    _forget_objects()
    for path in (LIBC, JEMALLOC, TCMALLOC_MINIMAL):
        elf.load(_open(require_file(path)))
    d = os.path.join(store, diskcache.DIR_NAME)
    files = sorted(entries(store))
    assert len(files) == 3
    for age, name in enumerate(files):                  # the first listed is the oldest
        os.utime(os.path.join(d, name), ns=(age * 10**9, age * 10**9))
    total = sum(os.path.getsize(os.path.join(d, n)) for n in files)
    assert diskcache.evict(d, max_bytes=total) == 0     # within both bounds
    assert diskcache.evict(d, max_entries=2) == 2       # down to 3/4 of the bound
    assert sorted(entries(store)) == [files[-1]]


def test_eviction_goes_by_last_use(store):
    """A hit on an entry REFRESH_AFTER_S old marks it used now, so the
    bound removes what no run reads any more, not what was written first;
    a hit on a fresh entry writes nothing."""
    keys = [(1, ino, 100, 7, None) for ino in (1, 2, 3)]
    for key in keys:
        diskcache.store(key, "elf", {"facts": key[1]}, "test")
    d = os.path.join(store, diskcache.DIR_NAME)
    names = [diskcache._file_name(key, "elf") for key in keys]
    day = 86_400
    for age, name in zip((3, 2, 1), names):                 # the first written is the oldest
        os.utime(os.path.join(d, name), (time.time() - age * day,) * 2)
    assert diskcache.load(keys[0], "elf", "test") == {"facts": 1}   # ... and still read
    assert time.time() - os.stat(os.path.join(d, names[0])).st_mtime < 60
    assert diskcache.evict(d, max_entries=2) == 2           # down to 3/4 of the bound
    assert sorted(entries(store)) == [names[0]]
    fresh = os.stat(os.path.join(d, names[0])).st_mtime_ns
    assert diskcache.load(keys[0], "elf", "test") == {"facts": 1}
    assert os.stat(os.path.join(d, names[0])).st_mtime_ns == fresh


def test_eviction_is_checked_at_most_every_interval(store, monkeypatch):
    """A run that stores something checks the bounds (a stat of every
    entry) only when the last check is EVICT_EVERY_S old: the marker's
    mtime says when, and a marker from the future does not stop it."""
    d = os.path.join(store, diskcache.DIR_NAME)
    os.makedirs(d, exist_ok=True)
    scans = []
    monkeypatch.setattr(diskcache, "evict", lambda directory: scans.append(directory) or 0)
    now = 1_000_000_000.0
    marker = os.path.join(d, diskcache.EVICT_MARKER)
    diskcache.evict_if_due(d, now=now)                       # no marker yet
    assert scans == [d] and os.stat(marker).st_mtime == now
    diskcache.evict_if_due(d, now=now + diskcache.EVICT_EVERY_S - 1)
    assert scans == [d]                                      # checked a moment ago
    diskcache.evict_if_due(d, now=now + diskcache.EVICT_EVERY_S)
    assert scans == [d, d]
    diskcache.evict_if_due(d, now=now)                       # the clock went back
    assert scans == [d, d, d]


def test_the_marker_is_not_an_entry(store):
    d = os.path.join(store, diskcache.DIR_NAME)
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, diskcache.EVICT_MARKER), "w").close()
    assert diskcache.evict(d, max_entries=0) == 0
    assert os.listdir(d) == [diskcache.EVICT_MARKER]


def test_a_change_to_any_classifier_makes_stored_signatures_foreign():
    """A stored signature is what the homes' signature() said when it was
    stored: every home's module (and detect, the registry) is part of the
    producer checksum, so a new version's classifier is never skipped."""
    from collectors.allocators import registry
    here = os.path.join(ROOT, "collectors")
    homes = {os.path.relpath(sys.modules[type(h).__module__].__file__, here)
             for h in registry.ALL}
    homes |= {os.path.relpath(sys.modules[base.__module__].__file__, here)
              for h in registry.ALL for base in type(h).__mro__
              if base.__module__.startswith("collectors.allocators.")}
    assert homes <= set(diskcache._PRODUCER_MODULES), homes - set(diskcache._PRODUCER_MODULES)
    assert {"detect.py", "allocators/registry.py"} <= set(diskcache._PRODUCER_MODULES)


def test_the_suite_keeps_a_cache_of_its_own():
    """The suite and the CLI runs it starts store entries in a directory of
    the session's (tests/conftest.py), not in the user's ~/.cache: a test
    run leaves no entries behind, and meets none another checkout wrote."""
    home_cache = os.path.join(os.path.expanduser("~"), ".cache")
    own = diskcache.cache_dir()
    assert not own.startswith(home_cache + os.sep), own
    assert os.path.basename(os.path.dirname(own)).startswith("allocdiag-test-cache-"), own
