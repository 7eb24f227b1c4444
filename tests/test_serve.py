"""``allocdiag serve``: the TUI in a browser through textual-serve.

The server is started for real on a free loopback port with ``replay`` of a
captured recording (tests/fixtures/recording-jemalloc-burst-release.jsonl.gz);
the page is fetched over HTTP, the websocket is driven as the page's script
does (the app process starts and draws the process view of the recorded
pid), and headless Chromium, driven over its DevTools protocol, loads the
page and shows the TUI after the app's first bytes.  The server's process
group is killed at the end, whatever happened.
"""

import asyncio
import base64
import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import deps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "recording-jemalloc-burst-release.jsonl.gz")
START_TIMEOUT_S = 20
APP_TIMEOUT_S = 25
ANSI = re.compile(r"\x1b(?:\[[0-9;?$<>=]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-_])")

pytest.importorskip("textual_serve")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_addresses(port):
    """Local addresses of the TCP sockets listening on PORT (/proc/net/tcp*)."""
    out = []
    for name, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(name) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, p = local.split(":")
                if state == "0A" and int(p, 16) == port:     # 0A = LISTEN
                    out.append(addr)
    return out


@contextlib.contextmanager
def serve(*view, port=None):
    """A running ``allocdiag serve --port PORT VIEW``; yields (port, proc)."""
    port = port or free_port()
    proc = subprocess.Popen([sys.executable, "-m", "diag", "serve", "--port", str(port), *view],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                break
            assert time.monotonic() < deadline, "serve did not listen"
            time.sleep(0.2)
        yield port, proc
    finally:
        # the server and every app process it started (same session)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


@pytest.fixture(scope="module")
def server():
    with serve("replay", FIXTURE) as (port, proc):
        yield port


def recorded_pid():
    from diag.recording import read_recording
    return read_recording(FIXTURE)[0].pid


def test_page_is_the_textual_serve_page_on_loopback(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server}/", timeout=10) as r:
        assert r.status == 200
        page = r.read().decode()
    assert f'data-session-websocket-url="ws://127.0.0.1:{server}/ws"' in page
    assert "/static/js/textual.js" in page
    assert f"<div>allocdiag replay {FIXTURE}</div>" in page
    # bound to loopback only (127.0.0.1 in /proc/net/tcp's little-endian hex)
    assert listening_addresses(server) == ["0100007F"]


async def _app_screen(port, want, timeout=APP_TIMEOUT_S):
    """Text the app draws over the websocket until every string in WANT shows."""
    import aiohttp
    text = ""
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(f"ws://127.0.0.1:{port}/ws?width=120&height=40") as ws:
            await ws.send_str(json.dumps(["resize", {"width": 120, "height": 40}]))
            raw = b""
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not all(w in text for w in want):
                try:
                    msg = await ws.receive(timeout=1)
                except asyncio.TimeoutError:
                    continue
                if msg.type == aiohttp.WSMsgType.BINARY:
                    raw += msg.data
                    text = ANSI.sub("", raw.decode(errors="replace"))
                elif msg.type != aiohttp.WSMsgType.TEXT:
                    break
    return text


def test_websocket_starts_the_app_on_the_recording(server):
    pid = recorded_pid()
    want = (f"allocdiag · {pid}", "jemalloc", "RSS", "Findings")
    text = asyncio.run(_app_screen(server, want))
    for w in want:
        assert w in text, (w, text[-2000:])


class DevTools:
    """Headless Chromium driven over its DevTools protocol (CDP, one websocket)."""

    def __init__(self, ws):
        self.ws, self.next_id, self.session = ws, 0, None

    async def call(self, method, params=None, session=True):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        await self.ws.send_str(json.dumps(msg))
        while True:
            reply = json.loads((await self.ws.receive(timeout=30)).data)
            if reply.get("id") == self.next_id:     # events have no id
                assert "error" not in reply, reply
                return reply["result"]


def _devtools_url(proc, timeout=START_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    buf = ""
    while time.monotonic() < deadline:
        r, _, _ = select.select([proc.stderr], [], [], 0.5)
        if r:
            chunk = os.read(proc.stderr.fileno(), 65536).decode(errors="replace")
            assert chunk, f"chromium exited: {buf}"
            buf += chunk
            m = re.search(r"DevTools listening on (ws://\S+)", buf)
            if m:
                return m.group(1)
    raise AssertionError(f"no DevTools URL from chromium: {buf}")


async def _browser_shot(url, png, tmp):
    """Load URL in headless Chromium; after the app's first bytes reached the
    page, screenshot it to PNG.  Returns the terminal's text where the page
    exposes it (xterm's accessibility tree), else ""."""
    import aiohttp
    argv = [deps.need("chromium"), "--headless", "--disable-gpu", "--remote-debugging-port=0",
            f"--user-data-dir={tmp}", "--window-size=1280,900", "--no-first-run",
            "--disable-background-networking", "about:blank"]
    if os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        browser = _devtools_url(proc)
        async with aiohttp.ClientSession() as s, s.ws_connect(browser, max_msg_size=0) as ws:
            cdp = DevTools(ws)
            target = (await cdp.call("Target.createTarget", {"url": url}))["targetId"]
            cdp.session = (await cdp.call("Target.attachToTarget",
                                          {"targetId": target, "flatten": True}))["sessionId"]
            deadline = time.monotonic() + APP_TIMEOUT_S
            started = False
            while time.monotonic() < deadline and not started:
                r = await cdp.call("Runtime.evaluate", {"expression": (
                    "document.body && document.body.classList.contains('-first-byte')"),
                    "returnByValue": True})
                started = r["result"].get("value") is True
                await asyncio.sleep(0.5)
            assert started, "the page never received the app's first bytes"
            await asyncio.sleep(3)       # let the first full screen paint
            shot = await cdp.call("Page.captureScreenshot", {"format": "png"})
            with open(png, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
            r = await cdp.call("Runtime.evaluate", {"expression": (
                "Array.from(document.querySelectorAll('.xterm-rows, .xterm-accessibility'))"
                ".map(e => e.innerText).join('\\n')"), "returnByValue": True})
            return r["result"].get("value") or ""
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()


def bright_share(png, box):
    """Share of pixels in BOX of PNG brighter than the page's dark background."""
    from PIL import Image       # matplotlib's dependency; the test extra has it
    with Image.open(png) as im:
        region = im.convert("RGB").crop(box)
        colours = region.getcolors(maxcolors=region.width * region.height)
    return sum(n for n, c in colours if max(c) > 100) / sum(n for n, _c in colours)


def test_chromium_shows_the_tui(server, tmp_path):
    pytest.importorskip("PIL")
    png = tmp_path / "serve.png"
    text = asyncio.run(_browser_shot(f"http://127.0.0.1:{server}/", png, tmp_path / "profile"))
    keep = os.environ.get("ALLOCDIAG_KEEP_SCREENSHOT")
    if keep:
        import shutil
        shutil.copy(png, keep.replace(".png", "-serve.png"))
    if text:
        assert "jemalloc" in text
    # the intro dialog is a small box in the middle of a dark page; the TUI
    # fills the page with text and bars: a band across the top is lit
    assert bright_share(png, (0, 0, 1280, 300)) > 0.03


# -- errors -------------------------------------------------------------------------------

def allocdiag(*args, code=None):
    argv = [sys.executable, "-m", "diag", *args] if code is None else \
        [sys.executable, "-c", code, *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_missing_textual_serve_names_the_extra():
    res = allocdiag("serve", "--port", str(free_port()), code=(
        "import sys; sys.modules['textual_serve'] = None; sys.modules['textual_serve.server'] "
        "= None\nfrom diag.cli import main; sys.exit(main(sys.argv[1:]))"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "pip install 'allocdiag[serve]'" in res.stderr


def test_bad_view_and_bad_recording_fail_before_serving(tmp_path):
    res = allocdiag("serve", "--port", str(free_port()), "inspect", "1")
    assert res.returncode == 2 and "the views are top, watch, replay, demo" in res.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not a recording\n")
    res = allocdiag("serve", "--port", str(free_port()), "replay", str(bad))
    assert res.returncode == 2 and str(bad) in res.stderr and "Traceback" not in res.stderr
    res = allocdiag("serve", "--port", str(free_port()), "watch", "999999999")
    assert res.returncode == 3
    # the view's options too (before: a server whose every view failed)
    res = allocdiag("serve", "--port", str(free_port()), "top", "--bogus")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "allocdiag top: error: unrecognized arguments: --bogus" in res.stderr
    res = allocdiag("serve", "--port", str(free_port()), "watch", "1", "--interval", "0")
    assert res.returncode == 2 and "--interval: must be at least 0.2 seconds" in res.stderr
