"""mimalloc's knobs: MIMALLOC_* variables at start, mi_option_set at runtime."""

from __future__ import annotations

from typing import Any, Callable

from collectors import lazylog
from diag.model import Knob

from collectors.allocators import common
from collectors.allocators.mimalloc.optiontable import OPTIONS_2_0
from collectors.allocators.common import int_value

log = lazylog.getLogger("collectors.allocators")


def read(native: dict[str, Any]) -> dict[str, Knob]:
    env = prefixed_env((native.get("config") or {}).get("env") or {}, "MIMALLOC_")
    opts = native.get("options") or {}
    out = {}
    for name, value in opts.items():
        if name.startswith("deprecated_"):
            continue
        if name in env:
            source = env[name][1]
            if str(value) != env[name][0] and env[name][0].lower() not in ("1", "true", "on", "yes"):
                source += f" asked for {env[name][0]}"
        else:
            source = "compiled default"
        out[name] = Knob(name=name, current=str(value), source=source,
                         how=f"MIMALLOC_{name.upper()}=N at start, or `allocdiag set PID {name}=N` "
                             "(mi_option_set) at runtime")
    return out


def start_env(options: list[tuple[str, str]], env: dict[str, str]) -> None:
    """MIMALLOC_K=v; ``purge_delay`` (the 2.1 name) also sets
    MIMALLOC_DECOMMIT_DELAY, its 2.0 name, and vice versa."""
    common.start_options(options, env, _option)


def _option(key: str, value: str, env: dict[str, str]) -> None:
    env[f"MIMALLOC_{key.upper()}"] = value
    if key == "purge_delay":
        env.setdefault("MIMALLOC_DECOMMIT_DELAY", value)
    elif key == "decommit_delay":
        env.setdefault("MIMALLOC_PURGE_DELAY", value)


def prefixed_env(env: dict[str, str], prefix: str) -> dict[str, tuple[str, str]]:
    """{lower-case name: (value, source)} for PREFIX* variables (mimalloc
    matches its option names case-insensitively)."""
    out = {}
    for k, v in (env or {}).items():
        if k.upper().startswith(prefix):
            out[k[len(prefix):].lower()] = (v, f"env {k}")
    return out


class Knobs(common.KnobsBase):
    runtime: tuple[str, ...] = tuple(n for n in OPTIONS_2_0 if not n.startswith("deprecated_"))
    read = staticmethod(read)
    start_env = staticmethod(start_env)

    def set(self, rp: Any, resolve: Callable[[str], int], prefix: str | None,
            name: str, value: str) -> tuple[str | None, str, str]:
        from collectors.allocators.mimalloc import reader     # not with the home (issue 23)
        idx = OPTIONS_2_0.index(name)
        get, put = resolve("mi_option_get"), resolve("mi_option_set")
        v = int_value(value, name)
        with rp.borrow() as c:
            old = common.signed(c.call(get, idx))
            c.call(put, idx, v & common.U64)
            new = common.signed(c.call(get, idx))
        reader.forget_options()         # cached option values are stale now
        return str(old), str(new), f"mi_option_set({name})"
