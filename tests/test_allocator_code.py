"""Where allocator code lies: a statically linked allocator is delimited by
its home's anchors (collectors.allocators.code), so a running thread may be
borrowed in the program's own code but never inside the allocator's."""

from collectors.allocators import registry
from collectors.allocators.code import forbidden_ranges, static_allocator_ranges
from collectors.binary.image import ProcessImage
from collectors.detect import detect
from targets import build_c, start, static_jemalloc_flags


def _inside(addr, ranges):
    return any(lo <= addr < hi for lo, hi, _ in ranges)


def test_static_jemalloc_span_holds_its_code_and_not_main():
    exe = build_c("idle.c", *static_jemalloc_flags(), name="idle_static_je")
    with start([exe, "1"]) as t:
        image = ProcessImage(t.pid)
        det = detect(image)
        ranges = forbidden_ranges(image, det)
    assert (det.allocator.kind, det.allocator.linkage) == ("jemalloc", "static")
    obj = image.exe
    spans = static_allocator_ranges(obj, "jemalloc", det.allocator.prefix)
    assert spans and all(name == "jemalloc (static)" for *_, name in spans)
    symtab = obj.elf.symtab(obj.opener.open)
    for name in ("je_malloc_default", "mallctl", "malloc_stats_print"):
        sym = symtab.get(name)
        if sym is not None:
            assert _inside(obj.bias + sym.st_value, spans), name
    assert not _inside(obj.bias + symtab["main"].st_value, ranges)
    assert any(name == "jemalloc (static)" for *_, name in ranges)


def test_anchors_are_each_homes_own():
    assert registry.for_kind("jemalloc").anchor("", "je_arena_malloc_hard")
    assert registry.for_kind("jemalloc").anchor("_rjem_", "_rjem_mallctl")
    assert not registry.for_kind("jemalloc").anchor("_rjem_", "mallctl")
    assert registry.for_kind("mimalloc").anchor(None, "_mi_page_malloc")
    assert registry.for_kind("tcmalloc").anchor(None, "tc_malloc")
    assert registry.for_kind("tcmalloc-google").anchor(None, "TCMalloc_Internal_GetStats")
    assert not registry.for_kind("glibc").anchor(None, "malloc")
    assert not registry.for_kind("jemalloc").anchor("", "main")
