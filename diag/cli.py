"""allocdiag command line: argument parsing, exit codes, human and JSON output.

Exit codes (DESIGN.md), defined here once:
  0 ok · 1 internal error · 2 usage · 3 no such process · 4 permission denied ·
  5 allocator not detected / unsupported for what was asked · 6 partial
  (some collectors failed; the document is still printed).
"""

import argparse
import json
import os
import sys
import time

from collectors.errors import AccessDenied, AllocdiagError, NoSuchProcess, Unsupported
from diag import __version__, commands, render

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_NO_PROCESS, EXIT_DENIED, EXIT_UNSUPPORTED, EXIT_PARTIAL = range(7)

EXIT_CODES_HELP = """\
exit codes:
  0  ok
  1  internal error (a bug: please report it with the traceback from --debug)
  2  usage error
  3  no such process (or it exited while being read)
  4  permission denied (run as root, or grant CAP_SYS_PTRACE; see the message)
  5  allocator not detected, or unsupported for what was asked
  6  partial: some collectors failed; the document is still printed
"""


def _pid(text):
    try:
        pid = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}") from None
    if pid <= 0:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}")
    return pid


def build_parser():
    p = argparse.ArgumentParser(
        prog="allocdiag",
        description="Which allocator serves malloc in a running Linux process, what it holds, "
                    "and how that reconciles with the kernel's RSS, LazyFree and cgroup numbers.",
        epilog=EXIT_CODES_HELP + "\nRun 'allocdiag COMMAND --help' for each command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"allocdiag {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    p.add_argument("--proc", default="/proc", metavar="DIR",
                   help="procfs root to read (default /proc; a captured tree for offline use)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    ps = sub.add_parser(
        "ps", help="every readable process: allocator, preload verdict, RSS split",
        description="List every process the caller can read, with the allocator serving malloc "
                    "(and how it is linked), the LD_PRELOAD verdict, RSS, anonymous RSS, LazyFree "
                    "and thread count.  Nothing is stopped.  Processes that cannot be read are "
                    "counted and reported at the end.",
        epilog="examples:\n  allocdiag ps\n  allocdiag ps --json | jq '.processes[] | "
               "select(.allocator.kind==\"jemalloc\")'\n\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ps.add_argument("--json", action="store_true", help="print one JSON document")
    ps.add_argument("--sort", choices=("rss", "pid", "lazyfree", "anon"), default="rss",
                    help="sort key (default rss, largest first)")

    ins = sub.add_parser(
        "inspect", help="one process: allocator, preload, kernel and cgroup memory",
        description="Describe one process: the allocator serving malloc and the others loaded "
                    "(with the evidence), the LD_PRELOAD verdict, the kernel's memory view "
                    "(RSS split, LazyFree, THP, swap), its memory cgroup (usage, working set, "
                    "limit), and the allocator's own numbers (allocated, active, resident, "
                    "mapped, ...), read by calling its stats functions on one idle thread of the "
                    "target for a few milliseconds (no other thread is stopped; --no-attach "
                    "avoids even that).  --json prints the document described in DESIGN.md.",
        epilog="examples:\n  allocdiag inspect 1234\n  allocdiag inspect --json 1234 > snap.json\n"
               "  allocdiag inspect --no-attach 1234\n  allocdiag inspect --from malloc_info.xml\n\n"
               + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ins.add_argument("pid", type=_pid, nargs="?")
    ins.add_argument("--json", action="store_true", help="print one JSON document")
    ins.add_argument("--no-attach", action="store_true",
                     help="read /proc and the ELF files only; never stop a thread of the target "
                          "(allocator stats are then unknown)")
    ins.add_argument("--arenas", action="store_true",
                     help="also read per-arena rows (jemalloc; glibc arenas are always read)")
    ins.add_argument("--from", dest="from_file", metavar="FILE",
                     help="read a saved malloc_info XML, jemalloc malloc_stats_print JSON "
                          "(opts 'J'), gperftools MallocExtension_GetStats text or mimalloc "
                          "stats text instead of a live process")

    pre = sub.add_parser(
        "preload", help="did LD_PRELOAD take effect, and if not, why",
        description="Compare what was requested (LD_PRELOAD in the process's initial environment, "
                    "/etc/ld.so.preload in its root) with what is mapped and with where the "
                    "process's malloc GOT slot really points.  Nothing is stopped.",
        epilog="examples:\n  allocdiag preload 1234\n  allocdiag preload --expect jemalloc 1234\n\n"
               "exit status 0 when the verdict could be made (in effect or not); see --json's "
               "'effective' for the answer.\n\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    pre.add_argument("pid", type=_pid)
    pre.add_argument("--json", action="store_true", help="print one JSON document")
    pre.add_argument("--expect", metavar="ALLOCATOR",
                     help="the allocator you expected (jemalloc, tcmalloc, mimalloc): when nothing "
                          "was requested, explain why")
    ex = sub.add_parser(
        "explain", help="where the RSS goes, and what to do about it",
        description="A plain-language account of one process: where its RSS goes (allocator-held "
                    "live, fragmentation and free pages, LazyFree, other anonymous memory, files), "
                    "the findings in order of bytes at stake with the knob, its current value and "
                    "where that came from, and what an RSS panel and a cgroup working-set panel "
                    "would show and why they differ.",
        epilog="examples:\n  allocdiag explain 1234\n  allocdiag explain --json 1234\n\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ex.add_argument("pid", type=_pid)
    ex.add_argument("--json", action="store_true", help="print the snapshot document (with findings)")
    ex.add_argument("--no-attach", action="store_true", help="read /proc only (fewer findings)")

    rel = sub.add_parser(
        "release", help="make the allocator give free memory back now; measure before/after",
        description="Call the allocator's own release function in the target -- glibc "
                    "malloc_trim(0), jemalloc arena.4096.purge, tcmalloc "
                    "MallocExtension_ReleaseFreeMemory, mimalloc mi_collect(true) -- and print RSS, "
                    "anonymous RSS, LazyFree and the allocator stack before and after, so what it "
                    "gave back is measured.  Changes the target's allocator state: asks first "
                    "unless --yes.",
        epilog="examples:\n  allocdiag release 1234\n  allocdiag release --yes --json 1234\n\n"
               + EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    rel.add_argument("pid", type=_pid)
    rel.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    rel.add_argument("--json", action="store_true", help="print one JSON document")

    st = sub.add_parser(
        "set", help="change a runtime knob of the allocator (shows old and new value)",
        description="Change an allocator knob that the allocator lets a running program change: "
                    "jemalloc dirty_decay_ms, muzzy_decay_ms (every arena and the default for new "
                    "ones), background_thread; glibc mallopt parameters (arena_max, trim_threshold, "
                    "top_pad, mmap_threshold, mmap_max, arena_test); gperftools "
                    "max_total_thread_cache_bytes; mimalloc options (mi_option_set).  Asks first "
                    "unless --yes.",
        epilog="examples:\n  allocdiag set 1234 dirty_decay_ms=1000\n"
               "  allocdiag set --yes 1234 background_thread=true\n\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    st.add_argument("pid", type=_pid)
    st.add_argument("assignment", metavar="KNOB=VALUE")
    st.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    st.add_argument("--json", action="store_true", help="print one JSON document")
    dm = sub.add_parser(
        "demo", help="run the classic allocator situations from examples/ and look at them",
        description="Start a set of the example workloads (LazyFree-inflated RSS under jemalloc, "
                    "glibc holding freed memory, arena sprawl, a fragmentation staircase, a "
                    "preload typo) under the installed allocators, then open the terminal UI on "
                    "them; with --no-tui print `explain` for each.  Every workload is stopped when "
                    "the demo ends.  Needs about 1 GiB of memory.",
        epilog="examples:\n  allocdiag demo\n  allocdiag demo --no-tui --only glibc_held\n\n"
               + EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    dm.add_argument("--no-tui", action="store_true", help="print explain for each instead")
    dm.add_argument("--only", action="append", metavar="WORKLOAD",
                    help="run only this workload (repeatable); see --list")
    dm.add_argument("--list", action="store_true", help="list the workloads and exit")
    top = sub.add_parser(
        "top", help="the host view (terminal UI); also what plain `allocdiag` runs",
        description="A live table of every readable process: allocator, preload verdict, RSS, "
                    "anonymous RSS, LazyFree and the top finding; sortable, filterable with /; "
                    "Enter opens the process view.  Nothing is stopped for the table; the process "
                    "view borrows one idle thread of its target per sample (--no-attach: never).",
        epilog="keys: ? help, q quit\n\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--no-attach", action="store_true", help="never stop a thread of any target")

    wa = sub.add_parser(
        "watch", help="live process view: allocator stacks, history, findings, actions",
        description="The process view of the terminal UI for PID: the allocator stack "
                    "(allocated / active / resident, mapped shown apart), the RSS split "
                    "(allocator-held / LazyFree / other anon / file / shmem), cgroup usage and "
                    "working set, a history of the layers, the allocator's own tables, findings "
                    "with their knobs, and actions (release now, set a knob, pause, interval, "
                    "record).  Each sample borrows one idle thread of the target for about a "
                    "millisecond; the default interval keeps that far below 1% of wall time.",
        epilog="examples:\n  allocdiag watch 1234\n  allocdiag watch --interval 5 --no-attach 1234\n\n"
               "keys: ? help, space pause, i interval, r release, k knob, w record, q quit\n\n"
               + EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    wa.add_argument("pid", type=_pid)
    wa.add_argument("--interval", type=float, default=2.0, metavar="S",
                    help="seconds between samples (default 2)")
    wa.add_argument("--no-attach", action="store_true", help="read /proc only; never stop a thread")

    rc = sub.add_parser(
        "record", help="record snapshots of PID to a JSON Lines file (gzip with .gz)",
        description="Write one snapshot per line -- the same document as `inspect --json` -- every "
                    "INTERVAL seconds until DURATION passes, the process exits, or Ctrl-C.  A "
                    "recording is how an incident is shared: `allocdiag replay FILE` opens it in "
                    "the process view.",
        epilog="examples:\n  allocdiag record 1234 -o incident.jsonl.gz --duration 600\n\n"
               + EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    rc.add_argument("pid", type=_pid)
    rc.add_argument("-o", "--output", required=True, metavar="FILE")
    rc.add_argument("--interval", type=float, default=2.0, metavar="S")
    rc.add_argument("--duration", type=float, default=None, metavar="S",
                    help="stop after S seconds (default: until the process exits or Ctrl-C)")
    rc.add_argument("--no-attach", action="store_true", help="read /proc only; never stop a thread")

    rp = sub.add_parser(
        "replay", help="open a recording in the process view, with time navigation",
        description="Open a recording made by `allocdiag record` (or the TUI's w key) in the "
                    "process view; left/right step through samples, Home/End jump.",
        epilog="examples:\n  allocdiag replay incident.jsonl.gz\n\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_argument("file")
    for mod in commands.load():
        mod.add_parser(sub)
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["top"] + (argv if argv is not None else sys.argv[1:]))
    try:
        handler = COMMANDS.get(args.command)
        if handler is None:
            handler = {m.NAME: m.run for m in commands.load()}[args.command]
        return int(handler(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `allocdiag ps | head`: not an error.
        sys.stderr.close()
        return EXIT_OK
    except AllocdiagError as exc:
        _print_error(exc)
        return exc.exit_code
    except Exception:
        if args.debug:
            raise
        import traceback
        print("allocdiag: internal error (re-run with --debug for the traceback):", file=sys.stderr)
        print("  " + traceback.format_exc().strip().splitlines()[-1], file=sys.stderr)
        return EXIT_INTERNAL


class UsageError(AllocdiagError):
    exit_code = EXIT_USAGE


def _print_error(exc):
    print(f"allocdiag: {exc}", file=sys.stderr)
    if exc.remediation:
        print(exc.remediation, file=sys.stderr)


def _dump(doc):
    json.dump(doc, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


# -- ps ---------------------------------------------------------------------

def cmd_ps(args):
    from diag import hostscan
    result = hostscan.scan(procfs_root=args.proc, workers=min(2, os.cpu_count() or 1))
    rows = result.rows
    key = {"rss": lambda r: -(r["rss"] or 0), "pid": lambda r: r["pid"],
           "lazyfree": lambda r: -(r["lazyfree"] or 0), "anon": lambda r: -(r["rss_anon"] or 0)}
    rows.sort(key=key[args.sort])
    if args.json:
        _dump(result.to_json())
        return EXIT_OK
    out = []
    for r in rows:
        a = r["allocator"]
        alloc = a["kind"] + (f"/{a['linkage']}" if a["linkage"] else "")
        if a.get("prefix"):
            alloc += f"({a['prefix']})"
        out.append([str(r["pid"]), (r["comm"] or "?")[:16], alloc,
                    render.human_bytes(r["rss"]), render.human_bytes(r["rss_anon"]),
                    render.human_bytes(r["lazyfree"]), str(r["threads"] or "-"),
                    r["preload"]["verdict"]])
    render.table(out, ["PID", "COMMAND", "ALLOCATOR", "RSS", "ANON", "LAZYFREE", "THR", "PRELOAD"],
                 right={0, 3, 4, 5, 6})
    tail = [f"{len(rows)} processes"]
    if result.denied:
        tail.append(f"{result.denied} not readable (permission denied: run as root to see them)")
    if result.vanished:
        tail.append(f"{result.vanished} exited while being read")
    if result.failed:
        tail.append(f"{len(result.failed)} failed: " + "; ".join(
            f"{pid}: {err}" for pid, err in result.failed[:3]))
    print("; ".join(tail), file=sys.stderr)
    return EXIT_OK


# -- inspect / preload ------------------------------------------------------------

def _take(args, expect=None, attach=False):
    from collectors.procfs import ProcFS
    from diag import snapshot
    return snapshot.take(args.pid, procfs=ProcFS(args.proc), expect=expect, attach=attach,
                         per_arena=getattr(args, "arenas", False))


def cmd_inspect(args):
    if args.from_file:
        from diag import filemode
        snap = filemode.snapshot_from_file(args.from_file)
        if args.json:
            _dump(snap.to_json())
        else:
            print_inspect(snap)
        return EXIT_OK
    if args.pid is None:
        raise UsageError("inspect needs a PID (or --from FILE)")
    snap, col = _take(args, attach=not args.no_attach)
    if args.json:
        _dump(snap.to_json())
    else:
        print_inspect(snap)
    if col.partial:
        if col.first_denied is not None:
            _print_error(col.first_denied)
        return EXIT_PARTIAL
    return EXIT_OK


def cmd_preload(args):
    snap, col = _take(args, expect=args.expect)
    if args.json:
        _dump({"pid": snap.pid, "comm": snap.comm, "exe": snap.exe,
               "allocator": snap.allocator.to_json(), "preload": snap.preload.to_json()})
    else:
        print_preload(snap)
    if col.first_denied is not None and not args.json:
        _print_error(col.first_denied)
    return EXIT_PARTIAL if col.partial else EXIT_OK


def _alloc_line(a):
    text = a.kind
    if a.version:
        text += f" {a.version}"
    extra = [x for x in (a.variant, a.linkage, f"prefix {a.prefix}" if a.prefix else None) if x]
    if extra:
        text += f" ({', '.join(extra)})"
    if a.path:
        text += f"  {a.path}"
    return text


def print_preload(snap, out=None):
    out = out or sys.stdout
    p = snap.preload
    print(f"pid {snap.pid}  {snap.comm or '?'}  {snap.exe or ''}".rstrip(), file=out)
    pairs = [("requested", ", ".join(p.requested) or "nothing (no LD_PRELOAD, no /etc/ld.so.preload)"),
             ("verdict", p.verdict),
             ("malloc from", _alloc_line(snap.allocator))]
    for b in p.bindings:
        if b.symbol == "malloc":
            state = ("-> " + (b.target_path or "?")) if b.resolved else \
                ("not bound yet (lazy)" if b.resolved is False else "unreadable")
            pairs.append(("GOT slot", f"{os.path.basename(b.object)} malloc @ {b.slot:#x} {state}"))
    render.kv(pairs, out=out, indent="")
    for r in p.reasons:
        print(f"  why: {r}", file=out)
    for n in p.notes:
        print(f"  note: {n}", file=out)


def print_inspect(snap, out=None):
    out = out or sys.stdout
    a, p, m, c = snap.allocator, snap.preload, snap.process, snap.cgroup
    print(f"pid {snap.pid}  {snap.comm or '?'}  {snap.exe or ''}".rstrip(), file=out)
    pairs = [("allocator", _alloc_line(a))]
    for e in a.evidence:
        pairs.append(("  evidence", e))
    for o in a.others:
        pairs.append(("  also loaded", _alloc_line(o)))
        for e in o.evidence[1:]:
            pairs.append(("", e))
    pairs.append(("preload", p.verdict))
    for r in p.reasons:
        pairs.append(("  why", r))
    for n in p.notes:
        pairs.append(("  note", n))
    hb = render.human_bytes
    pairs.append(("RSS", f"{hb(m.rss)} = anon {hb(m.rss_anon)} + file {hb(m.rss_file)} "
                         f"+ shmem {hb(m.rss_shmem)}"))
    lazy = hb(m.lazyfree) if m.lazyfree is not None else "not reported by this kernel"
    pairs.append(("  LazyFree", f"{lazy} {render.pct(m.lazyfree, m.rss)} of RSS".rstrip()
                  if m.lazyfree else lazy))
    pairs.append(("  THP / swap", f"{hb(m.anon_thp)} / {hb(m.swap)}"))
    pairs.append(("  PSS", f"{hb(m.pss)}  (source: {m.source})"))
    pairs.append(("  threads", str(m.threads if m.threads is not None else "-")))
    if c.usage is not None:
        lim = hb(c.limit) if c.limit is not None else "none"
        pairs.append(("cgroup", f"v{c.version} {c.path}"))
        pairs.append(("  usage", f"{hb(c.usage)}  working set {hb(c.working_set)} "
                                  f"(usage - inactive_file {hb(c.inactive_file)})  limit {lim}"))
    else:
        pairs.append(("cgroup", c.error or "unknown"))
    known = {k: v for k, v in snap.stats.items() if v.value is not None}
    remote = snap.collectors.get("remote")
    if known:
        head = "allocator stats"
        if remote is not None and remote.pause_us is not None:
            thread = snap.native.get("borrowed_thread") or {}
            head_v = (f"borrowed thread {thread.get('tid')} ({thread.get('syscall') or thread.get('kind')}) "
                      f"for {remote.pause_us} us")
        else:
            head_v = ""
        pairs.append((head, head_v))
        for k, v in known.items():
            pairs.append((f"  {render.label(k)}", f"{hb(v.value):>10}  {v.provenance}: {v.source}"))
        unknown = [render.label(k) for k, v in snap.stats.items() if v.value is None]
        if unknown:
            pairs.append(("  unknown", ", ".join(unknown)))
    else:
        why = remote.error if remote is not None and remote.error else "not collected (--no-attach)"
        pairs.append(("allocator stats", f"unknown: {why}"))
    render.kv(pairs, out=out, indent="")
    failed = [f"{n}: {s.error}" for n, s in snap.collectors.items() if not s.ok]
    if failed:
        print("partial: " + "; ".join(failed), file=out)


def _confirm(question, args):
    """True to go ahead.  Without a terminal to ask on, --yes is required."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise UsageError(f"{question} -- refusing without --yes (no terminal to ask on)")
    answer = input(f"{question} [y/N] ").strip().lower()
    return answer in ("y", "yes")


def cmd_explain(args):
    snap, col = _take(args, attach=not args.no_attach)
    if args.json:
        _dump(snap.to_json())
    else:
        print_explain(snap)
    return EXIT_PARTIAL if col.partial else EXIT_OK


def print_explain(snap, out=None):
    from diag import breakdown
    out = out or sys.stdout
    hb = render.human_bytes
    p, c = snap.process, snap.cgroup
    print(f"pid {snap.pid} {snap.comm or '?'}: malloc is served by {_alloc_line(snap.allocator)}",
          file=out)
    print(f"\nWhere the RSS goes ({hb(p.rss)}):", file=out)
    rows = []
    for layer in breakdown.layers(snap):
        indent = "  " * (layer.depth + 1)
        rows.append([indent + layer.label, hb(layer.bytes), render.pct(layer.bytes, p.rss),
                     layer.note or ""])
    if rows:
        render.table(rows, ["layer", "bytes", "of RSS", "how known"], right={1, 2}, out=out)
    held, _ = breakdown.allocator_held(snap)
    if held is None:
        remote = snap.collectors.get("remote")
        why = remote.error if remote is not None and remote.error else "not attached"
        print(f"  (allocator share unknown: {why})", file=out)
    print("\nFindings, most bytes at stake first:" if snap.findings else "\nFindings: none", file=out)
    for i, f in enumerate(snap.findings, 1):
        stake = f" [{hb(f.expected_effect_bytes)} at stake]" if f.expected_effect_bytes else ""
        print(f"  {i}. {f.severity}: {f.title}{stake}", file=out)
        if f.knob is not None:
            k = f.knob
            line = f"     knob {k.name}"
            if k.current is not None:
                line += f" = {k.current} ({k.source})"
            if k.suggested:
                line += f"; suggested: {k.suggested}"
            print(line, file=out)
            if k.how:
                print(f"     how: {k.how}", file=out)
    print("\nWhat dashboards show:", file=out)
    print(f"  an RSS panel (ps, top, process_resident_memory_bytes) shows {hb(p.rss)}", file=out)
    if c.usage is not None:
        print(f"  a cgroup working-set panel (kubectl top, cAdvisor) shows {hb(c.working_set)} for "
              f"the whole cgroup: usage {hb(c.usage)} minus inactive_file {hb(c.inactive_file)}", file=out)
        if p.lazyfree:
            print(f"  they differ partly because {hb(p.lazyfree)} of LazyFree pages count in RSS but sit "
                  "on the cgroup's inactive list, so the working set leaves them out", file=out)
        else:
            print("  the cgroup also counts page cache and other processes, and drops inactive file "
                  "pages; RSS counts only this process's mapped pages", file=out)


def _stack_rows(snap):
    hb = render.human_bytes
    p = snap.process
    rows = [("RSS", p.rss), ("anon", p.rss_anon), ("LazyFree", p.lazyfree)]
    for name in ("allocated", "active", "resident", "mapped", "dirty", "muzzy", "retained"):
        v = snap.stats.get(name)
        if v is not None and v.value is not None:
            rows.append((render.label(name), v.value))
    return rows


def cmd_release(args):
    from diag import actions
    kind, call = actions.describe_release(args.pid)
    if call is None:
        raise Unsupported(f"{kind}: allocdiag knows no release call for this allocator", pid=args.pid)
    if not _confirm(f"call {call} in pid {args.pid} ({kind})?", args):
        print("nothing done", file=sys.stderr)
        return EXIT_OK
    r = actions.release(args.pid)
    before, after = r["before"], r["after"]
    if args.json:
        _dump({"pid": args.pid, "call": r["call"], "return": r["return"], "pause_us": r["pause_us"],
               "before": before.to_json(), "after": after.to_json()})
        return EXIT_OK
    print(f"pid {args.pid}: {r['call']} returned {r['return']} "
          f"(thread stopped {max(r['pause_us'] or [0])} us)")
    b, a = dict(_stack_rows(before)), dict(_stack_rows(after))
    rows = []
    for name, _ in _stack_rows(before):
        if name in a:
            delta = (a[name] or 0) - (b[name] or 0)
            rows.append([name, render.human_bytes(b[name]), render.human_bytes(a[name]),
                         ("-" if delta < 0 else "+") + render.human_bytes(abs(delta))])
    render.table(rows, ["", "before", "after", "change"], right={1, 2, 3})
    return EXIT_OK


def cmd_set(args):
    from diag import actions
    name, sep, value = args.assignment.partition("=")
    if not sep or not name:
        raise UsageError(f"expected KNOB=VALUE, got {args.assignment!r}")
    if not _confirm(f"set {name}={value} in pid {args.pid}?", args):
        print("nothing done", file=sys.stderr)
        return EXIT_OK
    r = actions.set_knob(args.pid, name, value)
    if args.json:
        _dump({"pid": args.pid, **r})
    else:
        print(f"pid {args.pid} ({r['allocator']}): {name} {r['old'] if r['old'] is not None else '?'} "
              f"-> {r['new']}")
        print(f"  via {r['detail']}")
    return EXIT_OK


def cmd_demo(args):
    from diag import demo
    if args.list:
        for name, alloc, dargs, what in demo.SCENES:
            print(f"{name:18} {alloc:10} {what}")
        return EXIT_OK
    return demo.run(only=args.only, tui=not args.no_tui)


def cmd_top(args):
    from tui import app
    return app.run_host(no_attach=args.no_attach)


def cmd_watch(args):
    from tui import app
    if args.interval < 0.2:
        raise UsageError("--interval must be at least 0.2 seconds")
    return app.run_watch(args.pid, interval=args.interval, no_attach=args.no_attach)


def cmd_replay(args):
    from tui import app
    return app.run_replay(args.file)


def cmd_record(args):
    from diag import recording
    if args.interval < 0.2:
        raise UsageError("--interval must be at least 0.2 seconds")
    tty = sys.stderr.isatty()
    t0 = time.monotonic()

    def progress(count, snap):
        rss = render.human_bytes(snap.process.rss)
        msg = f"{count} snapshots, {time.monotonic() - t0:.0f} s, RSS {rss} -> {args.output}"
        if tty:
            print("\r" + msg, end="", file=sys.stderr, flush=True)
        elif count == 1 or count % 30 == 0:
            print(msg, file=sys.stderr)

    try:
        n = recording.record(args.pid, args.output, interval=args.interval,
                             duration=args.duration, progress_cb=progress,
                             no_attach=args.no_attach)
    except KeyboardInterrupt:
        n = None
    if tty:
        print(file=sys.stderr)
    print(f"recorded {'' if n is None else n} snapshots of pid {args.pid} to {args.output}",
          file=sys.stderr)
    return EXIT_OK


COMMANDS = {"top": cmd_top, "watch": cmd_watch, "record": cmd_record, "replay": cmd_replay,
            "demo": cmd_demo, "ps": cmd_ps, "inspect": cmd_inspect, "preload": cmd_preload, "explain": cmd_explain,
            "release": cmd_release, "set": cmd_set}
