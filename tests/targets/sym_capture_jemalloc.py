"""Capture a jemalloc threaded heap profile with named threads and
``prof_accum`` (the alloc columns filled), from python3 itself:

    MALLOC_CONF=prof:true,prof_accum:true,lg_prof_sample:16 \
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 \
    python3 tests/targets/sym_capture_jemalloc.py OUT.heap

(produced tests/fixtures/heap-jemalloc-threads-accum-python.heap)."""
import ctypes
import sys
import threading

mallctl = ctypes.CDLL(None).mallctl
mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                    ctypes.c_size_t]
keep = []


def work(name, n):
    nm = ctypes.c_char_p(name.encode())
    mallctl(b"thread.prof.name", None, None, ctypes.addressof(nm), ctypes.sizeof(nm))
    for _ in range(n):
        keep.append(bytearray(200000))


threads = [threading.Thread(target=work, args=(f"worker{i}", 20 + i)) for i in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
path = ctypes.c_char_p(sys.argv[1].encode())
sys.exit(mallctl(b"prof.dump", None, None, ctypes.addressof(path), ctypes.sizeof(path)))
