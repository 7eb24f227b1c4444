"""The metrics ``allocdiag exporter`` emits: names, types, labels, HELP
strings (all taken from diag.fields), and the disjoint memory partition.

Naming follows prometheus.io/docs/practices/naming: the ``allocdiag_``
prefix, base units with their suffix (``_bytes``, ``_seconds``), ``_total``
on counters (prometheus_client adds it to a CounterMetricFamily), and
quantities that overlap (allocated within active within resident) each in a
metric of their own, so that ``sum()`` over any label is meaningful.  The one
metric whose label values may be stacked is ``allocdiag_memory_bytes``: its
classes are disjoint and add up to the targets' RSS (the Go runtime's
``go_memory_classes_*`` model).

Labels are bounded: ``group`` (comm, exe name, user or a --group rule),
``allocator`` (a kind), ``preload_effective`` (true|false|unknown),
``class``, ``state``, ``reason`` (diag.hostlive.REASONS), ``collector``.
A pid appears only on ``allocdiag_target_info`` (one series per selected
target, and the number of targets is capped).
"""

from collections import namedtuple

from diag import breakdown
from diag.fields import BY_NAME, EXPORTER_BY_NAME, STATS_FIELDS, WALL_BY_NAME

Metric = namedtuple("Metric", "name type labels field")

PREFIX = "allocdiag_"
PROC_LABELS = ("group", "allocator", "preload_effective")
LIVE_LABELS = ("group", "allocator")
INFO_LABELS = ("group", "pid", "comm", "allocator", "state", "reason")

# /proc metrics for every readable process, summed per group: (scan row key, field)
PROC_ROW_FIELDS = (("rss", BY_NAME["rss"]), ("rss_anon", BY_NAME["rss_anon"]),
                   ("lazyfree", BY_NAME["lazyfree"]), ("threads", BY_NAME["threads"]))


def _unit_suffix(field):
    return {"bytes": "_bytes", "seconds": "_seconds"}.get(field.unit, "")


def _proc_metric(key, field):
    return Metric(f"{PREFIX}process_{key}{_unit_suffix(field)}", "gauge", PROC_LABELS, field)


def _stats_metric(key):
    field = BY_NAME[key]
    return Metric(f"{PREFIX}allocator_{key}{_unit_suffix(field)}", "gauge", LIVE_LABELS, field)


X = EXPORTER_BY_NAME
PROC_METRICS = {key: _proc_metric(key, f) for key, f in PROC_ROW_FIELDS}
PROCESSES = Metric(f"{PREFIX}processes", "gauge", PROC_LABELS, X["processes"])
SCAN_SKIPPED = Metric(f"{PREFIX}scan_skipped_processes", "gauge", ("reason",), X["scan_skipped"])
STATS_METRICS = {key: _stats_metric(key) for key in STATS_FIELDS}
MEMORY = Metric(f"{PREFIX}memory_bytes", "gauge", LIVE_LABELS + ("class",), X["memory_class"])
TARGET_RSS = Metric(f"{PREFIX}target_rss_bytes", "gauge", LIVE_LABELS, X["target_rss"])
CGROUP_METRICS = {key: Metric(f"{PREFIX}cgroup_{key}_bytes", "gauge", LIVE_LABELS, BY_NAME[key])
                  for key in ("working_set", "usage")}
TARGET_INFO = Metric(f"{PREFIX}target_info", "gauge", INFO_LABELS, X["target_info"])
# counters: the exposed names end in _total (prometheus_client appends it)
TARGET_PAUSE = Metric(f"{PREFIX}target_pause_seconds", "counter", ("group",), X["target_pause"])
TARGET_READS = Metric(f"{PREFIX}target_reads", "counter", ("group", "state"), X["target_reads"])
SCRAPE_DURATION = Metric(f"{PREFIX}scrape_duration_seconds", "gauge", (), X["scrape_duration"])
COLLECTOR_SUCCESS = Metric(f"{PREFIX}collector_success", "gauge", ("collector",),
                           X["collector_success"])

ALL = (tuple(PROC_METRICS.values()) + (PROCESSES, SCAN_SKIPPED) + tuple(STATS_METRICS.values())
       + (MEMORY, TARGET_RSS) + tuple(CGROUP_METRICS.values())
       + (TARGET_INFO, TARGET_PAUSE, TARGET_READS, SCRAPE_DURATION, COLLECTOR_SUCCESS))


# the allocation wall of the live targets (--wall), each group's last windows;
# gauges: a window is a sample of the time, not a count since start
def _wall_metric(name, field, extra=()):
    return Metric(f"{PREFIX}{name}", "gauge", LIVE_LABELS + extra, WALL_BY_NAME[field])


WALL_CPU_RATIO = _wall_metric("allocator_cpu_ratio", "cpu.allocator_share")
WALL_UNKNOWN_RATIO = _wall_metric("allocator_cpu_unknown_ratio", "cpu.unknown_share")
WALL_LOCK_SECONDS = _wall_metric("allocator_lock_wait_seconds", "off_cpu.allocator_lock_s")
WALL_LOCK_RATIO = _wall_metric("allocator_lock_wait_ratio", "off_cpu.allocator_lock_share")
WALL_MINOR_FAULTS = _wall_metric("minor_page_faults_per_second", "faults.minor_per_s")
WALL_MAJOR_FAULTS = _wall_metric("major_page_faults_per_second", "faults.major_per_s")
WALL_SYSCALLS = _wall_metric("syscalls_per_second", "syscalls.NAME.per_s", ("syscall",))
WALL_SYSCALLS_ALLOCATOR = _wall_metric("syscalls_from_allocator_ratio",
                                       "syscalls.NAME.from_allocator_share", ("syscall",))
WALL_WINDOW = _wall_metric("wall_window_seconds", "window.duration_s")
WALL = (WALL_CPU_RATIO, WALL_UNKNOWN_RATIO, WALL_LOCK_SECONDS, WALL_LOCK_RATIO,
        WALL_MINOR_FAULTS, WALL_MAJOR_FAULTS, WALL_SYSCALLS, WALL_SYSCALLS_ALLOCATOR,
        WALL_WINDOW)


def exposed_name(metric):
    """The name as it appears in the exposition (and in PromQL)."""
    return metric.name + "_total" if metric.type == "counter" else metric.name


def help_text(metric):
    return metric.field.meaning


# -- the disjoint partition of RSS -----------------------------------------------------

CLASSES = ("live", "allocator_free", "allocator_metadata", "allocator_held", "lazyfree",
           "python_arenas", "other_anon", "file", "shmem")


def memory_classes(snap):
    """{class: bytes} of SNAP's RSS, disjoint, every value >= 0, summing
    exactly to ``process.rss`` (None when the kernel numbers are missing).

    Kernel numbers are the frame; allocator numbers are clamped into it,
    because they come from another source at a slightly different moment
    and some are upper bounds (glibc's mapped):

    * ``lazyfree`` = min(LazyFree, rss_anon) (MADV_FREE pages are anon);
    * allocator ``held`` (diag.breakdown.allocator_held: jemalloc/tcmalloc
      resident, glibc mapped) is clamped to rss_anon - lazyfree;
    * ``live`` = min(allocated, held); ``allocator_metadata`` =
      min(metadata, held - live); ``allocator_free`` = the rest of held.
      When allocated is unknown, held is not split: ``allocator_held``;
    * ``python_arenas`` (pymalloc's own mmaps, outside malloc) =
      min(arena resident, what is left of rss_anon), carved from other_anon;
    * ``other_anon`` = rss_anon - lazyfree - held - python_arenas;
    * ``file`` = rss_file, ``shmem`` = rss_shmem.
    Classes that are unknown (no allocator read, no metadata figure) are
    left out, never filled with a guess.
    """
    p = snap.process
    if p.rss is None or p.rss_anon is None:
        return None
    anon = p.rss_anon
    out = {}
    lazy = min(p.lazyfree or 0, anon)
    out["lazyfree"] = lazy
    held, _ = breakdown.allocator_held(snap)
    held = 0 if held is None else max(0, min(held, anon - lazy))
    if held:
        alloc = _stat(snap, "allocated")
        if alloc is None:
            out["allocator_held"] = held
        else:
            live = min(alloc, held)
            meta = _stat(snap, "metadata")
            meta = None if meta is None else min(meta, held - live)
            out["live"] = live
            if meta is not None:
                out["allocator_metadata"] = meta
            out["allocator_free"] = held - live - (meta or 0)
    other = anon - lazy - held
    py = breakdown.python_arenas(snap)
    if py is not None:
        out["python_arenas"] = min(py[0], other)
        other -= out["python_arenas"]
    out["other_anon"] = other
    # RSS = rss_anon + rss_file + rss_shmem in the kernel (all in kB, exact);
    # file takes what is left so the sum is exact even if a field is missing.
    shmem = p.rss_shmem or 0
    out["shmem"] = min(shmem, p.rss - anon)
    out["file"] = p.rss - anon - out["shmem"]
    return out


def _stat(snap, name):
    v = snap.stats.get(name)
    return v.value if v is not None and v.value is not None else None
