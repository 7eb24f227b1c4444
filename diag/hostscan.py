"""Scan every process on the host (``allocdiag ps`` and the TUI host view).

Nothing is stopped.  Per process: status, smaps_rollup, maps, the ELF
objects (parsed once per file for the whole scan, see collectors.elf) and
one read of the executable's malloc GOT slot.
"""

from collectors.detect import detect
from collectors.errors import AccessDenied, AllocdiagError, NoSuchProcess
from collectors.image import ProcessImage
from collectors.preload import verdict
from collectors.procfs import ProcFS
from diag import findings
from diag.model import Snapshot


class ScanResult:
    def __init__(self):
        self.rows = []
        self.denied = 0
        self.vanished = 0
        self.failed = []   # (pid, message)

    def to_json(self):
        return {"processes": self.rows, "total": len(self.rows), "unreadable": self.denied,
                "vanished": self.vanished,
                "failed": [{"pid": pid, "error": err} for pid, err in self.failed]}


def scan_one(pid, procfs):
    """The ps row of PID (dict), raising the collectors' exceptions."""
    status = procfs.status(pid)
    if b"VmRSS" not in status:          # kernel thread: no user memory
        return None
    mem = procfs.memory(pid, status=status)
    image = ProcessImage(pid, procfs, status=status)
    det = detect(image)
    pre = verdict(image, det)
    a = det.allocator
    # Findings that need no stop (LazyFree, preload, two allocators): the
    # same rules as a full snapshot, on what /proc says.
    top = findings.evaluate(Snapshot(pid=pid, allocator=a, preload=pre, process=mem))
    return {
        "pid": pid, "comm": image.comm,
        "allocator": {"kind": a.kind, "linkage": a.linkage, "version": a.version,
                      "prefix": a.prefix, "others": [o.kind for o in a.others]},
        "preload": {"effective": pre.effective, "verdict": pre.verdict},
        "rss": mem.rss, "rss_anon": mem.rss_anon, "lazyfree": mem.lazyfree,
        "threads": mem.threads,
        "top_finding": top[0].title if top else None,
        "findings": [f.id for f in top],
    }


# Below this many processes a second worker costs more than it saves.
PARALLEL_MIN = 300


def scan(procfs_root="/proc", pids=None, workers=1):
    """Scan PIDS (default: every process).  WORKERS > 1 splits a large scan
    over forked processes (most of the cost is the kernel producing
    smaps_rollup and maps, which one Python process does serially).  Only
    for single-threaded callers such as the CLI: forking a threaded program
    (the TUI) is not safe."""
    procfs = ProcFS(procfs_root)
    pids = list(pids) if pids is not None else procfs.pids()
    if workers > 1 and len(pids) >= PARALLEL_MIN:
        return _scan_parallel(procfs_root, pids, workers)
    return _scan_serial(procfs, pids)


def _scan_chunk(args):
    root, pids = args
    r = _scan_serial(ProcFS(root), pids)
    return r.rows, r.denied, r.vanished, r.failed


def _scan_parallel(root, pids, workers):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    chunks = [pids[i::workers] for i in range(workers)]
    result = ScanResult()
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        for rows, denied, vanished, failed in pool.map(_scan_chunk, [(root, c) for c in chunks]):
            result.rows.extend(rows)
            result.denied += denied
            result.vanished += vanished
            result.failed.extend(failed)
    result.rows.sort(key=lambda r: r["pid"])
    return result


def _scan_serial(procfs, pids):
    result = ScanResult()
    for pid in pids:
        try:
            row = scan_one(pid, procfs)
        except NoSuchProcess:
            result.vanished += 1
            continue
        except AccessDenied:
            result.denied += 1
            continue
        except AllocdiagError as exc:
            result.failed.append((pid, str(exc.msg)))
            continue
        if row is not None:
            result.rows.append(row)
    return result
