"""tests/targets/sym_alloc.c driven from the heap-profile tests: start it
under an allocator with heap profiling on, send it commands, collect dumps.

Profiling: jemalloc with ``prof:true,lg_prof_sample:0`` (every allocation
sampled, so counts are exact), gperftools' heap profiler started by the
target itself (HeapProfilerStart, unsampled)."""
import contextlib
import os
import select
import subprocess
import sys

import targets

JEMALLOC_PROF = {"MALLOC_CONF": "prof:true,lg_prof_sample:0"}
PROFILE_ENV = {"jemalloc": JEMALLOC_PROF, "tcmalloc": {}}
REPLY_TIMEOUT_S = 20


class Session:
    def __init__(self, target):
        self.target = target
        self.pid = target.pid
        self._buf = b""

    def cmd(self, line):
        """Send one command line; return its reply ("OK ..."), fail on ERR."""
        proc = self.target.proc
        proc.stdin.write(line.encode() + b"\n")
        proc.stdin.flush()
        fd = proc.stdout.fileno()
        while b"\n" not in self._buf:
            r, _, _ = select.select([fd], [], [], REPLY_TIMEOUT_S)
            assert r, f"no reply to {line!r}"
            chunk = os.read(fd, 4096)
            assert chunk, f"target exited ({proc.wait()}) on {line!r}"
            self._buf += chunk
        reply, self._buf = self._buf.split(b"\n", 1)
        reply = reply.decode()
        assert reply.startswith("OK"), f"{line!r} -> {reply!r}"
        return reply

    def dump(self, path):
        self.cmd(f"dump {path}")
        return str(path)


@contextlib.contextmanager
def running(binary, allocator, tmp_path, env=None):
    """BINARY (sym_alloc built by targets.build_c, or a copy) under
    ALLOCATOR ("jemalloc" | "tcmalloc") with heap profiling on."""
    full_env = dict(PROFILE_ENV[allocator], **(env or {}))
    with targets.start([binary, str(tmp_path / "gperf")], allocator=allocator,
                       env=full_env, stdin=subprocess.PIPE) as t:
        yield Session(t)


def inspect_json(pid, out_path):
    """``allocdiag inspect --json PID`` written to OUT_PATH (the sidecar the
    live ``heap dump`` writes next to a dump)."""
    res = subprocess.run([sys.executable, "-m", "diag", "inspect", "--json", str(pid)],
                         capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(targets.HERE))
    assert res.returncode in (0, 6), res.stderr      # 6: partial, document printed
    with open(out_path, "w") as f:
        f.write(res.stdout)
    return out_path
