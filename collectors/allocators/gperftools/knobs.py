"""gperftools tcmalloc's knobs: TCMALLOC_* variables at start, the
numeric properties MallocExtension lets a program set at runtime."""

from __future__ import annotations

import logging
import struct
from typing import Any, Callable

from diag.model import Knob
from diag.model.errors import Unsupported

from collectors.allocators import gperftools
from collectors.allocators.common import int_value
from collectors.allocators import common

log = logging.getLogger("collectors.allocators")

# gperftools 2.10 (page_heap.cc, thread_cache.cc).
TCMALLOC_DEFAULTS = {"TCMALLOC_RELEASE_RATE": "1.0", "TCMALLOC_AGGRESSIVE_DECOMMIT": "false",
                     "TCMALLOC_MAX_TOTAL_THREAD_CACHE_BYTES": "33554432"}


def read(native: dict[str, Any]) -> dict[str, Knob]:
    env = (native.get("config") or {}).get("env") or {}
    props = {k: v for k, v in (native.get("properties") or {}).items() if v is not None}
    out = {}
    for name, default in TCMALLOC_DEFAULTS.items():
        current, source = (env[name], f"env {name}") if name in env else (default, "compiled default")
        out[name] = Knob(name=name, current=current, source=source,
                         how=f"{name}=N at start" + (
                             "; `allocdiag set PID max_total_thread_cache_bytes=N` at runtime"
                             if "THREAD_CACHE" in name else
                             "; `allocdiag release PID` (ReleaseFreeMemory) now" if "RELEASE" in name
                             else ""))
    if "tcmalloc.max_total_thread_cache_bytes" in props:
        v = str(props["tcmalloc.max_total_thread_cache_bytes"])
        k = out["TCMALLOC_MAX_TOTAL_THREAD_CACHE_BYTES"]
        src = k.source if v == k.current else "changed at runtime (SetNumericProperty)" \
            if k.source == "compiled default" else k.source
        out["TCMALLOC_MAX_TOTAL_THREAD_CACHE_BYTES"] = Knob(k.name, v, src, how=k.how)
    if "tcmalloc.aggressive_memory_decommit" in props:
        v = "true" if props["tcmalloc.aggressive_memory_decommit"] else "false"
        k = out["TCMALLOC_AGGRESSIVE_DECOMMIT"]
        out["TCMALLOC_AGGRESSIVE_DECOMMIT"] = Knob(k.name, v, k.source, how=k.how)
    return out


def start_env(options: list[tuple[str, str]], env: dict[str, str]) -> None:
    """TCMALLOC_K=v for gperftools' option names."""
    common.start_options(options, env, _option)


def _option(key: str, value: str, env: dict[str, str]) -> None:
    env[f"TCMALLOC_{key.upper()}"] = value


class Knobs(common.KnobsBase):
    runtime: tuple[str, ...] = ("max_total_thread_cache_bytes",)
    read = staticmethod(read)
    start_env = staticmethod(start_env)

    def refusal_hint(self, name: str) -> str | None:
        if name.upper().startswith("TCMALLOC_RELEASE_RATE"):
            return ("; SetMemoryReleaseRate takes a double, which the remote engine does not pass: "
                    "set TCMALLOC_RELEASE_RATE at start, or use `allocdiag release`")
        return None

    def set(self, rp: Any, resolve: Callable[[str], int], prefix: str | None,
            name: str, value: str) -> tuple[str | None, str, str]:
        get = resolve("MallocExtension_GetNumericProperty")
        put = resolve("MallocExtension_SetNumericProperty")
        prop = "tcmalloc." + name
        v = int_value(value, name)
        with rp.borrow() as c:
            n, out = c.scratch(64), c.scratch(16)
            c.write(n, prop.encode() + b"\0")
            c.call(get, n, out)
            old = struct.unpack("<Q", c.read(out, 8))[0]
            ok = c.call(put, n, v) & common.BOOL_RETURN
            c.call(get, n, out)
            new = struct.unpack("<Q", c.read(out, 8))[0]
        gperftools.forget_knobs()       # cached knob properties are stale now
        if not ok:
            raise Unsupported(f"tcmalloc refused {prop}={v}")
        return str(old), str(new), f"MallocExtension_SetNumericProperty({prop})"
