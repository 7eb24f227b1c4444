"""-v, --debug and --log-file: one logger per package, wired to stderr or a
file by the command line; silent without them."""

import os
import subprocess
import sys

from targets import build_c, start

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_LOGGERS = ("collectors.engine", "collectors.allocators")


def allocdiag(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "diag", *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), cwd="/", timeout=timeout)


def test_silent_without_the_flags():
    r = allocdiag("ps")
    assert r.returncode == 0
    assert " diag: " not in r.stderr and "allocdiag: allocdiag" not in r.stderr


def test_debug_log_file_gets_the_lines_and_stdout_keeps_the_table(tmp_path):
    log = tmp_path / "allocdiag.log"
    r = allocdiag("--debug", "--log-file", str(log), "ps")
    assert r.returncode == 0 and "PID" in r.stdout
    text = log.read_text()
    assert " diag: allocdiag " in text and "--log-file" in text
    assert " diag: " not in r.stderr


def test_log_file_that_cannot_be_written_is_a_usage_error(tmp_path):
    r = allocdiag("--log-file", str(tmp_path / "no" / "such" / "dir" / "x.log"), "ps")
    assert r.returncode == 2
    assert "No such file or directory" in r.stderr and "Traceback" not in r.stderr


def test_debug_shows_the_engine_and_the_allocator_decisions():
    """A real snapshot of a jemalloc process: the engine says which thread it
    borrowed, the allocator reader what it found, each under its package's
    logger name."""
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        r = allocdiag("--debug", "inspect", "--json", str(t.pid))
    assert r.returncode == 0, r.stderr
    for name in PACKAGE_LOGGERS:
        assert f" {name}: " in r.stderr, f"no {name} line in:\n{r.stderr[-3000:]}"


def test_verbose_says_the_decisions_in_one_line_each():
    """-v: which allocator serves malloc and how that was found, which thread
    was borrowed and for how long; no debug lines."""
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        r = allocdiag("-v", "inspect", "--json", str(t.pid))
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line]
    assert all(line.startswith("allocdiag: ") for line in lines), lines
    assert any(f"pid {t.pid}: malloc served by jemalloc (preload)" in line for line in lines), lines
    assert any("borrowed: stopped" in line and " us for " in line for line in lines), lines
    assert not any(" collectors.engine: " in line for line in lines)


def test_setup_twice_in_one_process_logs_each_line_once(capsys):
    """main() runs more than once in one process (in-process tests): each
    setup replaces the handler the last one installed, and a run without
    flags is silent again."""
    import logging
    import types
    from diag import cli
    flags = dict(debug=False, log_file=None)
    cli.setup_logging(types.SimpleNamespace(verbose=True, **flags))
    cli.setup_logging(types.SimpleNamespace(verbose=True, **flags))
    logging.getLogger("diag").info("one line")
    assert capsys.readouterr().err.count("allocdiag: one line") == 1
    cli.setup_logging(types.SimpleNamespace(verbose=False, **flags))
    logging.getLogger("diag").info("silent")
    assert "silent" not in capsys.readouterr().err
    assert len(logging.getLogger("collectors").handlers) == 1


def test_lazy_loggers_hand_lines_to_logging_once_it_is_there(caplog):
    """collectors.lazylog: with ``logging`` imported (pytest has), a line
    goes to the logger of the same name, recorded at its caller's line;
    isEnabledFor asks that logger."""
    import logging
    from collectors import lazylog
    log = lazylog.getLogger("collectors.test")
    with caplog.at_level(logging.DEBUG, logger="collectors.test"):
        log.debug("one %d", 1)
        log.info("two %s", "2")
        try:
            raise OSError("gone")
        except OSError:
            log.debug("with the exception", exc_info=True)
    assert [(r.levelname, r.getMessage(), r.funcName) for r in caplog.records] == [
        ("DEBUG", "one 1", "test_lazy_loggers_hand_lines_to_logging_once_it_is_there"),
        ("INFO", "two 2", "test_lazy_loggers_hand_lines_to_logging_once_it_is_there"),
        ("DEBUG", "with the exception",
         "test_lazy_loggers_hand_lines_to_logging_once_it_is_there")]
    assert caplog.records[-1].exc_info[1].args == ("gone",)
    logging.getLogger("collectors.test").setLevel(logging.INFO)
    assert log.isEnabledFor(lazylog.INFO) and not log.isEnabledFor(lazylog.DEBUG)


def test_without_logging_a_lazy_line_is_dropped_and_logging_stays_unimported():
    code = ("import sys\nfrom collectors import lazylog\nlog = lazylog.getLogger('diag')\n"
            "log.debug('x %d', 1); log.info('y')\n"
            "print(log.isEnabledFor(lazylog.DEBUG), 'logging' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert (r.stdout.strip(), r.stderr) == ("False False", "")
