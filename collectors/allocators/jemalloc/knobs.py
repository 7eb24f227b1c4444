"""jemalloc's knobs: each one's current value and its source (compiled-in
conf, global malloc_conf, /etc/malloc.conf, env MALLOC_CONF, changed at
runtime), and the runtime writes `allocdiag set` makes (mallctl)."""

from __future__ import annotations

import errno
import struct
from typing import Any, Callable

from collectors import lazylog
from diag.model import Knob
from diag.model.errors import Unsupported

from collectors.allocators.jemalloc.config import parse_conf
from collectors.allocators.common import int_value, true_false
from collectors.allocators import common

log = lazylog.getLogger("collectors.allocators")

# jemalloc 5.2+ defaults (include/jemalloc/internal/arena_types.h; ChangeLog
# 5.2.0 "Disable muzzy decay by default").
JEMALLOC_DEFAULTS = {"dirty_decay_ms": "10000", "muzzy_decay_ms": "0", "background_thread": "false",
                     "narenas": "4 x CPUs", "tcache": "true"}
# mallctl write errors that mean "this arena was never initialised": skipped
# (jemalloc src/ctl.c arena_i_decay_ms_ctl: EFAULT for an unused arena index,
# ENOENT for one past narenas).
ARENA_UNUSED = (errno.EFAULT, errno.ENOENT)


def _winner(name: str, sources: list[tuple[str, dict[str, str]]],
            default: str | None) -> tuple[str | None, str]:
    """(value, source) of NAME from ordered conf SOURCES [(label, dict)]:
    the last source that sets it wins; else the compiled default."""
    value, source = default, "compiled default"
    for label, conf in sources:
        if name in conf:
            value, source = conf[name], label
    return value, source


def read(native: dict[str, Any]) -> dict[str, Knob]:
    # A mallctl this build or source does not have is None in the native
    # document (collectors.allocators.jemalloc.reader): treat it as absent.
    m = {k: v for k, v in (native.get("mallctl") or {}).items() if v is not None}
    config = native.get("config", {})
    prefix = native.get("prefix") or config.get("prefix") or ""
    env_name = prefix.upper() + "MALLOC_CONF"
    sources = []
    if m.get("config.malloc_conf"):
        sources.append(("compiled-in conf (config.malloc_conf)", parse_conf(m["config.malloc_conf"])))
    for label, text in (config.get("jemalloc") or {}).items():
        if label.startswith("global") and "2_conf_harder" not in label:
            sources.append((label, parse_conf(text)))
    for label, text in (config.get("jemalloc") or {}).items():
        if label.startswith("/etc/"):
            sources.append((label, parse_conf(text)))
    for label, text in (config.get("jemalloc") or {}).items():
        if label.startswith("env"):
            sources.append((label, parse_conf(text)))
    for label, text in (config.get("jemalloc") or {}).items():
        if "2_conf_harder" in label:
            sources.append((label, parse_conf(text)))
    out = {}
    # (opt.* as configured at start, the runtime value).  The merged
    # pseudo-arena 4096 reports -1 for decay times: it has none of its own.
    live = {"dirty_decay_ms": ("opt.dirty_decay_ms", "arenas.dirty_decay_ms"),
            "muzzy_decay_ms": ("opt.muzzy_decay_ms", "arenas.muzzy_decay_ms"),
            "background_thread": ("opt.background_thread", "background_thread"),
            "narenas": ("opt.narenas", None),
            "tcache": ("opt.tcache", None)}
    how = {"dirty_decay_ms": f"{env_name}=dirty_decay_ms:N at start, or `allocdiag set PID "
                             "dirty_decay_ms=N` (arena.<i>.dirty_decay_ms) at runtime",
           "muzzy_decay_ms": f"{env_name}=muzzy_decay_ms:N at start, or `allocdiag set PID "
                             "muzzy_decay_ms=N` at runtime",
           "background_thread": f"{env_name}=background_thread:true at start, or `allocdiag set "
                                "PID background_thread=true` at runtime",
           "narenas": f"{env_name}=narenas:N at start (not changeable at runtime)",
           "tcache": f"{env_name}=tcache:false at start"}
    for name, (opt, runtime) in live.items():
        conf_value, conf_source = _winner(name, sources, JEMALLOC_DEFAULTS.get(name))
        current, source = conf_value, conf_source
        if opt in m:
            current = _fmt(m[opt])
            if conf_value is not None and _fmt_conf(conf_value) != current and \
                    conf_source != "compiled default":
                source = f"{conf_source} asked for {conf_value}, but opt.{name} is {current}: ignored"
            elif conf_source == "compiled default":
                source = "compiled default"
        if runtime and runtime in m and opt in m and _fmt(m[runtime]) != _fmt(m[opt]):
            current, source = _fmt(m[runtime]), f"changed at runtime ({runtime})"
        out[name] = Knob(name=name, current=current, source=source, how=how[name])
    env = config.get("env") or {}
    if prefix and env.get("MALLOC_CONF") and not env.get(env_name):
        out["MALLOC_CONF"] = Knob(
            name="MALLOC_CONF", current=env["MALLOC_CONF"],
            source=f"env MALLOC_CONF is set but this jemalloc is prefixed ({prefix}) and reads "
                   f"{env_name}: ignored", how=f"set {env_name} instead")
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _fmt_conf(v: str) -> str:
    return {"1": "true", "0": "false"}.get(v, v).lower() if v in ("true", "false", "1", "0") else v


def _set(rp: Any, mallctl: int, name: str, value: Any) -> tuple[str | None, str, str]:
    from collectors.allocators.jemalloc import reader as jemalloc   # not with the home (issue 23)
    if name == "background_thread":
        flag = str(value).lower()
        if flag not in ("true", "false", "1", "0"):
            raise Unsupported("background_thread takes true or false")
        new = flag in ("true", "1")
        with rp.borrow() as c:
            rc, was = jemalloc.mallctl_write_bool(c, mallctl, "background_thread", new)
        if rc:
            raise Unsupported(f"mallctl(background_thread) failed with error {rc}")
        return true_false(was), true_false(new), "mallctl background_thread (starts/stops jemalloc's purging threads)"
    v = int_value(value, name)
    with rp.borrow() as c:
        scratch = (c.scratch(64), c.scratch(16), c.scratch(16))
        narenas = jemalloc.mallctl_read(c, mallctl, "arenas.narenas", "unsigned", scratch)
        old = jemalloc.mallctl_read(c, mallctl, f"arenas.{name}", "ssize_t", scratch)
        val = c.scratch(16)
        c.write(val, struct.pack("<q", v))
        failures = 0
        # The default for new arenas, then every existing arena.
        for target in [f"arenas.{name}"] + [f"arena.{i}.{name}" for i in range(narenas or 0)]:
            n = scratch[0]
            c.write(n, target.encode() + b"\0")
            rc = c.call(mallctl, n, 0, 0, val, 8) & common.INT_RETURN
            # EFAULT/ENOENT for arenas that were never initialised: skip.
            failures += rc not in (0,) + ARENA_UNUSED
        new = jemalloc.mallctl_read(c, mallctl, f"arenas.{name}", "ssize_t", scratch)
    jemalloc.forget_general()          # cached arenas.*_decay_ms are stale now
    if failures:
        raise Unsupported(f"jemalloc refused {name}={v} on {failures} arenas")
    return str(old), str(new), f"mallctl arenas.{name} and arena.<i>.{name} for {narenas} arenas"




def start_env(options: list[tuple[str, str]], env: dict[str, str]) -> None:
    """MALLOC_CONF=k:v,... for jemalloc's option names."""
    conf: list[str] = []
    common.start_options(options, env, lambda k, v, e: conf.append(f"{k}:{v}"))
    if conf:
        env["MALLOC_CONF"] = ",".join(conf)


class Knobs(common.KnobsBase):
    runtime: tuple[str, ...] = ("dirty_decay_ms", "muzzy_decay_ms", "background_thread")
    conf_strings: bool = True

    def conf_sources(self, image: Any, obj: Any, prefix: str | None) -> dict[str, Any]:
        from collectors.allocators.jemalloc.config import jemalloc_sources
        return {"jemalloc": jemalloc_sources(image, obj, prefix), "prefix": prefix or ""}

    read = staticmethod(read)
    start_env = staticmethod(start_env)

    def set(self, session: Any, resolve: Callable[[str], int], prefix: str | None,
            name: str, value: str) -> tuple[str | None, str, str]:
        return _set(session, resolve((prefix or "") + "mallctl"), name, value)
