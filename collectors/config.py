"""Where an allocator's settings come from, read without stopping the target.

jemalloc reads its options from these sources, each overriding the one
before (src/conf.c, "opts_explain"): the configure-time ``--with-malloc-conf``
(mallctl ``config.malloc_conf``, read live by collectors.livestats), the
global ``[prefix]malloc_conf`` string in the program, the target of the
``/etc/[prefix]malloc.conf`` symlink, the ``[PREFIX]MALLOC_CONF``
environment variable, and ``[prefix]malloc_conf_2_conf_harder``.
glibc reads ``GLIBC_TUNABLES`` (glibc.malloc.*) and the older ``MALLOC_*_``
variables; gperftools ``TCMALLOC_*``; mimalloc ``MIMALLOC_*`` (matched
case-insensitively).
"""

import os

from collectors.engine.memory import MemoryReader
from diag.model.errors import AllocdiagError


def jemalloc_sources(image, obj, prefix, mem=None):
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
        data = mem.read(ptr, 1024) or b""
        return data.split(b"\0", 1)[0].decode(errors="replace") or None
    finally:
        if own:
            mem.close()


def parse_conf(text):
    """jemalloc "k1:v1,k2:v2" -> {k: v} (later keys win, as in conf.c)."""
    out = {}
    for pair in (text or "").split(","):
        k, sep, v = pair.partition(":")
        if sep and k.strip():
            out[k.strip()] = v.strip()
    return out


def glibc_tunables(env):
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


def prefixed_env(env, prefix):
    """{lower-case name: (value, source)} for PREFIX* variables (mimalloc
    matches its option names case-insensitively)."""
    out = {}
    for k, v in (env or {}).items():
        if k.upper().startswith(prefix):
            out[k[len(prefix):].lower()] = (v, f"env {k}")
    return out
