"""Remote calls that CHANGE allocator behaviour.  Only ever made on an
explicit user action (DESIGN.md rule 7), never as part of a snapshot.

``release``: give free memory back to the OS now —
  glibc ``malloc_trim(0)`` (all arenas; madvises whole free pages inside
  the heap, then trims the main heap's top), jemalloc
  ``arena.4096.purge`` (MALLCTL_ARENAS_ALL), gperftools
  ``MallocExtension_ReleaseFreeMemory()``, google/tcmalloc
  ``MallocExtension_Internal_ReleaseMemoryToSystem(SIZE_MAX)``, mimalloc
  ``mi_collect(true)``.
``set_knob``: the knobs each allocator lets a program change at runtime.
"""

import struct

from collectors import livestats
from collectors.allocators import common, gperftools, jemalloc, mimalloc
from diag.model.errors import Unsupported

ACTION_TIMEOUT_S = 10.0     # malloc_trim of a multi-GiB heap takes a while
# Stack the release/set calls use on the borrowed thread (high-water marks
# measured by tests/targets/stack_need.c: malloc_trim 3,175 B, jemalloc
# arena.4096.purge 1,671 B, gperftools ReleaseFreeMemory 3,431 B, mi_collect
# 1,607 B; mallopt, mallctl writes, Get/SetNumericProperty and mi_option_*
# are smaller).
ACTION_STACK_NEED = 8 * 1024

# glibc mallopt parameters (malloc/malloc.h).
MALLOPT = {"trim_threshold": -1, "top_pad": -2, "mmap_threshold": -3, "mmap_max": -4,
           "arena_test": -7, "arena_max": -8}
RELEASE_CALLS = {
    "glibc": "malloc_trim(0)",
    "jemalloc": "mallctl(\"arena.4096.purge\")",
    "tcmalloc": "MallocExtension_ReleaseFreeMemory()",
    "tcmalloc-google": "MallocExtension_Internal_ReleaseMemoryToSystem(SIZE_MAX)",
    "mimalloc": "mi_collect(true)",
}


def _session(image, detection, deadline_s):
    return livestats.open_remote(image, detection, deadline_s=deadline_s,
                                 call_timeout_s=ACTION_TIMEOUT_S, stack_need=ACTION_STACK_NEED)


def _addr(res, obj, name, kind):
    return common.need(res.address(obj, name), name, kind)


def release(image, detection, deadline_s=2.0):
    """Run the allocator's release call; returns (call text, return value, pause_us)."""
    a = detection.allocator
    kind, obj = a.kind, detection.serving
    if kind not in RELEASE_CALLS:
        raise Unsupported(f"{kind}: no release call (allocdiag knows none for this allocator)",
                          pid=image.pid)
    res = livestats.Resolver(image)
    if kind == "glibc":
        fn, args = _addr(res, obj, "malloc_trim", kind), (0,)
    elif kind == "jemalloc":
        fn, args = _addr(res, obj, (a.prefix or "") + "mallctl", kind), None
    elif kind == "tcmalloc":
        fn, args = _addr(res, obj, "MallocExtension_ReleaseFreeMemory", kind), ()
    elif kind == "tcmalloc-google":
        fn, args = _addr(res, obj, "MallocExtension_Internal_ReleaseMemoryToSystem", kind), \
            ((1 << 64) - 1,)
    else:
        fn, args = _addr(res, obj, "mi_collect", kind), (1,)
    rp = _session(image, detection, deadline_s)
    with rp.borrow() as c:
        if args is None:
            name = c.scratch(32)
            c.write(name, b"arena.4096.purge\0")
            rv = c.call(fn, name, 0, 0, 0, 0) & 0xFFFFFFFF
        else:
            rv = c.call(fn, *args)
    return RELEASE_CALLS[kind], rv, list(rp.pause_us)


def runtime_knobs(kind):
    """Names `set` accepts for KIND."""
    return {"jemalloc": ("dirty_decay_ms", "muzzy_decay_ms", "background_thread"),
            "glibc": tuple(MALLOPT),
            "tcmalloc": ("max_total_thread_cache_bytes",),
            "mimalloc": tuple(n for n in mimalloc.OPTIONS_2_0
                              if not n.startswith("deprecated_"))}.get(kind, ())


def set_knob(image, detection, name, value, deadline_s=2.0):
    """Change knob NAME to VALUE (a string).  Returns (old, new, detail)."""
    a = detection.allocator
    kind, obj = a.kind, detection.serving
    allowed = runtime_knobs(kind)
    if name not in allowed:
        hint = f"; runtime knobs of {kind}: {', '.join(allowed)}" if allowed else ""
        if kind == "tcmalloc" and name.upper().startswith("TCMALLOC_RELEASE_RATE"):
            hint = ("; SetMemoryReleaseRate takes a double, which the remote engine does not pass: "
                    "set TCMALLOC_RELEASE_RATE at start, or use `allocdiag release`")
        raise Unsupported(f"{kind} does not let {name} be changed at runtime{hint}", pid=image.pid)
    res = livestats.Resolver(image)
    rp = _session(image, detection, deadline_s)
    if kind == "jemalloc":
        return _set_jemalloc(rp, _addr(res, obj, (a.prefix or "") + "mallctl", kind), name, value)
    if kind == "glibc":
        fn = _addr(res, obj, "mallopt", kind)
        v = _int(value, name)
        with rp.borrow() as c:
            ok = c.call(fn, MALLOPT[name] & 0xFFFFFFFFFFFFFFFF, v & 0xFFFFFFFFFFFFFFFF) & 0xFFFFFFFF
        if ok != 1:
            raise Unsupported(f"mallopt({name}, {v}) refused by glibc (returned {ok})")
        return None, str(v), "glibc has no getter for mallopt parameters: the old value is unknown; " \
                             "setting it disables glibc's dynamic mmap/trim thresholds"
    if kind == "tcmalloc":
        get = _addr(res, obj, "MallocExtension_GetNumericProperty", kind)
        put = _addr(res, obj, "MallocExtension_SetNumericProperty", kind)
        prop = "tcmalloc." + name
        v = _int(value, name)
        with rp.borrow() as c:
            n, out = c.scratch(64), c.scratch(16)
            c.write(n, prop.encode() + b"\0")
            c.call(get, n, out)
            old = struct.unpack("<Q", c.read(out, 8))[0]
            ok = c.call(put, n, v) & 0xFF
            c.call(get, n, out)
            new = struct.unpack("<Q", c.read(out, 8))[0]
        gperftools.forget_knobs()       # cached knob properties are stale now
        if not ok:
            raise Unsupported(f"tcmalloc refused {prop}={v}")
        return str(old), str(new), f"MallocExtension_SetNumericProperty({prop})"
    # mimalloc
    idx = mimalloc.OPTIONS_2_0.index(name)
    get, put = _addr(res, obj, "mi_option_get", kind), _addr(res, obj, "mi_option_set", kind)
    v = _int(value, name)
    with rp.borrow() as c:
        old = common.signed(c.call(get, idx))
        c.call(put, idx, v & 0xFFFFFFFFFFFFFFFF)
        new = common.signed(c.call(get, idx))
    return str(old), str(new), f"mi_option_set({name})"


def _int(value, name):
    try:
        return int(str(value), 0)
    except ValueError:
        raise Unsupported(f"{name} needs an integer, got {value!r}") from None


def _set_jemalloc(rp, mallctl, name, value):
    if name == "background_thread":
        v = str(value).lower()
        if v not in ("true", "false", "1", "0"):
            raise Unsupported("background_thread takes true or false")
        new = v in ("true", "1")
        with rp.borrow() as c:
            rc, was = jemalloc.mallctl_write_bool(c, mallctl, "background_thread", new)
        if rc:
            raise Unsupported(f"mallctl(background_thread) failed with error {rc}")
        return _b(was), _b(new), "mallctl background_thread (starts/stops jemalloc's purging threads)"
    v = _int(value, name)
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
            rc = c.call(mallctl, n, 0, 0, val, 8) & 0xFFFFFFFF
            # EFAULT/ENOENT for arenas that were never initialised: skip.
            failures += rc not in (0, 14, 2)
        new = jemalloc.mallctl_read(c, mallctl, f"arenas.{name}", "ssize_t", scratch)
    jemalloc.forget_general()          # cached arenas.*_decay_ms are stale now
    if failures:
        raise Unsupported(f"jemalloc refused {name}={v} on {failures} arenas")
    return str(old), str(new), f"mallctl arenas.{name} and arena.<i>.{name} for {narenas} arenas"


def _b(v):
    return "true" if v else "false"
