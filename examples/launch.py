#!/usr/bin/env python3
"""Run one allocdiag example workload under a chosen allocator.

    python3 examples/launch.py WORKLOAD [--allocator glibc|jemalloc|tcmalloc|
        tcmalloc_minimal|mimalloc] [--env K=V ...] [--timeout S] [workload args]
    python3 examples/launch.py --list

What it does:
  * sets LD_PRELOAD to the allocator's Debian path (none for glibc) and drops an
    inherited LD_PRELOAD / MALLOC_CONF so runs are reproducible; workload
    defaults (e.g. lying_rss's MALLOC_CONF under jemalloc) come next and
    ``--env K=V`` overrides everything;
  * builds C workloads with gcc on demand into a cache directory
    ($ALLOCDIAG_EXAMPLES_CACHE, else $XDG_CACHE_HOME/allocdiag/examples, else
    /tmp/allocdiag-examples-UID), keyed by a hash of the source and flags;
  * starts the workload in its own session and prints machine-readable lines:
        PID <pid>
        READY <workload> <details>        once the workload reached its state
    Every other line the workload prints (PHASE ..., RESULT ..., TRIM ...) is
    passed through unchanged; its stderr is inherited.
  * stays in the foreground forwarding INT/TERM/HUP/QUIT/USR1/USR2 to the
    workload until it exits, and exits with its status (Ctrl-C stops it: the
    workloads exit 0 on SIGINT/SIGTERM).

Library use (the ``allocdiag demo`` command, docs and tests):

    from examples.launch import WORKLOADS, start, wait_ready, stop
    proc = start("glibc_held", "glibc", args=["--count", "40000"])
    try:
        details = wait_ready(proc, timeout=30)      # "held=... rss=..."
        fields = parse_fields(details)              # {"held": "...", ...}
    finally:
        stop(proc)
"""

import argparse
import ctypes
import hashlib
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
LIBDIR = "/usr/lib/x86_64-linux-gnu"

# allocator name -> (LD_PRELOAD path or None, Debian package that ships it)
ALLOCATORS = {
    "glibc": (None, "libc6"),
    "jemalloc": (f"{LIBDIR}/libjemalloc.so.2", "libjemalloc2"),
    "tcmalloc": (f"{LIBDIR}/libtcmalloc.so.4", "libgoogle-perftools4"),
    "tcmalloc_minimal": (f"{LIBDIR}/libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
    "mimalloc": (f"{LIBDIR}/libmimalloc.so.2", "libmimalloc2.0"),
}

# The jemalloc configuration under which freed pages become LazyFree and stay
# in RSS (see DESIGN.md "Measured facts" and reference §4.2).
LAZY_JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:-1"

C_FLAGS = ("-O1", "-g", "-pthread", "-Wall", "-Wextra")


@dataclass(frozen=True)
class Workload:
    name: str
    source: str                 # path relative to examples/
    language: str               # "python" or "c" (the driver's language)
    description: str            # the field situation it reproduces
    shows: str                  # what allocdiag should show for it
    ready: str                  # the READY line's fields
    env: dict = field(default_factory=dict)   # allocator name or "*" -> {K: V}
    libs: tuple = ()            # extra link arguments for C workloads

    def default_env(self, allocator):
        out = dict(self.env.get("*", {}))
        out.update(self.env.get(allocator, {}))
        return out

    def as_dict(self):
        return {"name": self.name, "source": self.source, "language": self.language,
                "description": self.description, "shows": self.shows,
                "ready": self.ready}


WORKLOADS = {w.name: w for w in [
    Workload(
        "alloc_wall", "alloc_wall.py", "python",
        "Allocation wall: a JSON-shaped request handler that builds fresh dicts, "
        "lists, strings and an 8-256 KiB response buffer per request, against the same work on pooled, reused "
        "objects; throughput and p50/p99/p99.9 latency from a log-bucket histogram.",
        "A busy process whose allocator is a hot path: high allocation rate, "
        "small steady live set; the allocator's own stats (nmalloc rates for "
        "jemalloc) dwarf 'allocated'. Under CPython most objects are <=512 B and "
        "go to pymalloc; run with --env PYTHONMALLOC=malloc to hand them all to "
        "the preloaded allocator.",
        "READY mode=M seconds=S ops_s=N p50_us=X p99_us=X p999_us=X [pooled_*]"),
    Workload(
        "footprint", "footprint.py", "python",
        "Four-allocator footprint: build many dict-of-lists records, drop half, "
        "report time, RSS, RssAnon and LazyFree; --compare runs it under every "
        "installed allocator and prints one table.",
        "Per allocator: allocated vs resident vs RSS after the drop; the freed "
        "malloc half stays held by every allocator here (glibc: free-in-bins, "
        "jemalloc: dirty pages awaiting decay, tcmalloc: page-heap free, "
        "mimalloc: committed segments); only pymalloc arenas come back.",
        "READY records=N build_s=X drop_s=X rss=B rss_anon=B lazyfree=B peak_rss=B"),
    Workload(
        "staircase", "staircase.py", "python",
        "Fragmentation staircase: a long-lived 127.0.0.1 http.server service with a "
        "bounded live set of 4-64 KiB buffers, freeing a random subset per "
        "request; load phases with growing buffer sizes alternate with idle "
        "phases, so RSS ratchets up and never comes down.",
        "RSS far above live bytes while idle; glibc: large free-in-bins (fragmented "
        "holes) that malloc_trim can only partly return; jemalloc: dirty pages "
        "until decay; the finding is fragmentation, not a leak.",
        "READY port=P phase=N live=B rss=B  (then PHASE load|idle lines)"),
    Workload(
        "lying_rss", "lying_rss.c", "c",
        "Lying RSS: a large working set is freed but stays in RSS as LazyFree "
        "(MADV_FREE) pages: jemalloc with background_thread, dirty_decay_ms:1000 "
        "and muzzy_decay_ms:-1 (default under --allocator jemalloc), or direct "
        "madvise(MADV_FREE) with --madvise under any allocator.",
        "rss large, lazyfree a large share of rss_anon; cgroup working_set lower "
        "than RSS by about lazyfree; jemalloc pmuzzy ~= lazyfree; advice: a finite "
        "muzzy_decay_ms (or arena.<i>.purge) returns it for real.",
        "READY mode=M allocated=B freed=B rss=B rss_anon=B lazyfree=B",
        env={"jemalloc": {"MALLOC_CONF": LAZY_JEMALLOC_CONF}}),
    Workload(
        "glibc_held", "glibc_held.c", "c",
        "glibc held memory: a burst of 64 B-8 KiB allocations, most freed, one late "
        "survivor pinning the top of the main heap, so the main arena holds "
        "hundreds of MiB of free memory that malloc_trim(0) returns. --trim: on "
        "SIGUSR1 it calls malloc_trim(0) itself and prints RSS before/after.",
        "glibc main arena: system >> in-use, large free-in-bins (fordblks), small "
        "keepcost (top is pinned); finding: malloc_trim(0) would return ~held "
        "bytes; knob MALLOC_TRIM_THRESHOLD_/M_TRIM_THRESHOLD does not help here.",
        "READY allocations=N live=B held=B rss=B  (--trim: TRIM rss_before=B "
        "rss_after=B released=B)"),
    Workload(
        "arena_sprawl", "arena_sprawl.c", "c",
        "Arena sprawl: many threads (default 32), each allocating in its own glibc "
        "arena and keeping a small live set, then parked in nanosleep or read() "
        "on a pipe; each arena reserves 64 MiB of address space and keeps its "
        "free chunks.",
        "glibc: one heap per arena (up to 8 x CPUs arenas), VSZ >> RSS, per-arena "
        "free memory; knob MALLOC_ARENA_MAX (glibc.malloc.arena_max). Threads "
        "are parked in restartable idle waits, so remote calls can borrow them.",
        "READY threads=N arenas=A heaps=H live=B rss=B vsz=B"),
    Workload(
        "burst_idle", "burst_idle.c", "c",
        "A freed burst in an idle process: 128 MiB of 512 KiB blocks, 95% freed, then "
        "quiet.  tcmalloc keeps it in its page heap (TCMALLOC_RELEASE_RATE=0 by default "
        "here; the release is driven by later frees anyway), mimalloc keeps it "
        "committed (decommit delay, and no later call into mimalloc), glibc returns it "
        "at once (mmapped blocks).",
        "tcmalloc: page heap free (dirty) ~= freed, unmapped (retained) ~0, finding "
        "tcmalloc-pageheap-free with knob TCMALLOC_AGGRESSIVE_DECOMMIT; mimalloc: "
        "committed >> allocated, finding mimalloc-decommit-delay with knob "
        "decommit_delay; glibc: RSS back down.",
        "READY allocated=B freed=B rss=B rss_anon=B",
        env={"tcmalloc": {"TCMALLOC_RELEASE_RATE": "0"},
             "tcmalloc_minimal": {"TCMALLOC_RELEASE_RATE": "0"}}),
    Workload(
        "preload_mistakes", "preload_mistakes.py", "python",
        "Preload mistakes, one scenario per run: typo (LD_PRELOAD names a missing "
        "library), setuid (secure-execution drops LD_PRELOAD; needs root), dlopen "
        "(jemalloc dlopen()ed late: mapped but malloc stays glibc), prefixed "
        "(static _rjem_-prefixed jemalloc next to glibc, like tikv-jemallocator), "
        "static (jemalloc linked into the executable), go (a Go binary: "
        "LD_PRELOAD irrelevant, Go heap).",
        "preload verdict: requested vs mapped vs who serves malloc, with the reason "
        "(missing file / AT_SECURE / loaded-not-bound / prefixed / static / go).",
        "READY scenario=S ...  (scenario-specific fields)"),
]}


class LaunchError(Exception):
    """A workload cannot be started (unknown name, allocator missing, build failed)."""


# --- building ----------------------------------------------------------------

def cache_dir():
    d = os.environ.get("ALLOCDIAG_EXAMPLES_CACHE")
    if not d:
        xdg = os.environ.get("XDG_CACHE_HOME")
        d = (os.path.join(xdg, "allocdiag", "examples") if xdg
             else f"/tmp/allocdiag-examples-{os.getuid()}")
    os.makedirs(d, exist_ok=True)
    return d


def _digest(*parts):
    h = hashlib.sha1()
    for p in parts:
        h.update(p if isinstance(p, bytes) else repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:12]


def build_c(source, *, libs=(), inputs=(), flags=C_FLAGS, name=None):
    """Compile SOURCE (absolute, or relative to examples/) with gcc; cached.

    ``inputs`` are extra files given to gcc (objects, archives), hashed too;
    ``libs`` come last on the command line.  Returns the executable's path.
    """
    if shutil.which("gcc") is None:
        raise LaunchError("gcc is not installed (apt-get install gcc)")
    src = source if os.path.isabs(source) else os.path.join(HERE, source)
    blobs = []
    for path in (src, *inputs):
        with open(path, "rb") as f:
            blobs.append(f.read())
    key = _digest(*blobs, tuple(flags), tuple(libs), tuple(inputs))
    base = name or os.path.splitext(os.path.basename(src))[0]
    out = os.path.join(cache_dir(), f"{base}-{key}")
    if not os.path.exists(out):
        tmp = f"{out}.tmp{os.getpid()}"
        cmd = ["gcc", *flags, "-o", tmp, src, *inputs, *libs]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise LaunchError(f"build failed: {' '.join(cmd)}\n{res.stderr}")
        os.replace(tmp, out)
    return out


# --- starting ----------------------------------------------------------------

def preload_for(allocator):
    """The LD_PRELOAD path for ALLOCATOR (None for glibc); LaunchError if missing."""
    if allocator not in ALLOCATORS:
        raise LaunchError(f"unknown allocator {allocator!r}; "
                          f"choose from {', '.join(ALLOCATORS)}")
    path, package = ALLOCATORS[allocator]
    if path and not os.path.exists(path):
        raise LaunchError(f"allocator {allocator!r} needs {path}, which is not "
                          f"installed (apt-get install {package})")
    return path


def installed_allocators():
    return [a for a, (p, _) in ALLOCATORS.items() if p is None or os.path.exists(p)]


def command(workload, args=()):
    """argv that runs WORKLOAD (building it first if it is C)."""
    w = WORKLOADS.get(workload)
    if w is None:
        raise LaunchError(f"unknown workload {workload!r}; choose from "
                          f"{', '.join(WORKLOADS)}")
    if w.language == "c":
        return [build_c(w.source, libs=w.libs), *args]
    return [sys.executable, "-u", os.path.join(HERE, w.source), *args]


def child_env(workload, allocator, env=None):
    full = {k: v for k, v in os.environ.items()
            if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    lib = preload_for(allocator)
    if lib:
        full["LD_PRELOAD"] = lib
    full["ALLOCDIAG_EXAMPLE_ALLOCATOR"] = allocator
    full.update(WORKLOADS[workload].default_env(allocator))
    full.update(env or {})
    return full


_libc = None


def _die_with_parent():
    # Runs in the child between fork and exec: if the launcher dies, the
    # workload gets SIGTERM instead of lingering (cleared by a setuid exec).
    _libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start(workload, allocator="glibc", env=None, args=(), *, die_with_parent=True,
          stdin=subprocess.DEVNULL, stderr=None):
    """Start WORKLOAD under ALLOCATOR; returns the Popen (stdout is a pipe).

    The child runs in its own session (so ``stop`` can kill its whole group and
    a terminal's Ctrl-C reaches only the launcher).  Follow with ``wait_ready``.
    """
    global _libc
    argv = command(workload, list(args))
    full_env = child_env(workload, allocator, env)
    preexec = None
    if die_with_parent:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        preexec = _die_with_parent
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=stdin, stderr=stderr,
                            env=full_env, start_new_session=True, preexec_fn=preexec)
    proc.workload = workload
    proc.allocator = allocator
    proc.reader = LineReader(proc)
    return proc


class LineReader:
    """Line reader over a Popen's stdout pipe with timeouts (no threads)."""

    def __init__(self, proc):
        self.proc = proc
        self.buf = b""
        self.eof = False
        self.lines = []        # every line read so far, READY included

    def readline(self, timeout=None):
        """Next line (without newline); None on EOF; TimeoutError on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            if self.eof:
                if self.buf:
                    line, self.buf = self.buf, b""
                    break
                return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 65536)
                if chunk:
                    self.buf += chunk
                else:
                    self.eof = True
        else:
            line, self.buf = self.buf.split(b"\n", 1)
        text = line.decode(errors="replace")
        self.lines.append(text)
        return text

    def wait_for(self, prefix, timeout):
        """Read until a line starting with PREFIX; returns the rest of it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.readline(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise TimeoutError(
                    f"{self.proc.args!r}: no {prefix!r} line after {timeout}s; "
                    f"printed {self.lines!r}") from None
            if line is None:
                code = self.proc.wait()
                raise RuntimeError(f"{self.proc.args!r} exited ({code}) before "
                                   f"{prefix!r}; printed {self.lines!r}")
            if line == prefix or line.startswith(prefix + " "):
                return line[len(prefix):].strip()


def wait_ready(proc, timeout=60):
    """Block until PROC prints ``READY ...``; returns the details after READY.

    Raises TimeoutError, or RuntimeError if the process exits first.  The
    lines printed before READY are in ``proc.reader.lines``.
    """
    if not hasattr(proc, "reader"):
        proc.reader = LineReader(proc)
    return proc.reader.wait_for("READY", timeout)


def wait_line(proc, prefix, timeout=30):
    """Like wait_ready for any protocol word (``TRIM``, ``PHASE``, ``RESULT``)."""
    return proc.reader.wait_for(prefix, timeout)


def parse_fields(details):
    """``"a=1 b=x"`` -> ``{"a": "1", "b": "x"}`` (tokens without '=' are skipped)."""
    out = {}
    for tok in details.split():
        k, eq, v = tok.partition("=")
        if eq:
            out[k] = v
    return out


def stop(proc, timeout=5):
    """SIGTERM the workload's process group, then SIGKILL; always reaps it."""
    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
    else:
        # The leader is gone; make sure nothing of its group survives.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if proc.stdout:
        proc.stdout.close()
    return proc.returncode


# --- command line --------------------------------------------------------------

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
             signal.SIGUSR1, signal.SIGUSR2)


def _parse_env(items):
    env = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not eq or not k:
            raise LaunchError(f"--env wants K=V, got {item!r}")
        env[k] = v
    return env


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="launch.py", description="Run an allocdiag example workload.",
        allow_abbrev=False,
        epilog="Arguments after the workload name that the launcher does not "
               "know are passed to the workload.")
    ap.add_argument("workload", nargs="?", help="one of: " + ", ".join(WORKLOADS))
    ap.add_argument("--allocator", default="glibc", choices=list(ALLOCATORS))
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="extra environment for the workload (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the workloads")
    opts, rest = ap.parse_known_args(argv)
    if rest[:1] == ["--"]:
        rest = rest[1:]

    if opts.list or not opts.workload:
        for w in WORKLOADS.values():
            print(f"{w.name:18} [{w.language}] {w.description}")
            print(f"{'':18} shows: {w.shows}")
        return 0 if opts.list else 2

    try:
        env = _parse_env(opts.env)
        proc = start(opts.workload, opts.allocator, env, rest)
    except LaunchError as e:
        print(f"launch.py: error: {e}", file=sys.stderr)
        return 2

    def forward(signum, frame):
        try:
            os.kill(proc.pid, signum)
        except ProcessLookupError:
            pass
    for sig in FORWARDED:
        signal.signal(sig, forward)

    print(f"PID {proc.pid}", flush=True)
    ready = False
    while True:
        line = proc.reader.readline()
        if line is None:
            break
        if line.startswith("READY") and not ready:
            ready = True
            print(f"READY {opts.workload} {line[5:].strip()}".rstrip(), flush=True)
        else:
            print(line, flush=True)
        proc.reader.lines.clear()
    code = proc.wait()
    if not ready:
        print(f"launch.py: {opts.workload} exited with status {code} before READY",
              file=sys.stderr)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
