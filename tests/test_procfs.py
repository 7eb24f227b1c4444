"""procfs and cgroup parsing: captured trees, a live process, odd inputs."""

import os

import pytest

import unpriv

from diag.model.errors import MalformedData, NoSuchProcess
from collectors.proc.cgroup import cgroup_memory
from collectors.proc.environ import is_allocator_var
from collectors.proc.maps import parse_maps
from collectors.proc.procfs import ProcFS

ROLLUP = b"""55d5c0e2a000-7ffd1a9f1000 ---p 00000000 00:00 0                          [rollup]
Rss:              409600 kB
Pss:              400000 kB
Pss_Anon:         380000 kB
Shared_Clean:       8000 kB
Shared_Dirty:          0 kB
Private_Clean:      4000 kB
Private_Dirty:    397600 kB
Anonymous:        390000 kB
LazyFree:         300000 kB
AnonHugePages:      2048 kB
Swap:                 12 kB
"""

STATUS = b"""Name:\tworker
Umask:\t0022
State:\tS (sleeping)
PPid:\t1
VmSize:\t 1048576 kB
VmRSS:\t  409600 kB
RssAnon:\t  390000 kB
RssFile:\t   19600 kB
RssShmem:\t       0 kB
VmSwap:\t      12 kB
Threads:\t8
SigIgn:\t0000000000001000
"""

ENVIRON = (b"HOME=/root\0AWS_SECRET_ACCESS_KEY=hunter2\0LD_PRELOAD=/usr/lib/libjemalloc.so.2\0"
           b"MALLOC_CONF=dirty_decay_ms:1000\0_RJEM_MALLOC_CONF=narenas:2\0"
           b"MALLOC_ARENA_MAX=2\0MALLOC_TRIM_THRESHOLD_=131072\0GLIBC_TUNABLES=glibc.malloc.tcache_count=0\0"
           b"TCMALLOC_RELEASE_RATE=10\0mimalloc_purge_delay=0\0PYTHONMALLOC=malloc\0"
           b"DATABASE_URL=postgres://u:p@h/db\0MALLOCATOR_TOKEN=x\0")


def make_proc(tmp_path, pid=4242, files=None):
    d = tmp_path / "proc" / str(pid)
    d.mkdir(parents=True)
    base = {"status": STATUS, "smaps_rollup": ROLLUP, "environ": ENVIRON,
            "maps": b"00400000-00452000 r-xp 00000000 fd:01 1234 /usr/bin/worker\n"
                    b"7f0000000000-7f0004000000 rw-p 00000000 00:00 0 \n"
                    b"7f1000000000-7f1000001000 r--p 00000000 fd:01 99 /tmp/x (deleted)\n"}
    base.update(files or {})
    for name, data in base.items():
        if data is not None:
            (d / name).write_bytes(data)
    return ProcFS(str(tmp_path / "proc")), pid


def test_memory_from_captured_rollup(tmp_path):
    procfs, pid = make_proc(tmp_path)
    m = procfs.memory(pid)
    assert m.source == "smaps_rollup"
    assert m.rss == 409600 * 1024 and m.rss_anon == 390000 * 1024
    assert m.rss_file == 19600 * 1024 and m.rss_shmem == 0
    assert m.lazyfree == 300000 * 1024 and m.anon_thp == 2048 * 1024
    assert m.swap == 12 * 1024 and m.pss == 400000 * 1024
    assert m.private == (4000 + 397600) * 1024 and m.shared == 8000 * 1024
    assert m.threads == 8


def test_smaps_fallback_sums_every_mapping(tmp_path):
    smaps = (b"00400000-00452000 r-xp 00000000 fd:01 1234 /usr/bin/worker\n"
             b"Rss:                 100 kB\nLazyFree:              0 kB\nAnonymous:             0 kB\n"
             b"7f0000000000-7f0004000000 rw-p 00000000 00:00 0\n"
             b"Rss:                5000 kB\nLazyFree:           3000 kB\nAnonymous:          5000 kB\n")
    procfs, pid = make_proc(tmp_path, files={"smaps_rollup": None, "smaps": smaps})
    m = procfs.memory(pid)
    assert m.source == "smaps"
    assert m.lazyfree == 3000 * 1024


def test_kernel_without_lazyfree(tmp_path):
    rollup = b"\n".join(l for l in ROLLUP.split(b"\n") if not l.startswith(b"LazyFree"))
    procfs, pid = make_proc(tmp_path, files={"smaps_rollup": rollup})
    m = procfs.memory(pid)
    assert m.lazyfree is None          # unknown, not zero
    assert m.rss == 409600 * 1024


def test_neither_rollup_nor_smaps(tmp_path):
    procfs, pid = make_proc(tmp_path, files={"smaps_rollup": None})
    m = procfs.memory(pid)
    assert m.source == "status" and m.lazyfree is None and m.rss == 409600 * 1024


def test_environ_keeps_only_allocator_variables(tmp_path):
    procfs, pid = make_proc(tmp_path)
    env = procfs.environ(pid)
    assert env == {
        "LD_PRELOAD": "/usr/lib/libjemalloc.so.2", "MALLOC_CONF": "dirty_decay_ms:1000",
        "_RJEM_MALLOC_CONF": "narenas:2", "MALLOC_ARENA_MAX": "2",
        "MALLOC_TRIM_THRESHOLD_": "131072", "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0",
        "TCMALLOC_RELEASE_RATE": "10", "mimalloc_purge_delay": "0", "PYTHONMALLOC": "malloc",
    }
    for secret in (b"hunter2", b"postgres", b"/root"):
        assert secret not in repr(env).encode()
    assert not is_allocator_var("MALLOCATOR_TOKEN")


def test_an_environ_block_overwritten_by_the_program_is_told_apart(tmp_path):
    # setproctitle (redis, nginx): the block is still there but holds no
    # NAME=VALUE entry; an empty block is a process started with none
    from collectors.proc.environ import OVERWRITTEN, overwritten
    assert overwritten(b"\0" * 300) and overwritten(b"nginx: worker process\0\0\0")
    assert not overwritten(b"") and not overwritten(b"HOME=/root\0")
    procfs, pid = make_proc(tmp_path, files={"environ": b"\0" * 64})
    assert procfs.environ_or_why(pid) == (None, OVERWRITTEN)
    procfs, pid = make_proc(tmp_path / "kept")
    env, why = procfs.environ_or_why(pid)
    assert why is None and env == procfs.environ(pid) and "LD_PRELOAD" in env


def test_environ_prefilter_keeps_each_allocator_variable_alone():
    # a block is dropped whole when no allocator name can be in it: each
    # variable the full parse keeps must survive that search on its own
    from collectors.proc.environ import parse_allocator_environ
    kept = parse_allocator_environ(ENVIRON)
    for name, value in kept.items():
        block = b"HOME=/root\0" + f"{name}={value}".encode() + b"\0PATH=/bin\0"
        assert parse_allocator_environ(block) == {name: value}
    assert parse_allocator_environ(b"HOME=/root\0PATH=/bin\0") == {}


def test_environ_search_equals_the_entry_by_entry_filter():
    # the parser looks only around candidate names; it must keep exactly
    # what testing every entry keeps, whatever the order, with names in
    # values, two candidates in one entry, and no trailing NUL
    import random
    from collectors.proc.environ import parse_allocator_environ
    entries = ENVIRON.split(b"\0")[:-1] + [
        b"NOTE=set LD_PRELOAD=x here", b"MALLOC_CONF=a:MALLOC_b", b"mimalloc_verbose=1",
        b"X_MALLOC_CONF_Y=1", b"=MALLOC", b"LD_PRELOAD", b"GODEBUG=madvdontneed=1"]
    rng = random.Random(23)
    for _ in range(200):
        block = b"\0".join(rng.sample(entries, rng.randint(0, len(entries))))
        expect = {}
        for entry in block.split(b"\0"):
            name, sep, value = entry.partition(b"=")
            if sep and is_allocator_var(name):
                expect[name.decode()] = value.decode()
        assert parse_allocator_environ(block) == expect, block


def test_maps_parsing(tmp_path):
    procfs, pid = make_proc(tmp_path)
    maps = procfs.maps(pid)
    assert maps[0].path == "/usr/bin/worker" and maps[0].inode == 1234 and "x" in maps[0].perms
    assert maps[1].path is None and maps[1].end - maps[1].start == 64 << 20
    assert maps[2].deleted and maps[2].path == "/tmp/x"


def test_maps_with_spaces_in_path():
    m = parse_maps(b"7f00-7f10 r-xp 00000000 fd:01 7 /opt/my app/lib x.so\n")
    assert m[0].path == "/opt/my app/lib x.so"


def test_vanished_pid(tmp_path):
    procfs = ProcFS(str(tmp_path))
    with pytest.raises(NoSuchProcess):
        procfs.status(99999)


def test_live_process_auxv_and_memory():
    from targets import build_c, start
    with start([build_c("idle.c"), "1"]) as t:
        procfs = ProcFS()
        aux = procfs.auxv(t.pid)
        assert aux.get(23) == 0       # AT_SECURE off for a plain exec
        m = procfs.memory(t.pid)
        assert m.rss and m.rss == m.rss_anon + m.rss_file + m.rss_shmem
        assert m.rss_anon >= 1 << 20   # the 1 MiB it wrote
        assert m.lazyfree is not None  # 6.x kernels print it


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop privileges")
def test_permission_denied_is_access_denied():
    # A non-dumpable root process cannot be read by another uid.
    code = ("from collectors.proc.procfs import ProcFS\nfrom diag.model.errors import AccessDenied\n"
            "try:\n    ProcFS().maps(1)\nexcept AccessDenied as e:\n    print('DENIED', e.exit_code)\n")
    out = unpriv.run(["-c", code])
    assert "DENIED 4" in out.stdout, out.stderr


# -- cgroup ------------------------------------------------------------------

def write_tree(root, files):
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_cgroup_v2(tmp_path):
    write_tree(tmp_path, {
        "kubepods/pod1/c1/memory.current": b"1073741824\n",
        "kubepods/pod1/c1/memory.max": b"2147483648\n",
        "kubepods/pod1/c1/memory.stat": b"anon 500000000\nfile 400000000\ninactive_file 300000000\n"
                                        b"active_file 100000000\n",
    })
    c = cgroup_memory({"": "/kubepods/pod1/c1"}, str(tmp_path))
    assert (c.version, c.usage, c.limit, c.inactive_file) == (2, 1073741824, 2147483648, 300000000)
    assert c.working_set == 1073741824 - 300000000


def test_cgroup_v2_unlimited_and_clamped(tmp_path):
    write_tree(tmp_path, {
        "a/memory.current": b"100\n", "a/memory.max": b"max\n",
        "a/memory.stat": b"inactive_file 500\n",
    })
    c = cgroup_memory({"": "/a"}, str(tmp_path))
    assert c.limit is None and c.working_set == 0   # max(0, usage - inactive_file)


def test_cgroup_v1(tmp_path):
    write_tree(tmp_path, {
        "memory/docker/abc/memory.usage_in_bytes": b"734003200\n",
        "memory/docker/abc/memory.limit_in_bytes": b"9223372036854771712\n",
        "memory/docker/abc/memory.stat": b"cache 1\ninactive_file 10\ntotal_inactive_file 209715200\n",
    })
    c = cgroup_memory({"memory": "/docker/abc", "": "/"}, str(tmp_path))
    assert (c.version, c.usage, c.limit, c.inactive_file) == (1, 734003200, None, 209715200)
    assert c.working_set == 734003200 - 209715200


def test_cgroup_hybrid_unified(tmp_path):
    write_tree(tmp_path, {
        "unified/user.slice/memory.current": b"4096\n",
        "unified/user.slice/memory.max": b"8192\n",
        "unified/user.slice/memory.stat": b"inactive_file 1024\n",
    })
    c = cgroup_memory({"": "/user.slice"}, str(tmp_path))
    assert (c.version, c.working_set, c.limit) == (2, 3072, 8192)


def test_cgroup_missing(tmp_path):
    c = cgroup_memory({"cpu": "/x"}, str(tmp_path))
    assert c.usage is None and "no readable memory cgroup" in c.error


def test_cgroup_of_live_process():
    procfs = ProcFS()
    c = cgroup_memory(procfs.cgroup_paths(os.getpid()))
    if c.usage is None:
        pytest.skip(f"no memory cgroup visible here: {c.error}")
    assert c.version in (1, 2) and c.usage > 0
    assert c.working_set == max(0, c.usage - c.inactive_file)


def test_maps_read_to_the_end():
    # seq_file hands large files out in pieces; every mapping must be seen.
    from targets import build_c, start
    with start([build_c("many_maps.c"), "20000"]) as t:
        maps = ProcFS().maps(t.pid)
        with open(f"/proc/{t.pid}/maps", "rb") as f:
            expected = f.read().count(b"\n")
    assert len(maps) == expected and expected > 20000


def test_read_all_whole_files_and_errors(tmp_path):
    from collectors.proc.readall import READ_CHUNK, read_all
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    big = tmp_path / "big"
    data = bytes(range(256)) * (3 * READ_CHUNK // 256 + 7)      # several reads
    big.write_bytes(data)
    assert read_all(str(empty)) == b""
    assert read_all(str(big)) == data
    with open("/proc/self/status", "rb") as f:
        head = f.read().split(b"\n", 1)[0]
    assert read_all("/proc/self/status").split(b"\n", 1)[0] == head
    with pytest.raises(FileNotFoundError):
        read_all(str(tmp_path / "missing"))
    with pytest.raises(IsADirectoryError):
        read_all(str(tmp_path))


def test_parsed_maps_are_kept_by_their_bytes_and_handed_out_as_copies():
    a = b"7f00-7f10 r-xp 00000000 fd:01 7 /lib/a.so\n"
    b = a + b"7f10-7f20 rw-p 00000000 00:00 0 \n"
    from collectors.proc import maps as maps_mod
    first = parse_maps(a)
    first.append("scribbled")                  # a caller's list is its own
    hits = maps_mod._parsed.cache_info().hits
    again = parse_maps(bytes(bytearray(a)))    # equal bytes, another object
    assert maps_mod._parsed.cache_info().hits == hits + 1
    assert again == [first[0]] and again is not first
    assert len(parse_maps(b)) == 2             # other bytes: parsed anew
    for _ in range(2):                         # a malformed line raises each time
        with pytest.raises(MalformedData):
            parse_maps(b"not a mapping at all\n")
