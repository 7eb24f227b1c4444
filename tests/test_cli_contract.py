"""The command line's contract (issue 21, item 6): variant lists, missing
optional packages, kernel threads and zombies, input files of the wrong kind,
and `record` stopped by a signal.  Everything through the real CLI, against
real processes: a real kernel thread, a real unreaped child, a module made
unimportable by a PYTHONPATH shim that raises ImportError."""

import gzip
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from targets import build_c, kernel_thread_pid, start

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
RECORDING = os.path.join(FIXTURES, "recording-jemalloc-burst-release.jsonl.gz")


def allocdiag(*args, env=None, timeout=120):
    full = dict(os.environ, PYTHONPATH=ROOT)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "diag", *args], capture_output=True, text=True,
                          env=full, cwd="/", timeout=timeout)


def clean(r):
    return "Traceback" not in r.stderr and "internal error" not in r.stderr


# -- compare --variants -----------------------------------------------------------------------

def test_variants_with_a_comma_are_two_variants_and_both_run():
    r = allocdiag("compare", "--json", "--variants", "glibc,jemalloc", "--warmup-seconds", "0",
                  "--idle-seconds", "0", "--interval", "0.2", "--timeout", "20",
                  "--", "/bin/sleep", "1")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    by = {v["name"]: v for v in doc["variants"]}
    assert list(by) == ["glibc", "jemalloc"]
    for name, kind in (("glibc", "glibc"), ("jemalloc", "jemalloc")):
        assert by[name]["runs"] and by[name]["excluded_reason"] is None, by[name]
        assert by[name]["allocator_kind"] == kind


@pytest.mark.parametrize("variants", [["glibc,jemaloc"], ["nosuch"], [""], [","], [],
                                      ["glibc", "glibc"]])
def test_unknown_or_empty_variants_fail_before_starting_anything(variants, tmp_path):
    marker = tmp_path / "started"
    r = allocdiag("compare", "--variants", *variants, "--",
                  "/bin/sh", "-c", f"touch {marker}; sleep 5", timeout=60)
    assert r.returncode == 2, (variants, r.returncode, r.stderr)
    assert clean(r)
    assert not marker.exists(), "the workload was started"
    if variants != ["glibc", "glibc"]:
        assert "valid variants: glibc, jemalloc, tcmalloc" in r.stderr, r.stderr
    if variants == ["glibc,jemaloc"]:
        assert "did you mean jemalloc" in r.stderr


def test_split_variants_keeps_knob_sets_together():
    from diag.compare import split_variants
    assert split_variants(["glibc,jemalloc:dirty_decay_ms=1000,muzzy_decay_ms=0,mimalloc"]) == \
        ["glibc", "jemalloc:dirty_decay_ms=1000,muzzy_decay_ms=0", "mimalloc"]
    assert split_variants(["glibc:MALLOC_ARENA_MAX=2,tcmalloc", "mimalloc"]) == \
        ["glibc:MALLOC_ARENA_MAX=2", "tcmalloc", "mimalloc"]


# -- optional packages ------------------------------------------------------------------------

def _shim(tmp_path, *modules):
    """A PYTHONPATH directory whose MODULES raise ImportError on import (as
    when the extra is not installed)."""
    for m in modules:
        d = tmp_path / "shim" / m
        d.mkdir(parents=True)
        (d / "__init__.py").write_text(f"raise ImportError('{m} is not installed (test shim)')\n")
    return {"PYTHONPATH": f"{tmp_path / 'shim'}:{ROOT}"}


@pytest.mark.parametrize("argv, module, extra", [
    (["exporter", "--once"], "prometheus_client", "exporter"),
    (["report", RECORDING, "-o", "{tmp}/r.html"], "matplotlib", "report"),
    (["serve", "--port", "1"], "textual_serve", "serve"),
])
def test_missing_optional_package_names_the_extra(argv, module, extra, tmp_path):
    r = allocdiag(*[a.format(tmp=tmp_path) for a in argv], env=_shim(tmp_path, module))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"pip install 'allocdiag[{extra}]'" in r.stderr and clean(r), r.stderr
    assert "unsupported" not in r.stderr.lower() and "not detected" not in r.stderr


# -- kernel threads and zombies ---------------------------------------------------------------

def _kernel_thread():
    return kernel_thread_pid() or pytest.skip("no kernel thread visible in this PID namespace")


PID_COMMANDS = [["inspect"], ["inspect", "--no-attach"], ["inspect", "--json"], ["explain"],
                ["preload"], ["release", "--yes"], ["heap", "status"],
                ["set", "--yes", "{pid}", "arena_max=2"], ["wall", "--duration", "0.5"],
                ["record", "-o", "{out}", "--duration", "1"]]


def _pid_argv(argv, pid, out="unused.jsonl"):
    return [a.format(pid=pid, out=out) for a in argv] + ([] if "{pid}" in argv else [str(pid)])


@pytest.mark.parametrize("argv", PID_COMMANDS)
def test_kernel_thread_is_named_as_one_exit_5(argv, tmp_path):
    pid = _kernel_thread()
    out = tmp_path / "k.jsonl"
    r = allocdiag(*_pid_argv(argv, pid, out))
    assert r.returncode == 5, r.stderr
    assert "is a kernel thread" in r.stderr and "no allocator" in r.stderr and clean(r)
    assert "no such process" not in r.stderr
    assert not out.exists()         # record: no empty recording left behind


def test_a_recording_that_fails_at_its_first_snapshot_leaves_the_file_as_it_was(tmp_path):
    """record -o over an earlier recording, of a process that does not exist:
    exit 3, and the earlier file is untouched (it is truncated only when the
    first snapshot is written)."""
    old = tmp_path / "incident.jsonl"
    old.write_text("an earlier recording\n")
    r = allocdiag("record", "-o", str(old), "--duration", "1", "999999999")
    assert r.returncode == 3 and "no such process" in r.stderr and clean(r)
    assert old.read_text() == "an earlier recording\n"
    unwritable = allocdiag("record", "-o", str(tmp_path / "no" / "dir.jsonl"), "999999999")
    assert unwritable.returncode == 2 and clean(unwritable), unwritable.stderr


def test_kernel_thread_without_the_status_line_is_found_by_its_flags(tmp_path):
    """Before Linux 6.10 status has no ``Kthread:`` line: PF_KTHREAD in
    /proc/PID/stat decides (a real capture with that line removed)."""
    from diag.model.errors import Unsupported
    from collectors.proc.procfs import ProcFS
    pid = _kernel_thread()
    d = tmp_path / str(pid)
    d.mkdir()
    with open(f"/proc/{pid}/status", "rb") as f:
        (d / "status").write_bytes(b"".join(l for l in f if not l.startswith(b"Kthread:")))
    with open(f"/proc/{pid}/stat", "rb") as f:
        (d / "stat").write_bytes(f.read())
    fs = ProcFS(str(tmp_path))
    assert fs.is_kernel_thread(pid)
    with pytest.raises(Unsupported, match="kernel thread"):
        fs.check_user_process(pid)
    assert not ProcFS().is_kernel_thread(os.getpid())


@pytest.fixture
def zombie():
    """A real zombie: a child that exited and that we have not reaped."""
    child = subprocess.Popen(["/bin/true"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{child.pid}/status", "rb") as f:
                if b"\nState:\tZ" in f.read():
                    break
            time.sleep(0.02)
        else:
            pytest.fail("child did not become a zombie")
        yield child.pid
    finally:
        child.wait()


@pytest.mark.parametrize("argv", PID_COMMANDS)
def test_zombie_is_named_as_one_exit_3(zombie, argv):
    r = allocdiag(*_pid_argv(argv, zombie))
    assert r.returncode == 3, r.stderr
    assert "is a zombie" in r.stderr and "not reaped" in r.stderr and clean(r), r.stderr


def test_record_of_a_zombie_exit_3(zombie, tmp_path):
    r = allocdiag("record", str(zombie), "-o", str(tmp_path / "z.jsonl"), "--duration", "1")
    assert r.returncode == 3 and "is a zombie" in r.stderr and clean(r), r.stderr


@pytest.mark.parametrize("argv", PID_COMMANDS)
def test_process_whose_main_thread_exited_is_named_as_such_exit_5(argv):
    """pthread_exit() in main: the leader is a zombie, the process runs on
    in its other thread (it was called "a zombie ... nothing is left to
    read", exit 3)."""
    with start([build_c("leader_exit.c", "-pthread")]) as t:
        r = allocdiag(*_pid_argv(argv, t.pid))
        assert t.alive()
    assert r.returncode == 5, r.stderr
    assert "main thread has exited (pthread_exit) and 1 other thread runs on" in r.stderr \
        and clean(r), r.stderr
    assert "is a zombie" not in r.stderr


def test_wall_names_a_zombie_and_a_gone_main_thread(zombie):
    """The sampler took both for "no such process"."""
    r = allocdiag("wall", "--duration", "1", str(zombie))
    assert r.returncode == 3 and "is a zombie" in r.stderr and clean(r), r.stderr
    with start([build_c("leader_exit.c", "-pthread")]) as t:
        r = allocdiag("wall", "--duration", "1", str(t.pid))
    assert r.returncode == 5, r.stderr
    assert "main thread has exited (pthread_exit)" in r.stderr and clean(r), r.stderr


# -- input files that are not what the command reads ------------------------------------------

def _bad_inputs(tmp_path):
    real = gzip.open(RECORDING).read()
    files = {"empty.jsonl": b"", "random.bin": os.urandom(4096),
             "truncated.jsonl.gz": gzip.compress(real)[:300]}
    out = {}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        out[name] = str(tmp_path / name)
    return out


@pytest.mark.parametrize("command", [["report", "{f}", "-o", "{tmp}/x.html"], ["replay", "{f}"],
                                     ["inspect", "--from", "{f}"], ["heap", "show", "{f}"]])
def test_wrong_kind_of_input_file_exit_2_saying_what_was_expected(command, tmp_path):
    for name, path in _bad_inputs(tmp_path).items():
        r = allocdiag(*[a.format(f=path, tmp=tmp_path) for a in command], timeout=60)
        assert r.returncode == 2, (command, name, r.returncode, r.stderr)
        assert path in r.stderr and "expected" in r.stderr and clean(r), (name, r.stderr)
        assert "allocator not detected" not in r.stderr


def test_help_documents_the_input_file_exit_code():
    for cmd in ("report", "replay", "inspect"):
        r = allocdiag(cmd, "--help")
        assert "not what" in r.stdout and "the command reads" in r.stdout, cmd
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    row = next(l for l in readme.splitlines() if l.startswith("| 2 |"))
    assert "not what the command reads" in row and "allocdiag[exporter]" in row


# -- record stopped by a signal -----------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_record_ends_cleanly_on_a_signal_and_counts_what_it_wrote(sig, tmp_path):
    out = tmp_path / "rec.jsonl"
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        proc = subprocess.Popen([sys.executable, "-m", "diag", "record", str(t.pid), "-o",
                                 str(out), "--interval", "0.2"],
                                stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, PYTHONPATH=ROOT), cwd="/")
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                if out.exists() and out.read_text().count("\n") >= 4:
                    break
                time.sleep(0.05)
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            proc.wait()
    lines = out.read_text().splitlines()
    assert proc.returncode == 0, err
    assert len(lines) >= 4
    assert f"recorded {len(lines)} snapshots of pid {t.pid}" in err, err
    assert f"stopped by {sig.name}" in err and "Traceback" not in err
    for line in lines:                       # every line whole
        assert json.loads(line)["pid"] == t.pid


def test_record_survives_its_terminal_closing(tmp_path):
    """SIGHUP from a real hang-up: the terminal record writes its progress to
    is closed under it (writes then fail with EIO).  It still ends cleanly,
    exit 0, every line whole."""
    import pty
    out = tmp_path / "rec.jsonl"
    with start([build_c("idle.c"), "1"]) as t:
        pid, master = pty.fork()
        if pid == 0:                                    # child: its controlling tty is the pty
            os.environ["PYTHONPATH"] = ROOT
            os.execv(sys.executable, [sys.executable, "-m", "diag", "record", str(t.pid), "-o",
                                      str(out), "--interval", "0.2", "--no-attach"])
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if out.exists() and out.read_text().count("\n") >= 3:
                    break
                time.sleep(0.05)
            os.close(master)                            # the hang-up
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("record did not end after its terminal closed")
        finally:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    lines = out.read_text().splitlines()
    assert len(lines) >= 3 and all(json.loads(line)["pid"] == t.pid for line in lines)
