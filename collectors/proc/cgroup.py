"""/proc/PID/cgroup and the memory cgroup it names (cgroup v1, v2, hybrid):
the cgroup layer of the vocabulary (diag.fields, layer "cgroup")."""

from __future__ import annotations

import os

from collectors.proc.readall import read_all
from diag.model import CgroupMemory

# mm/memcontrol.c: v1 reports "no limit" as PAGE_COUNTER_MAX pages, a huge
# page-aligned number; anything from 2^62 up is taken as "no limit"
V1_NO_LIMIT = 1 << 62


def parse_cgroup(data: bytes) -> dict[str, str]:
    """{controller or "": path} from /proc/PID/cgroup bytes ("" is the v2
    entry; "hierarchy-ID:controller-list:cgroup-path" lines, cgroups(7))."""
    out = {}
    for line in data.split(b"\n"):
        parts = line.split(b":", 2)
        if len(parts) != 3:
            continue
        _hid, controllers, raw = parts
        path = raw.decode(errors="replace")
        if not controllers:
            out[""] = path
        for c in controllers.split(b","):
            if c:
                out[c.decode(errors="replace")] = path
    return out


def cgroup_memory(paths: dict[str, str], cgroup_root: str = "/sys/fs/cgroup") -> CgroupMemory:
    """The cgroup layer for a process whose /proc/PID/cgroup gave PATHS.

    v1 when a ``memory`` controller line exists and its directory is
    mounted under ``cgroup_root/memory``; v2 otherwise (unified at the root,
    or at ``cgroup_root/unified`` on hybrid hosts when it has memory files).
    working_set = max(0, usage - inactive_file), as cAdvisor and
    ``kubectl top`` compute it.
    """
    candidates = []
    if "memory" in paths:
        candidates.append((1, os.path.join(cgroup_root, "memory", paths["memory"].lstrip("/")),
                           paths["memory"]))
    if "" in paths:
        rel = paths[""].lstrip("/")
        candidates.append((2, os.path.join(cgroup_root, rel), paths[""]))
        candidates.append((2, os.path.join(cgroup_root, "unified", rel), paths[""]))
    for version, directory, path in candidates:
        usage_file = "memory.usage_in_bytes" if version == 1 else "memory.current"
        usage = _read_int(os.path.join(directory, usage_file))
        if usage is None:
            continue
        stat = _read_kv(os.path.join(directory, "memory.stat"))
        if version == 1:
            limit = _read_int(os.path.join(directory, "memory.limit_in_bytes"))
            # v1 reports "no limit" as a huge page-aligned number.
            if limit is not None and limit >= V1_NO_LIMIT:
                limit = None
            # total_* includes descendants, like usage_in_bytes does.
            inactive = stat.get(b"total_inactive_file", stat.get(b"inactive_file"))
        else:
            limit = _read_int(os.path.join(directory, "memory.max"))  # "max" -> None
            inactive = stat.get(b"inactive_file")
        working = max(0, usage - inactive) if inactive is not None else None
        return CgroupMemory(version=version, path=path, usage=usage, limit=limit,
                            inactive_file=inactive, working_set=working)
    where = ", ".join(f"{k or 'v2'}:{v}" for k, v in sorted(paths.items())
                      if k in ("memory", "")) or "no memory controller line"
    return CgroupMemory(error=f"no readable memory cgroup for {where} under {cgroup_root}")


def _read_int(path: str) -> int | None:
    try:
        v = read_all(path).strip()
    except OSError:
        return None
    if v == b"max":
        return None
    try:
        return int(v)
    except ValueError:
        return None


def _read_kv(path: str) -> dict[bytes, int]:
    out: dict[bytes, int] = {}
    try:
        for line in read_all(path).splitlines():
            k, _, v = line.partition(b" ")
            try:
                out[k] = int(v)
            except ValueError:
                pass
    except OSError:
        pass
    return out
