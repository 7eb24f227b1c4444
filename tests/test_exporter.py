"""allocdiag exporter: exposition, labels, HELP text, the memory partition,
textfile atomicity, unreadable targets, argument errors.  Real targets under
real allocators; the Prometheus server test is tests/test_exporter_prometheus.py."""

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from diag import exporter, fields, metrics
from diag.commands import exporter as cmd
from diag.model.exitcodes import ExitCode
from diag.hostlive import REASONS, HostLive
from diag.snapshot import take
from servers import free_port, wait_port
from targets import build_c, python_argv, start

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "hunter2-do-not-export"
# 32 MiB in 64 KiB chunks, all kept: an idle target whose numbers stay put
BURST_ARGS = ("32", "64", "1")


def allocdiag(*argv, timeout=60, **kw):
    return subprocess.run([sys.executable, "-m", "diag", *argv], capture_output=True,
                          text=True, cwd=ROOT, timeout=timeout, **kw)


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(fams, name, **labels):
    """The samples of family NAME whose labels include LABELS."""
    return [s for s in fams[name].samples
            if all(s.labels.get(k) == v for k, v in labels.items())] if name in fams else []


@contextlib.contextmanager
def burst(allocator="jemalloc", env=None):
    with start([build_c("burst.c"), *BURST_ARGS], allocator=allocator, env=env) as t:
        yield t


def test_once_exposition_parses_help_from_fields_no_pid_no_environment():
    with burst(env={"ALLOCDIAG_TEST_SECRET": SECRET}) as t:
        r = allocdiag("exporter", "--once", "--target", str(t.pid), "--group", "^burst=je")
    assert r.returncode == ExitCode.OK, r.stderr
    assert "Traceback" not in r.stderr
    fams = families(r.stdout)
    # every family is one the table defines, with its HELP from diag.fields
    by_name = {m.name: m for m in metrics.ALL}
    assert set(fams) <= set(by_name)
    for name, fam in fams.items():
        assert fam.documentation == by_name[name].field.meaning, name
    resident = "allocdiag_allocator_resident_bytes"
    assert fams[resident].documentation == fields.BY_NAME["resident"].meaning
    assert fams["allocdiag_memory_bytes"].documentation == \
        fields.EXPORTER_BY_NAME["memory_class"].meaning
    # a pid only on the _info metric, and there as the target's pid
    for name, fam in fams.items():
        if fam.type == "gauge" and not name.endswith("_info"):
            assert all("pid" not in s.labels for s in fam.samples), name
    info = samples(fams, "allocdiag_target_info", group="je")
    assert [(s.labels["pid"], s.labels["state"], s.labels["allocator"]) for s in info] == \
        [(str(t.pid), "ok", "jemalloc")]
    # the live numbers are there for the target's group, and a pause was counted
    assert samples(fams, resident, group="je", allocator="jemalloc")[0].value > 32 << 20
    assert samples(fams, "allocdiag_target_pause_seconds", group="je")[0].value > 0
    assert samples(fams, "allocdiag_collector_success", collector="live")[0].value == 1
    # /proc metrics: the target's group, labelled with its preload verdict
    proc = samples(fams, "allocdiag_process_rss_bytes", group="je", allocator="jemalloc")
    assert proc and proc[0].labels["preload_effective"] == "true"
    assert SECRET not in r.stdout


def test_partition_sums_exactly_to_rss_in_the_exposition():
    with burst() as t:
        r = allocdiag("exporter", "--once", "--target", str(t.pid), "--group", "^burst=je")
    fams = families(r.stdout)
    classes = {s.labels["class"]: s.value for s in samples(fams, "allocdiag_memory_bytes",
                                                           group="je")}
    rss = samples(fams, "allocdiag_target_rss_bytes", group="je")[0].value
    assert set(classes) <= set(metrics.CLASSES)
    assert all(v >= 0 for v in classes.values()), classes
    assert sum(classes.values()) == rss
    # jemalloc: the kept 32 MiB is live, and the allocator's share is split
    assert classes["live"] >= 32 << 20
    assert {"live", "allocator_free", "allocator_metadata", "file"} <= set(classes)


@pytest.mark.parametrize("allocator", ["jemalloc", "glibc", "tcmalloc", "mimalloc"])
def test_memory_classes_disjoint_and_exact_for_each_allocator(allocator):
    with burst(allocator) as t:
        snap, _ = take(t.pid, attach=True, deadline_s=2.0)
    classes = metrics.memory_classes(snap)
    assert all(v >= 0 for v in classes.values()), classes
    assert sum(classes.values()) == snap.process.rss
    # glibc's held figure is an upper bound (mapped): clamped into rss_anon
    held = sum(classes.get(c, 0) for c in ("live", "allocator_free", "allocator_metadata",
                                           "allocator_held"))
    assert held <= snap.process.rss_anon - classes["lazyfree"]
    assert held > 0, (allocator, classes)


def test_python_arenas_are_carved_from_other_anon():
    code_path = os.path.join(ROOT, "tests", "targets", "rt_pyobjects.py")
    with start([sys.executable, code_path, "50000"]) as t:
        snap, _ = take(t.pid, attach=False)
    classes = metrics.memory_classes(snap)
    assert classes["python_arenas"] > 1 << 20, classes
    assert sum(classes.values()) == snap.process.rss


def test_match_selects_targets_and_group_by_user_labels(tmp_path):
    # a comm of its own: other tests on the machine may run burst targets too
    comm = f"xp{os.getpid()}"
    exe = tmp_path / comm
    shutil.copy(build_c("burst.c"), exe)
    with start([str(exe), *BURST_ARGS], allocator="jemalloc") as t:
        opts = exporter.Options(match=re.compile("^" + re.escape(comm) + "$"), group_by="user")
        collector = exporter.AllocdiagCollector(opts, sync=True)
        fams = _scrape(exporter.registry(collector))
    (info,) = samples(fams, "allocdiag_target_info")
    assert info.labels["pid"] == str(t.pid) and info.labels["state"] == "ok"
    user = pwd.getpwuid(os.getuid()).pw_name
    assert info.labels["group"] == user
    assert samples(fams, "allocdiag_allocator_allocated_bytes", group=user)[0].value >= 32 << 20
    groups = {s.labels["group"] for s in fams["allocdiag_processes"].samples}
    assert user in groups and comm not in groups


def test_a_scrape_never_reads_a_target_itself():
    # HTTP and --interval modes: only HostLive's thread stops targets; a
    # scrape reads the cache (here the thread is not started: still pending)
    with burst() as t:
        live = HostLive(min_gap_s=0.05)
        collector = exporter.AllocdiagCollector(exporter.Options(targets=(t.pid,)), live=live)
        reg = exporter.registry(collector)
        for _ in range(3):
            fams = _scrape(reg)
        assert live.reads == 0
        assert samples(fams, "allocdiag_target_info")[0].labels["state"] == "pending"
        assert not samples(fams, "allocdiag_allocator_resident_bytes")
        # once the thread has read it, the next scrape shows the numbers
        with live:
            deadline = time.monotonic() + 15
            while live.reads == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            fams = _scrape(reg)
    assert samples(fams, "allocdiag_target_info")[0].labels["state"] == "ok"
    assert samples(fams, "allocdiag_allocator_resident_bytes")[0].value > 32 << 20


def test_a_target_that_exits_is_reported_vanished():
    # the pid was checked at start-up (exit 3 then); later it may exit
    pid = _vanished_pid()
    collector = exporter.AllocdiagCollector(exporter.Options(targets=(pid,)), sync=True)
    fams = _scrape(exporter.registry(collector))
    (info,) = samples(fams, "allocdiag_target_info", pid=str(pid))
    assert (info.labels["state"], info.labels["reason"]) == ("not read", "vanished")
    assert samples(fams, "allocdiag_collector_success", collector="live")[0].value == 0
    assert collector.last_live_ok is False


def test_a_kernel_thread_target_is_reported_unsupported_not_denied():
    """The scan skips kernel threads; one named with --target was reported
    "denied" (a permission problem) though it has no allocator at all."""
    from targets import kernel_thread_pid
    pid = kernel_thread_pid() or pytest.skip("no kernel thread visible in this PID namespace")
    collector = exporter.AllocdiagCollector(exporter.Options(targets=(pid,)), sync=True)
    (info,) = samples(_scrape(exporter.registry(collector)), "allocdiag_target_info",
                      pid=str(pid))
    assert (info.labels["state"], info.labels["reason"]) == ("not read", "unsupported")


def _scrape(reg):
    return families(generate_latest(reg).decode())


def test_unborrowable_target_reported_once_not_retried():
    # A process that ignores SIGSEGV is refused by the remote engine (the
    # return trap would reset its handler): reported, not retried in a loop.
    code = ("import signal, sys; signal.signal(signal.SIGSEGV, signal.SIG_IGN); "
            "print('READY', flush=True); sys.stdin.read()")
    with start(python_argv(code)) as t:
        opts = exporter.Options(targets=(t.pid,), group_by="comm")
        live = HostLive(min_gap_s=0.05, refresh_s=0.2, retry_s=300.0)
        collector = exporter.AllocdiagCollector(opts, live=live)
        reg = exporter.registry(collector)
        with live:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                fams = _scrape(reg)
                info = samples(fams, "allocdiag_target_info", pid=str(t.pid))
                if info and info[0].labels["state"] != "pending":
                    break
                time.sleep(0.05)
            time.sleep(1.5)      # 30 chances for the worker to retry, at min_gap 0.05 s
            fams = _scrape(reg)
    info = samples(fams, "allocdiag_target_info", pid=str(t.pid))[0].labels
    assert info["state"] == "not read"
    assert info["reason"] == "remote_failed" and info["reason"] in REASONS
    assert samples(fams, "allocdiag_collector_success", collector="live")[0].value == 0
    reads = samples(fams, "allocdiag_target_reads", state="not read")
    assert [s.value for s in reads] == [1.0]
    assert live.reads == 1
    assert not samples(fams, "allocdiag_allocator_resident_bytes", group=info["group"])


def test_textfile_is_replaced_atomically_and_ends_in_prom(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "diag", "exporter", "--textfile",
                             str(tmp_path), "--interval", "0.2"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    path = tmp_path / "allocdiag.prom"
    reads, inodes = 0, set()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (len(inodes) < 3 or reads < 50):
            if path.exists():
                with contextlib.suppress(FileNotFoundError):
                    inodes.add(os.stat(path).st_ino)
                    text = path.read_text()
                    # never half a file: every read is complete exposition
                    assert text.rstrip().splitlines()[-1].startswith(
                        'allocdiag_collector_success{collector="live"}'), text[-200:]
                    families(text)
                    reads += 1
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(10)
    assert rc == ExitCode.OK, proc.stderr.read()
    assert len(inodes) >= 3, "each write must be a new file renamed over the old one"
    assert reads >= 50
    # only the .prom file is left: no temporary node_exporter could pick up
    assert [p.name for p in tmp_path.iterdir()] == ["allocdiag.prom"]


def test_textfile_one_shot(tmp_path):
    r = allocdiag("exporter", "--textfile", str(tmp_path))
    assert r.returncode == ExitCode.OK, r.stderr
    fams = families((tmp_path / exporter.TEXTFILE_NAME).read_text())
    assert exporter.TEXTFILE_NAME.endswith(".prom")
    assert samples(fams, "allocdiag_collector_success", collector="procfs")[0].value == 1


def test_default_listen_is_loopback_and_http_serves_metrics():
    args = cmd.add_parser(_subparsers()).parse_args([])
    import ipaddress
    assert ipaddress.ip_address(args.listen[0]).is_loopback
    assert args.listen == ("127.0.0.1", 9731)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "diag", "exporter", "--listen",
                             f"127.0.0.1:{port}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_port(port, proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            fams = families(resp.read().decode())
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(10)
    assert rc == ExitCode.OK
    assert samples(fams, "allocdiag_processes")
    # the exporter's own registry: no process_/python_ metrics of the exporter itself
    assert all(n.startswith("allocdiag_") for n in fams)
    assert f"http://127.0.0.1:{port}/metrics" in proc.stderr.read()


def _subparsers():
    import argparse
    return argparse.ArgumentParser().add_subparsers()


def _vanished_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("argv, code, words", [
    (["--listen", "junk"], ExitCode.USAGE, "not HOST:PORT"),
    (["--listen", "127.0.0.1:99999"], ExitCode.USAGE, "port out of range"),
    (["--group", "nonameatall"], ExitCode.USAGE, "not REGEX=NAME"),
    (["--match", "("], ExitCode.USAGE, "bad regular expression"),
    (["--interval", "5"], ExitCode.USAGE, "--interval goes with --textfile"),
    (["--textfile", "/nonexistent/dir"], ExitCode.USAGE, "no such directory"),
    (["--once", "--target", "VANISHED"], ExitCode.NO_PROCESS, "no such process"),
    (["--textfile", "/sys"], ExitCode.DENIED, "cannot write /sys/allocdiag.prom"),
])
def test_bad_arguments_give_clear_errors(argv, code, words):
    argv = [str(_vanished_pid()) if a == "VANISHED" else a for a in argv]
    r = allocdiag("exporter", *argv)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert words in r.stderr
    assert "Traceback" not in r.stderr


def test_port_in_use_is_a_usage_error():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = allocdiag("exporter", "--listen", f"127.0.0.1:{s.getsockname()[1]}")
    assert r.returncode == ExitCode.USAGE
    assert "cannot listen on 127.0.0.1:" in r.stderr


def test_missing_prometheus_client_names_the_extra():
    code = ("import sys; sys.modules['prometheus_client'] = None; from diag.cli import main; "
            "sys.exit(main(['exporter', '--once']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert r.returncode == ExitCode.USAGE       # the user's to fix: install the extra
    assert "pip install 'allocdiag[exporter]'" in r.stderr
    assert "Traceback" not in r.stderr


def test_help_teaches_with_examples_and_exit_codes():
    r = allocdiag("exporter", "--help")
    assert r.returncode == 0
    for words in ("examples:", "allocdiag exporter --once --target", "default 127.0.0.1:9731",
                  "--max-pause-ms-per-minute", "in this command:",
                  "pip install 'allocdiag[exporter]'", "allocdiag_memory_bytes"):
        assert words in r.stdout, words


def test_http_mode_reads_targets_before_the_first_scrape():
    """The targets are selected when the exporter starts, so the very first
    scrape (seconds later, as Prometheus's would be) finds the
    target read, not "pending"."""
    with contextlib.ExitStack() as stack:
        t = stack.enter_context(burst())
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "diag", "exporter", "--listen",
                                 f"127.0.0.1:{port}", "--target", str(t.pid)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(port, proc)
            # a few seconds (Prometheus's first scrape comes later still):
            # a cold read of the target on a loaded CI can take a second
            time.sleep(4.0)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                fams = families(resp.read().decode())
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
    (info,) = samples(fams, "allocdiag_target_info", pid=str(t.pid))
    assert info.labels["state"] == "ok"
    assert samples(fams, "allocdiag_allocator_resident_bytes")[0].value > 0


def test_preload_label_tells_none_requested_from_unknown():
    """A glibc process started without LD_PRELOAD is preload_effective="none"
    (not "unknown"); a preloaded one "true"."""
    with burst(allocator="glibc"), burst():          # one plain, one preloaded
        r = allocdiag("exporter", "--once", "--group", "^burst=b")
    assert r.returncode in (ExitCode.OK, ExitCode.PARTIAL), r.stderr
    got = {(s.labels["allocator"], s.labels["preload_effective"])
           for s in samples(families(r.stdout), "allocdiag_processes", group="b")}
    assert ("glibc", "none") in got and ("jemalloc", "true") in got, got
    assert exporter.preload_label({"effective": None, "verdict": "unknown: environment not "
                                   "readable"}) == "unknown"


def test_group_by_exe_uses_the_executable_name():
    """--group-by exe: the executable's file name (the host scan's exe), also
    what --group rules match besides comm and the command line."""
    with burst() as t:
        exe = os.path.basename(os.readlink(f"/proc/{t.pid}/exe"))
        r = allocdiag("exporter", "--once", "--group-by", "exe")
        r2 = allocdiag("exporter", "--once", "--group", f"^{re.escape(exe)}$=by_exe")
    assert r.returncode in (ExitCode.OK, ExitCode.PARTIAL), r.stderr
    assert samples(families(r.stdout), "allocdiag_processes", group=exe)
    assert samples(families(r2.stdout), "allocdiag_processes", group="by_exe")


def test_scrapes_read_again_only_processes_whose_stat_moved():
    # the collector keeps one incremental host scanner: an idle process's row
    # is kept between scrapes, its figures still exported
    with burst() as t:
        collector = exporter.AllocdiagCollector(exporter.Options(), live=HostLive())
        reg = exporter.registry(collector)
        _scrape(reg)
        first = collector.scanner.rows_read
        fams = _scrape(reg)
    assert first > 0 and collector.scanner.rows_kept > 0
    assert collector.scanner.rows_read - first < first
    group = t.proc.args[0].rsplit("/", 1)[-1][:15]
    assert samples(fams, "allocdiag_process_rss_bytes", group=group)[0].value > 32 << 20
