"""allocdiag exporter scraped by a real Prometheus server (Debian's
``prometheus`` 2.42): the jemalloc target's resident bytes, queried through
the HTTP API, agree with the allocator's own number within 2%."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import deps
from servers import free_port, wait_port
from targets import build_c, start

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRAPE_INTERVAL = "1s"
TOLERANCE = 0.02
GROUP = "je"

CONFIG = """\
global:
  scrape_interval: {interval}
  evaluation_interval: {interval}
scrape_configs:
  - job_name: allocdiag
    static_configs:
      - targets: ["127.0.0.1:{port}"]
"""


@contextlib.contextmanager
def process(argv, port, **kw):
    """ARGV started in its own session, listening on PORT; killed at the end."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True, **kw)
    try:
        wait_port(port, proc)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()


@contextlib.contextmanager
def prometheus(scrape_port):
    exe = deps.need("prometheus")
    with tempfile.TemporaryDirectory(prefix="prom") as tmp:
        cfg = os.path.join(tmp, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write(CONFIG.format(interval=SCRAPE_INTERVAL, port=scrape_port))
        port = free_port()
        argv = [exe, f"--config.file={cfg}", f"--storage.tsdb.path={tmp}/data",
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
        with process(argv, port):
            base = f"http://127.0.0.1:{port}"
            wait_ready(base)
            yield base


def wait_ready(base, timeout=20):
    """Prometheus answers queries (503 before) once /-/ready says 200."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=5) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def query(base, promql):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as resp:
        doc = json.load(resp)
    assert doc["status"] == "success", doc
    return {tuple(sorted(r["metric"].items())): float(r["value"][1])
            for r in doc["data"]["result"]}


def poll(base, promql, timeout=20):
    """The first non-empty result of PROMQL within TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = query(base, promql)
        if res:
            return res
        time.sleep(0.25)
    raise AssertionError(f"no result for {promql} after {timeout}s")


def inspect_resident(pid):
    r = subprocess.run([sys.executable, "-m", "diag", "inspect", "--json", str(pid)],
                       capture_output=True, text=True, cwd=ROOT, timeout=30)
    failed = {} if not r.stdout.startswith("{") else {
        name: c for name, c in json.loads(r.stdout)["collectors"].items() if not c["ok"]}
    assert r.returncode == 0, (r.stderr, failed)
    return json.loads(r.stdout)["stats"]["resident"]["value"]


def test_prometheus_scrapes_jemalloc_resident_within_two_percent():
    deps.need("promtool")
    # 32 MiB live in 64 KiB chunks under Debian's jemalloc, then idle
    with start([build_c("burst.c"), "32", "64", "1"], allocator="jemalloc") as t:
        port = free_port()
        argv = [sys.executable, "-m", "diag", "exporter", "--listen", f"127.0.0.1:{port}",
                "--target", str(t.pid), "--group", f"^burst={GROUP}", "--refresh", "1"]
        with process(argv, port, cwd=ROOT), prometheus(port) as prom:
            assert poll(prom, 'up{job="allocdiag"} == 1')
            series = poll(prom, f'allocdiag_allocator_resident_bytes{{group="{GROUP}"}}')
            truth = inspect_resident(t.pid)
            (labels, scraped), = series.items()
            assert dict(labels)["allocator"] == "jemalloc"
            assert truth > 32 << 20
            print(f"scraped {scraped:.0f} allocator {truth}")
            assert abs(scraped - truth) <= TOLERANCE * truth, (scraped, truth)
            # the stacked panel's query: the classes add up to the targets' RSS
            # (one query: two would read two scrapes when one lands between them)
            gap = query(prom, f'sum(allocdiag_memory_bytes{{group="{GROUP}"}}) - '
                              f'sum(allocdiag_target_rss_bytes{{group="{GROUP}"}})')
            assert list(gap.values()) == [0]
            # the pause counter is a counter Prometheus can rate()
            pause = poll(prom, f'allocdiag_target_pause_seconds_total{{group="{GROUP}"}}')
            assert list(pause.values())[0] > 0
