"""The command line: the JSON and exit-code contracts of DESIGN.md."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import deps
import unpriv
from targets import build_c, start

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP_KEYS = ["schema_version", "pid", "comm", "exe", "taken_at", "allocator", "preload", "process",
            "cgroup", "stats", "native", "findings", "collectors"]


def allocdiag(*args, python=sys.executable, stdin=None):
    """`python -m diag ARGS` from /, as a terminal-less caller would run it
    (STDIN: subprocess.DEVNULL for no terminal at all; never serve's web
    driver)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("TEXTUAL_DRIVER", None)
    cmd = [python, "-m", "diag", *args]
    return subprocess.run(cmd, stdin=stdin, capture_output=True, text=True, env=env, cwd="/",
                          timeout=120)


def test_inspect_json_document():
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        r = allocdiag("inspect", "--json", str(t.pid))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)          # exactly one document
    assert list(doc) == TOP_KEYS
    assert doc["schema_version"] == 1 and doc["pid"] == t.pid
    assert doc["allocator"]["kind"] == "jemalloc" and doc["allocator"]["linkage"] == "preload"
    assert doc["preload"]["effective"] is True
    proc = doc["process"]
    assert isinstance(proc["rss"], int) and proc["rss"] == proc["rss_anon"] + proc["rss_file"] + proc["rss_shmem"]
    assert isinstance(proc["lazyfree"], int)
    # Allocator layer: every field present, unknown until stats are collected.
    assert set(doc["stats"]) >= {"allocated", "active", "resident", "mapped"}
    assert all(v["provenance"] in ("measured", "derived", "adjusted", "unknown")
               for v in doc["stats"].values())
    # a figure lowered to the kernel's keeps the allocator's beside it
    assert all(v["raw"] > v["value"] for v in doc["stats"].values()
               if v["provenance"] == "adjusted")
    for name, c in doc["collectors"].items():
        assert set(c) == {"ok", "error", "duration_s", "pause_us"}, name


def test_inspect_human_output():
    with start([build_c("idle.c"), "1"], allocator="tcmalloc") as t:
        r = allocdiag("inspect", str(t.pid))
    assert r.returncode == 0, r.stderr
    assert "tcmalloc 2." in r.stdout and "preload" in r.stdout and "LazyFree" in r.stdout


def test_no_such_process_exit_3():
    r = allocdiag("inspect", "4194303")
    assert r.returncode == 3
    assert "no such process" in r.stderr and "Traceback" not in r.stderr


def test_usage_exit_2():
    r = allocdiag("inspect", "not-a-pid")
    assert r.returncode == 2 and "not a process id" in r.stderr


def test_an_unknown_option_is_reported_with_its_commands_usage():
    """`allocdiag wall PID -d 3` exits 2 and shows wall's usage, which names
    --duration, not the top-level one (argparse's default)."""
    r = allocdiag("wall", "1", "-d", "3")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("usage: allocdiag wall ") and "--duration S" in r.stderr
    assert "allocdiag wall: error: unrecognized arguments: -d 3" in r.stderr
    r = allocdiag("wall", "1", "--duration", "0")
    assert r.returncode == 2
    assert "argument --duration: must be between 0.2 and 3600 seconds" in r.stderr, r.stderr
    r = allocdiag("heap", "show", "/nonexistent.heap", "--bogus")       # an action's own usage
    assert r.returncode == 2 and r.stderr.startswith("usage: allocdiag heap show ")
    assert "allocdiag heap show: error: unrecognized arguments: --bogus" in r.stderr
    # no command is top: its parser reports what neither it nor the globals know
    r = allocdiag("-v", "--bogus")
    assert r.returncode == 2 and "allocdiag top: error: unrecognized arguments: --bogus" in r.stderr


@pytest.mark.parametrize("argv", [
    ["inspect", "--from", "{missing}"], ["inspect", "--from", "{dir}"], ["replay", "{missing}"],
    ["serve", "replay", "{missing}"], ["heap", "show", "{missing}"], ["heap", "show", "{dir}"],
    ["heap", "diff", "{missing}", "{missing}"], ["report", "{missing}", "-o", "{dir}/r.html"],
    ["record", "1", "-o", "{missing}/x.jsonl", "--duration", "1"]])
def test_unusable_paths_are_usage_errors_naming_the_path(argv, tmp_path):
    """A file the user named that does not exist (or is a directory) exits 2
    with the path and the reason, from every command that takes one."""
    missing, d = str(tmp_path / "nope"), str(tmp_path)
    r = allocdiag(*[a.format(missing=missing, dir=d) for a in argv])
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    assert (missing in r.stderr and "No such file" in r.stderr) or \
        (d in r.stderr and "directory" in r.stderr), r.stderr


@pytest.mark.parametrize("argv, word", [
    (["inspect", "1"], "inspect"), (["-v", "--log-file", "x", "ps", "--json"], "ps"),
    (["--proc=/tmp/p", "--no-cache", "heap", "show", "f"], "heap"),
    (["--log-file", "inspect"], None),             # the option's value, not a command
    ([], None), (["-v", "--no-attach"], None),     # top
    (["--help"], None), (["-h", "inspect"], None), (["--version"], None),
    (["bogus"], None), (["1234"], None), (["--log-file"], None)])
def test_the_command_word_is_found_before_any_command_is_imported(argv, word):
    from diag import cli
    assert cli.command_word(argv) == word


def test_a_run_imports_and_builds_its_own_command_only():
    """`allocdiag inspect` imports one command module and builds one
    sub-parser (all seventeen cost a CLI run ~25 ms); the top-level help
    still lists every command."""
    code = ("import sys; from diag import cli; p = cli.build_parser(cli.command_word(sys.argv[1:]));"
            "print(sorted(p.get_default('command_parsers')));"
            "print(sorted(m for m in sys.modules if m.startswith('diag.commands.')))")
    r = subprocess.run([sys.executable, "-c", code, "inspect", "--json", "1"], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=ROOT), cwd="/", timeout=60)
    assert r.stdout.splitlines() == ["['inspect']",
                                     "['diag.commands.common', 'diag.commands.inspect']"], r.stderr
    r = allocdiag("--help")
    assert r.returncode == 0
    from diag import commands
    for name in commands.MODULES:
        assert f"\n    {name} " in r.stdout, name


def test_a_run_leaves_shutil_unimported():
    """argparse imports shutil (and with it bz2 and lzma, ~3 ms) for
    the terminal's width each time it makes a help formatter, as does a
    text table: diag.terminal reads the width instead.  A text `inspect` and
    a command's --help import none of them, and the options are wrapped to
    the terminal's width ($COLUMNS here, less argparse's 2)."""
    code = ("import sys, io, contextlib; from diag import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try: cli.main(sys.argv[1:])\n"
            "    except SystemExit: pass\n"
            "print(sorted({'shutil', 'bz2', 'lzma'} & set(sys.modules)))\n"
            "text = out.getvalue().split('options:')[-1].split('examples:')[0]\n"
            "print(max(map(len, text.splitlines())))")
    for argv in (["inspect", "--no-attach", str(os.getpid())], ["inspect", "--help"]):
        r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=ROOT, COLUMNS="64"), cwd="/",
                           timeout=60)
        lines = r.stdout.splitlines()
        assert lines[0] == "[]", (argv, r.stdout, r.stderr)
        if argv[-1] == "--help":
            assert 50 < int(lines[1]) <= 64 - 2, r.stdout


# What a warm `inspect` has no use for, with what importing it cost on the
# slow guest: dataclasses with inspect, dis and ast (~25 ms, and ~1 ms a
# class: diag.model.records), pyelftools (~11 ms: only a file not in the
# detection cache is parsed), subprocess with selectors (~2 ms: the
# understudy is posix_spawn'ed), logging with traceback and tokenize (~6 ms:
# no line is written without -v, collectors.lazylog), textwrap (~1 ms: the
# exit codes' help is wrapped without it), CPython's heap reader (~1.5 ms:
# only for a Python, collectors.runtimes.interpreter says whether), locale
# (~1.5 ms: gettext's catalogue search for argparse's messages, diag.cli).
UNUSED_WHEN_WARM = ("dataclasses", "inspect", "elftools", "subprocess", "selectors",
                    "logging", "traceback", "tokenize", "textwrap",
                    "collectors.runtimes.pymalloc", "locale")


def test_a_warm_inspect_imports_only_what_it_uses(tmp_path):
    """With the detection cache warm (the second run), an `inspect` that
    stops a thread of a jemalloc target imports none of UNUSED_WHEN_WARM;
    the first run parses ELF files with pyelftools (whose pprint import
    brings dataclasses)."""
    # Both runs see a free CPU, as on an idle machine.  The rehearsal and the
    # warm-up before a stop run only when a CPU is free (Tracer.free_cpu, a
    # /proc/loadavg read); the warm-up walks the understudy's stack, whose
    # FDEs (cat's) a first run that met a saturated moment never decoded, so
    # a second run that found a CPU free decoded them with pyelftools (the
    # project's CI, stop 37; reproduced with ALLOCDIAG_NO_WARM_UP=1 on the
    # first run only).
    code = ("import sys, io, contextlib; from diag import cli\n"
            "from collectors.engine.tracee import Tracer\n"
            "Tracer.free_cpu = lambda self: True\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    rc = cli.main(sys.argv[1:])\n"
            f"print(rc, sorted(set({UNUSED_WHEN_WARM!r}) & set(sys.modules)))")
    env = dict(os.environ, PYTHONPATH=ROOT, XDG_CACHE_HOME=str(tmp_path))
    for name in ("ALLOCDIAG_NO_CACHE", "ALLOCDIAG_NO_REHEARSAL", "ALLOCDIAG_NO_WARM_UP"):
        env.pop(name, None)
    seen = []
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        for _ in range(2):
            r = subprocess.run([sys.executable, "-c", code, "inspect", str(t.pid)],
                               capture_output=True, text=True, env=env, cwd="/", timeout=120)
            seen.append(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr)
    assert seen[0].startswith("0 ") and "elftools" in seen[0], seen
    assert seen[1] == "0 []", seen


def test_a_short_command_runs_without_a_cyclic_collection():
    """Start-up's objects are not garbage: `inspect` (imports, detection,
    the document) runs without one pass of the cyclic collector, which at
    its default threshold made ~70 (diag.cli.GC_THRESHOLD0); the caller's
    threshold is back after main() returns."""
    code = ("import gc, sys; from diag import cli; passes = [];"
            "gc.callbacks.append(lambda phase, info: phase == 'start' and passes.append(info));"
            "gc.set_threshold(700, 10, 10);"
            "rc = cli.main(sys.argv[1:]); print(rc, len(passes), gc.get_threshold())")
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        r = subprocess.run([sys.executable, "-c", code, "inspect", "--json", str(t.pid)],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT),
                           cwd="/", timeout=120)
    assert r.stdout.splitlines()[-1] == "0 0 (700, 10, 10)", r.stderr[-2000:]


def test_the_program_ends_without_collecting_what_it_made():
    """The console script and `python -m diag` run cli.entry, which freezes
    the run's objects before the interpreter's finalisation collects them
    all again (45-70 ms of a 260 ms `inspect` on the slow guest)."""
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    assert "allocdiag = diag.cli:entry" in cfg["options.entry_points"]["console_scripts"]
    with open(os.path.join(ROOT, "diag", "__main__.py")) as f:
        assert "sys.exit(entry())" in f.read()
    code = ("import atexit, gc, sys; from diag import cli;"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count(), file=sys.stderr));"
            "sys.argv[0] = 'allocdiag'; sys.exit(cli.entry())")
    r = subprocess.run([sys.executable, "-c", code, "inspect", "--no-attach", str(os.getpid())],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT),
                       cwd="/", timeout=120)
    assert r.returncode == 0 and "pid %d" % os.getpid() in r.stdout, r.stderr[-2000:]
    assert int(r.stderr.split("frozen ")[-1]) > 10_000


def test_help_teaches_exit_codes():
    r = allocdiag("inspect", "--help")
    assert r.returncode == 0
    assert "permission denied" in r.stdout and "examples:" in r.stdout


def test_ps_json_and_table():
    with start([build_c("idle.c"), "1"], allocator="mimalloc") as t:
        r = allocdiag("ps", "--json")
        h = allocdiag("ps")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    row = next(p for p in doc["processes"] if p["pid"] == t.pid)
    assert row["allocator"]["kind"] == "mimalloc" and row["allocator"]["linkage"] == "preload"
    assert row["preload"]["effective"] is True
    for k in ("rss", "rss_anon", "lazyfree", "threads", "comm"):
        assert k in row
    assert doc["total"] == len(doc["processes"])
    line = next(l for l in h.stdout.splitlines() if l.lstrip().startswith(f"{t.pid} "))
    assert "mimalloc/preload" in line and "in effect" in line


def test_preload_command():
    typo = "/usr/lib/x86_64-linux-gnu/libjemaloc.so.2"
    with start([build_c("idle.c"), "1"], preload=typo, stderr=subprocess.DEVNULL) as t:
        r = allocdiag("preload", str(t.pid))
        j = allocdiag("preload", "--json", str(t.pid))
    assert r.returncode == 0
    assert "not in effect" in r.stdout and "file not found" in r.stdout
    assert json.loads(j.stdout)["preload"]["effective"] is False


def test_permission_denied_partial_with_help():
    # As nobody, a root-owned target's status is readable but its maps and
    # memory are not: the procfs part is printed, exit 6, with the help text.
    with start([build_c("idle.c"), "1"]) as t:
        r = unpriv.run(["-m", "diag", "inspect", "--json", str(t.pid)])
        text = unpriv.run(["-m", "diag", "inspect", str(t.pid)])
        ps = unpriv.run(["-m", "diag", "ps"])
    assert r.returncode == 6, r.stderr
    doc = json.loads(r.stdout)
    assert doc["process"]["rss"] is not None
    assert doc["collectors"]["maps"]["ok"] is False
    # no stats: for the reason it has (not "--no-attach", which was not asked)
    assert doc["collectors"]["remote"] == {
        "ok": False, "error": "not collected: the allocator was not detected (maps failed)",
        "duration_s": 0.0, "pause_us": None}
    assert "allocator stats  unknown: not collected: the allocator was not detected " \
           "(maps failed)" in text.stdout and "--no-attach)" not in text.stdout
    assert "ptrace_scope" in r.stderr and "CAP_SYS_PTRACE" in r.stderr
    assert "refused as root: root without CAP_SYS_PTRACE" in r.stderr
    assert ps.returncode == 0 and "not readable" in ps.stderr
    assert "(permission denied: run as root to see them)" in ps.stderr


def test_unreadable_hint_does_not_tell_root_to_run_as_root():
    """Root refused (a container's init holding capabilities this process
    lacks, a security module) is not told to run as root."""
    from diag.hostscan import unreadable_hint
    assert unreadable_hint(euid=1000) == "run as root to see them"
    as_root = unreadable_hint(euid=0)
    assert "run as root" not in as_root and "refused even to root" in as_root
    assert "allocdiag inspect PID" in as_root and "CAP_SYS_PTRACE" in as_root
    assert unreadable_hint(euid=0, short=True) == "refused even to root"
    assert unreadable_hint(euid=1000, short=True) == "run as root to see them"


def test_demo_from_installed_package_runs_and_leaves_no_children(tmp_path):
    # The console script of the installed package, run from the checkout as
    # the README says: it must find examples/ there, show the situation and
    # stop its workloads.
    script = os.path.join(os.path.dirname(sys.executable), "allocdiag")
    if not os.path.exists(script):
        pytest.skip("allocdiag console script not installed in this environment")
    r = subprocess.run([script, "demo", "--no-tui", "--only", "glibc_held"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "glibc-free-held" in r.stdout or "glibc holds" in r.stdout
    left = subprocess.run([deps.need("pgrep"), "-f", "glibc_held-"], capture_output=True, text=True)
    assert left.stdout.strip() == ""
    r = subprocess.run([script, "demo", "--list"], capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 0 and "lying_rss" in r.stdout
    r = subprocess.run([script, "demo", "--no-tui"], capture_output=True, text=True, cwd=str(tmp_path),
                       env={k: v for k, v in os.environ.items() if k != "ALLOCDIAG_EXAMPLES"})
    assert r.returncode == 5 and "examples/ directory" in r.stderr and "Traceback" not in r.stderr


def test_parallel_scan_matches_serial(monkeypatch):
    from diag import hostscan
    monkeypatch.setattr(hostscan, "PARALLEL_MIN", 1)
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as a, \
            start([build_c("idle.c"), "1"], allocator="tcmalloc") as b, \
            start([build_c("idle.c"), "1"], allocator="mimalloc") as c:
        pids = [a.pid, b.pid, c.pid]
        serial = hostscan.scan(pids=pids)
        parallel = hostscan.scan(pids=pids, workers=2)
    # Only what does not change between two scans is compared: CPU%, RSS and
    # LazyFree of a live process do (CPU% made this fail one run in three).
    stable = ("pid", "comm", "exe", "user", "allocator", "preload", "threads")
    keep = lambda rows: [{k: r[k] for k in stable} for r in sorted(rows, key=lambda r: r["pid"])]
    assert keep(parallel.rows) == keep(serial.rows)
    assert {k for r in parallel.rows for k in r} == {k for r in serial.rows for k in r}
    kinds = {r["pid"]: r["allocator"]["kind"] for r in parallel.rows}
    assert kinds[a.pid] == "jemalloc" and kinds[b.pid] == "tcmalloc"


def test_record_ctrl_c_reports_the_count_written(tmp_path):
    out = tmp_path / "rec.jsonl"
    with start([build_c("idle.c"), "1"]) as t:
        env = dict(os.environ, PYTHONPATH=ROOT)
        proc = subprocess.Popen([sys.executable, "-m", "diag", "record", str(t.pid), "-o", str(out),
                                 "--interval", "0.2", "--no-attach"],
                                stderr=subprocess.PIPE, text=True, env=env, cwd="/")
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if out.exists() and out.read_text().count("\n") >= 3:
                    break
                time.sleep(0.1)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
    lines = out.read_text().count("\n")
    assert proc.returncode == 0, err
    assert f"recorded {lines} snapshots of pid {t.pid}" in err, err


@pytest.mark.parametrize("command", [["release", "--yes"], ["set", "--yes", "arena_max=2"]])
def test_action_that_cannot_borrow_says_why(command):
    # A stopped process is never resumed by allocdiag: the action is refused,
    # and the user is told why and what to do, on stderr, with exit 6.
    with start([build_c("idle.c"), "1"]) as t:
        os.kill(t.pid, signal.SIGSTOP)
        try:
            r = allocdiag(command[0], *command[1:2], str(t.pid), *command[2:])
        finally:
            os.kill(t.pid, signal.SIGCONT)
    assert r.returncode == 6, (r.returncode, r.stderr)
    assert "stopped" in r.stderr and "SIGCONT" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_ps_shows_user_and_cpu_from_psutil():
    # A busy process shows a high CPU% and its user; psutil's view, through
    # the host scan (and the meter measures between two scans like top).
    from diag import hostscan
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)
        meter = hostscan.CpuMeter()
        first = {r["pid"]: r for r in hostscan.scan(pids=[busy.pid], meter=meter).rows}
        time.sleep(0.5)
        second = {r["pid"]: r for r in hostscan.scan(pids=[busy.pid], meter=meter).rows}
        r = allocdiag("ps", "--json")
    finally:
        busy.kill()
        busy.wait()
    import pwd
    me = pwd.getpwuid(os.getuid()).pw_name
    assert first[busy.pid]["user"] == me
    assert first[busy.pid]["cpu_percent"] > 30 and second[busy.pid]["cpu_percent"] > 30
    row = {p["pid"]: p for p in json.loads(r.stdout)["processes"]}[busy.pid]
    assert row["user"] == me and row["cpu_percent"] > 30 and "_key" not in row


def test_vanished_pid_is_counted_not_raised():
    from diag import hostscan
    p = subprocess.Popen(["true"])
    p.wait()
    result = hostscan.scan(pids=[p.pid])
    assert result.rows == [] and result.vanished == 1


def test_inspect_native_prints_schema_units():
    # --native: the allocator's own numbers, units from collectors.schema
    # (jemalloc pactive is a page count: shown as pages and bytes).
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        r = allocdiag("inspect", "--native", str(t.pid))
        plain = allocdiag("inspect", str(t.pid))
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if "stats.arenas.4096.pactive" in l)
    assert " pages (" in line, line
    assert "stats.arenas.4096.pactive" not in plain.stdout


def _without_terminal(*args):
    return allocdiag(*args, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("argv, instead", [
    (["top"], "`allocdiag ps`"), ([], "`allocdiag ps`"),
    # global options and top's own without the command (before: "unrecognized arguments")
    (["-v"], "`allocdiag ps`"), (["--no-cache", "--no-attach"], "`allocdiag ps`"),
    (["watch", "{pid}"], "`allocdiag inspect PID`"),
    (["replay", os.path.join(ROOT, "tests", "fixtures", "recording-wall-jemalloc.jsonl.gz")],
     "`allocdiag report FILE -o OUT.html`")])
def test_the_terminal_ui_without_a_terminal_says_what_to_run_instead(argv, instead):
    """Piped or redirected, the UI would write escape codes into the pipe and
    wait for keys that never come: it exits 2 and names the non-UI command."""
    argv = [a.replace("{pid}", str(os.getpid())) for a in argv]
    r = _without_terminal(*argv)
    assert r.returncode == 2, r.stderr
    assert "is a terminal UI, and stdin and stderr are not a terminal" in r.stderr
    assert instead in r.stderr and "\x1b[" not in r.stdout + r.stderr and "Traceback" not in r.stderr


def test_without_a_terminal_a_bad_input_is_said_first():
    """The pid or file is checked before the terminal: its own exit code."""
    assert _without_terminal("watch", "4194303").returncode == 3
    r = _without_terminal("replay", "/nonexistent/x.jsonl")
    assert r.returncode == 2 and "/nonexistent/x.jsonl" in r.stderr


def test_demo_without_a_terminal_prints_the_text_reports(monkeypatch, capsys):
    """`allocdiag demo` in a script or CI job falls back to --no-tui (and says
    so); under serve's web driver (TEXTUAL_DRIVER) it keeps the UI."""
    import argparse
    from diag import demo
    from diag.commands import demo as demo_command
    calls = []
    monkeypatch.setattr(demo, "run", lambda only, host_view: calls.append(host_view) or 0)
    monkeypatch.delenv("TEXTUAL_DRIVER", raising=False)
    args = argparse.Namespace(list=False, only=None, no_tui=False)
    with open(os.devnull) as devnull:
        monkeypatch.setattr(sys, "__stdin__", devnull)
        assert demo_command.run(args) == 0 and calls == [None]
        assert "not a terminal: the scenes' text reports follow" in capsys.readouterr().err
        monkeypatch.setenv("TEXTUAL_DRIVER", "textual.drivers.web_driver:WebDriver")
        assert demo_command.run(args) == 0 and calls[-1] is demo_command.host_view
