"""Self mode: the allocator statistics of the *calling* process.

Which allocator serves ``malloc`` is decided by where the process's
``malloc`` binding points: ``dladdr(dlsym(RTLD_DEFAULT, "malloc"))`` names
the object that defines it (a preloaded libjemalloc, libtcmalloc, libmimalloc,
the executable for a static build, or libc), and the stats API is looked up
in that object only.  A library that is merely loaded (say a jemalloc
dlopen'ed with RTLD_LOCAL, or a prefixed ``_rjem_mallctl``) is not taken for
the allocator.

The numbers are read by the same code the live path runs
(collectors.allocators: plan, gather, parse, normalise), driven by an
in-process call object (collectors.engine.inproc.InProcess) instead of a borrowed
thread, so the native document has the same shape in both modes.  Side
effects are those of the live path (``native["side_effects"]``): e.g. glibc's
fmemopen FILE, jemalloc's malloc_stats_print output buffer.
"""

import ctypes
import os

from collectors import lazylog
from collectors import allocators
from collectors.allocators import common, registry
from collectors.allocators.mimalloc.home import version_text
from collectors.allocators.registry import for_kind
from diag.model.errors import AllocdiagError, Unsupported
from collectors.engine.inproc import InProcess, SelfResolver
from collectors.proc.maps import parse_maps

log = lazylog.getLogger("collectors.allocators")


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def malloc_provider():
    """(path of the object defining the process's malloc, its ctypes handle).

    Asks collectors.detect about this very process first (the malloc GOT
    slot, read from /proc/self/mem).  ``dlsym(RTLD_DEFAULT, "malloc")`` is
    not enough: in a non-PIE executable that takes malloc's address (Debian's
    /usr/bin/python3.11) the canonical address is the executable's own PLT
    stub, and dladdr then names the executable."""
    try:
        from collectors.detect import detect as detect_process
        from collectors.binary.image import ProcessImage
        det = detect_process(ProcessImage(os.getpid()))
        if det.serving is not None and for_kind(det.allocator.kind) is not registry.UNKNOWN:
            path = det.serving.path
            try:
                exe = os.path.realpath("/proc/self/exe")
            except OSError:
                exe = None
            if exe and os.path.realpath(path) == exe:
                return path, ctypes.CDLL(None)
            try:
                return path, ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            except OSError:
                pass
    except AllocdiagError:
        pass
    return _dladdr_provider()


def _dladdr_provider():
    default = ctypes.CDLL(None)
    addr = ctypes.cast(default.malloc, ctypes.c_void_p).value
    info = _DlInfo()
    dladdr = default.dladdr
    dladdr.argtypes = (ctypes.c_void_p, ctypes.POINTER(_DlInfo))
    dladdr.restype = ctypes.c_int
    if not dladdr(addr, ctypes.byref(info)) or not info.dli_fname:
        return None, default
    path = os.fsdecode(info.dli_fname)
    try:
        exe = os.path.realpath("/proc/self/exe")
    except OSError:
        exe = None
    if not path or (exe and os.path.realpath(path) == exe):
        return path or exe, default
    try:
        handle = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        handle = ctypes.CDLL(path)
    return path, handle


def detect():
    """-> (kind, path, handle).  kind: jemalloc|tcmalloc|tcmalloc-google|mimalloc|glibc|unknown."""
    return _detect()[1:]


def _detect():
    """-> (Signature, kind, path, handle): the first allocator that knows LIB."""
    path, lib = malloc_provider()
    for a in registry.ALL:
        sig = a.in_process(lib, path)
        if sig is not None:
            log.debug("in-process malloc at %s: %s", path, sig.kind)
            return sig, sig.kind, path, lib
    return None, "unknown", path, lib


# --------------------------------------------------------------------------

class _SelfAllocator:
    """What the allocator modules read of a detection's allocator."""

    def __init__(self, kind, path, version, variant=None):
        self.kind, self.path, self.version = kind, path, version
        self.prefix = ""
        self.variant = variant


class _Resolver(SelfResolver):
    def maps(self):
        with open("/proc/self/maps", "rb") as f:
            return parse_maps(f.read())


def _version(kind, lib):
    """The allocator's version, asked in-process (outside the gather: it is
    not a statistic)."""
    try:
        return for_kind(kind).self_version(lib)
    except (AttributeError, OSError, UnicodeDecodeError):
        return None


mimalloc_version = version_text


def snapshot_self(**options):
    """-> (kind, native, stats) for the calling process.

    kind: glibc|jemalloc|tcmalloc|tcmalloc-google|mimalloc.  Raises
    Unsupported when the allocator serving malloc is not one of these.
    """
    sig, kind, path, lib = _detect()
    mod = allocators.module(kind)
    if mod is None:
        raise Unsupported(f"malloc is served by {path or 'an unknown object'}, "
                          "which is not an allocator allocdiag knows")
    alloc = _SelfAllocator(kind, path, _version(kind, lib), sig.variant if sig else None)
    opts = {"glibc_xml": True, "per_arena": False, **options}
    addrs = mod.plan(_Resolver(lib), path, alloc, opts)
    raw = mod.gather(InProcess(), addrs, opts)
    try:
        native = mod.parse(raw, alloc)
    except common.Retry as retry:
        opts.update(retry.opts)
        addrs = mod.plan(_Resolver(lib), path, alloc, opts)
        native = mod.parse(mod.gather(InProcess(), addrs, opts), alloc)
    native["path"] = path
    return kind, native, mod.normalise(native)
