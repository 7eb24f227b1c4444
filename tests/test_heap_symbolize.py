"""Symbolization of real heap dumps: targets from tests/targets/sym_*.c/.cpp
run under jemalloc (prof:true) or gperftools' heap profiler and dump their own
profile; the dump's MAPPED_LIBRARIES drive the lookup.  Separate debug files
(build-id directory, .gnu_debuglink), a binary moved under another root, a
binary replaced on disk (map_files wins), unknown addresses, C++ demangling,
allocator frames dropped."""
import json
import os
import re
import shutil
import subprocess

import pytest

import deps
import symtarget
import targets
from collectors.binary import demangle as dm
from collectors.binary.symbolize import Frame, Symbolizer, drop_allocator_frames, is_allocator_frame
from diag import heapview

GROW = "allocdiag_sym_grow_site"
CPP_SITE = "allocdiag_sym::Arena::grow(int, unsigned long)"
BLOCKS, SIZE = 10, 100000


@pytest.fixture(scope="module")
def sym_alloc():
    return targets.build_c("sym_alloc.c")


@pytest.fixture(scope="module")
def sym_cpp():
    return targets.build_c("sym_cpp.cpp")


def _site(view, function):
    found = [s for s in heapview.sites(view) if s["function"] == function]
    assert found, [s["function"] for s in heapview.sites(view)][:10]
    return found[0]


def _dump(binary, allocator, tmp_path, name="d.heap", **kw):
    with symtarget.running(binary, allocator, tmp_path, **kw) as s:
        s.cmd(f"grow {BLOCKS} {SIZE}")
        return s.dump(tmp_path / name)


def _nm_range(binary, name):
    """(st_value, st_size) of NAME from binutils nm (the reference)."""
    out = subprocess.run(["nm", "-S", binary], capture_output=True, text=True, check=True).stdout
    m = re.search(rf"^([0-9a-f]+) ([0-9a-f]+) [tT] {re.escape(name)}$", out, re.M)
    return int(m.group(1), 16), int(m.group(2), 16)


@pytest.mark.parametrize("allocator", ["jemalloc", "tcmalloc"])
def test_c_site_named_and_allocator_frames_dropped(sym_alloc, allocator, tmp_path):
    view = heapview.load(_dump(sym_alloc, allocator, tmp_path))
    site = _site(view, GROW)
    assert site["object"] == sym_alloc
    assert site["stack"][:2] == [GROW, "main"]
    assert site["inuse_objects"] == BLOCKS
    if allocator == "tcmalloc":        # unsampled: exact requested bytes
        assert site["inuse_bytes"] == BLOCKS * SIZE
    else:                              # jemalloc counts the size class
        assert BLOCKS * SIZE <= site["inuse_bytes"] <= BLOCKS * SIZE * 1.25
    # jemalloc's raw stacks start inside libjemalloc (prof_backtrace...);
    # after dropping, no stack starts inside the allocator
    sym = Symbolizer(view.profile.mappings)
    raw_tops = [sym.frame(s.stack[0]) for s in view.profile.samples]
    if allocator == "jemalloc":
        assert all(f.object.endswith("/libjemalloc.so.2") for f in raw_tops)
    for frames, _sample in view.stacks:
        assert not frames[0].allocator or len(frames) == 1


@pytest.mark.parametrize("allocator", ["jemalloc", "tcmalloc"])
def test_cpp_method_demangled(sym_cpp, allocator, tmp_path):
    env = symtarget.PROFILE_ENV[allocator]
    dump = tmp_path / "cpp.heap"
    with targets.start([sym_cpp, str(dump), str(tmp_path / "gperf")], allocator=allocator,
                       env=env) as t:
        assert t.ready == "0"
    view = heapview.load(str(dump))
    site = _site(view, CPP_SITE)
    assert site["inuse_objects"] == 64 and site["inuse_bytes"] >= 64 * 4096
    assert site["stack"][1] == "main"
    # operator new (libstdc++ under jemalloc, libtcmalloc under gperftools) is dropped
    assert not any(f.startswith("operator new") for s in heapview.sites(view) for f in s["stack"][:1])


def _strip_copy(src, dest):
    shutil.copy(src, dest)
    subprocess.run([deps.need("strip"), "--strip-all", dest], check=True)
    out = subprocess.run(["readelf", "-S", dest], capture_output=True, text=True).stdout
    assert ".symtab" not in out


def _debug_copy(src, dest):
    subprocess.run([deps.need("objcopy"), "--only-keep-debug", src, dest], check=True)


def _build_id(path):
    out = subprocess.run(["readelf", "-n", path], capture_output=True, text=True).stdout
    return re.search(r"Build ID: ([0-9a-f]+)", out).group(1)


def test_stripped_binary_named_through_build_id_debug_file(sym_alloc, tmp_path):
    bindir, debug_root, empty = tmp_path / "bin", tmp_path / "debug", tmp_path / "nodebug"
    for d in (bindir, debug_root, empty):
        d.mkdir()
    exe = str(bindir / "sym_alloc")
    _strip_copy(sym_alloc, exe)
    bid = _build_id(exe)
    (debug_root / ".build-id" / bid[:2]).mkdir(parents=True)
    _debug_copy(sym_alloc, str(debug_root / ".build-id" / bid[:2] / f"{bid[2:]}.debug"))
    dump = _dump(exe, "tcmalloc", tmp_path)

    site = _site(heapview.load(dump, debug_root=str(debug_root)), GROW)
    assert site["object"] == exe and site["inuse_bytes"] == BLOCKS * SIZE

    # no debug file: the frame stays "object+0xVADDR", and that address is
    # inside the function according to nm on the unstripped build
    plain = heapview.load(dump, debug_root=str(empty))
    tops = [fr[0] for fr, s in plain.stacks if s.inuse_bytes == BLOCKS * SIZE]
    assert len(tops) == 1
    top = tops[0]
    assert top.function is None and top.object == exe
    assert re.fullmatch(r"sym_alloc\+0x[0-9a-f]+", top.text)
    st_value, st_size = _nm_range(sym_alloc, GROW)
    assert st_value <= int(top.text.split("+")[1], 16) < st_value + st_size
    assert top.vaddr == int(top.text.split("+")[1], 16)


def test_stripped_binary_named_through_gnu_debuglink(sym_alloc, tmp_path):
    bindir, empty = tmp_path / "bin", tmp_path / "nodebug"
    bindir.mkdir()
    empty.mkdir()
    exe = str(bindir / "sym_alloc")
    _strip_copy(sym_alloc, exe)
    _debug_copy(sym_alloc, str(bindir / "sym_alloc.debug"))
    subprocess.run(["objcopy", "--add-gnu-debuglink=sym_alloc.debug", exe], check=True,
                   cwd=bindir)
    dump = _dump(exe, "jemalloc", tmp_path)
    assert _site(heapview.load(dump, debug_root=str(empty)), GROW)["object"] == exe


def test_objects_read_under_root(sym_alloc, tmp_path):
    """A dump whose binary is not at its path on this side of the mount
    namespace: read under ROOT (the /proc/PID/root of a container)."""
    rundir = tmp_path / "run"
    rundir.mkdir()
    exe = str(rundir / "sym_alloc")
    shutil.copy(sym_alloc, exe)
    dump = _dump(exe, "tcmalloc", tmp_path)
    fake_root = tmp_path / "root"
    moved = fake_root / exe.lstrip("/")
    moved.parent.mkdir(parents=True)
    os.rename(exe, moved)

    lost = heapview.load(dump)
    assert not any(s["function"] == GROW for s in heapview.sites(lost))
    assert any(exe in w for w in lost.warnings)
    assert _site(heapview.load(dump, root=str(fake_root)), GROW)["object"] == exe


def test_live_process_root_and_pid(sym_alloc, tmp_path):
    """What `heap dump` does: objects under /proc/PID/root, checked against
    /proc/PID/map_files; nothing was replaced, so no warning."""
    with symtarget.running(sym_alloc, "jemalloc", tmp_path) as s:
        s.cmd(f"grow {BLOCKS} {SIZE}")
        dump = s.dump(tmp_path / "d.heap")
        view = heapview.load(dump, root=f"/proc/{s.pid}/root", pid=s.pid)
    assert _site(view, GROW)["inuse_objects"] == BLOCKS
    assert not any("build-id" in w for w in view.warnings)


def test_replaced_binary_read_through_map_files(sym_alloc, sym_cpp, tmp_path):
    """The binary was replaced on disk after the dump (a deploy): with the
    pid, /proc/PID/map_files gives the file really mapped, its build-id
    differs from the new file's, and the mapped one is used."""
    rundir = tmp_path / "run"
    rundir.mkdir()
    exe = str(rundir / "sym_alloc")
    shutil.copy(sym_alloc, exe)
    with symtarget.running(exe, "jemalloc", tmp_path) as s:
        s.cmd(f"grow {BLOCKS} {SIZE}")
        dump = s.dump(tmp_path / "d.heap")
        shutil.copy(sym_cpp, exe + ".new")
        os.replace(exe + ".new", exe)        # new inode, the old one stays mapped
        assert _build_id(exe) != _build_id(sym_alloc)

        wrong = heapview.load(dump)
        assert not any(s["function"] == GROW for s in heapview.sites(wrong))
        for root in (None, f"/proc/{s.pid}/root"):
            right = heapview.load(dump, root=root, pid=s.pid)
            assert _site(right, GROW)["object"] == exe
            assert any("build-id" in w and exe in w for w in right.warnings)


def test_address_outside_every_mapping_is_kept(sym_alloc, tmp_path):
    from collectors.heapprofile import parse, unparse
    prof = parse(open(_dump(sym_alloc, "tcmalloc", tmp_path), "rb").read())
    lost = 0x10                      # below every mapping
    prof.samples[0].stack.insert(0, lost)
    out = tmp_path / "edited.heap"
    out.write_text(unparse(prof))
    view = heapview.load(str(out))
    top = view.stacks[0][0][0]
    assert top.text == "0xf" and top.object is None        # addr - 1, not dropped


def test_demangle_status_codes_and_cache():
    assert dm.available()
    assert dm.demangle("_ZN13allocdiag_sym5Arena4growEim") == CPP_SITE
    assert dm.demangle("_Znwm") == "operator new(unsigned long)"
    assert dm.demangle("_Z") == "_Z"                    # status -2: not a mangled name
    assert dm.demangle("_ZN3foo") == "_ZN3foo"          # truncated: -2 too
    assert dm.demangle("main") == "main"                # not even tried
    before = dm.demangle.cache_info().hits
    dm.demangle("_ZN13allocdiag_sym5Arena4growEim")
    assert dm.demangle.cache_info().hits == before + 1


def _frame(fn, obj):
    return Frame(1, obj, fn, 0, fn or f"{obj}+0x0")


@pytest.mark.parametrize("fn, obj, internal", [
    (None, "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", True),
    ("tc_malloc", "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4", True),
    ("malloc", "/usr/lib/x86_64-linux-gnu/libc.so.6", True),
    ("_int_malloc", "/usr/lib/x86_64-linux-gnu/libc.so.6", True),
    ("tcache_init.part.0", "/usr/lib/x86_64-linux-gnu/libc.so.6", True),
    ("mi_heap_malloc_small", "/srv/app-with-static-mimalloc", True),
    ("mi_parse_args", "/srv/app", False),
    ("operator new(unsigned long)", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6", True),
    ("je_prof_backtrace", "/srv/app-with-static-jemalloc", True),
    ("MallocHook::InvokeNewHookSlow(void const*, unsigned long)", "/x/libfoo.so", True),
    ("__strdup", "/usr/lib/x86_64-linux-gnu/libc.so.6", False),
    ("mallocate_things", "/srv/app", False),
    ("_PyObject_Malloc", "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0", False),
    (None, "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0", False),
])
def test_allocator_frame_rule(fn, obj, internal):
    assert is_allocator_frame(_frame(fn, obj)) is internal


def test_drop_keeps_the_first_outside_frame_and_never_empties():
    inside = _frame("je_malloc_default", "/srv/app")
    app = _frame("load_config", "/srv/app")
    assert drop_allocator_frames([inside, inside, app, inside]) == [app, inside]
    assert drop_allocator_frames([inside, inside]) == [inside]


def test_binary_under_a_non_utf8_path(sym_alloc, tmp_path):
    """Paths are bytes: a binary under b"\\xff\\xfe" is found, named, written
    back byte for byte, and shown with escapes (no encoding error)."""
    odd = tmp_path / os.fsdecode(b"dir-\xff\xfe")
    odd.mkdir()
    exe = str(odd / "sym_alloc")
    shutil.copy(sym_alloc, exe)
    dump = _dump(exe, "jemalloc", tmp_path)
    raw = open(dump, "rb").read()
    assert b"dir-\xff\xfe/sym_alloc" in raw
    view = heapview.load(dump)
    site = _site(view, GROW)
    assert site["object"].endswith("dir-\\xff\\xfe/sym_alloc")
    (heapview.render_top(view) + json.dumps(view.to_json(), ensure_ascii=False)).encode("utf-8")
    out = tmp_path / "written.heap"
    heapview.write_legacy(view, str(out))
    assert out.read_bytes() == raw


def test_symbol_source_is_logged(caplog):
    """Which table named an object's functions (.symtab, a debug file, or
    .dynsym) is a debug line on the collectors.binary logger."""
    from collectors.binary import symbolize
    libc = targets.require_file("/usr/lib/x86_64-linux-gnu/libc.so.6")
    symbolize.clear_cache()
    with caplog.at_level("DEBUG", logger="collectors.binary"):
        table = symbolize.load_table(libc, libc)
    assert table is not None
    lines = [r.getMessage() for r in caplog.records if r.name == "collectors.binary"]
    assert any(m.startswith(f"symbols of {libc}: {table.source},") for m in lines), lines
