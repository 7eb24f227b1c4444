"""``allocdiag heap``: heap profiles of a running process -- what it can do
(status), start / dump / stop its allocator's own profiler through the
remote-call engine (collectors.heapcontrol), and views of a dump (show) or
of two dumps (diff) from diag.heapview."""

import os
import sys
import time

from diag.commands.common import (EXIT_CODES_HELP, UsageError, add_command, confirm,
                                  dump_json, pid_arg, print_error)
from diag.model.exitcodes import ExitCode
from diag.terminal import HelpFormatter

NAME = "heap"
VIEW_KEYS = ("inuse_bytes", "inuse_objects", "alloc_bytes", "alloc_objects")
DEFAULT_TOP = 20
DUMP_TOP = 10                 # sites printed after a dump
DEFAULT_OUT = "heap-{pid}-{stamp}.heap"

# Measured by bench/heapprof_cost.py (figures and machine in bench/README.md).
COST = ("cost: gperftools' heap profiler records EVERY allocation after `heap start` (no "
        "sampling; a stack capture and a table insert per malloc): it added about 5 us to each "
        "malloc+free, so a tight churn loop ran at 0.0035x its speed (bench/heapprof_cost.py); "
        "a program doing real work between allocations slows by that 5 us times its allocation "
        "rate.  `heap stop` removes the hooks and the data.  jemalloc samples (on average one "
        "allocation per 512 KiB, lg_prof_sample 19): prof.active on added about 0.03 us per op "
        "(the same loop at 0.5x); armed but inactive (prof:true,prof_active:false) cost nothing "
        "measurable.  Each start/dump/stop stops one idle thread for about a millisecond; "
        "GetHeapProfile holds the profiler's lock while it writes, so allocating threads wait "
        "that long.")
GROWTH = ("A gperftools profile started here sees only what is allocated after the start: "
          "the growth since attach.  Allocations made before are never seen.")
FILES = ("Files the target must write go to /tmp/allocdiag-heap-PID-START inside the target's "
         "own root, created with its uid/gid and removed by `heap stop` (jemalloc: right after "
         "the dump is copied out).")


def add_parser(sub):
    p = add_command(
        sub, NAME, help="heap profiles: start/dump/stop the allocator's profiler; show, diff",
        description="Heap profiles of a running process through its allocator's own profiler, "
                    "called on one idle thread at a safe point: gperftools (full "
                    "libtcmalloc.so.4: HeapProfilerStart, GetHeapProfile, HeapProfilerStop) and "
                    "jemalloc started with prof:true (prof.active, prof.dump).  Without one "
                    "(glibc, mimalloc, libtcmalloc_minimal, jemalloc without prof:true) `status` "
                    "says so and how to restart the program so it works (exit 5).  Profiles the "
                    "program writes itself (HEAPPROFILE, jemalloc prof_prefix) are listed and "
                    "can be copied with `dump --latest`.\n\n" + GROWTH + "\n\n" + COST + "\n\n"
                    + FILES,
        examples=["allocdiag heap status 1234",
                  "allocdiag heap start 1234            # gperftools: growth from now on",
                  "allocdiag heap dump 1234 -o a.heap   # also writes a.heap.snapshot.json",
                  "allocdiag heap dump 1234 -o b.heap",
                  "allocdiag heap diff a.heap b.heap    # what grew, next to RSS/allocator deltas",
                  "allocdiag heap stop 1234",
                  "allocdiag heap show b.heap --top 30",
                  "allocdiag heap show b.heap --collapsed > b.folded   # flamegraph.pl",
                  "allocdiag heap dump 1234 --latest -o last.heap   # its own HEAPPROFILE"])
    hs = p.add_subparsers(dest="heap_command", metavar="ACTION")
    # diag.cli.parse reports an unknown option with the action's usage
    p.set_defaults(heap_command=None, action_dest="heap_command", action_parsers=hs.choices)

    def action(name, help_text, more=""):
        return hs.add_parser(name, help=help_text, description=help_text + more,
                             epilog=EXIT_CODES_HELP,
                             formatter_class=HelpFormatter)

    s = action("status", "what heap profiling the process can do, and why (exit 5: none)")
    s.add_argument("pid", type=pid_arg)
    s.add_argument("--json", action="store_true", help="print one JSON document")

    s = action("start", "start (gperftools) or activate (jemalloc prof.active) the profiler",
               ".\n\n" + GROWTH + "\n\n" + COST + "\n\n" + FILES)
    s.add_argument("pid", type=pid_arg)
    s.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    s.add_argument("--json", action="store_true", help="print one JSON document")

    s = action("dump", "take a profile now and write it to FILE, with FILE.snapshot.json (the "
                       "`inspect --json` document of the same moment, which `heap diff` reads)")
    s.add_argument("pid", type=pid_arg)
    s.add_argument("-o", "--output", metavar="FILE",
                   help="where to write it (default heap-PID-YYYYmmdd-HHMMSS.heap)")
    s.add_argument("--latest", action="store_true",
                   help="copy the newest profile the program wrote itself (HEAPPROFILE, jemalloc "
                        "prof_prefix) instead of taking one")
    s.add_argument("--no-snapshot", action="store_true",
                   help="do not write FILE.snapshot.json (no second stop of the target)")
    s.add_argument("--top", type=int, default=DUMP_TOP, metavar="N", help="sites to print")
    s.add_argument("--json", action="store_true",
                   help="print one JSON document (sites biggest first, allocator frames dropped)")

    s = action("stop", "stop the profiler allocdiag started (gperftools: its data is dropped; "
                       "jemalloc: prof.active off) and remove allocdiag's directory")
    s.add_argument("pid", type=pid_arg)
    s.add_argument("--force", action="store_true",
                   help="also stop a gperftools profile the program started itself")
    s.add_argument("--json", action="store_true", help="print one JSON document")

    s = action("show", "one profile file: top sites (default), --tree, --collapsed, --legacy")
    s.add_argument("file")
    _view_options(s)
    s.add_argument("--tree", action="store_true", help="the call tree, outermost caller first")
    s.add_argument("--collapsed", action="store_true",
                   help="collapsed stacks (flamegraph.pl, speedscope, inferno)")
    s.add_argument("--legacy", metavar="OUT", help="also write the profile as legacy .heap text "
                                                   "for pprof/jeprof")

    s = action("diff", "what grew between two dumps, next to the allocator and kernel deltas "
                       "of the same two moments (from the .snapshot.json sidecars)")
    s.add_argument("a")
    s.add_argument("b")
    _view_options(s)
    return p


def _view_options(s):
    s.add_argument("--pid", type=pid_arg,
                   help="symbolize through this live process's root (/proc/PID/root; containers)")
    s.add_argument("--top", type=int, default=DEFAULT_TOP, metavar="N", help="rows to print")
    s.add_argument("--by", choices=VIEW_KEYS, default="inuse_bytes", help="value to rank by")
    s.add_argument("--json", action="store_true",
                   help="print one JSON document (sites biggest first, allocator frames dropped)")


def run(args):
    if args.heap_command is None:
        raise UsageError("heap needs an action: status, start, dump, stop, show or diff "
                         "(allocdiag heap --help)")
    return {"status": _status, "start": _start, "dump": _dump, "stop": _stop,
            "show": _show, "diff": _diff}[args.heap_command](args)


def _procfs(args):
    from collectors.proc.procfs import ProcFS
    return ProcFS(args.proc)


def _root(args, pid):
    return _procfs(args).path(pid, "root") if pid else None


def _pause(info):
    return f"thread stopped {max(info.get('pause_us') or [0])} us"


# -- status / start / stop ------------------------------------------------------------

def _status(args):
    from collectors import heapcontrol
    doc = heapcontrol.status(args.pid, _procfs(args))
    code = ExitCode.OK if doc["possible"] else ExitCode.UNSUPPORTED
    if args.json:
        dump_json({**doc, "files": [{k: v for k, v in f.items() if k != "local"}
                                    for f in doc["files"]]})
        return code
    a = doc["allocator"]
    print(f"pid {doc['pid']}: {a['kind']}{' ' + a['variant'] if a['variant'] else ''}"
          f"{' ' + a['version'] if a['version'] else ''}  {a['path'] or ''}".rstrip())
    print(f"heap profiling: {'possible' if doc['possible'] else 'NOT possible'} -- {doc['reason']}")
    if doc["possible"]:
        print(f"  through: {doc['how']}")
        print(f"  running now: {'yes' if doc['running'] else 'no'}")
    for name, value in doc["values"].items():
        print(f"  {name} = {_show_value(value)}")
    for name, value in doc["env"].items():
        print(f"  env {name}={value}")
    for note in doc["notes"]:
        print(f"  note: {note}")
    if doc["work_dir"]:
        print(f"  allocdiag's directory in the target: {doc['work_dir']} (removed by heap stop)")
    if doc["files"]:
        print("profiles already on disk (newest last; `heap dump --latest` copies the newest):")
        for f in doc["files"]:
            print(f"  {f['path']}  {f['bytes']} bytes  "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(f['mtime']))}  "
                  f"({f['source']})")
    if doc["remedy"]:
        print(f"how: {doc['remedy']}")
    return code


def _show_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    return "(none)" if v is None else str(v)


def _start(args):
    from collectors import heapcontrol
    procfs = _procfs(args)
    doc = heapcontrol.status(args.pid, procfs)
    if not doc["possible"]:
        raise heapcontrol.not_possible(doc)
    what = heapcontrol.start_wording(doc)
    if not doc["running"] and not confirm(f"{what} in pid {args.pid}?", args):
        print("nothing done", file=sys.stderr)
        return ExitCode.OK
    r = heapcontrol.start(args.pid, procfs)
    if args.json:
        dump_json({"pid": args.pid, **r})
        return ExitCode.OK
    state = "was already running" if r["was_running"] else "started"
    print(f"pid {args.pid}: {r['call']}: profiler {state} ({_pause(r)})")
    for note in r["notes"]:
        print(f"note: {note}")
    print(f"next: allocdiag heap dump {args.pid} -o FILE; allocdiag heap stop {args.pid}")
    return ExitCode.OK


def _stop(args):
    from collectors import heapcontrol
    r = heapcontrol.stop(args.pid, _procfs(args), force=args.force)
    if args.json:
        dump_json({"pid": args.pid, **r})
        return ExitCode.OK
    if r["call"]:
        print(f"pid {args.pid}: {r['call']} ({_pause(r)}); running now: "
              f"{'yes' if r['running'] else 'no'}")
    if r["removed"]:
        print(f"removed {r['removed']} (inside the target's root)")
    for note in r["notes"]:
        print(f"note: {note}")
    return ExitCode.OK


# -- dump ------------------------------------------------------------------------------

def _dump(args):
    from collectors import heapcontrol
    from diag import heapview
    procfs = _procfs(args)
    out = args.output or DEFAULT_OUT.format(pid=args.pid, stamp=time.strftime("%Y%m%d-%H%M%S"))
    if args.latest:
        data, newest, doc = heapcontrol.latest(args.pid, procfs)
        _write(out, data)
        info = {"call": None, "source": newest["path"], "notes": [
            f"copied {newest['path']} ({newest['source']}); no snapshot sidecar: the file was "
            f"written at {time.strftime('%H:%M:%S', time.localtime(newest['mtime']))}, not now"],
                "pause_us": doc["pause_us"]}
        sidecar = None
    else:
        data, info = heapcontrol.dump(args.pid, procfs)
        _write(out, data)
        sidecar = None if args.no_snapshot else _write_sidecar(args, out)
    view = heapview.load(out, root=_root(args, args.pid), pid=args.pid)
    if args.json:
        dump_json({"pid": args.pid, "file": out, "snapshot": sidecar, "call": info["call"],
                   "notes": info["notes"], "pause_us": info["pause_us"], **view.to_json()})
        return ExitCode.OK
    how = f"{info['call']}, {_pause(info)}" if info["call"] else info.get("source")
    print(f"wrote {out} ({how})" + (f" and {sidecar}" if sidecar else ""))
    for note in info["notes"]:
        print(f"note: {note}")
    print(heapview.render_top(view, n=args.top), end="")
    return ExitCode.OK


def _write(path, data):
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None


def _write_sidecar(args, out):
    """FILE.snapshot.json: the `inspect --json` document of the target right
    after the dump (one more short stop: the allocator's stats)."""
    import io
    from diag import heapview
    from diag.commands.common import take
    snap, col = take(args, attach=True)
    side = out + heapview.SIDECAR_SUFFIX
    buf = io.StringIO()
    dump_json(snap.to_json(), buf)
    _write(side, buf.getvalue().encode())
    if col.partial and col.first_denied is not None:
        print_error(col.first_denied)
    return side


# -- show / diff --------------------------------------------------------------------

def _show(args):
    from diag import heapview
    view = heapview.load(args.file, root=_root(args, args.pid), pid=args.pid)
    if args.legacy:
        heapview.write_legacy(view, args.legacy)
    if args.json:
        dump_json(view.to_json())
    elif args.collapsed:
        sys.stdout.write(heapview.render_collapsed(view, by=args.by))
    elif args.tree:
        sys.stdout.write(heapview.render_tree(view, by=args.by))
    else:
        sys.stdout.write(heapview.render_top(view, n=args.top, by=args.by))
    if args.legacy and not args.json and not args.collapsed:
        print(f"wrote {args.legacy}")
    return ExitCode.OK


def _diff(args):
    from diag import heapview
    root = _root(args, args.pid)
    d = heapview.diff(heapview.load(args.a, root=root, pid=args.pid),
                      heapview.load(args.b, root=root, pid=args.pid))
    if args.json:
        dump_json(heapview.diff_json(d))
    else:
        sys.stdout.write(heapview.render_diff(d, n=args.top))
    return ExitCode.OK
