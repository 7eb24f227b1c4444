#!/usr/bin/env python3
"""preload_mistakes.py -- "I set LD_PRELOAD=libjemalloc.so.2, is it in effect?"

One scenario per run; each builds a small target and exec()s it (same PID as
this driver, so the launcher's PID line names the target), the target prints
``READY scenario=S malloc_from=... jemalloc_mapped=0|1 preload=...`` and idles.
The --allocator given to the launcher only affects this driver before the
exec; every scenario sets the environment it is about.

  typo      LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemaloc.so.2 (one 'l').
            ld.so prints "object ... cannot be preloaded ... ignored" on stderr
            and runs the program anyway.  allocdiag: requested=[the typo], not
            mapped, malloc from libc; reason "file does not exist".
  setuid    a copy of the target owned by nobody with the setuid bit, run
            (as root) with LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2.
            The exec is "secure" (AT_SECURE: real uid root != effective uid
            nobody), so ld.so ignores preload entries that contain a slash
            (and would load bare names only from system dirs if the library
            itself were setuid).  Needs root to chown/run; the copy lives in
            the cache dir, which must not be on a nosuid mount.  allocdiag:
            requested but not mapped; reason "secure-execution (AT_SECURE)".
            ld.so also scrubs LD_PRELOAD from the program's environ array, so
            the target's own getenv() prints preload=- while
            /proc/PID/environ (the exec-time block) still shows it.
  dlopen    no preload; the program dlopen()s libjemalloc.so.2 (RTLD_LOCAL)
            after start, as a plugin or an extension module linked to
            jemalloc would.  jemalloc is mapped (and holds one block), but
            the program's malloc stays bound to glibc.  jemalloc's TLS is
            initial-exec, so a plain dlopen fails here with "cannot allocate
            memory in static TLS block" (a field problem of its own); the
            scenario sets GLIBC_TUNABLES=glibc.rtld.optional_static_tls=8192.  allocdiag: kind glibc,
            jemalloc in `others` ("loaded but does not serve malloc").
  prefixed  the target is linked statically against a copy of
            libjemalloc_pic.a whose public symbols were renamed with
            `objcopy --redefine-sym malloc=_rjem_malloc ...` (the public_syms
            list of jemalloc's configure.ac).  Its "Rust" allocations call
            _rjem_malloc; its C code keeps glibc malloc.  This stands in for a
            Rust binary using tikv-jemallocator (which configures
            --with-jemalloc-prefix=_rjem_): two allocators in one process.
            Difference from the real thing: the env var our copy reads is
            still MALLOC_CONF (the name is a string compiled into jemalloc);
            tikv's build reads _RJEM_MALLOC_CONF.  allocdiag: `_rjem_mallctl`
            in the executable, prefix "_rjem_", glibc serves malloc.
  static    the target linked with libjemalloc_pic.a unchanged: malloc, free,
            mallctl are defined in the executable, so jemalloc serves
            everything and no libjemalloc.so is mapped.  malloc/free/calloc/
            realloc are exported in .dynsym (libc.so references them), but
            mallctl is only in .symtab: strip the binary and it is gone
            (link with -Wl,--export-dynamic to export it).  allocdiag: linkage
            static, mallctl resolved from the executable's .symtab.
  go        a static Go binary (CGO_ENABLED=0) run with LD_PRELOAD=
            libjemalloc.so.2: there is no dynamic loader, nothing is
            preloaded, and the memory is on the Go heap.  allocdiag: kind go.
            Skipped with a message (exit 3) when the go toolchain is missing.

Everything built lands in the launcher's cache dir.  The go build runs
offline (GOFLAGS=-mod=mod, GOTOOLCHAIN=local, GOPROXY=off, stdlib only).

Measured here (Debian 12, glibc 2.36):
  typo     malloc_from=/lib/x86_64-linux-gnu/libc.so.6 jemalloc_mapped=0
           preload=/usr/lib/x86_64-linux-gnu/libjemaloc.so.2 (+ ld.so error)
  setuid   malloc_from=libc.so.6 jemalloc_mapped=0 preload=- (getenv), while
           /proc/PID/environ has LD_PRELOAD=...libjemalloc.so.2;
           status Uid: 0 65534 65534 65534
  dlopen   malloc_from=libc.so.6 jemalloc_mapped=1 lib_malloc_used=1
  prefixed malloc_from=libc.so.6 jemalloc_mapped=0 rjem_allocated=4222976
           (256 x 16 KiB + jemalloc's own); nm: _rjem_mallctl T, no mallctl
  static   malloc_from=exe jemalloc_mapped=0 je_allocated=~2.9 MB
           je_version=5.3.0-0-g54eaed1d8b56b1aa528be3bdd1877e59c56fa90c;
           malloc/free/calloc in .dynsym, mallctl only in .symtab
  go       heap_alloc=~34 MB heap_sys=~71 MB (64 MiB touched, half dropped),
           preload=...libjemalloc.so.2 but no jemalloc mapping (static binary)
"""

import os
import shutil
import stat
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _procmem import say  # noqa: E402
from launch import LIBDIR, LaunchError, _digest, build_c, cache_dir  # noqa: E402

TARGET = os.path.join(HERE, "preload", "preload_target.c")
GO_MAIN = os.path.join(HERE, "preload", "go", "main.go")
JEMALLOC_SO = f"{LIBDIR}/libjemalloc.so.2"
JEMALLOC_PIC = f"{LIBDIR}/libjemalloc_pic.a"
TYPO = f"{LIBDIR}/libjemaloc.so.2"
NOBODY = 65534
STATIC_LIBS = ("-lpthread", "-lm", "-ldl")

# jemalloc's public API (configure.ac public_syms), renamed for "prefixed".
PUBLIC_SYMS = (
    "aligned_alloc calloc dallocx free mallctl mallctlbymib mallctlnametomib "
    "malloc malloc_conf malloc_conf_2_conf_harder malloc_message "
    "malloc_stats_print malloc_usable_size mallocx memalign nallocx "
    "posix_memalign rallocx realloc sallocx sdallocx valloc xallocx").split()
PREFIX = "_rjem_"

SCENARIOS = ("typo", "setuid", "dlopen", "prefixed", "static", "go")


def need(path, package):
    if not os.path.exists(path):
        raise LaunchError(f"{path} is missing (apt-get install {package})")


def prefixed_archive():
    """libjemalloc_pic.a with every public symbol renamed to _rjem_<name>."""
    need(JEMALLOC_PIC, "libjemalloc-dev")
    with open(JEMALLOC_PIC, "rb") as f:
        key = _digest(f.read(), PREFIX, tuple(PUBLIC_SYMS))
    out = os.path.join(cache_dir(), f"libjemalloc_rjem-{key}.a")
    if not os.path.exists(out):
        tmp = f"{out}.tmp{os.getpid()}"
        cmd = ["objcopy"]
        for s in PUBLIC_SYMS:
            cmd += ["--redefine-sym", f"{s}={PREFIX}{s}"]
        res = subprocess.run(cmd + [JEMALLOC_PIC, tmp], capture_output=True, text=True)
        if res.returncode != 0:
            raise LaunchError(f"objcopy failed: {res.stderr}")
        os.replace(tmp, out)
    return out


def setuid_copy(exe):
    if os.geteuid() != 0:
        raise LaunchError("the setuid scenario must run as root: it chowns a copy "
                          "of the target to nobody and sets the setuid bit, and the "
                          "effect shows when a different real uid (root) runs it")
    d = os.path.join(cache_dir(), "setuid")
    os.makedirs(d, mode=0o755, exist_ok=True)
    if os.statvfs(d).f_flag & os.ST_NOSUID:
        raise LaunchError(f"{d} is on a nosuid mount; set ALLOCDIAG_EXAMPLES_CACHE "
                          "to a directory on a filesystem without nosuid")
    out = os.path.join(d, os.path.basename(exe) + "-setuid")
    if not os.path.exists(out):
        tmp = f"{out}.tmp{os.getpid()}"
        shutil.copyfile(exe, tmp)
        os.chown(tmp, NOBODY, NOBODY)
        os.chmod(tmp, 0o755 | stat.S_ISUID)     # chown clears S_ISUID: chmod after
        os.replace(tmp, out)
    return out


def go_binary():
    go = shutil.which("go") or ("/usr/local/go/bin/go"
                                if os.path.exists("/usr/local/go/bin/go") else None)
    if go is None:
        return None
    with open(GO_MAIN, "rb") as f:
        key = _digest(f.read(), "go")
    out = os.path.join(cache_dir(), f"preload_go-{key}")
    if not os.path.exists(out):
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod",
                   GOTOOLCHAIN="local", GOPROXY="off", GO111MODULE="off")
        env.setdefault("GOCACHE", os.path.join(cache_dir(), "gocache"))
        env.pop("LD_PRELOAD", None)
        tmp = f"{out}.tmp{os.getpid()}"
        res = subprocess.run([go, "build", "-o", tmp, GO_MAIN], env=env,
                             capture_output=True, text=True, cwd=os.path.dirname(GO_MAIN))
        if res.returncode != 0:
            raise LaunchError(f"go build failed:\n{res.stderr}")
        os.replace(tmp, out)
    return out


def plan(scenario):
    """(argv, env changes) for SCENARIO; env value None removes the variable."""
    if scenario == "typo":
        return [build_c(TARGET), "--scenario", "typo"], {"LD_PRELOAD": TYPO}
    if scenario == "setuid":
        need(JEMALLOC_SO, "libjemalloc2")
        exe = setuid_copy(build_c(TARGET))
        return [exe, "--scenario", "setuid"], {"LD_PRELOAD": JEMALLOC_SO}
    if scenario == "dlopen":
        need(JEMALLOC_SO, "libjemalloc2")
        # jemalloc's TLS is initial-exec: dlopen() fails with "cannot allocate
        # memory in static TLS block" unless ld.so reserves surplus for it.
        tun = os.environ.get("GLIBC_TUNABLES", "")
        tun = (tun + ":" if tun else "") + "glibc.rtld.optional_static_tls=8192"
        return ([build_c(TARGET), "--scenario", "dlopen", "--dlopen", JEMALLOC_SO],
                {"LD_PRELOAD": None, "GLIBC_TUNABLES": tun})
    if scenario == "prefixed":
        exe = build_c(TARGET, inputs=(prefixed_archive(),), libs=STATIC_LIBS,
                      flags=("-O1", "-g", "-pthread", "-Wall", "-Wextra", "-DUSE_RJEM"),
                      name="preload_target_rjem")
        return [exe, "--scenario", "prefixed"], {"LD_PRELOAD": None}
    if scenario == "static":
        need(JEMALLOC_PIC, "libjemalloc-dev")
        exe = build_c(TARGET, inputs=(JEMALLOC_PIC,), libs=STATIC_LIBS,
                      flags=("-O1", "-g", "-pthread", "-Wall", "-Wextra",
                             "-DUSE_JE_STATIC"),
                      name="preload_target_static")
        return [exe, "--scenario", "static"], {"LD_PRELOAD": None}
    if scenario == "go":
        exe = go_binary()
        if exe is None:
            return None, None
        return [exe], {"LD_PRELOAD": JEMALLOC_SO}
    raise LaunchError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")


def main(argv):
    if len(argv) != 1 or argv[0] not in SCENARIOS:
        print(f"usage: preload_mistakes.py {{{'|'.join(SCENARIOS)}}}", file=sys.stderr)
        return 2
    scenario = argv[0]
    try:
        cmd, changes = plan(scenario)
    except LaunchError as e:
        print(f"preload_mistakes: {scenario}: {e}", file=sys.stderr)
        return 2
    if cmd is None:
        print("preload_mistakes: go: SKIP: the go toolchain is not installed "
              "(looked for go in PATH and /usr/local/go/bin/go)", file=sys.stderr)
        return 3
    env = dict(os.environ)
    env.pop("ALLOCDIAG_EXAMPLE_ALLOCATOR", None)
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    say("SCENARIO", name=scenario, exe=cmd[0],
        preload=env.get("LD_PRELOAD", "-"))
    os.execve(cmd[0], cmd, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
