"""gperftools tcmalloc's knobs: TCMALLOC_* variables at start, the
numeric properties MallocExtension lets a program set at runtime."""

from __future__ import annotations

import struct
from typing import Any, Callable

from collectors import lazylog
from diag.model import Knob
from diag.model.errors import Unsupported

from collectors.allocators.common import int_value
from collectors.allocators import common

log = lazylog.getLogger("collectors.allocators")

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
    # a live value other than the default, and no variable that set it: changed
    # at runtime, or set at start in an environment that cannot be read
    moved = ("not the compiled default: set at start (the environment is not readable) "
             "or at runtime (SetNumericProperty)"
             if (native.get("config") or {}).get("env_unreadable")
             else "changed at runtime (SetNumericProperty)")
    for name, prop in (("TCMALLOC_MAX_TOTAL_THREAD_CACHE_BYTES",
                        "tcmalloc.max_total_thread_cache_bytes"),
                       ("TCMALLOC_AGGRESSIVE_DECOMMIT", "tcmalloc.aggressive_memory_decommit")):
        if prop not in props:
            continue
        v = str(props[prop]) if "THREAD_CACHE" in name else \
            "true" if props[prop] else "false"
        k = out[name]
        src = moved if v != k.current and k.source == "compiled default" else k.source
        out[name] = Knob(k.name, v, src, how=k.how)
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
        from collectors.allocators.gperftools import reader   # not with the home (issue 23)
        reader.forget_knobs()           # cached knob properties are stale now
        if not ok:
            raise Unsupported(f"tcmalloc refused {prop}={v}")
        return str(old), str(new), f"MallocExtension_SetNumericProperty({prop})"
