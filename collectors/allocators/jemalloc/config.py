"""Where jemalloc's settings come from, read without stopping the target.

jemalloc reads its options from these sources, each overriding the one
before (src/conf.c, "opts_explain"): the configure-time ``--with-malloc-conf``
(mallctl ``config.malloc_conf``, read live by the stats reader), the
global ``[prefix]malloc_conf`` string in the program, the target of the
``/etc/[prefix]malloc.conf`` symlink, the ``[PREFIX]MALLOC_CONF``
environment variable, and ``[prefix]malloc_conf_2_conf_harder``.
"""

from __future__ import annotations

import os
from typing import Any

from collectors.engine.memory import MemoryReader
from diag.model.errors import AllocdiagError

CONF_STRING_MAX = 1024      # bytes of a malloc_conf global read (the options fit in far less)


def jemalloc_sources(image: Any, obj: Any, prefix: str | None, mem: Any = None) -> dict[str, str]:
    """{source name: conf string} for a jemalloc in loaded object OBJ (the
    executable for a static build).  Only sources that are set appear."""
    prefix = prefix or ""
    out = {}
    for name in (f"{prefix}malloc_conf", f"{prefix}malloc_conf_2_conf_harder"):
        text = _global_string(image, obj, name, mem)
        if text:
            out[f"global {name}"] = text
    link = image.in_root(f"/etc/{prefix}malloc.conf")
    try:
        out[f"/etc/{prefix}malloc.conf"] = os.readlink(link)
    except OSError:
        pass
    env_name = prefix.upper() + "MALLOC_CONF"
    env = image.environ or {}
    if env.get(env_name):
        out[f"env {env_name}"] = env[env_name]
    return out


def _global_string(image, obj, name, mem):
    """The C string a ``const char *NAME`` global in OBJ points to, read
    from process memory; None when unset, absent or unreadable."""
    if obj is None or obj.elf is None or obj.bias is None:
        return None
    sym = obj.elf.lookup(name, obj.opener.open)
    if sym is None or not sym.defined:
        return None
    own = mem is None
    try:
        mem = mem or MemoryReader(image.pid, image.procfs.root)
    except AllocdiagError:
        return None
    try:
        ptr = mem.read_u64(obj.bias + sym.st_value)
        if not ptr:
            return None
        data = mem.read(ptr, CONF_STRING_MAX) or b""
        return data.split(b"\0", 1)[0].decode(errors="replace") or None
    finally:
        if own:
            mem.close()


def parse_conf(text: str | None) -> dict[str, str]:
    """jemalloc "k1:v1,k2:v2" -> {k: v} (later keys win, as in conf.c)."""
    out = {}
    for pair in (text or "").split(","):
        k, sep, v = pair.partition(":")
        if sep and k.strip():
            out[k.strip()] = v.strip()
    return out
