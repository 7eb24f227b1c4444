"""Real target processes for the tests: build C sources, start them under a
chosen allocator, wait for their readiness line, always kill them.

A target prints one line ``READY <anything>`` on stdout when it has reached
the state the test wants to inspect, then blocks (usually in ``pause()`` or
``read()`` on stdin) until killed.
"""

import contextlib
import hashlib
import os
import select
import signal
import subprocess
import sys
import time

import deps

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = os.path.join(HERE, "targets")
BUILD_DIR = os.environ.get("ALLOCDIAG_TEST_BUILD",
                           os.path.join(HERE, ".build"))
LIBDIR = "/usr/lib/x86_64-linux-gnu"

# The allocators the tests run targets under; path None = no preload (glibc).
PRELOADS = {
    "glibc": None,
    "jemalloc": f"{LIBDIR}/libjemalloc.so.2",
    "tcmalloc": f"{LIBDIR}/libtcmalloc.so.4",
    "tcmalloc_minimal": f"{LIBDIR}/libtcmalloc_minimal.so.4",
    "mimalloc": f"{LIBDIR}/libmimalloc.so.2",
}


def wait_for(pred, timeout=5.0, what="condition"):
    """Poll PRED until true, for what a target does on its own time (a
    fixed sleep is not enough under a loaded CI); AssertionError after
    TIMEOUT."""
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if pred():
            return
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def require_file(path):
    """PATH, or fail naming the Debian package (tools/packages.txt) that provides it."""
    return deps.need(path)


def preload_path(allocator):
    path = PRELOADS[allocator]
    return require_file(path) if path else None


def build_c(source, *flags, name=None):
    """Compile tests/targets/SOURCE with gcc (g++ for .cpp/.cc); cached by
    source text + flags.

    Returns the path of the executable (or shared object with -shared).
    """
    src = source if os.path.isabs(source) else os.path.join(SOURCES, source)
    with open(src, "rb") as f:
        text = f.read()
    key = hashlib.sha1(text + repr(flags).encode()).hexdigest()[:12]
    base = name or os.path.splitext(os.path.basename(src))[0]
    os.makedirs(BUILD_DIR, exist_ok=True)
    out = os.path.join(BUILD_DIR, f"{base}-{key}")
    if not os.path.exists(out):
        tmp = out + f".tmp{os.getpid()}"
        # C++ sources (.cpp, .cc) with g++, the rest with gcc
        cmd = (["g++", "-std=c++17"] if src.endswith((".cpp", ".cc")) else ["gcc"])
        deps.need(cmd[0])
        cmd += ["-O1", "-g", "-o", tmp, src, *flags]
        # every header and library used must come from a listed package
        res = deps.check_build(cmd, src)
        if res.returncode != 0:
            raise RuntimeError(f"build failed: {' '.join(cmd)}\n{res.stderr}")
        os.replace(tmp, out)
    return out


class Target:
    """A started target.  ``pid``, ``ready`` (the words after READY) and
    ``lines`` (everything it printed before READY)."""

    def __init__(self, proc, ready, lines):
        self.proc = proc
        self.pid = proc.pid
        self.ready = ready
        self.lines = lines

    def alive(self):
        return self.proc.poll() is None


def _read_until_ready(proc, timeout):
    lines = []
    deadline = time.monotonic() + timeout
    buf = b""
    fd = proc.stdout.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"target {proc.args!r} not ready after {timeout}s; "
                               f"printed {lines!r}")
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            raise RuntimeError(f"target {proc.args!r} exited ({proc.wait()}) "
                               f"before READY; printed {lines!r}")
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            line = line.decode(errors="replace")
            if line.startswith("READY"):
                return line[5:].strip(), lines
            lines.append(line)


@contextlib.contextmanager
def start(argv, allocator="glibc", env=None, preload=None, timeout=20,
          stdin=subprocess.PIPE, **popen):
    """Start ARGV under ALLOCATOR (an LD_PRELOAD from PRELOADS, or an explicit
    ``preload`` string) and yield a Target once it printed READY.  The process
    (group) is killed on exit, whatever happened."""
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    lib = preload if preload is not None else preload_path(allocator)
    if lib:
        full_env["LD_PRELOAD"] = lib
    full_env.update(env or {})
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=stdin,
                            env=full_env, start_new_session=True, **popen)
    try:
        ready, lines = _read_until_ready(proc, timeout)
        yield Target(proc, ready, lines)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for f in (proc.stdout, proc.stdin):
            if f:
                f.close()


def python_argv(code):
    """argv running CODE in this interpreter (which has allocdiag installed)."""
    return [sys.executable, "-c", code]


# Public symbols of jemalloc's API (configure.ac public_syms, as exported by
# Debian's libjemalloc_pic.a); renamed to _rjem_* they give the layout of
# tikv-jemallocator's default prefixed build.
JEMALLOC_PUBLIC = ("aligned_alloc calloc dallocx free mallctl mallctlbymib mallctlnametomib "
                   "malloc malloc_conf malloc_conf_2_conf_harder malloc_message "
                   "malloc_stats_print malloc_usable_size mallocx memalign nallocx "
                   "posix_memalign rallocx realloc sallocx sdallocx valloc xallocx").split()
JEMALLOC_PIC = f"{LIBDIR}/libjemalloc_pic.a"


def prefixed_jemalloc_archive(prefix="_rjem_"):
    """A copy of libjemalloc_pic.a with the public API renamed to PREFIX*."""
    require_file(JEMALLOC_PIC)
    deps.need("objcopy")
    os.makedirs(BUILD_DIR, exist_ok=True)
    out = os.path.join(BUILD_DIR, f"libjemalloc{prefix}pic.a")
    if not os.path.exists(out):
        mapping = os.path.join(BUILD_DIR, f"redefine{prefix}.txt")
        with open(mapping, "w") as f:
            for sym in JEMALLOC_PUBLIC:
                f.write(f"{sym} {prefix}{sym}\n")
        tmp = out + f".tmp{os.getpid()}"
        subprocess.run(["objcopy", f"--redefine-syms={mapping}", JEMALLOC_PIC, tmp], check=True)
        os.replace(tmp, out)
    return out


def static_jemalloc_flags(full_static=False):
    require_file(JEMALLOC_PIC)
    flags = [JEMALLOC_PIC, "-lpthread", "-lm", "-ldl"]
    return (["-static"] + flags) if full_static else flags


def build_go(package_dir, cgo=False):
    """`go build` a stdlib-only main package under tests/targets/; skips
    when there is no Go toolchain.  CGO: build with cgo (a dynamically
    linked executable whose C side calls malloc)."""
    go = deps.go()
    src = os.path.join(SOURCES, package_dir, "main.go")
    with open(src, "rb") as f:
        key = hashlib.sha1(f.read()).hexdigest()[:12]
    out = os.path.join(BUILD_DIR, f"{package_dir}-{'cgo-' if cgo else ''}{key}")
    if not os.path.exists(out):
        os.makedirs(BUILD_DIR, exist_ok=True)
        env = dict(os.environ, GO111MODULE="off", CGO_ENABLED="1" if cgo else "0", GOFLAGS="")
        env.setdefault("GOCACHE", os.path.join(BUILD_DIR, "gocache"))
        res = subprocess.run([go, "build", "-o", out + ".tmp", src], capture_output=True,
                             text=True, env=env)
        if res.returncode != 0:
            raise RuntimeError(f"go build failed:\n{res.stderr}")
        os.replace(out + ".tmp", out)
    return out


CAP_SYS_ADMIN = 21          # include/uapi/linux/capability.h


def has_cap_sys_admin():
    with open("/proc/self/status") as f:
        cap_eff = int(next(line for line in f if line.startswith("CapEff:")).split()[1], 16)
    return bool(cap_eff >> CAP_SYS_ADMIN & 1)


def zero_page_pfn_or_skip():
    """The kernel's zero page PFN as allocdiag learns it.  Skips only when
    this process lacks CAP_SYS_ADMIN (PFNs read 0: nothing to learn); with
    the capability, a PFN that was not learnt fails the test."""
    from collectors.proc import pagemap
    if not has_cap_sys_admin():
        import pytest
        pytest.skip("PFNs are not visible to this process (no CAP_SYS_ADMIN)")
    pfn = pagemap.zero_page_pfn()
    assert pfn is not None, "CAP_SYS_ADMIN held, but the zero page's PFN was not learnt"
    return pfn


def kernel_thread_pid():
    """A kernel thread's pid, by its status line "Kthread: 1" (the kernel's
    own word, not allocdiag's reading of the stat flags), kthreadd (2)
    first; None where a PID namespace shows none."""
    names = ["2"] + [n for n in os.listdir("/proc") if n.isdigit() and n != "2"]
    for name in names:
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                if b"\nKthread:\t1" in f.read():
                    return int(name)
        except OSError:
            continue
    return None
