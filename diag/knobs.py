"""Each allocator knob's current value and where that value came from.

Pure functions of what a snapshot collected: ``native`` (live values read
from the allocator, when attached) and ``native["config"]`` (the
configuration sources read from /proc and memory, collectors.config).
Sources, in words the user will recognise: "compiled default",
"compiled-in conf (config.malloc_conf)", "global malloc_conf",
"/etc/malloc.conf", "env MALLOC_CONF", "changed at runtime".

A knob here is {name: Knob(name, current, source, how)}; findings copy it
and add ``suggested``.
"""

from collectors.config import parse_conf
from diag.model import Knob

# jemalloc 5.2+ defaults (include/jemalloc/internal/arena_types.h; ChangeLog
# 5.2.0 "Disable muzzy decay by default").
JEMALLOC_DEFAULTS = {"dirty_decay_ms": "10000", "muzzy_decay_ms": "0", "background_thread": "false",
                     "narenas": "4 x CPUs", "tcache": "true"}
# glibc malloc.c defaults (64-bit).
GLIBC_DEFAULTS = {"arena_max": "8 x cores (NARENAS_FROM_NCORES)",
                  "trim_threshold": "131072 (dynamic: raised to 2 x mmap_threshold)",
                  "mmap_threshold": "131072 (dynamic, up to 33554432)", "top_pad": "131072",
                  "tcache_count": "7"}
# gperftools 2.10 (page_heap.cc, thread_cache.cc).
TCMALLOC_DEFAULTS = {"TCMALLOC_RELEASE_RATE": "1.0", "TCMALLOC_AGGRESSIVE_DECOMMIT": "false",
                     "TCMALLOC_MAX_TOTAL_THREAD_CACHE_BYTES": "33554432"}


def knobs(kind, native):
    fn = {"jemalloc": jemalloc_knobs, "glibc": glibc_knobs, "tcmalloc": tcmalloc_knobs,
          "mimalloc": mimalloc_knobs}.get(kind)
    return fn(native) if fn else {}


def _winner(name, sources, default):
    """(value, source) of NAME from ordered conf SOURCES [(label, dict)]:
    the last source that sets it wins; else the compiled default."""
    value, source = default, "compiled default"
    for label, conf in sources:
        if name in conf:
            value, source = conf[name], label
    return value, source


def jemalloc_knobs(native):
    # A mallctl this build or source does not have is None in the native
    # document (collectors.allocators.jemalloc): treat it as absent.
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


def _fmt(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _fmt_conf(v):
    return {"1": "true", "0": "false"}.get(v, v).lower() if v in ("true", "false", "1", "0") else v


def glibc_knobs(native):
    from collectors.config import glibc_tunables
    env = (native.get("config") or {}).get("env") or {}
    set_ = glibc_tunables(env)
    how = {"arena_max": "MALLOC_ARENA_MAX=N or GLIBC_TUNABLES=glibc.malloc.arena_max=N at start; "
                        "`allocdiag set PID arena_max=N` (mallopt M_ARENA_MAX) affects new arenas only",
           "trim_threshold": "GLIBC_TUNABLES=glibc.malloc.trim_threshold=N (note: setting it "
                             "disables glibc's dynamic mmap/trim thresholds); or call "
                             "malloc_trim(0) (`allocdiag release PID`)",
           "mmap_threshold": "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=N (disables the dynamic "
                             "threshold)",
           "top_pad": "GLIBC_TUNABLES=glibc.malloc.top_pad=N",
           "tcache_count": "GLIBC_TUNABLES=glibc.malloc.tcache_count=N (0 disables tcache)"}
    out = {}
    for name, default in GLIBC_DEFAULTS.items():
        value, source = set_.get(name, (default, "compiled default"))
        out[name] = Knob(name=name, current=value, source=source, how=how[name])
    return out


def tcmalloc_knobs(native):
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


def mimalloc_knobs(native):
    from collectors.config import prefixed_env
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
