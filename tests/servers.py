"""Real servers for the tests (issue 9 items 6 and 9): started from Debian
packages on loopback only (127.0.0.1 free ports or unix sockets in a temp
dir), waited for, and always stopped (process group killed in ``finally``).

Also the shared helpers ``untraced(pid)`` (every task's TracerPid is 0) and
C++ targets are built by ``targets.build_c`` (g++ for .cpp).
"""

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time

import deps


def task_status(pid):
    """{tid: status text} for every task of PID."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                out[int(tid)] = f.read()
    return out


def traced_tasks(pid):
    """[(tid, TracerPid line)] of the tasks of PID that are traced (empty = untraced)."""
    bad = []
    for tid, text in task_status(pid).items():
        for line in text.splitlines():
            if line.startswith("TracerPid:") and line.split()[1] != "0":
                bad.append((tid, line))
    return bad


def untraced(pid):
    """True when PID exists, is not a zombie/dead, and no task is traced
    (every /proc/PID/task/TID/status has ``TracerPid:\\t0``)."""
    tasks = task_status(pid)
    if not tasks:
        return False
    for text in tasks.values():
        if "TracerPid:\t0\n" not in text:
            return False
        state = [l for l in text.splitlines() if l.startswith("State:")][0]
        if state.split()[1] in ("Z", "X", "t", "T"):
            return False
    return True


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited ({proc.returncode}) before listening")
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        time.sleep(0.05)
    raise TimeoutError(f"{proc.args!r} not listening on 127.0.0.1:{port} after {timeout}s")


class Server:
    def __init__(self, proc, port, tmp, pid=None):
        self.proc, self.port, self.tmp = proc, port, tmp
        self.pid = pid or proc.pid

    def alive(self):
        return self.proc.poll() is None


@contextlib.contextmanager
def _run(argv, port, tmp, timeout=15, **popen):
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, cwd=tmp, **popen)
    try:
        wait_port(port, proc, timeout)
        yield Server(proc, port, tmp)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def redis(preload=None):
    """redis-server on loopback; PRELOAD: a library for its LD_PRELOAD."""
    exe = deps.need("redis-server")
    env = dict(os.environ, LD_PRELOAD=preload) if preload else None
    with tempfile.TemporaryDirectory(prefix="srv_redis") as tmp:
        port = free_port()
        sock = os.path.join(tmp, "redis.sock")
        argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--unixsocket", sock,
                "--save", "", "--appendonly", "no", "--dir", tmp, "--daemonize", "no"]
        with _run(argv, port, tmp, env=env) as s:
            s.unixsocket = sock
            yield s


@contextlib.contextmanager
def memcached():
    exe = deps.need("memcached")
    with tempfile.TemporaryDirectory(prefix="srv_mc") as tmp:
        port = free_port()
        argv = [exe, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-t", "2", "-u", "root"]
        with _run(argv, port, tmp) as s:
            yield s


NGINX_CONF = """daemon off; master_process on; worker_processes 2;
pid {tmp}/nginx.pid; error_log {tmp}/error.log;
events {{ worker_connections 64; }}
http {{ access_log off; client_body_temp_path {tmp}; proxy_temp_path {tmp};
  fastcgi_temp_path {tmp}; uwsgi_temp_path {tmp}; scgi_temp_path {tmp};
  server {{ listen 127.0.0.1:{port}; location / {{ return 200 "ok\\n"; }} }} }}
"""


@contextlib.contextmanager
def varnish():
    """varnishd in the foreground on 127.0.0.1 (no jail, no management port,
    a 16 MiB malloc store, a backend port nobody listens on: it answers 503),
    its working directory in a temp dir.  ``pid`` is the worker ("cache-main")
    child: ~200 idle pool threads with small stacks, jemalloc linked in."""
    exe = deps.need("/usr/sbin/varnishd")
    with tempfile.TemporaryDirectory(prefix="srv_varnish") as tmp:
        port, backend = free_port(), free_port()
        argv = [exe, "-F", "-j", "none", "-T", "none", "-n", os.path.join(tmp, "wd"),
                "-a", f"127.0.0.1:{port}", "-b", f"127.0.0.1:{backend}", "-s", "malloc,16m"]
        with _run(argv, port, tmp, timeout=30) as s:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                children = subprocess.run(["pgrep", "-P", str(s.proc.pid)], capture_output=True,
                                          text=True).stdout.split()
                if children and len(os.listdir(f"/proc/{children[0]}/task")) > 100:
                    break
                time.sleep(0.1)
            else:
                raise TimeoutError("varnishd started no worker child with its thread pools")
            s.pid = int(children[0])
            yield s


@contextlib.contextmanager
def nginx():
    exe = deps.need("nginx")
    with tempfile.TemporaryDirectory(prefix="srv_nginx") as tmp:
        port = free_port()
        conf = os.path.join(tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_CONF.format(tmp=tmp, port=port))
        with _run([exe, "-p", tmp, "-c", conf], port, tmp) as s:
            deadline = time.monotonic() + 10
            workers = []
            while time.monotonic() < deadline and not workers:
                with contextlib.suppress(FileNotFoundError):
                    with open(f"/proc/{s.proc.pid}/task/{s.proc.pid}/children") as f:
                        workers = [int(x) for x in f.read().split()]
                time.sleep(0.05)
            assert workers, "nginx started no worker"
            s.master, s.workers, s.pid = s.proc.pid, workers, workers[0]
            yield s


NODE_JS = ("require('http').createServer((q,r)=>{r.end('ok\\n')})"
           ".listen(+process.argv[1],'127.0.0.1')")


@contextlib.contextmanager
def node():
    exe = deps.need("node")
    with tempfile.TemporaryDirectory(prefix="srv_node") as tmp:
        port = free_port()
        with _run([exe, "-e", NODE_JS, str(port)], port, tmp) as s:
            yield s


ASYNCIO_PY = r"""
import asyncio, sys
async def handle(r, w):
    while True:
        line = await r.readline()
        if not line:
            break
        w.write(b"ok " + str(len(bytearray(len(line) * 100))).encode() + b"\n")
        await w.drain()
    w.close()
async def main():
    srv = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    async with srv:
        await srv.serve_forever()
asyncio.run(main())
"""

POOL_PY = r"""
import concurrent.futures, socketserver, sys
pool = concurrent.futures.ThreadPoolExecutor(4)
for f in [pool.submit(lambda: 0) for _ in range(8)]:
    f.result()
def work(n):
    return sum(len(bytes(64 + i % 512)) for i in range(n))
class H(socketserver.StreamRequestHandler):
    def handle(self):
        for line in self.rfile:
            self.wfile.write(b"ok %d\n" % pool.submit(work, int(line or 1)).result())
socketserver.TCPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@contextlib.contextmanager
def python_server(code, name):
    import sys
    with tempfile.TemporaryDirectory(prefix=f"srv_{name}") as tmp:
        port = free_port()
        with _run([sys.executable, "-c", code, str(port)], port, tmp) as s:
            yield s


def asyncio_server():
    return python_server(ASYNCIO_PY, "asyncio")


def thread_pool():
    return python_server(POOL_PY, "pool")


SERVERS = {"redis": redis, "memcached": memcached, "nginx": nginx, "node": node,
           "asyncio": asyncio_server, "pool": thread_pool}


def http_get(port, timeout=5):
    """One HTTP/1.0 GET on loopback; True on a 200 answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.startswith(b"HTTP/1.") and b" 200 " in data.split(b"\r\n", 1)[0]


def line_client(port, text=b"7\n", timeout=5):
    """One request/answer on a line protocol (asyncio, pool, memcached 'version')."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(text)
        data = b""
        while b"\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.startswith((b"ok", b"VERSION", b"STORED"))


def resp(sock_path, *args, timeout=5):
    """A tiny RESP client over redis's unix socket: one command, bulk/simple reply text."""
    cmd = b"*%d\r\n" % len(args) + b"".join(
        b"$%d\r\n%s\r\n" % (len(a), a) for a in (x.encode() if isinstance(x, str) else x for x in args))
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(sock_path)
        s.sendall(cmd)
        data = b""
        while True:
            chunk = s.recv(65536)
            data += chunk
            if not chunk:
                break
            if data.startswith((b"+", b"-", b":")) and data.endswith(b"\r\n"):
                break
            if data.startswith(b"$"):
                n = int(data[1:data.index(b"\r\n")])
                if n < 0 or len(data) >= data.index(b"\r\n") + 2 + n + 2:
                    break
    if data.startswith(b"$"):
        head = data.index(b"\r\n")
        return data[head + 2:head + 2 + int(data[1:head])].decode()
    return data.decode().strip()


def redis_memory(sock_path):
    out = {}
    for line in resp(sock_path, "INFO", "memory").splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            out[k] = v.strip()
    return out
