"""``allocdiag ps``: the host table as text or JSON."""

import os
import sys

from diag import render
from diag.commands.common import add_command, dump_json
from diag.model.exitcodes import ExitCode

NAME = "ps"
SORT_KEYS = {"rss": lambda r: -(r["rss"] or 0), "pid": lambda r: r["pid"],
             "lazyfree": lambda r: -(r["lazyfree"] or 0), "anon": lambda r: -(r["rss_anon"] or 0)}


def add_parser(sub):
    p = add_command(
        sub, NAME, help="every readable process: allocator, preload verdict, RSS split",
        description="List every process the caller can read, with its user, CPU% (average over "
                    "its lifetime, as ps shows it), the allocator serving malloc "
                    "(and how it is linked), the LD_PRELOAD verdict, RSS, anonymous RSS, LazyFree "
                    "and thread count.  Nothing is stopped.  Processes that cannot be read are "
                    "counted and reported at the end.",
        examples=["allocdiag ps",
                  "allocdiag ps --json | jq '.processes[] | select(.allocator.kind==\"jemalloc\")'"])
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--sort", choices=tuple(SORT_KEYS), default="rss",
                   help="sort key (default rss, largest first)")
    return p


def run(args):
    from diag import hostscan
    # the table shows no exe and no findings: not built for it (--json has every column)
    columns = hostscan.PS_COLUMNS if args.json else \
        ("user", "cpu_percent", "comm", "allocator", "rss", "rss_anon", "lazyfree", "threads",
         "preload")
    result = hostscan.scan(procfs_root=args.proc, workers=min(2, os.cpu_count() or 1),
                           columns=columns)
    rows = result.rows
    rows.sort(key=SORT_KEYS[args.sort])
    if args.json:
        dump_json(result.to_json(), one_per_line=("processes", "failed"))
        return ExitCode.OK
    out = []
    for r in rows:
        a = r["allocator"]
        alloc = a["kind"] + (f"/{a['linkage']}" if a["linkage"] else "")
        if a.get("prefix"):
            alloc += f"({a['prefix']})"
        cpu = "-" if r["cpu_percent"] is None else f"{r['cpu_percent']:.1f}"
        out.append([str(r["pid"]), (r["user"] or "-")[:10], cpu, (r["comm"] or "?")[:16], alloc,
                    render.human_bytes(r["rss"]), render.human_bytes(r["rss_anon"]),
                    render.human_bytes(r["lazyfree"]), str(r["threads"] or "-"),
                    r["preload"]["verdict"]])
    render.table(out, ["PID", "USER", "%CPU", "COMMAND", "ALLOCATOR", "RSS", "ANON", "LAZYFREE",
                       "THR", "PRELOAD"], right={0, 2, 5, 6, 7, 8})
    tail = [f"{len(rows)} processes"]
    if result.denied:
        tail.append(f"{result.denied} not readable (permission denied: "
                    f"{hostscan.unreadable_hint()})")
    if result.vanished:
        tail.append(f"{result.vanished} exited while being read")
    if result.failed:
        tail.append(f"{len(result.failed)} failed: " + "; ".join(
            f"{pid}: {err}" for pid, err in result.failed[:3]))
    print("; ".join(tail), file=sys.stderr)
    return ExitCode.OK
