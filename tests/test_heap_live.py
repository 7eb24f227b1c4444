"""`allocdiag heap` against real targets (issue 10, live control):
gperftools' heap profiler started in a running process, jemalloc's
prof.active switched on in one started with prof:true, the "not possible,
here is how" answer (exit 5) for everything else, profiles the program writes
itself, and nothing left behind in the target's filesystem.

The target (tests/targets/heap_grow.c) runs as nobody, so the work directory
must really be the target's to write in.  It allocates from a uniquely named
function only when told, after the profile started."""

import glob
import json
import os
import re
import shutil
import stat
import tempfile

import pytest

from diag.cli import main
from diag.model.exitcodes import ExitCode
import unpriv
from targets import build_c, start

NOBODY = 65534
GROW_SITE = "allocdiag_heapctl_grow_site"
CXX_SITE = "allocdiag_heapctl::Grower::grow_site(int, unsigned long)"
# jemalloc armed but inactive, sampling every 2^15 bytes on average: 64 KiB
# blocks are then sampled with p = 1 - exp(-2) = 0.86, so 320 of them give
# ~277 samples and the scaled estimate is within a few percent (15% is ~7 sigma).
JE_ARMED = "prof:true,prof_active:false,lg_prof_sample:15"
AS_NOBODY = {"user": NOBODY, "group": NOBODY, "extra_groups": []}


def allocdiag(capsys, *argv):
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def jdoc(capsys, *argv):
    code, out, err = allocdiag(capsys, *argv, "--json")
    assert code == ExitCode.OK, err
    return json.loads(out)


def command(t, line):
    """Send one command to heap_grow and wait for its OK line."""
    t.proc.stdin.write((line + "\n").encode())
    t.proc.stdin.flush()
    answer = t.proc.stdout.readline().decode().strip()
    assert answer.startswith("OK"), answer
    return answer


def leftovers(pid):
    """allocdiag work directories of PID in the target's root."""
    return glob.glob(f"/proc/{pid}/root/tmp/allocdiag-heap-{pid}-*")


def grow_target(allocator, env=None, source="heap_grow.c", **popen):
    exe = build_c(source)
    if popen.get("user") == NOBODY:
        exe = unpriv.executable(exe)     # a checkout under /root is not nobody's to run
    return start([exe], allocator=allocator, env=env, **popen)


def tmp_entries():
    return set(os.listdir("/tmp"))


def test_gperftools_start_dump_diff_stop(capsys, tmp_path):
    # 10 MB between interval dumps, so the running profile also writes files
    # into allocdiag's directory -- as the target's (nobody's) own files.
    before = tmp_entries()
    with grow_target("tcmalloc", env={"HEAP_PROFILE_ALLOCATION_INTERVAL": "10000000"},
                     **AS_NOBODY) as t:
        pid = str(t.pid)
        command(t, "grow 10 100000")                  # before the start: never seen
        st = jdoc(capsys, "heap", "status", pid)
        assert (st["possible"], st["running"]) == (True, False)
        assert st["allocator"]["kind"] == "tcmalloc" and st["allocator"]["variant"] == "full"

        code, out, err = allocdiag(capsys, "heap", "start", pid, "--yes")
        assert code == ExitCode.OK, err
        assert "growth since attach" in out
        (wd,) = leftovers(t.pid)
        info = os.lstat(wd)
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (NOBODY, NOBODY, 0o700)

        command(t, "grow 200 100000")
        a = str(tmp_path / "a.heap")
        doc = jdoc(capsys, "heap", "dump", pid, "-o", a)
        top = doc["sites"][0]
        assert top["function"] == GROW_SITE
        # unsampled: exact, and only what was allocated after the start
        assert abs(top["inuse_bytes"] - 200 * 100000) <= 0.01 * 200 * 100000
        assert top["inuse_objects"] == 200
        # GetHeapProfile's own buffer is not a site, and the header agrees
        assert doc["totals"]["inuse_bytes"] == doc["header_totals"]["inuse_bytes"] == 20000000
        assert all("GetHeapProfile" not in " ".join(s["stack"]) for s in doc["sites"])
        side = json.load(open(a + ".snapshot.json"))
        assert side["pid"] == t.pid and side["stats"]["allocated"]["value"] > 20000000
        # the target wrote its interval dumps into allocdiag's directory, as nobody
        written = glob.glob(os.path.join(wd, "heap.*.heap"))
        assert written and all(os.stat(f).st_uid == NOBODY for f in written)
        assert any(f["source"] == "allocdiag work dir"
                   for f in jdoc(capsys, "heap", "status", pid)["files"])

        command(t, "grow 100 50000")
        b = str(tmp_path / "b.heap")
        jdoc(capsys, "heap", "dump", pid, "-o", b)
        d = jdoc(capsys, "heap", "diff", a, b)
        assert d["delta"]["inuse_bytes"] == 100 * 50000 and d["delta"]["inuse_objects"] == 100
        assert [(e["function"], e["delta"]["inuse_bytes"]) for e in d["sites"]] == \
            [(GROW_SITE, 100 * 50000)]
        assert {row["layer"] for row in d["layers"]} >= {"allocated", "rss", "lazyfree"}
        code, out, err = allocdiag(capsys, "heap", "diff", a, b)
        assert code == ExitCode.OK and "+100" in out and "verdict: growth is live objects" in out
        _views_of_a_dump(capsys, a, tmp_path)

        code, out, err = allocdiag(capsys, "heap", "stop", pid)
        assert code == ExitCode.OK, err
        assert leftovers(t.pid) == []
        assert jdoc(capsys, "heap", "status", pid)["running"] is False
        command(t, "grow 1 1000")                     # the target is unharmed
        # nothing else was created in the target's /tmp (other tests may add
        # their own entries meanwhile: only ours would name the pid or heap)
        new = tmp_entries() - before
        assert not [n for n in new if str(t.pid) in n or "heap" in n], new


def _views_of_a_dump(capsys, path, tmp_path):
    """show's text views and the legacy copy of a real dump."""
    code, out, err = allocdiag(capsys, "heap", "show", path, "--tree")
    assert code == ExitCode.OK and f"{GROW_SITE} (self 19.1 MiB)" in out
    code, out, err = allocdiag(capsys, "heap", "show", path, "--collapsed")
    # libc's static __libc_start_call_main has a name only with libc6-dbg's
    # debug file (found by build-id); without it the frame is libc.so.6+0xOFFSET
    (line,) = out.splitlines()
    assert re.fullmatch(r"_start;__libc_start_main;(__libc_start_call_main|libc\.so\.6\+0x[0-9a-f]+);"
                        rf"main;{GROW_SITE} 20000000", line), line
    legacy = str(tmp_path / "legacy.heap")
    code, out, err = allocdiag(capsys, "heap", "show", path, "--legacy", legacy, "--top", "1")
    assert code == ExitCode.OK and f"wrote {legacy}" in out and GROW_SITE in out
    assert jdoc(capsys, "heap", "show", legacy)["sites"] == \
        jdoc(capsys, "heap", "show", path)["sites"]


def test_gperftools_cxx_frames_demangled(capsys, tmp_path):
    with grow_target("tcmalloc", source="heap_grow_cxx.cpp") as t:
        pid = str(t.pid)
        assert allocdiag(capsys, "heap", "start", pid, "--yes")[0] == ExitCode.OK
        command(t, "grow 50 40000")
        try:
            doc = jdoc(capsys, "heap", "dump", pid, "-o", str(tmp_path / "c.heap"),
                       "--no-snapshot")
        finally:
            allocdiag(capsys, "heap", "stop", pid)
        assert doc["sites"][0]["function"] == CXX_SITE
        assert doc["sites"][0]["inuse_bytes"] == 50 * 40000
        assert not os.path.exists(tmp_path / "c.heap.snapshot.json")
        assert leftovers(t.pid) == []


def test_jemalloc_prof_active_and_dump(capsys, tmp_path):
    with grow_target("jemalloc", env={"MALLOC_CONF": JE_ARMED}, **AS_NOBODY) as t:
        pid = str(t.pid)
        st = jdoc(capsys, "heap", "status", pid)
        assert (st["possible"], st["running"]) == (True, False)
        assert st["values"]["opt.prof"] is True and st["values"]["opt.lg_prof_sample"] == 15
        command(t, "grow 320 65536")                  # prof.active off: not sampled
        assert allocdiag(capsys, "heap", "start", pid, "--yes")[0] == ExitCode.OK
        assert jdoc(capsys, "heap", "status", pid)["running"] is True
        command(t, "grow 320 65536")
        doc = jdoc(capsys, "heap", "dump", pid, "-o", str(tmp_path / "j.heap"))
        top = doc["sites"][0]
        assert top["function"] == GROW_SITE
        assert abs(top["inuse_bytes"] - 320 * 65536) <= 0.15 * 320 * 65536, top
        assert leftovers(t.pid) == []                 # the dump's directory is gone
        stopped = jdoc(capsys, "heap", "stop", pid)
        assert (stopped["was_running"], stopped["running"]) == (True, False)
        assert jdoc(capsys, "heap", "status", pid)["running"] is False


@pytest.mark.parametrize("allocator,env,says", [
    ("tcmalloc_minimal", None, "libtcmalloc_minimal has no heap profiler"),
    ("glibc", None, "glibc malloc has no heap profiler"),
    ("mimalloc", None, "mimalloc malloc has no heap profiler"),
    ("jemalloc", {"MALLOC_CONF": "narenas:2"}, "not started with prof:true"),
])
def test_not_possible_says_how_exit_5(capsys, allocator, env, says):
    with grow_target(allocator, env=env) as t:
        pid = str(t.pid)
        code, out, err = allocdiag(capsys, "heap", "status", pid)
        assert code == ExitCode.UNSUPPORTED
        assert says in out and "how: " in out
        if allocator == "jemalloc":     # the exact recipe, keeping the program's own options
            assert "MALLOC_CONF=narenas:2,prof:true,prof_active:false,lg_prof_sample:19" in out
        else:
            assert "MALLOC_CONF=prof:true,prof_active:false" in out and "libtcmalloc.so.4" in out
        for action in (["start", pid, "--yes"], ["dump", pid], ["stop", pid]):
            code, out, err = allocdiag(capsys, "heap", *action)
            assert code == ExitCode.UNSUPPORTED and says in err and "how: " in err, action
        assert leftovers(t.pid) == []


def test_program_own_heapprofile_listed_and_copied(capsys, tmp_path):
    """A program started with HEAPPROFILE writes its own dumps: status lists
    them (reading HEAPPROFILE from its environment, no other variable),
    dump --latest copies the newest, and stop leaves its profiler alone."""
    # pytest's tmp_path is root's (0700): the target (nobody) writes elsewhere
    mine = tempfile.mkdtemp(prefix="allocdiag-test-heapprofile-")
    os.chown(mine, NOBODY, NOBODY)
    own = os.path.join(mine, "own")
    try:
        _program_own_heapprofile(capsys, tmp_path, own)
    finally:
        shutil.rmtree(mine)


def _program_own_heapprofile(capsys, tmp_path, own):
    env = {"HEAPPROFILE": own, "HEAP_PROFILE_ALLOCATION_INTERVAL": "10000000",
           "ALLOCDIAG_TEST_SECRET": "hunter2"}
    with grow_target("tcmalloc", env=env, **AS_NOBODY) as t:
        pid = str(t.pid)
        command(t, "grow 300 100000")                 # 30 MB: interval dumps
        st = jdoc(capsys, "heap", "status", pid)
        assert st["running"] is True
        assert st["env"] == {"HEAPPROFILE": own,
                             "HEAP_PROFILE_ALLOCATION_INTERVAL": "10000000"}
        code, out, err = allocdiag(capsys, "heap", "status", pid)
        assert "hunter2" not in out + err + json.dumps(st)
        files = [f for f in st["files"] if f["source"] == "HEAPPROFILE"]
        assert files and all(f["path"].startswith(own + ".") for f in files)

        copy = str(tmp_path / "latest.heap")
        doc = jdoc(capsys, "heap", "dump", pid, "--latest", "-o", copy)
        newest = f"/proc/{pid}/root{files[-1]['path']}"
        assert open(copy, "rb").read() == open(newest, "rb").read()
        assert doc["sites"][0]["function"] == GROW_SITE
        # the whole run (HEAPPROFILE starts at exec): all 300 blocks by the newest dump or less
        assert 0 < doc["sites"][0]["inuse_objects"] <= 300

        code, out, err = allocdiag(capsys, "heap", "stop", pid)
        assert code == ExitCode.UNSUPPORTED and "not started by allocdiag" in err
        assert jdoc(capsys, "heap", "status", pid)["running"] is True

        # A target that plants a symlink to a file it cannot read does not
        # get allocdiag (root) to copy that file out.
        secret = tmp_path / "root-only"
        secret.write_text("heap profile: root's secret\n")
        os.chmod(secret, 0o600)
        os.symlink(secret, own + ".9999.heap")
        code, out, err = allocdiag(capsys, "heap", "dump", pid, "--latest", "-o",
                                   str(tmp_path / "stolen.heap"))
        assert code == ExitCode.DENIED and "symlinks are not followed" in err
        assert not os.path.exists(tmp_path / "stolen.heap")


def test_jemalloc_prof_prefix_files_listed(capsys, tmp_path):
    """jemalloc started with prof:true and an interval writes
    PREFIX.PID.SEQ.iN.heap itself; status finds them through opt.prof_prefix."""
    mine = tempfile.mkdtemp(prefix="allocdiag-test-jeprof-")
    os.chown(mine, NOBODY, NOBODY)
    prefix = os.path.join(mine, "je")
    conf = f"prof:true,lg_prof_sample:15,lg_prof_interval:22,prof_prefix:{prefix}"
    try:
        with grow_target("jemalloc", env={"MALLOC_CONF": conf}, **AS_NOBODY) as t:
            pid = str(t.pid)
            command(t, "grow 160 65536")                 # 10 MiB: interval dumps every 4 MiB
            st = jdoc(capsys, "heap", "status", pid)
            assert st["running"] is True and st["values"]["opt.prof_prefix"] == prefix
            files = [f for f in st["files"] if f["source"] == "opt.prof_prefix"]
            assert files and all(f["path"].startswith(f"{prefix}.{pid}.") for f in files)
            doc = jdoc(capsys, "heap", "dump", pid, "--latest", "-o", str(tmp_path / "i.heap"))
            assert doc["sites"][0]["function"] == GROW_SITE
            assert doc["snapshot"] is None
    finally:
        shutil.rmtree(mine)


def test_real_redis_gets_the_recipe_naming_the_program(capsys):
    """Debian's redis-server (its jemalloc, no prof:true): exit 5 with a recipe
    that names the program as started (its executable is redis-check-rdb)."""
    import servers
    with servers.redis() as s:
        code, out, err = allocdiag(capsys, "heap", "status", str(s.pid))
        assert code == ExitCode.UNSUPPORTED
        how = [ln for ln in out.splitlines() if ln.startswith("how: ")]
        assert how and "MALLOC_CONF=prof:true,prof_active:false" in how[0]
        assert "redis-server" in how[0]
        assert servers.untraced(s.pid)
