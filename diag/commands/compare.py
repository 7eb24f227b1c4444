"""``allocdiag compare``: one workload under several allocators and knob sets."""

import argparse
import os
import sys

from diag.commands.common import UsageError, add_command, dump_json
from diag.model.exitcodes import ExitCode

NAME = "compare"

VARIANT_HELP = """\
variants (--variants, separated by spaces or commas; default: every installed allocator):
  glibc | jemalloc | tcmalloc | tcmalloc_minimal | mimalloc
        the allocator (LD_PRELOAD of its Debian library under /usr/lib/x86_64-linux-gnu;
        none for glibc)
  /path/to/libX.so      any library to preload
  ...:k=v,k=v           a knob set:
    jemalloc:dirty_decay_ms=1000,muzzy_decay_ms=0 -> MALLOC_CONF=dirty_decay_ms:1000,...
    glibc:trim_threshold=131072    -> GLIBC_TUNABLES=glibc.malloc.trim_threshold=131072
    glibc:MALLOC_ARENA_MAX=2       -> the environment variable (any KEY in capitals)
    mimalloc:purge_delay=0         -> MIMALLOC_PURGE_DELAY=0 (+ MIMALLOC_DECOMMIT_DELAY, its
                                      mimalloc 2.0 name; decommit_delay likewise)
    tcmalloc:release_rate=10       -> TCMALLOC_RELEASE_RATE=10
  --variants glibc,jemalloc is the same as --variants glibc jemalloc; a comma followed by
  KEY=VALUE continues the knob set before it.  An unknown allocator name or an empty list
  is a usage error (exit 2, before anything is started).  A variant whose preload does not
  take effect (typo in a path, malloc bound elsewhere) is run, marked and excluded from the
  ranking with the reason; an allocator that is not installed is not run and excluded
  likewise.

presets (the field's two standard experiments, from examples/):
  footprint   examples/footprint.py: build 40000 dict-of-lists records, drop the older half;
              settled = after --idle-seconds past its READY line
  staircase   examples/staircase.py: a 127.0.0.1 service under 4 load phases of growing
              buffer sizes, each followed by an idle phase; settled = after the last one

output: a table, or with --json one document: {"variants": [{"name", "allocator",
  "preload_effective", "excluded_reason", "peak": {...}, "settled": {...}, "gap", "spread",
  "finding", "runs": [... samples ...]}], "ranking", "confounds"}; inner keys are the field
  names of `allocdiag --help` / diag/fields.py (rss, rss_anon, lazyfree, working_set,
  allocated, resident, retained, ...), in bytes.  A chart page: --html OUT writes per-variant
  RSS, anon, LazyFree and allocator resident over time and peak vs settled bars (the HTML
  report renderer; needs pip install 'allocdiag[report]'); a saved --json document gives the
  same page later with `allocdiag report FILE -o OUT.html`.
"""


def add_parser(sub):
    p = add_command(
        sub, NAME,
        help="run a workload under every installed allocator / knob set: peak vs settled",
        description="Run COMMAND once per variant (by default every installed allocator, via "
                    "LD_PRELOAD), optionally drive it with --load for --load-seconds, then "
                    "leave it idle for --idle-seconds.  Samples RSS, anon, LazyFree and the "
                    "cgroup working set every --interval seconds and the allocator's own "
                    "layers through the engine (one borrowed idle thread, within "
                    "--max-pause-ms-per-minute); reports peak vs settled per variant with the "
                    "preload verdict and the finding that explains the gap.\n\n" + VARIANT_HELP,
        examples=[
            "allocdiag compare --preset footprint",
            "allocdiag compare --preset staircase --variants glibc jemalloc --repeat 3",
            "allocdiag compare --variants glibc glibc:MALLOC_ARENA_MAX=2 "
            "jemalloc:dirty_decay_ms=1000,muzzy_decay_ms=0 "
            "--load 'wrk -d10 http://127.0.0.1:8080/' --ready 'listening' -- ./server",
            "allocdiag compare --json --idle-after READY -- python3 myjob.py > compare.json",
            "allocdiag compare --preset footprint --html footprint.html"])
    p.add_argument("--variants", nargs="*", action="extend", metavar="VARIANT",
                   help="allocators / knob sets to run (default: every installed allocator)")
    p.add_argument("--preset", choices=("footprint", "staircase"),
                   help="one of the standard experiments from examples/ (no COMMAND needed)")
    p.add_argument("--load", metavar="CMD",
                   help="shell command run against COMMAND after the warm-up (without the "
                        "variant's preload); its output is captured and a throughput line "
                        "(wrk, ab, redis-benchmark, ops_s=) is picked up")
    p.add_argument("--load-seconds", type=float, default=10.0,
                   help="stop the load after this long (default 10)")
    p.add_argument("--idle-seconds", type=float, default=10.0,
                   help="seconds of nothing after the load (default 10)")
    p.add_argument("--warmup-seconds", type=float, default=1.0,
                   help="the same warm-up for every variant before load/run (default 1)")
    p.add_argument("--ready", metavar="REGEX",
                   help="wait for a COMMAND output line matching REGEX before the warm-up")
    p.add_argument("--idle-after", metavar="REGEX",
                   help="without --load: COMMAND is a workload that prints a line matching "
                        "REGEX when done and then stays up; the idle phase starts there")
    p.add_argument("--interval", type=float, default=1.0,
                   help="sampling interval in seconds (default 1)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="stop a run after this many seconds in all (default 600)")
    p.add_argument("--max-pause-ms-per-minute", type=float, default=600.0,
                   help="pause budget of the allocator reads, per run (default 600)")
    p.add_argument("--repeat", type=int, default=1, help="runs per variant (round-robin)")
    p.add_argument("--noise-pct", type=float, default=5.0,
                   help="settled figures closer than this are 'within noise' (default 5)")
    p.add_argument("--rank-by", default="rss", choices=("rss", "rss_anon", "working_set"),
                   help="settled field the ranking uses (default rss)")
    p.add_argument("--isolate", action="store_true",
                   help="run each variant in its own transient memory cgroup (v2, or v1's "
                        "memory hierarchy) under ours, removed afterwards")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("-o", "--output", metavar="FILE", help="also write the JSON document to FILE")
    p.add_argument("--html", metavar="OUT", help="also write a chart page (HTML) to OUT")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS",
                   help="the workload to run (after --)")
    return p


def _preset(name):
    """(command, settings overrides, workload-line extractor) of a preset."""
    from diag import compare
    ex = compare.examples_dir()
    py = sys.executable
    if name == "footprint":
        return ([py, "-u", os.path.join(ex, "footprint.py")],
                dict(idle_after=r"^READY", idle_s=3.0, warmup_s=0.0, timeout_s=180.0,
                     example_env=True))
    return ([py, "-u", os.path.join(ex, "staircase.py"), "--phases", "4",
             "--load-seconds", "4", "--idle-seconds", "3"],
            dict(idle_after=r"^PHASE done", idle_s=5.0, warmup_s=0.0, timeout_s=240.0,
                     example_env=True))


def run(args):
    from diag import compare
    cmd = list(args.argv)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    over = {}
    if args.preset:
        if cmd:
            raise UsageError("give either --preset or a COMMAND, not both")
        cmd, over = _preset(args.preset)
    if not cmd:
        raise UsageError("no COMMAND given (allocdiag compare [options] -- COMMAND ARGS...)")
    if args.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    if args.interval < 0.2:
        raise UsageError("--interval must be at least 0.2 seconds")
    settings = compare.Settings(
        command=cmd, load=args.load, load_s=args.load_seconds, idle_s=args.idle_seconds,
        warmup_s=args.warmup_seconds, interval_s=args.interval, timeout_s=args.timeout,
        ready=args.ready, idle_after=args.idle_after,
        pause_ms_per_minute=args.max_pause_ms_per_minute, isolate=args.isolate,
        repeat=args.repeat, noise_pct=args.noise_pct, rank_by=args.rank_by)
    for k, v in over.items():
        # a preset's defaults, unless the user set the option
        user = {"idle_s": args.idle_seconds != 10.0, "warmup_s": args.warmup_seconds != 1.0,
                "timeout_s": args.timeout != 600.0, "idle_after": args.idle_after is not None}
        if not user.get(k):
            setattr(settings, k, v)
    try:
        variants = (compare.parse_variants(args.variants) if args.variants is not None
                    else compare.default_variants())
    except compare.CompareError as exc:
        raise UsageError(str(exc.msg)) from None
    if args.html:
        from diag import report_charts
        report_charts.check_available()     # before the runs, not after them
    doc = compare.compare(variants, settings,
                          progress=lambda m: print(m, file=sys.stderr, flush=True))
    if args.preset:
        doc["preset"] = args.preset
        compare.extract_preset(doc, args.preset)
    if args.output:
        with open(args.output, "w") as f:
            f.write(compare.dumps(doc) + "\n")
    if args.html:
        from diag import report
        report.write_compare(doc, args.html)
    if args.json:
        dump_json(doc)
    else:
        compare.render_text(doc)
    ran = [e for e in doc["variants"] if e["runs"]]
    return ExitCode.OK if ran else ExitCode.PARTIAL
