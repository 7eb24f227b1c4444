"""``allocdiag exporter``: Prometheus metrics over HTTP, into a node_exporter
textfile, or printed once (diag.exporter holds the collector)."""

import argparse
import ipaddress
import os
import re
import signal
import sys
import threading

from diag.model.errors import NoSuchProcess
from diag.commands.common import UsageError, add_command, pid_arg
from diag.model.exitcodes import ExitCode

NAME = "exporter"
DEFAULT_LISTEN = "127.0.0.1:9731"
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")

DESCRIPTION = """\
Prometheus metrics for every readable process on the host, grouped, plus the
allocator's own numbers for a few selected live targets.

/proc metrics (nothing is stopped) are summed per group, labelled
{group, allocator, preload_effective}; the group is the process's comm
(--group-by exe|user, or --group REGEX=NAME rules matched against comm, exe
name and command line; the first rule that matches wins).  No metric carries
a pid except allocdiag_target_info, and no environment value is exported.

Live targets (--target, --match, --top; at most --max-targets) have their
allocator read by a background thread that borrows one idle thread of the
target for a few milliseconds, at most one read per second, within
--max-pause-ms-per-minute of stop time in all; a scrape only reads the cache
and never waits for a stop.  A target that cannot be read is reported
(allocdiag_target_info{state="not read",reason=...},
allocdiag_collector_success{collector="live"} 0) and tried again only after
--retry seconds.  allocdiag_memory_bytes{class} splits the targets' RSS into
disjoint classes that add up to allocdiag_target_rss_bytes (stack them).

Modes: serve HTTP on --listen (loopback by default: expose it on purpose,
e.g. --listen 0.0.0.0:9731); --textfile DIR writes DIR/allocdiag.prom
atomically for node_exporter's textfile collector (once, or every
--interval seconds); --once prints the exposition text once.  In the one-shot
modes the live targets are read synchronously.  Needs the Python package
prometheus_client: pip install 'allocdiag[exporter]'.
See docs/exporter.md and examples/deploy/."""

EXIT_NOTES = """
in this command:
  2  also a --listen address that cannot be bound, a --textfile directory that is missing,
     prometheus_client not installed (pip install 'allocdiag[exporter]')
  4  the --textfile cannot be written
  6  a one-shot run (--once, or --textfile without --interval) left a live target
     unread; the metrics are still printed or written
"""


def listen_arg(text):
    """argparse type: HOST:PORT (IPv6 as [ADDR]:PORT) -> (host, port)."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([^:\[\]]+):(\d{1,5})", text or "")
    if not m:
        raise argparse.ArgumentTypeError(
            f"not HOST:PORT: {text!r} (e.g. 127.0.0.1:9731, 0.0.0.0:9731, [::1]:9731)")
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    port = int(port)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"port out of range: {port}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOSTNAME.match(host):
            raise argparse.ArgumentTypeError(f"not an address or host name: {host!r}") from None
    return host, port


def regex_arg(text):
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"bad regular expression {text!r}: {exc}") from None


def group_rule_arg(text):
    """argparse type: REGEX=NAME -> (compiled REGEX, NAME)."""
    rx, sep, name = text.rpartition("=")
    if not sep or not rx or not re.fullmatch(r"[A-Za-z0-9_.:-]+", name):
        raise argparse.ArgumentTypeError(
            f"not REGEX=NAME: {text!r} (NAME: letters, digits, _ . : -)")
    return regex_arg(rx), name


def positive(kind):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return v
    return parse


def add_parser(sub):
    from diag.exporter_options import GROUP_BY, MAX_TARGETS_DEFAULT
    p = add_command(
        sub, NAME, help="Prometheus metrics: HTTP, node_exporter textfile, or once",
        description=DESCRIPTION,
        examples=["allocdiag exporter                       # http://127.0.0.1:9731/metrics",
                  "allocdiag exporter --top 5 --group 'redis|valkey=redis'",
                  "allocdiag exporter --listen 0.0.0.0:9731 --match '^(redis|envoy)'",
                  "allocdiag exporter --once --target 1234  # print once, read 1234 now",
                  "allocdiag exporter --textfile /var/lib/prometheus/node-exporter --top 3",
                  "allocdiag exporter --textfile DIR --interval 60 --group-by exe"])
    p.epilog += EXIT_NOTES
    mode = p.add_argument_group("mode (HTTP by default)")
    mode.add_argument("--listen", type=listen_arg, default=listen_arg(DEFAULT_LISTEN),
                      metavar="HOST:PORT",
                      help=f"serve /metrics here (default {DEFAULT_LISTEN}, loopback only)")
    mode.add_argument("--textfile", metavar="DIR",
                      help="write DIR/allocdiag.prom (atomic rename) instead of serving HTTP")
    mode.add_argument("--interval", type=positive(float), metavar="SECONDS",
                      help="with --textfile: rewrite every SECONDS (default: once, then exit)")
    mode.add_argument("--once", action="store_true",
                      help="print the exposition text once to stdout and exit")
    grp = p.add_argument_group("grouping (/proc metrics for every readable process)")
    grp.add_argument("--group-by", choices=GROUP_BY, default="comm",
                     help="the group label: comm (default), exe name or user")
    grp.add_argument("--group", dest="groups", type=group_rule_arg, action="append", default=[],
                     metavar="REGEX=NAME",
                     help="processes whose comm, exe name or command line match REGEX go into "
                          "group NAME (repeatable; first match wins)")
    live = p.add_argument_group("live targets (allocator numbers; one thread borrowed briefly)")
    live.add_argument("--target", dest="targets", type=pid_arg, action="append", default=[],
                      metavar="PID", help="read this process's allocator (repeatable)")
    live.add_argument("--match", type=regex_arg, metavar="REGEX",
                      help="read processes whose comm or command line match REGEX")
    live.add_argument("--top", type=positive(int), default=0, metavar="N",
                      help="read the N processes with the largest RSS")
    live.add_argument("--max-targets", type=positive(int), default=MAX_TARGETS_DEFAULT,
                      metavar="N", help=f"at most N live targets (default {MAX_TARGETS_DEFAULT})")
    live.add_argument("--max-pause-ms-per-minute", type=positive(float), default=50.0,
                      metavar="MS", help="stop time allowed across all targets (default 50)")
    live.add_argument("--refresh", type=positive(float), default=30.0, metavar="SECONDS",
                      help="re-read a target this often (default 30)")
    live.add_argument("--retry", type=positive(float), default=300.0, metavar="SECONDS",
                      help="try a target that could not be read again after this (default 300)")
    wall = p.add_argument_group("the allocation wall of the live targets (opt-in; no stop, "
                                "some CPU)")
    wall.add_argument("--wall", action="store_true",
                      help="sample each live target's allocation wall with perf_event_open (as "
                           "`allocdiag wall`, without the counter reads: no thread stopped) and "
                           "export allocdiag_allocator_cpu_ratio, lock-wait seconds, faults and "
                           "syscalls per second")
    wall.add_argument("--wall-window", type=positive(float), default=None, metavar="SECONDS",
                      help="with --wall: seconds per window (default 5)")
    wall.add_argument("--wall-every", type=positive(float), default=None, metavar="SECONDS",
                      help="with --wall: a target's window starts at most this often (default 60)")
    return p


def options(args):
    from diag.exporter import Options
    return Options(group_by=args.group_by, groups=tuple(args.groups), targets=tuple(args.targets),
                   match=args.match, top=args.top, max_targets=args.max_targets,
                   max_pause_ms_per_minute=args.max_pause_ms_per_minute,
                   refresh_s=args.refresh, retry_s=args.retry, proc=args.proc,
                   **_wall_options(args))


def _wall_options(args):
    """Options' wall fields: --wall-window/--wall-every only with --wall."""
    if not args.wall:
        if args.wall_window is not None or args.wall_every is not None:
            raise UsageError("--wall-window and --wall-every go with --wall")
        return {}
    out = {"wall": True}
    if args.wall_window is not None:
        out["wall_window_s"] = args.wall_window
    if args.wall_every is not None:
        out["wall_every_s"] = args.wall_every
    return out


def _check_args(args):
    if args.interval is not None and not args.textfile:
        raise UsageError("--interval goes with --textfile DIR")
    if args.once and args.textfile:
        raise UsageError("--once and --textfile are two modes: choose one")
    if args.textfile and not os.path.isdir(args.textfile):
        raise UsageError(f"--textfile: no such directory: {args.textfile}")
    for pid in args.targets:
        if not os.path.exists(f"{args.proc}/{pid}"):
            raise NoSuchProcess(pid, "no such process (--target)")


def run(args):
    _check_args(args)
    from diag import exporter
    exporter.require_client()
    one_shot = args.once or (args.textfile and args.interval is None)
    collector = exporter.AllocdiagCollector(options(args), sync=one_shot)
    reg = exporter.registry(collector)
    if args.once:
        from prometheus_client import generate_latest
        sys.stdout.write(generate_latest(reg).decode())
        return _one_shot_code(collector)
    if args.textfile:
        path = os.path.join(args.textfile, exporter.TEXTFILE_NAME)
        if one_shot:
            exporter.write_textfile(path, reg)
            return _one_shot_code(collector)
        return _loop(collector, lambda: exporter.write_textfile(path, reg), args.interval)
    # One scan now selects the live targets, so the reader starts on them at
    # once and the first scrape finds them read rather than "pending".
    collector.collect()
    return _serve(collector, reg, *args.listen)


def _one_shot_code(collector):
    return ExitCode.OK if collector.last_live_ok else ExitCode.PARTIAL


def _serve(collector, reg, host, port):
    from prometheus_client import start_http_server
    try:
        server, _ = start_http_server(port, addr=host, registry=reg)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    print(f"allocdiag exporter: serving http://{_url_host(host)}:{server.server_port}/metrics",
          file=sys.stderr, flush=True)
    try:
        return _loop(collector, None, None)
    finally:
        server.shutdown()


def _url_host(host):
    return f"[{host}]" if ":" in host else host


def _loop(collector, job, interval):
    """Run JOB every INTERVAL seconds (or just wait) with the live reader
    started, until SIGTERM (exit 0) or Ctrl-C."""
    stop = threading.Event()
    old = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    collector.start()
    try:
        while not stop.is_set():
            if job is not None:
                job()
            stop.wait(interval if interval else 3600)
    finally:
        collector.stop()
        signal.signal(signal.SIGTERM, old)
    return ExitCode.OK
