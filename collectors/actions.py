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


from collectors import lazylog
from collectors import livestats
from collectors.allocators import common, registry
from diag.model.errors import Unsupported

log = lazylog.getLogger("collectors.allocators")

ACTION_TIMEOUT_S = 10.0     # malloc_trim of a multi-GiB heap takes a while
# Stack the release/set calls use on the borrowed thread (high-water marks
# measured by tests/targets/stack_need.c: malloc_trim 3,175 B, jemalloc
# arena.4096.purge 1,671 B, gperftools ReleaseFreeMemory 3,431 B, mi_collect
# 1,607 B; mallopt, mallctl writes, Get/SetNumericProperty and mi_option_*
# are smaller).
ACTION_STACK_NEED = 8 * 1024

# kind -> the release call's text, for the allocators that have one
RELEASE_CALLS = {a.kind: a.release.text for a in registry.ALL if a.release is not None}


def _session(image, detection, deadline_s):
    return livestats.open_remote(image, detection, deadline_s=deadline_s,
                                 call_timeout_s=ACTION_TIMEOUT_S, stack_need=ACTION_STACK_NEED)


def _addr(res, obj, name, kind):
    return common.need(res.address(obj, name), name, kind)


def release(image, detection, deadline_s=2.0):
    """Run the allocator's release call; returns (call text, return value,
    pause_us, the syscalls of the call a seccomp filter made it skip)."""
    a = detection.allocator
    kind, obj = a.kind, detection.serving
    rel = registry.for_kind(kind).release
    if rel is None:
        raise Unsupported(f"{kind}: no release call (allocdiag knows none for this allocator)",
                          pid=image.pid)
    res = livestats.Resolver(image)
    fn = _addr(res, obj, (a.prefix or "") + rel.symbol, kind)
    log.debug("pid %s: release with %s at %#x", image.pid, rel.text, fn)
    rp = _session(image, detection, deadline_s)
    with rp.borrow() as c:
        rv = rel.run(c, fn)
    return rel.text, rv, list(rp.pause_us), list(rp.skipped_syscalls)


def runtime_knobs(kind):
    """Names `set` accepts for KIND."""
    k = registry.for_kind(kind).knobs
    return k.runtime if k is not None else ()


def set_knob(image, detection, name, value, deadline_s=2.0):
    """Change knob NAME to VALUE (a string).  Returns (old, new, detail)."""
    a = detection.allocator
    kind, obj = a.kind, detection.serving
    knobs = registry.for_kind(kind).knobs
    allowed = runtime_knobs(kind)
    if knobs is None or name not in allowed:
        hint = f"; runtime knobs of {kind}: {', '.join(allowed)}" if allowed else ""
        hint = (knobs.refusal_hint(name) if knobs is not None else None) or hint
        raise Unsupported(f"{kind} does not let {name} be changed at runtime{hint}", pid=image.pid)
    res = livestats.Resolver(image)
    rp = _session(image, detection, deadline_s)
    log.debug("pid %s: set %s=%s (%s)", image.pid, name, value, kind)
    return knobs.set(rp, lambda sym: _addr(res, obj, sym, kind), a.prefix, name, value)
