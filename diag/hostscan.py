"""Scan every process on the host (``allocdiag ps`` and the TUI host view).

Nothing is stopped.  Per process: status, smaps_rollup, maps, the ELF
objects (parsed once per file for the whole scan, see collectors.binary.elf) and
one read of the executable's malloc GOT slot.  psutil gives the process
list, each process's identity (pid + create time), its user name and CPU
times; its exceptions are translated here, once, into diag.model.errors.
"""

from __future__ import annotations

import functools
import logging
import pwd
import time
from collections.abc import Iterable
from typing import Any

import psutil

from collectors.detect import detect
from diag.model.errors import AccessDenied, AllocdiagError, NoSuchProcess
from collectors.binary.image import ProcessImage
from collectors.preload import verdict
from collectors.proc.procfs import ProcFS
from diag import findings
from diag.model import Snapshot

log = logging.getLogger("diag")
PsKey = tuple[int, float]       # (pid, create time): a process, not a recycled pid


class ScanResult:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.denied = 0
        self.vanished = 0
        self.failed: list[tuple[int, str]] = []   # (pid, message)

    def to_json(self) -> dict[str, Any]:
        return {"processes": self.rows, "total": len(self.rows), "unreadable": self.denied,
                "vanished": self.vanished,
                "failed": [{"pid": pid, "error": err} for pid, err in self.failed]}


class CpuMeter:
    """CPU% per process.  The first time a process is seen: its average over
    its lifetime (what ps(1) shows); afterwards: over the time since the
    previous scan with the same meter (what top(1) shows).  Keyed by pid and
    create time, so a recycled pid starts afresh."""

    def __init__(self) -> None:
        self._last: dict[PsKey, tuple[float, float]] = {}   # -> (cpu seconds, monotonic time)

    def percent(self, key: PsKey, cpu_s: float, create_time: float) -> float | None:
        now = time.monotonic()
        prev = self._last.get(key)
        self._last[key] = (cpu_s, now)
        if prev is not None and now > prev[1]:
            return 100.0 * (cpu_s - prev[0]) / (now - prev[1])
        age = time.time() - create_time
        return 100.0 * cpu_s / age if age > 0 else None

    def forget_except(self, keys: set[PsKey]) -> None:
        self._last = {k: v for k, v in self._last.items() if k in keys}


@functools.lru_cache(maxsize=1024)
def _user_name(uid: int) -> str:
    """psutil's Process.username() looks the passwd file up for every process;
    one lookup per uid per run is enough."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:            # a uid with no passwd entry (containers)
        return str(uid)


def _ps_facts(pid: int, meter: CpuMeter) -> tuple[str, float | None, PsKey]:
    """(user name, CPU%, identity key) from psutil; its errors translated."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            t = proc.cpu_times()
            create = proc.create_time()
            user = _user_name(proc.uids().real)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        raise NoSuchProcess(pid) from None
    except psutil.AccessDenied:
        raise AccessDenied(pid) from None
    key = (pid, create)
    return user, meter.percent(key, t.user + t.system, create), key


def scan_one(pid: int, procfs: ProcFS, meter: CpuMeter | None = None) -> dict[str, Any] | None:
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
    user, cpu, key = _ps_facts(pid, meter or CpuMeter()) if procfs.root == "/proc" else (None, None, None)
    return {
        "pid": pid, "comm": image.comm, "exe": image.exe_path, "user": user,
        "cpu_percent": None if cpu is None else round(cpu, 1), "_key": key,
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


def scan(procfs_root: str = "/proc", pids: Iterable[int] | None = None, workers: int = 1,
         meter: CpuMeter | None = None) -> ScanResult:
    """Scan PIDS (default: every process).  WORKERS > 1 splits a large scan
    over forked processes (most of the cost is the kernel producing
    smaps_rollup and maps, which one Python process does serially).  Only
    for single-threaded callers such as the CLI: forking a threaded program
    (the TUI) is not safe."""
    procfs = ProcFS(procfs_root)
    if pids is None:
        pids = psutil.pids() if procfs_root == "/proc" else procfs.pids()
    pids = list(pids)
    parallel = workers > 1 and len(pids) >= PARALLEL_MIN
    log.debug("host scan of %d processes under %s: %s", len(pids), procfs_root,
              f"{workers} forked workers" if parallel else "serial")
    if parallel:
        result = _scan_parallel(procfs_root, pids, workers)
    else:
        result = _scan_serial(procfs, pids, meter)
    log.debug("host scan: %d rows, %d unreadable, %d vanished, %d failed", len(result.rows),
              result.denied, result.vanished, len(result.failed))
    keys = {r.pop("_key") for r in result.rows}
    if meter is not None:
        meter.forget_except(keys)
    return result


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


def _scan_serial(procfs: ProcFS, pids: Iterable[int], meter: CpuMeter | None = None) -> ScanResult:
    result = ScanResult()
    meter = meter or CpuMeter()
    for pid in pids:
        try:
            row = scan_one(pid, procfs, meter)
        except NoSuchProcess:
            result.vanished += 1
            continue
        except AccessDenied:
            result.denied += 1
            continue
        except AllocdiagError as exc:
            log.debug("host scan: pid %d failed: %s", pid, exc.msg)
            result.failed.append((pid, str(exc.msg)))
            continue
        if row is not None:
            result.rows.append(row)
    return result
