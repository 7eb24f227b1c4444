"""The ELF collector: real objects, odd and broken files, the cache."""

import os
import re
import subprocess
import shutil

import pytest

from collectors.binary.elf import ElfCache, ElfObject, ObjectFile
from diag.model.errors import MalformedData
from targets import LIBDIR, build_c, require_file

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def parse(path):
    with open(path, "rb") as f:
        return ElfObject(path, f)


def test_build_id_is_the_gnu_note_not_a_stapsdt_probe():
    """libstdc++ carries SystemTap probe notes whose n_type equals
    NT_GNU_BUILD_ID; the build-id is the "GNU" owner's note (readelf -n)."""
    path = require_file(f"{LIBDIR}/libstdc++.so.6")
    readelf = subprocess.run([require_file("readelf"), "-n", path], capture_output=True, text=True,
                             check=True).stdout
    want = re.search(r"Build ID: ([0-9a-f]+)", readelf).group(1)
    assert parse(path).build_id == want


def test_libc_facts():
    o = parse(LIBC)
    assert o.soname == "libc.so.6" and o.defines("malloc") and o.defines("malloc_info")
    assert o.interp is not None          # libc.so.6 is also executable
    assert len(o.build_id) == 40
    assert o.rodata_version("glibc", lambda: open(LIBC, "rb")) == \
        os.confstr("CS_GNU_LIBC_VERSION").split()[-1]
    # libc's own calls to malloc go through a GOT slot (interposable).
    assert o.got.get("malloc")


def test_executable_needed_and_got():
    o = parse(build_c("idle.c"))
    assert "libc.so.6" in o.needed and o.interp.endswith("ld-linux-x86-64.so.2")
    assert o.got.get("malloc") and not o.defines("malloc")
    # symtab (not stripped: built with -g) holds main.
    assert "main" in o.symtab(lambda: open(build_c("idle.c"), "rb"))


def test_jemalloc_version_string():
    path = require_file(f"{LIBDIR}/libjemalloc.so.2")
    o = parse(path)
    assert o.defines("mallctl")
    assert o.rodata_version("jemalloc", lambda: open(path, "rb")).startswith("5.")


@pytest.mark.parametrize("cut", [0, 3, 16, 64, 4096])
def test_truncated_elf_is_a_clear_error(tmp_path, cut):
    src = build_c("idle.c")
    bad = tmp_path / "truncated"
    bad.write_bytes(open(src, "rb").read()[:cut])
    with pytest.raises(MalformedData) as ei:
        parse(str(bad))
    assert "truncated" in str(ei.value) and "not a readable ELF" in str(ei.value)


def test_garbage_section_table(tmp_path):
    data = bytearray(open(build_c("idle.c"), "rb").read())
    data[0x28:0x30] = (len(data) - 8).to_bytes(8, "little")   # e_shoff near the end
    bad = tmp_path / "badsh"
    bad.write_bytes(bytes(data))
    with pytest.raises(MalformedData):
        parse(str(bad))


def test_not_elf(tmp_path):
    p = tmp_path / "text"
    p.write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(MalformedData):
        parse(str(p))


def test_cache_keyed_by_file_identity(tmp_path):
    cache = ElfCache()
    exe = tmp_path / "copy"
    shutil.copy(build_c("idle.c"), exe)
    opener = ObjectFile("/nonexistent-proc", 1, 0, 0, str(exe))
    a = cache.get(opener)
    assert cache.get(opener) is a and len(cache) == 1
    # Replaced file (new inode/size/mtime): parsed again.
    shutil.copy(build_c("dlopen_je.c", "-ldl"), exe)
    b = cache.get(ObjectFile("/nonexistent-proc", 1, 0, 0, str(exe)))
    assert b is not a and len(cache) == 2


def test_object_file_prefers_map_files():
    from collectors.proc.procfs import ProcFS
    from targets import start
    with start([build_c("idle.c"), "1"]) as t:
        m = next(m for m in ProcFS().maps(t.pid) if m.path and "libc" in m.path)
        of = ObjectFile("/proc", t.pid, m.start, m.end, m.path)
        with of.open() as f:
            assert f.name.startswith(f"/proc/{t.pid}/map_files/")
            assert f.read(4) == b"\x7fELF"
