#!/usr/bin/env python3
"""staircase.py -- the fragmentation staircase of a long-lived service.

Field situation: a service keeps a bounded set of in-flight/cached buffers;
every request allocates a few new 4-64 KiB buffers and frees a random subset
of the old ones.  Under load the live set is constant, yet RSS climbs; when
traffic stops and most buffers are released, RSS does not come down; the next
busy period (with somewhat larger messages) climbs to a new, higher step.
The graph looks like a staircase and gets reported as a leak.  It is
fragmentation: freed holes are scattered between survivors, too small for
the next, larger buffers, and pinned in place by the survivors.

Structure:
  * an http.server on 127.0.0.1 (port 0 = a free port; --port to choose) in a
    thread: GET /stats -> JSON (phase, live buffers/bytes, rss, lazyfree),
    GET /request -> runs one request against the same live set;
  * the main thread runs --phases N (4) cycles of
        load: up to --requests (20000) requests or --load-seconds (5 s),
              whichever comes first; phase k draws sizes from
              [4 KiB, min(64 KiB, 16 KiB * (k+1))], keeps <= --live (2000)
              buffers, freeing random ones to make room;
        idle: drop a random 90% of the live set (--idle-keep 0.1), sleep
              --idle-seconds (5 s);
    then stays idle until killed.
Buffers are bytearrays of >= 4 KiB, so they come from malloc (pymalloc only
serves objects <= 512 bytes).

Lines:
  PHASE load n=K size_hi=B
  READY port=P phase=1 live=N live_bytes=B rss=B   (after the first load phase)
  PHASE idle n=K live=N live_bytes=B rss=B rss_anon=B lazyfree=B requests=N
  PHASE done rss=B                                    (after the last idle phase)

What allocdiag should show (idle phases): RSS several times the live bytes;
glibc: most of it free-in-bins of the main arena (the load loop runs in the
main thread) with a small keepcost, malloc_trim(0) returns only part
(survivors pin pages); jemalloc: dirty pages that decay only with activity
(no background thread) -- advice background_thread:true; a "fragmentation,
not a leak" finding with live vs held bytes.

Measured here (Python 3.11, defaults but --idle-seconds 2; RSS in MB at
each idle phase, while only 2.0 / 3.7 / 5.1 / 7.0 MB are live):
  glibc:     44.2 -> 62.0 -> 77.7 ->  96.7
  jemalloc:  53.4 -> 77.2 -> 97.3 -> 123.9   (no LazyFree: muzzy decay is 0)
Each load phase itself holds ~20-70 MB live (2000 buffers).
"""

import argparse
import json
import os
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _procmem import exit_on_signals, memory, say  # noqa: E402

KiB = 1024


class Service:
    def __init__(self, max_live, seed=1):
        self.max_live = max_live
        self.live = []
        self.live_bytes = 0
        self.size_hi = 16 * KiB
        self.phase = "start"
        self.requests = 0
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def request(self):
        """One request: 4 new buffers in, random old ones out to stay bounded."""
        with self.lock:
            rng = self.rng
            for _ in range(4):
                n = rng.randint(4 * KiB, self.size_hi)
                buf = bytearray(n)             # malloc + zero-fill: resident
                buf[0] = buf[-1] = 1
                self.live.append(buf)
                self.live_bytes += n
            while len(self.live) > self.max_live:
                self._drop(rng.randrange(len(self.live)))
            self.requests += 1

    def _drop(self, i):
        last = self.live.pop()                  # swap-remove: O(1)
        if i < len(self.live):
            last, self.live[i] = self.live[i], last
        self.live_bytes -= len(last)

    def shrink(self, keep_fraction):
        with self.lock:
            keep = int(len(self.live) * keep_fraction)
            while len(self.live) > keep:
                self._drop(self.rng.randrange(len(self.live)))

    def stats(self):
        with self.lock:
            d = {"phase": self.phase, "live": len(self.live),
                 "live_bytes": self.live_bytes, "requests": self.requests,
                 "size_hi": self.size_hi}
        d.update(memory())
        return d


def make_handler(service):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/stats"):
                body = json.dumps(service.stats()).encode()
            elif self.path.startswith("/request"):
                service.request()
                body = b'{"ok": true}'
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    return Handler


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0, help="0 = any free port")
    ap.add_argument("--phases", type=int, default=4)
    ap.add_argument("--requests", type=int, default=20000, help="per load phase")
    ap.add_argument("--load-seconds", type=float, default=5.0)
    ap.add_argument("--idle-seconds", type=float, default=5.0)
    ap.add_argument("--live", type=int, default=2000, help="max live buffers")
    ap.add_argument("--idle-keep", type=float, default=0.1)
    opts = ap.parse_args()
    exit_on_signals()

    service = Service(opts.live)
    server = HTTPServer(("127.0.0.1", opts.port), make_handler(service))
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    port = server.server_address[1]

    for k in range(opts.phases):
        service.size_hi = min(64 * KiB, 16 * KiB * (k + 1))
        service.phase = "load"
        say("PHASE load", n=k + 1, size_hi=service.size_hi)
        end = time.monotonic() + opts.load_seconds
        for i in range(opts.requests):
            service.request()
            if i % 256 == 0 and time.monotonic() > end:
                break
        if k == 0:
            s = service.stats()
            say("READY", port=port, phase=1, live=s["live"],
                live_bytes=s["live_bytes"], rss=s["rss"])
        service.shrink(opts.idle_keep)
        service.phase = "idle"
        s = service.stats()
        say("PHASE idle", n=k + 1, live=s["live"], live_bytes=s["live_bytes"],
            rss=s["rss"], rss_anon=s["rss_anon"], lazyfree=s["lazyfree"],
            requests=s["requests"])
        time.sleep(opts.idle_seconds)
    say("PHASE done", rss=memory()["rss"])
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
