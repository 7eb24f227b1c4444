"""Allocator detection and the preload verdict against real processes."""

import os
import shutil
import stat

import pytest

from collectors import heapcontrol
from collectors.detect import detect
from collectors.binary.image import ProcessImage
from collectors.preload import verdict
from targets import (LIBDIR, PRELOADS, build_c, build_go, prefixed_jemalloc_archive,
                     python_argv, require_file, start, static_jemalloc_flags)

PY_IDLE = ("import os, sys\nkeep = [bytearray(100000) for _ in range(50)]\n"
           "print('READY', os.getpid(), flush=True)\nsys.stdin.read()\n")


def inspect(pid, parent_environ=None, expect=None):
    image = ProcessImage(pid)
    det = detect(image)
    return det.allocator, verdict(image, det, parent_environ=parent_environ, expect=expect)


EXPECTED = {
    "glibc": ("glibc", "dynamic", None),
    "jemalloc": ("jemalloc", "preload", None),
    "tcmalloc": ("tcmalloc", "preload", "full"),
    "tcmalloc_minimal": ("tcmalloc", "preload", "minimal"),
    "mimalloc": ("mimalloc", "preload", None),
}


@pytest.mark.parametrize("allocator", sorted(PRELOADS))
@pytest.mark.parametrize("lang", ["c", "python"])
def test_serving_allocator_under_each_preload(allocator, lang):
    argv = [build_c("idle.c"), "1"] if lang == "c" else python_argv(PY_IDLE)
    with start(argv, allocator=allocator) as t:
        a, p = inspect(t.pid)
    kind, linkage, variant = EXPECTED[allocator]
    assert (a.kind, a.linkage) == (kind, linkage), a
    if variant:
        assert a.variant == variant
    assert a.version, f"no version for {a}"
    if allocator == "glibc":
        assert a.version == os.confstr("CS_GNU_LIBC_VERSION").split()[-1]
        assert p.effective is None and p.verdict == "none requested"
        assert a.others == ()
    else:
        assert p.effective is True, p
        assert p.verdict.startswith("in effect")
        assert os.path.realpath(a.path) == os.path.realpath(PRELOADS[allocator])
        # glibc stays loaded but does not serve malloc.
        assert [o.kind for o in a.others] == ["glibc"]
        # The evidence names the GOT slot that was read.
        assert any("GOT slot" in e for e in a.evidence)
    if lang == "python":
        assert any("pymalloc" in n for n in p.notes)


def test_versions_read_without_stopping():
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        a, _ = inspect(t.pid)
        assert a.version.startswith("5.") and "-g" in a.version
    with start([build_c("idle.c"), "1"], allocator="mimalloc") as t:
        a, _ = inspect(t.pid)
        # Debian bookworm ships mimalloc 2.0.x; the version is decoded from
        # mi_version's code bytes.
        assert a.version.count(".") == 2 and a.version.startswith("2.")
    with start([build_c("idle.c"), "1"], allocator="tcmalloc") as t:
        a, _ = inspect(t.pid)
        assert a.version.startswith("2.")


def test_typo_preload_not_in_effect():
    typo = f"{LIBDIR}/libjemaloc.so.2"
    with start([build_c("idle.c"), "1"], preload=typo, stderr=open(os.devnull, "w")) as t:
        a, p = inspect(t.pid)
    assert a.kind == "glibc"
    assert p.requested == (typo,)
    assert p.effective is False
    assert any("file not found" in r for r in p.reasons), p.reasons


def test_lazy_binding_reported():
    # Built with lazy binding; the program calls malloc itself only after
    # READY, so the executable's malloc slot still points into its PLT.
    exe = build_c("idle.c", "-Wl,-z,lazy", name="idle_lazy")
    with start([exe], allocator="jemalloc") as t:
        image = ProcessImage(t.pid)
        det = detect(image)
        p = verdict(image, det)
    exe_slots = [b for b in det.bindings if b.object == image.exe.path and b.symbol == "malloc"]
    assert exe_slots and exe_slots[0].resolved is False
    assert any("not bound yet" in n for n in p.notes)
    # Still the right answer, from libc's resolved slot or lookup order.
    assert det.allocator.kind == "jemalloc" and p.effective is True


def test_static_jemalloc_in_executable():
    exe = build_c("idle.c", *static_jemalloc_flags(), name="idle_static_je")
    with start([exe, "1"]) as t:
        a, p = inspect(t.pid)
    assert (a.kind, a.linkage) == ("jemalloc", "static"), a
    assert a.path == exe and a.version.startswith("5.")
    assert p.verdict == "none requested"


def test_fully_static_jemalloc_and_preload_ignored():
    exe = build_c("idle.c", *static_jemalloc_flags(full_static=True), name="idle_fullstatic_je")
    with start([exe, "1"], allocator="mimalloc") as t:
        a, p = inspect(t.pid)
    assert (a.kind, a.linkage) == ("jemalloc", "static")
    assert p.effective is False
    assert any("static executable" in r for r in p.reasons), p.reasons


def test_dlopened_jemalloc_is_not_serving():
    # jemalloc uses initial-exec TLS: dlopen() after start only works with
    # room in the static TLS surplus (otherwise "cannot allocate memory in
    # static TLS block"), which this tunable provides.
    tls = {"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=65536"}
    with start([build_c("dlopen_je.c", "-ldl")], env=tls) as t:
        a, p = inspect(t.pid)
    assert a.kind == "glibc"
    dl = [o for o in a.others if o.kind == "jemalloc"]
    assert dl and dl[0].linkage == "dlopen", a.others
    assert any("dlopen" in r for r in p.reasons)


def test_prefixed_jemalloc_two_allocators():
    exe = build_c("prefixed_je.c", prefixed_jemalloc_archive(), "-lpthread", "-lm", "-ldl",
                  name="prefixed_je")
    with start([exe]) as t:
        assert int(t.ready.split("=")[1]) >= 1 << 20   # its _rjem_ heap is live
        a, p = inspect(t.pid)
    assert a.kind == "glibc", a      # C code's malloc is glibc's
    je = [o for o in a.others if o.kind == "jemalloc"]
    assert je and je[0].prefix == "_rjem_" and je[0].linkage == "static"
    assert any("_RJEM_MALLOC_CONF" in e for e in je[0].evidence)


def test_prefixed_jemalloc_preload_does_not_interpose(tmp_path):
    # A shared prefixed jemalloc requested via LD_PRELOAD: mapped, but it
    # exports _rjem_malloc, not malloc.
    import deps
    lib = tmp_path / "libjemalloc_rjem.so"
    archive = prefixed_jemalloc_archive()
    res = deps.check_build(["gcc", "-shared", "-o", str(lib), "-Wl,--whole-archive", archive,
                            "-Wl,--no-whole-archive", "-lstdc++", "-lpthread", "-lm", "-ldl"],
                           archive)
    assert res.returncode == 0, res.stderr
    with start([build_c("idle.c"), "1"], preload=str(lib)) as t:
        a, p = inspect(t.pid)
    assert a.kind == "glibc" and p.effective is False
    assert any("prefixed jemalloc" in r for r in p.reasons), p.reasons


def test_go_binary():
    exe = build_go("goidle")
    with start([exe], allocator="jemalloc") as t:
        a, p = inspect(t.pid)
    assert a.kind == "go" and a.version.startswith("go1.")
    assert p.effective is False
    assert any("Go binary" in r for r in p.reasons), p.reasons


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a setuid-nobody copy")
def test_setuid_target_ignores_preload(tmp_path):
    exe = tmp_path / "idle_setuid"
    shutil.copy(build_c("idle.c"), exe)
    os.chown(exe, 65534, 65534)
    os.chmod(exe, 0o4755 | stat.S_IXGRP | stat.S_IXOTH)
    os.chmod(tmp_path, 0o755)
    with start([str(exe), "1"], allocator="jemalloc") as t:
        image = ProcessImage(t.pid)
        assert image.secure is True          # AT_SECURE from auxv
        det = detect(image)
        p = verdict(image, det)
    assert det.allocator.kind == "glibc"
    assert p.effective is False
    assert any("secure mode" in r for r in p.reasons), p.reasons


def test_preload_dropped_between_parent_and_child():
    with start([build_c("idle.c"), "1"]) as t:
        _, p = inspect(t.pid, parent_environ={"LD_PRELOAD": PRELOADS["jemalloc"]})
        _, p2 = inspect(t.pid, expect="jemalloc")
    assert p.effective is False and "parent process has LD_PRELOAD" in p.reasons[0]
    assert p2.effective is False and "not in this process's initial environment" in p2.reasons[0]


def test_google_tcmalloc_signature_in_static_executable():
    # No google/tcmalloc package exists for Debian; a static executable
    # exporting its C-ABI entry points stands for one.  Detection is by
    # those signature symbols in .symtab.
    exe = build_c("fake_google_tcmalloc.c", name="fake_google_tcmalloc")
    with start([exe]) as t:
        a, _ = inspect(t.pid)
    assert a.kind == "tcmalloc-google" and a.linkage == "static", a


def _musl_gcc():
    import deps
    deps.need("musl-gcc")


@pytest.mark.parametrize("static", [False, True])
def test_musl(static, tmp_path):
    _musl_gcc()
    import subprocess
    exe = tmp_path / "idle_musl"
    subprocess.run(["musl-gcc", "-O1", "-o", str(exe)] + (["-static"] if static else []) +
                   [os.path.join(os.path.dirname(__file__), "targets", "idle.c")], check=True)
    # musl's loader refuses to start with a glibc-built preload (missing
    # libstdc++/glibc symbols), so only the static case gets one: ignored.
    with start([str(exe), "1"], allocator="jemalloc" if static else "glibc") as t:
        a, p = inspect(t.pid)
    assert a.kind == "musl", a
    assert a.linkage == ("static" if static else "dynamic")
    if static:
        assert p.effective is False
        assert any("static executable" in r for r in p.reasons)


def test_unreadable_memory_is_a_typed_fact_not_a_phrase(monkeypatch):
    # Without ptrace rights the GOT cannot be read: detection still answers
    # from lookup order, says so as a flag (not an English phrase that the
    # snapshot would have to search for), and the snapshot marks detect partial.
    from collectors import detect as detect_mod
    from diag.model.errors import AccessDenied
    from diag import snapshot

    def denied(pid, *a, **kw):
        raise AccessDenied(pid)

    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        assert detect(ProcessImage(t.pid)).memory_readable is True
        monkeypatch.setattr(detect_mod, "MemoryReader", denied)
        det = detect(ProcessImage(t.pid))
        assert det.memory_readable is False and det.allocator.kind == "jemalloc"
        snap, col = snapshot.take(t.pid, attach=False)
    assert col.status["detect"].ok is False and col.partial
    assert "GOT slots not read" in col.status["detect"].error


def _interp(path):
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as f:
        return next(seg.get_interp_name() for seg in ELFFile(f).iter_segments()
                    if seg["p_type"] == "PT_INTERP")


@pytest.mark.parametrize("preload", [None, "jemalloc"])
def test_program_started_through_its_loader(preload):
    # `ld.so [--preload LIB] PROGRAM`: the kernel runs the loader, so the exe
    # link and AT_PHDR name ld.so, a shared object without PT_INTERP.  Read as
    # it looks, that is a static executable whose libraries were all
    # dlopen()ed; the program is the object the loader mapped.
    exe = build_c("idle.c")
    ldso = _interp(exe)
    argv = [ldso] + (["--preload", PRELOADS[preload]] if preload else []) + [exe, "1"]
    with start(argv) as t:
        image = ProcessImage(t.pid)
        a, p = inspect(t.pid)
        remedy = heapcontrol.status(t.pid)["remedy"] if not preload else None
    assert os.path.realpath(image.loader.path) == os.path.realpath(ldso)
    assert os.path.realpath(image.exe.path) == os.path.realpath(exe)
    assert any("dynamic loader" in e for e in a.evidence), a.evidence
    assert not any("dlopen" in e for o in a.others for e in o.evidence), a.others
    if preload:
        # the request is read from the command line, as the loader read it
        assert image.loader_options == {"--preload": [PRELOADS[preload]]}
        assert (a.kind, a.linkage) == ("jemalloc", "preload"), a
        assert p.requested == (PRELOADS[preload],) and p.effective is True, p
        assert p.verdict.startswith("in effect"), p
    else:
        assert image.loader_options == {}
        assert (a.kind, a.linkage) == ("glibc", "dynamic"), a
        assert p.verdict == "none requested", p
        # glibc has no heap profiler: the restart recipe names the program
        assert "MALLOC_CONF=prof:true" in remedy and exe in remedy, remedy
        assert "ld-linux" not in remedy, remedy


def test_musl_program_started_through_its_loader(tmp_path):
    _musl_gcc()
    import subprocess
    exe = tmp_path / "idle_musl"
    subprocess.run(["musl-gcc", "-O1", "-o", str(exe),
                    os.path.join(os.path.dirname(__file__), "targets", "idle.c")], check=True)
    # musl's loader is its libc.so, run as a program
    with start([_interp(exe), str(exe), "1"]) as t:
        image = ProcessImage(t.pid)
        a, _p = inspect(t.pid)
    assert os.path.realpath(image.exe.path) == os.path.realpath(exe)
    assert (a.kind, a.linkage) == ("musl", "dynamic"), a


def test_loader_options_read_as_the_loader_reads_them():
    from collectors.binary import loaderrun
    ldso = "/lib64/ld-linux-x86-64.so.2"
    # options up to the program; the program's own arguments are not the loader's
    argv = [ldso, "--inhibit-cache", "--preload", "libjemalloc.so.2:/x/libfoo.so bar.so",
            "--argv0", "name", "./prog", "--preload", "not-the-loaders"]
    options = loaderrun.loader_options(argv)
    assert options == {"--inhibit-cache": [], "--preload": ["libjemalloc.so.2:/x/libfoo.so bar.so"],
                       "--argv0": ["name"]}
    assert loaderrun.preloads(options) == ["libjemalloc.so.2", "/x/libfoo.so", "bar.so"]
    # an option missing its value is the program's name (dl_main needs argc > 2)
    assert loaderrun.loader_options([ldso, "--preload"]) == {}
    assert loaderrun.loader_options([ldso]) == {}


def test_two_allocators_preloaded_the_first_serves():
    # LD_PRELOAD=tcmalloc:jemalloc: both are mapped and searched in that
    # order, so tcmalloc serves malloc; jemalloc is a preload that
    # interposes nothing, and is said to be one (not a plain dependency).
    both = f"{PRELOADS['tcmalloc_minimal']}:{PRELOADS['jemalloc']}"
    with start([build_c("idle.c"), "1"], preload=both) as t:
        a, p = inspect(t.pid)
    assert (a.kind, a.variant, a.linkage) == ("tcmalloc", "minimal", "preload"), a
    je = next(o for o in a.others if o.kind == "jemalloc")
    assert je.linkage == "preload", je
    assert p.effective is True and p.requested == (PRELOADS["tcmalloc_minimal"], PRELOADS["jemalloc"])
    assert any(n.startswith(f"{PRELOADS['jemalloc']} is preloaded too") and
               "interposes nothing" in n for n in p.notes), p.notes


@pytest.mark.parametrize("token", ["$LIB", "${LIB}"])
def test_preload_with_the_loaders_lib_token(token):
    # LD_PRELOAD='/usr/$LIB/libjemalloc.so.2': ld.so expands its dynamic
    # string token (lib/x86_64-linux-gnu on Debian); the request is the
    # mapped file, in effect, not "not loaded"
    lib = PRELOADS["jemalloc"]
    requested = lib.replace("/lib/x86_64-linux-gnu/", f"/{token}/")
    assert token in requested
    with start([build_c("idle.c"), "1"], preload=requested) as t:
        a, p = inspect(t.pid)
        typo = ProcessImage(t.pid).expand_dst(requested.replace("jemalloc", "jemaloc"))
    assert (a.kind, a.linkage) == ("jemalloc", "preload"), a
    assert p.requested == (requested,) and p.effective is True, p
    assert p.verdict.startswith("in effect"), p
    assert "/usr/lib/x86_64-linux-gnu/libjemaloc.so.2" in typo


def test_dynamic_string_tokens_read_as_the_loader_reads_them():
    from collectors.binary.image import DST
    # a bare name ends where no identifier character follows; braces delimit it
    assert [m.group(1) or m.group(2) for m in DST.finditer("/a/$LIB/b/${PLATFORM}/$LIBX/$ORIGIN")] \
        == ["LIB", "PLATFORM", "ORIGIN"]


def test_an_allocator_behind_glibcs_names_is_not_glibc():
    """Chromium's allocator shim (PartitionAlloc) defines glibc's
    __libc_malloc, mallinfo and hooks in the chromium executable, but not
    malloc_info, which every glibc defines with malloc: it was taken for a
    static glibc, and a snapshot then failed on a missing mallinfo2."""
    from collectors.binary.elf import ObjectFile, load
    from collectors.detect import _classify_names
    path = require_file("/usr/lib/chromium/chromium")
    elf = load(ObjectFile("/nonexistent-proc", 1, 0, 0, path))
    assert {"__libc_malloc", "mallinfo", "malloc"} <= elf.exports
    assert "malloc_info" not in elf.exports
    sig = _classify_names(elf, path, elf.exports, ".dynsym")
    assert sig.kind == "unknown", sig
    assert "glibc's __libc_malloc, __malloc_hook, mallinfo but not malloc_info" in \
        sig.evidence[0], sig.evidence
    # and glibc itself still is glibc
    libc = "/usr/lib/x86_64-linux-gnu/libc.so.6"
    lelf = load(ObjectFile("/nonexistent-proc", 1, 0, 0, libc))
    assert _classify_names(lelf, libc, lelf.exports, ".dynsym").kind == "glibc"


def test_a_stored_signature_is_used_only_for_its_own_path():
    """The disk cache keeps each object's signature with the path it was
    classified under: the evidence names the file, and musl is told by its
    path, so the same file under another path (a container's root) is
    classified again; a payload of another shape is not used."""
    from collectors.detect import _stored_signature
    path = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    payload = (path, "jemalloc", None, "", ["libjemalloc.so.2 defines mallctl"], True)
    sig = _stored_signature(payload, path)
    assert (sig.kind, sig.prefix, sig.evidence, sig.defines_malloc) == \
        ("jemalloc", "", ("libjemalloc.so.2 defines mallctl",), True)
    assert _stored_signature(payload, "/proc/7/root" + path) is None
    for bad in (None, payload[:5], (path, "jemalloc", None, "", "evidence", True), [*payload]):
        assert _stored_signature(bad, path) is None
