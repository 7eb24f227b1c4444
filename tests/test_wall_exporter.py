"""``allocdiag exporter --wall`` (issue 20 item 7): the live targets' allocation
wall as opt-in metrics, sampled without a stop, HELP from diag.fields.  A real
glibc target with one arena; the captured windows for the group sums."""

import json
import os

import pytest

from diag import exporter, metrics, walllive
from diag.model.exitcodes import ExitCode
from diag.fields import WALL_BY_NAME
from diag.wallfile import wall_from_json
from targets import build_c, start
from test_exporter import allocdiag, families, samples

HERE = os.path.dirname(os.path.abspath(__file__))
GLIBC_WINDOWS = os.path.join(HERE, "fixtures", "wall-glibc-arena1.json")
ARENA1 = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
WALL_NAMES = {m.name for m in metrics.WALL}


def captured_walls():
    with open(GLIBC_WINDOWS) as f:
        return [wall_from_json(d) for d in json.load(f)]


def test_once_with_wall_exports_the_targets_wall_with_help_from_fields():
    exe = build_c("wall_ui.c", "-pthread")
    with start([exe, "4"], env=ARENA1) as t:
        r = allocdiag("exporter", "--once", "--target", str(t.pid), "--wall",
                      "--wall-window", "2", "--group", "wall_ui=wall")
    assert r.returncode == ExitCode.OK, r.stderr
    fams = families(r.stdout)
    assert fams["allocdiag_allocator_cpu_ratio"].documentation == \
        WALL_BY_NAME["cpu.allocator_share"].meaning
    labels = {"group": "wall", "allocator": "glibc"}
    cpu = samples(fams, "allocdiag_allocator_cpu_ratio", **labels)
    assert len(cpu) == 1 and 0.02 < cpu[0].value < 1
    assert samples(fams, "allocdiag_allocator_lock_wait_seconds", **labels)[0].value > 0
    mmap = samples(fams, "allocdiag_syscalls_per_second", syscall="mmap", **labels)
    assert mmap[0].value > 10
    assert samples(fams, "allocdiag_syscalls_from_allocator_ratio", syscall="mmap",
                   **labels)[0].value > 0.9
    assert samples(fams, "allocdiag_minor_page_faults_per_second", **labels)[0].value > 0
    assert 1.5 < samples(fams, "allocdiag_wall_window_seconds", **labels)[0].value < 3
    assert not [s for f in fams.values() for s in f.samples
                if f.name in WALL_NAMES and "pid" in s.labels]
    assert samples(fams, "allocdiag_collector_success", collector="wall")[0].value == 1


def test_a_failed_window_sets_the_wall_collector_to_zero():
    from diag.model.errors import AccessDenied

    def refused(pid, seconds, stop):
        raise AccessDenied(pid, "perf_event_open: EACCES")
    exe = build_c("wall_ui.c", "-pthread")
    with start([exe, "1"]) as t:
        collector = exporter.AllocdiagCollector(
            exporter.Options(targets=(t.pid,), wall=True), sync=True)
        collector.wall_live.sample = refused
        fams = {f.name: f for f in collector.collect()}
    assert collector.wall_live.entry(t.pid).error
    assert [s.value for s in fams["allocdiag_collector_success"].samples
            if s.labels["collector"] == "wall"] == [0]
    assert not WALL_NAMES & {n for n, f in fams.items() if f.samples}


def test_wall_metrics_are_opt_in():
    r = allocdiag("exporter", "--once", "--target", str(os.getpid()))
    assert r.returncode in (ExitCode.OK, ExitCode.PARTIAL), r.stderr
    assert not WALL_NAMES & set(families(r.stdout))


def test_the_wall_takes_no_stop_of_the_target():
    """The exporter's windows do not read the allocator's counters (the two
    borrowed-call stops of `allocdiag wall`): the pause budget is untouched."""
    exe = build_c("wall_ui.c", "-pthread")
    with start([exe, "2"], env=ARENA1) as t:
        opts = exporter.Options(targets=(t.pid,), wall=True, wall_window_s=1.0)
        collector = exporter.AllocdiagCollector(opts, sync=True)
        collector.collect()
        e = collector.wall_live.entry(t.pid)
    assert e is not None and e.error is None
    assert e.wall.counters == {} and e.wall.window.samples > 0
    assert not [m for m in e.wall.window.missing if m.figure == "counters"]


def test_group_sums_add_rates_and_weigh_shares():
    a, b = captured_walls()[:2]
    one, two = exporter.wall_sums([a]), exporter.wall_sums([a, b])
    M = metrics
    assert two[M.WALL_MINOR_FAULTS.name] == pytest.approx(
        a.faults.minor_per_s + b.faults.minor_per_s)
    assert two[(M.WALL_SYSCALLS.name, "mmap")] == pytest.approx(
        a.syscalls["mmap"].per_s + b.syscalls["mmap"].per_s)
    assert one[M.WALL_CPU_RATIO.name] == pytest.approx(a.cpu.allocator_share)
    assert two[M.WALL_CPU_RATIO.name] == pytest.approx(
        (a.cpu.allocator_samples + b.cpu.allocator_samples) / (a.cpu.samples + b.cpu.samples))
    assert two[M.WALL_LOCK_SECONDS.name] == pytest.approx(
        a.off_cpu.allocator_lock_s + b.off_cpu.allocator_lock_s)


def test_wall_live_samples_each_target_once_per_period():
    walls = captured_walls()
    taken = []

    def sample(pid, seconds, stop):
        taken.append((pid, seconds))
        return walls[0]
    live = walllive.WallLive(window_s=0.5, every_s=3600, sample=sample)
    live.annotate([11, 22])
    live.step_all()
    assert taken == [(11, 0.5), (22, 0.5)]
    assert live.entry(22).wall is walls[0]
    live.step_all()                 # not due again within every_s
    assert len(taken) == 2
    live.annotate([22])             # a target no longer selected is forgotten
    assert live.entry(11) is None


def test_wall_window_without_wall_is_a_usage_error():
    r = allocdiag("exporter", "--once", "--wall-window", "2")
    assert r.returncode == ExitCode.USAGE and "--wall" in r.stderr


def test_http_mode_samples_the_wall_in_the_background_and_stops_on_sigterm():
    import signal
    import subprocess
    import sys
    import time
    import urllib.request
    from servers import free_port, wait_port
    from test_exporter import ROOT
    exe = build_c("wall_ui.c", "-pthread")
    with start([exe, "2"], env=ARENA1) as t:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "diag", "exporter", "--listen",
                                 f"127.0.0.1:{port}", "--target", str(t.pid), "--wall",
                                 "--wall-window", "1"], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(port, proc)
            deadline = time.monotonic() + 30
            while True:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=10) as resp:
                    fams = families(resp.read().decode())
                if samples(fams, "allocdiag_allocator_cpu_ratio") or \
                        time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(15)
    assert code == ExitCode.OK
    assert samples(fams, "allocdiag_allocator_cpu_ratio", allocator="glibc")[0].value > 0
    assert samples(fams, "allocdiag_collector_success", collector="wall")[0].value == 1
