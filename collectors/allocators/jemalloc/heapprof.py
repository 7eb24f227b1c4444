"""jemalloc's heap profiler (built with config.prof; src/ctl.c), driven by
collectors.heapcontrol: opt.prof is fixed at start; prof.active switches
sampling, prof.dump writes the sampled profile."""

from __future__ import annotations

import errno
import os
import struct
from typing import Any

from collectors.allocators import common
from collectors.allocators.jemalloc import reader as jemalloc
from collectors.allocators.jemalloc.config import parse_conf
from collectors.heapcontrol import read_target_file, restart_recipe, work_dir
from diag.model.errors import Unsupported


JE_READS = (("config.prof", "bool"), ("opt.prof", "bool"), ("prof.active", "bool"),
            ("opt.prof_active", "bool"), ("opt.lg_prof_sample", "size_t"),
            ("opt.prof_prefix", "const char*"), ("opt.prof_final", "bool"),
            ("opt.lg_prof_interval", "ssize_t"), ("opt.prof_gdump", "bool"))
JE_DUMP_NAME = "dump.heap"
JE_ACTIVE_NOTE = ("jemalloc samples (one allocation per 2^lg_prof_sample bytes on average, "
                  "scaled back up) only while prof.active is on")


# what `allocdiag heap start` asks the user to confirm
START = "turn jemalloc's prof.active on"


def conf_var(alloc: Any) -> Any:
    """The MALLOC_CONF variable name jemalloc reads (prefixed builds: _RJEM_MALLOC_CONF)."""
    return (alloc.prefix or "").upper() + "MALLOC_CONF"


def restart(t: Any, arm: str, exe: str) -> str | None:
    """Restart with prof armed but inactive, keeping the program's own conf."""
    var = conf_var(t.alloc)
    current = (t.image.environ or {}).get(var)
    conf = ",".join(f"{k}:{v}" for k, v in {**parse_conf(current), **parse_conf(arm)}.items())
    return (f"restart it with {var}={conf} {exe}  (armed but inactive: costs almost "
            f"nothing until `allocdiag heap start {t.pid}` turns prof.active on)")


def _jemalloc_values(t):
    """The prof mallctls (None where the name does not exist)."""
    mallctl = t.mallctl()
    rp = t.session()
    out = {}
    with rp.borrow() as c:
        scratch = jemalloc.mallctl_scratch(c)
        for name, ctype in JE_READS:
            v = jemalloc.mallctl_read(c, mallctl, name, ctype, scratch)
            out[name] = v.decode(errors="replace") if isinstance(v, bytes) else v
    return out, list(rp.pause_us)


def _je_set_active(t, on):
    """Write prof.active; returns (old value, pause_us)."""
    mallctl = t.mallctl()
    rp = t.session()
    with rp.borrow() as c:
        rc, was = jemalloc.mallctl_write_bool(c, mallctl, "prof.active", on)
    if rc:
        raise Unsupported(f"mallctl(\"prof.active\") failed with error {rc}", pid=t.pid)
    return was, list(rp.pause_us)


def status(t: Any, doc: dict[str, Any]) -> None:
    doc["env"] = {k: v for k, v in (t.image.environ or {}).items() if k == conf_var(t.alloc)}
    vals, doc["pause_us"] = _jemalloc_values(t)
    doc["values"] = vals
    if not vals.get("config.prof"):
        doc["reason"] = "this jemalloc was built without profiling (config.prof false)"
        doc["remedy"] = ("use a jemalloc built with --enable-prof (Debian's libjemalloc2 is): "
                         + restart_recipe(t))
    elif not vals.get("opt.prof"):
        doc["reason"] = ("jemalloc has profiling compiled in (config.prof) but the program "
                         "was not started with prof:true, and opt.prof cannot be changed "
                         "at run time")
        doc["remedy"] = restart_recipe(t)
    else:
        doc["possible"] = True
        doc["running"] = bool(vals.get("prof.active"))
        doc["how"] = "mallctl prof.active / prof.dump"
        sample = vals.get("opt.lg_prof_sample")
        doc["reason"] = (f"started with prof:true: sampling every ~2^{sample} bytes "
                         f"allocated, switched by prof.active")
        doc["notes"].append(JE_ACTIVE_NOTE)


def start(t: Any, doc: dict[str, Any]) -> dict[str, Any]:
    old, pause = _je_set_active(t, True)
    return {"call": "mallctl(\"prof.active\", true)", "was_running": old, "running": True,
            "notes": [JE_ACTIVE_NOTE], "work_dir": None, "pause_us": pause}


def stop(t: Any, doc: dict[str, Any], wd: Any, ours: bool, force: bool) -> dict[str, Any]:
    old, pause = _je_set_active(t, False)
    wd.remove()
    return {"call": "mallctl(\"prof.active\", false)", "was_running": old, "running": False,
            "removed": wd.inside if ours else None,
            "notes": ["samples already taken stay in the profile (prof.dump still shows the "
                      "sampled objects that are live)"], "pause_us": pause}


def dump(t: Any, doc: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    mallctl = t.mallctl()
    wd = work_dir(t)
    try:
        inside = os.path.join(wd.inside, JE_DUMP_NAME)
        rp = t.session()
        with rp.borrow() as c:
            name, pathp, path = c.scratch(16), c.scratch(16), c.scratch(len(inside) + 1)
            c.write(name, b"prof.dump\0")
            c.write(path, inside.encode() + b"\0")
            c.write(pathp, struct.pack("<Q", path))
            rc = c.call(mallctl, name, 0, 0, pathp, 8) & common.INT_RETURN
        if rc:
            raise Unsupported(f"mallctl(\"prof.dump\") failed with error {rc}"
                              + (" (EFAULT: the target could not write the file)" if rc == errno.EFAULT
                                 else ""), pid=t.pid)
        data = read_target_file(os.path.join(wd.local, JE_DUMP_NAME), wd.uid)
    finally:
        wd.remove()
    notes = [] if doc["running"] else ["prof.active is off: the profile holds only what was "
                                       "sampled while it was on"]
    return data, {"call": f"mallctl(\"prof.dump\", \"{inside}\")",
                  "notes": [JE_ACTIVE_NOTE] + notes, "pause_us": list(rp.pause_us)}

