"""The wall model's JSON document (diag.model.wall) and its field table (diag.fields)."""

from diag import fields

from diag.model import wall


def _wall():
    d = 2.0
    return wall.Wall(
        wall.Window(pid=1, start=0.0, duration_s=d, requested_s=d, hz=99, samples=100,
                    missing=(wall.Missing("off_cpu", "EACCES", "run as root"),)),
        cpu=wall.Cpu(samples=100, seconds=1.0, allocator_samples=40, unknown_samples=5,
                     unwound_samples=90,
                     by_function=(wall.FunctionTime("_int_malloc", 20, 0.2, 0.2),)),
        off_cpu=wall.OffCpu(thread_s=4.0, blocked_s=2.0, allocator_lock_s=1.0),
        faults=wall.Faults(minor=100, major=0, duration_s=d),
        syscalls={n: wall.SyscallRate(n, 10, d, 4, 3, 1) for n in wall.SYSCALLS},
        counters={"jemalloc.nmalloc": wall.Counter("jemalloc.nmalloc", 10, 30, d)},
        sites=(wall.Site("alloc_batch", ("alloc_batch", "main"), "malloc", 40, 0.4, 1.0),),
        stacks=(wall.Stack(("main", "alloc_batch", "malloc"), 40, allocator=True),))


def _get(doc, path):
    for part in path.split("."):
        doc = doc[part]
    return doc


def test_document_has_the_issue_keys():
    doc = _wall().to_json()
    for path in ("cpu.allocator_share", "cpu.by_function", "cpu.unwound_share",
                 "off_cpu.allocator_lock_share", "off_cpu.allocator_lock_s",
                 "faults.minor_per_s", "faults.major_per_s", "counters", "findings",
                 "window.start", "window.duration_s", "window.hz", "window.samples",
                 "window.threads_seen", "window.missing"):
        _get(doc, path)
    for name in wall.SYSCALLS:
        assert _get(doc, f"syscalls.{name}.per_s") == 5.0
        assert _get(doc, f"syscalls.{name}.from_allocator_share") == 1.0   # 3 of 4 - 1 unknown
    assert doc["cpu"]["allocator_share"] == 0.4
    assert doc["cpu"]["application_share"] == 0.55     # unknown is not application
    assert doc["off_cpu"]["allocator_lock_share"] == 0.25
    assert doc["counters"]["jemalloc.nmalloc"]["delta"] == 20
    assert doc["counters"]["jemalloc.nmalloc"]["per_s"] == 10.0
    assert set(doc["sites"][0]) >= {"function", "frames", "allocator_cpu_s", "lock_wait_s"}
    assert "stacks" not in doc and "stacks" in _wall().to_json(stacks=True)


def test_every_wall_field_row_names_a_key_of_the_document():
    doc = _wall().to_json()
    for f in fields.WALL_FIELD_ROWS:
        path = f.name.replace("NAME", "mmap" if f.name.startswith("syscalls") else "x")
        if path.startswith("counters."):
            assert isinstance(doc["counters"], dict)
        elif path.startswith("sites."):
            assert path.split(".", 1)[1] in doc["sites"][0]
        else:
            _get(doc, path)


def test_collapsed_lines():
    assert _wall().collapsed() == ["main;alloc_batch;malloc 40"]
