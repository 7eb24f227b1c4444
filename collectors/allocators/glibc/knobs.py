"""glibc's knobs: tunables and MALLOC_* variables at start, mallopt at
runtime (malloc/malloc.h)."""

from __future__ import annotations

from typing import Any, Callable

from collectors import lazylog
from diag.model import Knob
from diag.model.errors import Unsupported

from collectors.allocators.common import int_value
from collectors.allocators import common

log = lazylog.getLogger("collectors.allocators")

# glibc malloc.c defaults (64-bit).
GLIBC_DEFAULTS = {"arena_max": "8 x cores (NARENAS_FROM_NCORES)",
                  "trim_threshold": "131072 (dynamic: raised to 2 x mmap_threshold)",
                  "mmap_threshold": "131072 (dynamic, up to 33554432)", "top_pad": "131072",
                  "tcache_count": "7"}
# glibc mallopt parameters (malloc/malloc.h M_TRIM_THRESHOLD...).
MALLOPT = {"trim_threshold": -1, "top_pad": -2, "mmap_threshold": -3, "mmap_max": -4,
           "arena_test": -7, "arena_max": -8}


def read(native: dict[str, Any]) -> dict[str, Knob]:
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


def start_env(options: list[tuple[str, str]], env: dict[str, str]) -> None:
    """GLIBC_TUNABLES=glibc.malloc.k=v:... (``glibc.*`` names as they are)."""
    tunables: list[str] = []
    common.start_options(options, env, lambda k, v, e: tunables.append(
        f"{k if k.startswith('glibc.') else 'glibc.malloc.' + k}={v}"))
    if tunables:
        env["GLIBC_TUNABLES"] = ":".join(tunables)


def glibc_tunables(env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """{tunable short name: value} from GLIBC_TUNABLES glibc.malloc.* and
    the MALLOC_*_ aliases, with where each came from."""
    out = {}
    aliases = {"MALLOC_ARENA_MAX": "arena_max", "MALLOC_ARENA_TEST": "arena_test",
               "MALLOC_TRIM_THRESHOLD_": "trim_threshold", "MALLOC_TOP_PAD_": "top_pad",
               "MALLOC_MMAP_THRESHOLD_": "mmap_threshold", "MALLOC_MMAP_MAX_": "mmap_max",
               "MALLOC_PERTURB_": "perturb", "MALLOC_CHECK_": "check"}
    for var, name in aliases.items():
        if var in env:
            out[name] = (env[var], f"env {var}")
    for item in env.get("GLIBC_TUNABLES", "").split(":"):
        k, sep, v = item.partition("=")
        if sep and k.startswith("glibc.malloc."):
            out[k[len("glibc.malloc."):]] = (v, "env GLIBC_TUNABLES")
    return out


class Knobs(common.KnobsBase):
    runtime: tuple[str, ...] = tuple(MALLOPT)
    read = staticmethod(read)
    start_env = staticmethod(start_env)

    def set(self, rp: Any, resolve: Callable[[str], int], prefix: str | None,
            name: str, value: str) -> tuple[str | None, str, str]:
        fn = resolve("mallopt")
        v = int_value(value, name)
        with rp.borrow() as c:
            ok = c.call(fn, MALLOPT[name] & common.U64, v & common.U64) & common.INT_RETURN
        if ok != 1:
            raise Unsupported(f"mallopt({name}, {v}) refused by glibc (returned {ok})")
        return None, str(v), "glibc has no getter for mallopt parameters: the old value is unknown; " \
                             "setting it disables glibc's dynamic mmap/trim thresholds"
