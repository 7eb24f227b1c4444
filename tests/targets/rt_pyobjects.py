"""Truth target for the pymalloc walk: builds a known population of small
objects, prints its own ``sys._debugmallocstats()`` (to stderr), then
``READY``, and stays idle so that the printed numbers remain exact while it
is read from outside.  Standard library only; runs under any CPython 3.x.

argv: N (objects per kind, default 100000), MODE:
  plain  every third object freed: partly used pools everywhere (default);
  frag   all but one object in 64 freed: arenas stay mapped, mostly empty;
  churn  as plain, then keeps allocating and freeing objects (arenas come
         and go) until killed: the walk must give a checked number or unknown;
  serve  as plain, plus a thread that times 1 ms sleeps.  After READY, each
         line on stdin ends a phase: the target prints "GAP <longest gap in
         seconds>" for the phase that just ended (the test reads from
         outside during the first phase and does nothing during the second).
"""
import sys
import threading
import time

n = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
mode = sys.argv[2] if len(sys.argv) > 2 else "plain"
keep = []
for i in range(n):
    keep.append((i, i + 1))              # 2-tuples: 64 B class
    keep.append(str(i) * 3)              # short str of several sizes
    keep.append([i])                     # list objects (GC header) + items
    keep.append({"k": i} if i % 4 == 0 else float(i))
step = 3 if mode != "frag" else None
if mode == "frag":
    keep = keep[::64]
else:
    for i in range(0, len(keep), step):
        keep[i] = None

gap = [0.0]
stop = threading.Event()


def server():
    last = time.perf_counter()
    while not stop.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        gap[0] = max(gap[0], now - last)
        last = now


if mode == "serve":
    threading.Thread(target=server, daemon=True).start()
    time.sleep(0.2)
sys._debugmallocstats()
sys.stderr.flush()
gap[0] = 0.0             # the first phase starts now
print("READY", flush=True)
if mode == "serve":
    for line in sys.stdin:
        print(f"GAP {gap[0]:.6f}", flush=True)
        gap[0] = 0.0
    stop.set()
elif mode == "churn":
    k = 0
    while True:
        batch = [(j, k) for j in range(20000)] + [str(j) * (k % 40) for j in range(5000)]
        keep.append(batch)
        if len(keep) > 60:
            del keep[-50:]       # frees whole arenas now and then
        k += 1
else:
    sys.stdin.read()
