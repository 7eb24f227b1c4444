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

from collectors import allocators
from collectors.allocators import common
from diag.model.errors import AllocdiagError, Unsupported
from collectors.engine.inproc import InProcess, SelfResolver, symbol
from collectors.proc.maps import parse_maps


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


# symbol looked up in the object that defines malloc -> allocator kind
_PROBES = (
    ("mallctl", "jemalloc"),
    ("MallocExtension_Internal_GetNumericProperty", "tcmalloc-google"),
    ("MallocExtension_GetNumericProperty", "tcmalloc"),
    ("mi_version", "mimalloc"),
)


def _has(lib, name):
    try:
        getattr(lib, name)
        return True
    except AttributeError:
        return False


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
        if det.serving is not None and det.allocator.kind != "unknown":
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
    path, lib = malloc_provider()
    for symbol, kind in _PROBES:
        if _has(lib, symbol):
            return kind, path, lib
    base = os.path.basename(path or "")
    if base.startswith("libc.so") or base.startswith("libc-"):
        return "glibc", path, lib
    return "unknown", path, lib


# --------------------------------------------------------------------------

class _SelfAllocator:
    """What the allocator modules read of a detection's allocator."""

    def __init__(self, kind, path, version):
        self.kind, self.path, self.version = kind, path, version
        self.prefix = ""
        base = os.path.basename(path or "")
        self.variant = "minimal" if kind == "tcmalloc" and "minimal" in base else None


class _Resolver(SelfResolver):
    def maps(self):
        with open("/proc/self/maps", "rb") as f:
            return parse_maps(f.read())


def _version(kind, lib):
    """The allocator's version, asked in-process (outside the gather: it is
    not a statistic)."""
    try:
        if kind == "glibc":
            fn = ctypes.CDLL(None).gnu_get_libc_version
            fn.restype = ctypes.c_char_p
            return fn().decode()
        if kind == "jemalloc":
            cell, size = ctypes.c_char_p(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_char_p))
            lib.mallctl.argtypes = (ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                    ctypes.c_void_p, ctypes.c_size_t)
            if lib.mallctl(b"version", ctypes.byref(cell), ctypes.byref(size), None, 0) == 0:
                return cell.value.decode()
        if kind == "tcmalloc" and symbol(lib, "tc_version"):
            tv = lib.tc_version
            tv.argtypes = (ctypes.POINTER(ctypes.c_int),) * 2 + (ctypes.POINTER(ctypes.c_char_p),)
            tv.restype = ctypes.c_char_p
            return tv(None, None, None).decode()
        if kind == "mimalloc" and symbol(lib, "mi_version"):
            lib.mi_version.restype = ctypes.c_int
            return mimalloc_version(lib.mi_version())
    except (AttributeError, OSError, UnicodeDecodeError):
        pass
    return None


def mimalloc_version(n):
    """MI_MALLOC_VERSION -> "major.minor.patch": 209 is 2.0.9, 20401 is 2.4.1."""
    if n >= 10000:
        return f"{n // 10000}.{n // 100 % 100}.{n % 100}"
    return f"{n // 100}.{n // 10 % 10}.{n % 10}"


def snapshot_self(**options):
    """-> (kind, native, stats) for the calling process.

    kind: glibc|jemalloc|tcmalloc|tcmalloc-google|mimalloc.  Raises
    Unsupported when the allocator serving malloc is not one of these.
    """
    kind, path, lib = detect()
    mod = allocators.module(kind)
    if mod is None:
        raise Unsupported(f"malloc is served by {path or 'an unknown object'}, "
                          "which is not an allocator allocdiag knows")
    alloc = _SelfAllocator(kind, path, _version(kind, lib))
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
