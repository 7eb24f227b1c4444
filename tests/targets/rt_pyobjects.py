"""Truth target for the pymalloc walk: builds a known population of small
objects, frees a part of it (leaving partly used pools and arenas), prints
its own ``sys._debugmallocstats()`` to stderr, then ``READY`` and blocks.

argv: N (objects per kind, default 100000).  Runs under any CPython 3.x,
with no imports outside the standard library.  Stays idle after READY so
that its printed numbers remain exact while it is read from outside;
with a second argument "serve" a thread keeps timing 1 ms sleeps and prints
its longest gap when stdin closes.
"""
import sys
import threading
import time

n = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
keep = []
for i in range(n):
    keep.append((i, i + 1))              # 2-tuples: 56 B -> 64 B class
    keep.append(str(i) * 3)              # short str of several sizes
    keep.append([i])                     # list objects (GC header) + items
    keep.append({"k": i} if i % 4 == 0 else float(i))
# free every third object: partly used pools everywhere
for i in range(0, len(keep), 3):
    keep[i] = None

serve = len(sys.argv) > 2 and sys.argv[2] == "serve"
gaps = [0.0]
stop = threading.Event()


def server():
    last = time.perf_counter()
    while not stop.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        gaps[0] = max(gaps[0], now - last)
        last = now


if serve:
    t = threading.Thread(target=server, daemon=True)
    t.start()
    time.sleep(0.2)
sys._debugmallocstats()
sys.stderr.flush()
print("READY", flush=True)
if serve:
    sys.stdin.readline()            # the test closes stdin after its reads
    gaps[0] = 0.0
    time.sleep(1.0)                 # a no-read baseline of the same length
    base = gaps[0]
    print(f"BASE {base:.6f}", flush=True)
    sys.stdin.readline()
    stop.set()
else:
    sys.stdin.read()
