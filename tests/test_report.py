"""``allocdiag report`` (and ``compare --html``) on real recordings.

A real target (tests/targets/burst.c under jemalloc: 96 MiB allocated, all
but every 4th chunk freed, then idle, so jemalloc keeps dirty pages) is
recorded for ~3 s through the real CLI with ``--release-at``, so the
recording holds snapshot lines and one release event line; ``release
--record`` appends a second event.  The page made from it is checked as
text (self-contained, the sections, the numbers), then rendered by headless
Chromium with networking unavailable: the DOM holds the SVG charts, the
screenshot's chart region is not blank, and Chromium's net log shows no
request made by the page.  A short real ``compare`` run gives the compare
page.  Bad input ends with exit 2 (the wrong file named) and one message
saying what was expected, never a traceback.
"""

import gzip
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import deps
from targets import build_c, preload_path, start

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
BURST_MIB = 96
CHROMIUM_TIMEOUT_S = 60
# Chromium with every network path closed: any request the page made would
# fail (and still show in the net log, which the test reads).
NO_NETWORK = ("--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
              "--disable-background-networking", "--disable-component-update",
              "--no-first-run")
WINDOW = (1280, 2400)


def allocdiag(*args, timeout=60, **kw):
    return subprocess.run([sys.executable, "-m", "diag", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(recording path, target pid) of a real jemalloc target recorded ~3 s,
    with a release 1.5 s in and one more appended by ``release --record``."""
    pytest.importorskip("matplotlib")
    preload_path("jemalloc")
    exe = build_c("burst.c")
    out = tmp_path_factory.mktemp("report") / "burst.jsonl.gz"
    with start([exe, str(BURST_MIB), "64", "4"], allocator="jemalloc") as t:
        res = allocdiag("record", str(t.pid), "-o", str(out), "--interval", "0.5",
                        "--duration", "3", "--release-at", "1.5", "--yes")
        assert res.returncode == 0, res.stderr
        res = allocdiag("release", "--yes", "--record", str(out), str(t.pid))
        assert res.returncode == 0, res.stderr
        pid = t.pid
    return out, pid


@pytest.fixture(scope="module")
def page(recorded, tmp_path_factory):
    out = tmp_path_factory.mktemp("page") / "report.html"
    res = allocdiag("report", str(recorded[0]), "-o", str(out))
    assert res.returncode == 0, res.stderr
    return out


# -- the recording ------------------------------------------------------------------

def test_event_lines_are_skipped_by_readers_and_replay(recorded):
    from diag.recording import read_recording, read_recording_events
    from diag.source import ReplaySource
    path, pid = recorded
    with gzip.open(path, "rt") as f:
        lines = [json.loads(line) for line in f]
    events = [d for d in lines if "event" in d]
    snaps = [d for d in lines if "event" not in d]
    assert len(events) == 2 and len(snaps) >= 6
    # snapshot lines are exactly inspect --json documents
    assert all(d["schema_version"] == 1 and d["pid"] == pid for d in snaps)
    assert len(read_recording(path)) == len(snaps)
    assert len(ReplaySource(path).backlog()) == len(snaps)
    got, evs = read_recording_events(path)
    assert [e["event"] for e in evs] == ["release", "release"]
    for e in evs:
        assert e["call"] == 'mallctl("arena.4096.purge")' and e["pid"] == pid
        assert e["before"].pid == pid and e["after"].taken_at >= e["before"].taken_at
    # the first release, 1.5 s in, purged jemalloc's dirty pages: RSS fell
    first = evs[0]
    assert first["before"].process.rss - first["after"].process.rss > 16 * MiB
    assert got[0].taken_at < first["taken_at"] < got[-1].taken_at


# -- the page as text -------------------------------------------------------------------

EXTERNAL = re.compile(r"""(?:\bsrc\s*=|\bhref\s*=|url\()\s*["']?\s*(?:https?:)?//""", re.I)


def external_references(text):
    """Everything in TEXT that would make a browser fetch something."""
    found = EXTERNAL.findall(text)
    found += re.findall(r"<script\b[^>]*\bsrc\s*=", text, re.I)
    found += re.findall(r"<link\b[^>]*>", text, re.I)
    found += re.findall(r"@import|@font-face", text, re.I)
    return found


def test_the_external_reference_check_catches_a_request():
    # the checker itself, on the kinds of reference a page could carry
    for bad in ('<img src="http://x/y.png">', "<style>a{background:url(https://x/y)}</style>",
                '<script src="a.js"></script>', '<link rel="stylesheet" href="//fonts.x/css">',
                "<style>@font-face{font-family:x}</style>"):
        assert external_references(bad), bad


def test_page_is_self_contained(page):
    text = page.read_text()
    assert external_references(text) == []
    assert "<script" not in text.lower()
    # every chart is inline SVG drawn by matplotlib, glyphs as paths (no <text>/font)
    svgs = re.findall(r"<svg\b.*?</svg>", text, re.S)
    assert len(svgs) >= 4          # stack over time, peak vs settled, two releases
    assert not re.search(r"<text\b", text) and "font-family" not in "".join(svgs)
    ids = re.findall(r'\bid="([^"]+)"', text)
    assert len(ids) == len(set(ids)), "ids repeat across charts"


def test_page_sections_and_numbers(page, recorded):
    from diag.recording import read_recording_events
    from diag.report import peak_settled, SETTLED_FRACTION
    text = page.read_text()
    snaps, events = read_recording_events(recorded[0])
    last = snaps[-1]
    for heading in ("Process and allocator", "The stack over time", "Peak vs settled",
                    "Findings", "Release"):
        assert f"<h2>{heading}</h2>" in text
    assert f"pid {recorded[1]}" in text and "jemalloc" in text
    assert last.allocator.path in text and last.preload.verdict in text
    # peak vs settled as defined: max, median of the last 20%
    rss = [s.process.rss for s in snaps]
    peak, settled = peak_settled(rss)
    assert peak == max(rss)
    n = max(1, round(len(rss) * SETTLED_FRACTION))
    assert f"the last {n} of {len(snaps)}" in text
    assert f"({peak:,} B)" in text and f"({settled:,} B)" in text
    # both releases, with before/after RSS in exact bytes
    assert text.count('mallctl(&quot;arena.4096.purge&quot;) at') == 2
    for e in events:
        assert f"({e['before'].process.rss:,} B)" in text
        assert f"({e['after'].process.rss:,} B)" in text


def test_findings_show_knob_and_evidence_with_units(page, recorded):
    from diag.recording import read_recording_events
    snaps, _ = read_recording_events(recorded[0])
    text = page.read_text()
    found = {f.id: f for s in snaps for f in s.findings}
    if not found:
        assert "None: no rule fired" in text
        return
    for f in found.values():
        assert f.id in text
        if f.knob is not None:
            assert f"<dd>{f.knob.name}</dd>" in text
        for k, v in f.evidence.items():
            assert f"<td>{k}</td>" in text
    # a byte-valued evidence field is shown in bytes, binary units and share of RSS
    assert re.search(r"[\d,]+ B \([\d.]+ MiB\) = [\d.]+% of RSS</td><td>bytes", text)


def test_evidence_units_come_from_fields():
    from diag.render import evidence_text, evidence_unit
    assert evidence_unit("rss_anon") == "bytes" and evidence_unit("allocator_resident") == "bytes"
    assert evidence_unit("arenas") == "count"            # diag.fields runtime layer
    assert evidence_unit("lazyfree_pct_of_rss") == "percent"
    assert evidence_unit("cause") is None
    assert evidence_text("lazyfree", 3 * MiB, rss=12 * MiB) == \
        "3,145,728 B (3.0 MiB) = 25.0% of RSS"
    assert evidence_text("ratio", 1.5) == "1.5×"


def test_peak_settled_definition():
    from diag.report import peak_settled
    # nine known samples: settled = median of the last round(1.8) = 2 (4, 6)
    vals = [5, 9, 7, 3, None, 2, 2, 2, 4, 6]
    assert peak_settled(vals) == (9, 5)
    assert peak_settled([None, 7]) == (7, 7)
    assert peak_settled([None]) == (None, None)


def test_plain_and_gzip_recordings_give_the_same_page(recorded, tmp_path):
    plain = tmp_path / "burst.jsonl"
    with gzip.open(recorded[0], "rb") as f:
        plain.write_bytes(f.read())
    a, b = tmp_path / "a.html", tmp_path / "b.html"
    assert allocdiag("report", str(plain), "-o", str(a)).returncode == 0
    assert allocdiag("report", str(recorded[0]), "-o", str(b)).returncode == 0

    def body(p):    # the pages differ only in their name and the time they were made
        t = p.read_text()
        t = re.sub(r"made by allocdiag report, [^<]*", "", t)
        t = re.sub(r"burst\.jsonl(\.gz)?", "", t)
        return re.sub(r'\b(id="|#)c\d+-', r"\1", t)
    assert body(a) == body(b)


# -- bad input ------------------------------------------------------------------------------

def test_bad_input_exit_2_says_what_was_expected(recorded, tmp_path, capsys):
    from diag.cli import main      # in process: seven cases, one matplotlib import
    with gzip.open(recorded[0], "rt") as f:
        real = f.read()
    cases = {
        "empty.jsonl": b"",
        "text.jsonl": b"hello, not a recording\n",
        "truncated.jsonl": real[: len(real) // 2].encode(),
        "notgzip.jsonl.gz": b"plain text with a .gz name\n",
        "cut.jsonl.gz": gzip.compress(real.encode())[:200],
        "list.json": b"[1, 2, 3]\n",
        "badcompare.json": b'{\n "kind": "compare"\n',
    }
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        code = main(["report", str(p), "-o", str(tmp_path / "x.html")])
        err = capsys.readouterr().err
        assert code == 2, (name, err)       # the wrong file named: a usage error
        assert "expected a recording" in err or "truncated (the recording was cut off" in err, name
        assert "Traceback" not in err and err.startswith("allocdiag: "), name
        assert str(p) in err, name
    assert not (tmp_path / "x.html").exists()


def _without(module):
    """Python code that makes MODULE unimportable, then runs the CLI."""
    return (f"import sys; sys.modules[{module!r}] = None\n"
            "from diag.cli import main; sys.exit(main(sys.argv[1:]))")


def test_missing_matplotlib_names_the_extra(recorded, tmp_path):
    res = subprocess.run([sys.executable, "-c", _without("matplotlib"), "report",
                          str(recorded[0]), "-o", str(tmp_path / "x.html")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "pip install 'allocdiag[report]'" in res.stderr and "matplotlib" in res.stderr


# -- in a browser ---------------------------------------------------------------------------

def chromium(*args, timeout=CHROMIUM_TIMEOUT_S):
    exe = deps.need("chromium")
    argv = [exe, "--headless", "--disable-gpu", "--hide-scrollbars", *NO_NETWORK, *args]
    if os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def page_requests(netlog):
    """URLs the page itself asked for, from a Chromium net log (requests whose
    site-for-cookies is the file:// page; Chromium's own service traffic is not)."""
    with open(netlog) as f:
        log = json.load(f)
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [e["params"]["url"] for e in log["events"]
            if e["type"] == start_job and "file://" in str(e["params"].get("site_for_cookies"))]


def _colours(png, box=None):
    """[(count, (r, g, b))] of PNG (or of BOX in it), counted by Pillow in C."""
    from PIL import Image       # matplotlib's own dependency: there whenever it is
    with Image.open(png) as im:
        im = im.convert("RGB")
        if box:
            im = im.crop(box)
        return im.getcolors(maxcolors=im.width * im.height)


def non_white_share(png, box):
    """Share of pixels in BOX (left, top, right, bottom) of PNG that are not white."""
    colours = _colours(png, box)
    return sum(n for n, c in colours if min(c) < 240) / sum(n for n, _c in colours)


def pixels_of_colour(png, hex_colour, tolerance=24):
    """How many pixels of PNG are within TOLERANCE of HEX_COLOUR ("#rrggbb")."""
    want = bytes.fromhex(hex_colour[1:])
    return sum(n for n, c in _colours(png) if all(abs(a - b) <= tolerance
                                                   for a, b in zip(c, want)))


def test_net_log_check_sees_a_page_request(tmp_path):
    # positive control: a page with one external image is caught by page_requests
    bad = tmp_path / "bad.html"
    bad.write_text('<html><body><img src="http://example.invalid/x.png"></body></html>')
    netlog = tmp_path / "net.json"
    res = chromium(f"--log-net-log={netlog}", "--dump-dom", bad.as_uri())
    assert res.returncode == 0, res.stderr
    assert page_requests(netlog) == ["http://example.invalid/x.png"]


def test_chromium_renders_the_charts_offline(recorded, page, tmp_path):
    netlog = tmp_path / "net.json"
    res = chromium(f"--log-net-log={netlog}", "--dump-dom", page.as_uri())
    assert res.returncode == 0, res.stderr
    dom = res.stdout
    # the SVG charts are in the live DOM, with drawn paths in them
    assert len(re.findall(r"<svg\b", dom)) >= 4
    assert len(re.findall(r"<path\b", dom)) > 100
    assert page_requests(netlog) == []
    shot = tmp_path / "report.png"
    res = chromium(f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                   page.as_uri())
    assert res.returncode == 0 and shot.exists(), res.stderr
    keep = os.environ.get("ALLOCDIAG_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)
    # the stack chart sits below the identity block: lines, axes and labels
    # cover a fair share of it; a page without its charts is white there
    chart = (80, 450, 1200, 1000)
    assert non_white_share(shot, chart) > 0.02
    # and the whole page is not one colour
    assert 0.02 < non_white_share(shot, (0, 0, WINDOW[0], WINDOW[1])) < 0.9
    # the plotted series are there in their own colours (no text has them):
    # anon and resident lines, peak/settled bars
    from diag.recording import read_recording
    from diag.report_charts import COLORS, PAIR_COLORS
    plotted = [COLORS["rss_anon"], COLORS["resident"], *PAIR_COLORS]
    if any(s.cgroup.working_set is not None for s in read_recording(recorded[0])):
        plotted.append(COLORS["working_set"])   # no memory cgroup in some chroots/CI runners
    for colour in plotted:
        assert pixels_of_colour(shot, colour) > 300, colour


# -- compare ------------------------------------------------------------------------------------

WORKLOAD = """\
import time
bufs = [bytearray(4096 + (i % 9) * 256) for i in range(9000)]
time.sleep(0.6)
del bufs[: 3 * len(bufs) // 4]
print("DONE", flush=True)
time.sleep(60)
"""


def test_compare_html_from_a_real_run(tmp_path):
    pytest.importorskip("matplotlib")
    preload_path("jemalloc")
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    out, doc_path = tmp_path / "cmp.html", tmp_path / "cmp.json"
    res = allocdiag("compare", "--html", str(out), "-o", str(doc_path),
                    "--variants", "glibc", "jemalloc", "--warmup-seconds", "0",
                    "--idle-after", "^DONE", "--idle-seconds", "1.5", "--interval", "0.5",
                    "--timeout", "15", "--", "/usr/bin/python3", str(script), timeout=90)
    assert res.returncode == 0, res.stderr
    doc = json.loads(doc_path.read_text())
    text = out.read_text()
    assert external_references(text) == []
    assert "<h2>Over time</h2>" in text and "<h2>Peak vs settled</h2>" in text
    for v in doc["variants"]:
        assert f"<td>{v['name']}</td>" in text
        assert len(v["runs"][0]["samples"]) >= 3
    # two charts: per-variant lines (RSS, anon, LazyFree, allocator resident) and bars
    assert len(re.findall(r"<svg\b", text)) == 2
    # the saved document gives the same page through `allocdiag report`
    again = tmp_path / "again.html"
    res = allocdiag("report", str(doc_path), "-o", str(again))
    assert res.returncode == 0 and "compare report" in res.stderr
    assert len(re.findall(r"<svg\b", again.read_text())) == 2


# -- the captured fixture, and the record/report options ----------------------------------------

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "recording-jemalloc-burst-release.jsonl.gz")


def test_fixture_with_and_without_its_release_event(tmp_path):
    pytest.importorskip("matplotlib")
    with gzip.open(FIXTURE, "rt") as f:
        lines = f.readlines()
    only_snaps = tmp_path / "old.jsonl"       # what a recording made before events looks like
    only_snaps.write_text("".join(line for line in lines if not line.startswith('{"event"')))
    assert len(only_snaps.read_text().splitlines()) == len(lines) - 1
    for src, releases in ((FIXTURE, 1), (only_snaps, 0)):
        out = tmp_path / "r.html"
        res = allocdiag("report", str(src), "-o", str(out))
        assert res.returncode == 0, res.stderr
        text = out.read_text()
        assert text.count('mallctl(&quot;arena.4096.purge&quot;) at') == releases
        if not releases:
            assert "No release in this recording" in text


def test_unreadable_paths_are_usage_errors(tmp_path):
    res = allocdiag("report", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "x.html"))
    assert res.returncode == 2 and "No such file" in res.stderr and "Traceback" not in res.stderr
    res = allocdiag("report", FIXTURE, "-o", str(tmp_path / "no" / "x.html"))
    assert res.returncode == 2 and f"{tmp_path / 'no' / 'x.html'}:" in res.stderr


def test_record_release_at_checks_before_recording(tmp_path):
    out = tmp_path / "r.jsonl"
    pid = str(os.getpid())
    res = allocdiag("record", pid, "-o", str(out), "--duration", "2", "--release-at", "3", "--yes")
    assert res.returncode == 2 and "--release-at must be between" in res.stderr
    res = allocdiag("record", pid, "-o", str(out), "--no-attach", "--release-at", "1", "--yes")
    assert res.returncode == 2 and "--no-attach" in res.stderr
    # no terminal to ask on and no --yes: refused, nothing recorded
    res = allocdiag("record", pid, "-o", str(out), "--duration", "2", "--release-at", "1",
                    stdin=subprocess.DEVNULL)
    assert res.returncode == 2 and "refusing without --yes" in res.stderr
    assert not out.exists()
