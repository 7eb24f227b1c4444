"""Self mode: the allocator statistics of the *calling* process, via ctypes.

Which allocator serves ``malloc`` is decided by where the process's
``malloc`` binding points: ``dladdr(dlsym(RTLD_DEFAULT, "malloc"))`` names
the object that defines it (a preloaded libjemalloc, libtcmalloc, libmimalloc,
the executable for a static build, or libc), and the stats API is looked up
in that object only.  A library that is merely loaded (say a jemalloc
dlopen'ed with RTLD_LOCAL, or a prefixed ``_rjem_mallctl``) is not taken for
the allocator.

Side effects, reported in ``native["side_effects"]``:

* glibc: ``mallinfo2`` does not allocate.  ``malloc_info`` is written into
  a pre-allocated buffer through ``fmemopen`` (unbuffered, so stdio allocates
  no buffer); fmemopen itself mallocs its FILE, after mallinfo2 was read and
  before malloc_info runs: the XML counts that one small allocation.
* jemalloc: ``mallctl`` reads do not allocate (``epoch`` is written first).
* gperftools: GetStats writes into a caller buffer; properties do not allocate.
* mimalloc: ``mi_stats_print_out`` calls back into Python for each line,
  which allocates Python strings (the text is built after the counters
  were read by the printer line by line, so later lines may see them).
"""

import ctypes
import os

from collectors.errors import AllocdiagError, Unsupported
from collectors import glibc_stats, jemalloc_stats, tcmalloc_stats, mimalloc_stats


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


_CTYPES = {
    "size_t": ctypes.c_size_t, "uint64": ctypes.c_uint64, "bool": ctypes.c_bool,
    "ssize_t": ctypes.c_ssize_t, "unsigned": ctypes.c_uint, "const char*": ctypes.c_char_p,
}

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
        from collectors.image import ProcessImage
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

def _glibc(lib, path):
    libc = ctypes.CDLL(None)
    side = []

    class _MI2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in glibc_stats.MALLINFO2_FIELDS]

    mallinfo2 = libc.mallinfo2
    mallinfo2.restype = _MI2
    fmemopen = libc.fmemopen
    fmemopen.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    fmemopen.restype = ctypes.c_void_p
    setvbuf = libc.setvbuf
    setvbuf.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t)
    malloc_info = libc.malloc_info
    malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
    ftell = libc.ftell
    ftell.argtypes = (ctypes.c_void_p,)
    ftell.restype = ctypes.c_long
    fclose = libc.fclose
    fclose.argtypes = (ctypes.c_void_p,)
    gnu_version = libc.gnu_get_libc_version
    gnu_version.restype = ctypes.c_char_p

    size = 256 << 10
    for _ in range(6):
        buf = ctypes.create_string_buffer(size)          # allocated before mallinfo2
        mi = mallinfo2()
        raw = ctypes.string_at(ctypes.addressof(mi), ctypes.sizeof(mi))
        f = fmemopen(buf, size, b"w")
        if not f:
            raise Unsupported("fmemopen failed; cannot capture malloc_info")
        setvbuf(f, None, 2, 0)                            # _IONBF: no stdio buffer
        rc = malloc_info(0, f)
        used = ftell(f)
        fclose(f)
        if rc == 0 and 0 <= used < size - 1:
            break
        size *= 4
    else:
        raise Unsupported("malloc_info output did not fit in 16 MiB")
    side.append("fmemopen allocated its FILE between mallinfo2 and malloc_info: "
                "the malloc_info numbers include that allocation")
    m2 = glibc_stats.parse_mallinfo2(raw)
    xml = buf.raw[:used]
    native = glibc_stats.parse_malloc_info(xml)
    native["mallinfo2"] = m2
    native["version"] = gnu_version().decode()
    native["side_effects"] = side
    return native, glibc_stats.normalise_glibc(native, m2)


def _jemalloc(lib, path):
    mallctl = lib.mallctl
    mallctl.argtypes = (ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                        ctypes.c_void_p, ctypes.c_size_t)
    mallctl.restype = ctypes.c_int
    epoch = ctypes.c_uint64(1)
    rc = mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.sizeof(epoch))
    values, errors = {}, {}
    if rc != 0:
        errors["epoch"] = os.strerror(rc)
    for name, ctype in jemalloc_stats.STATS_MALLCTLS.items():
        if name == "epoch":
            continue
        cell = _CTYPES[ctype]()
        sz = ctypes.c_size_t(ctypes.sizeof(cell))
        rc = mallctl(name.encode(), ctypes.byref(cell), ctypes.byref(sz), None, 0)
        if rc != 0:
            errors[name] = os.strerror(rc)
            continue
        val = cell.value
        values[name] = val.decode() if isinstance(val, bytes) else val
    native = {"mallctl": values, "errors": errors, "version": values.get("version"),
              "path": path, "side_effects": []}
    return native, jemalloc_stats.normalise_jemalloc(values)


def _tcmalloc(lib, path, google):
    props = {}
    buf = ctypes.create_string_buffer(1 << 16)
    if google:
        getp = lib.MallocExtension_Internal_GetNumericProperty
        getp.argtypes = (ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t))
        getp.restype = ctypes.c_bool
        names = tcmalloc_stats.GOOGLE_TCMALLOC_PROPERTIES
        text = None
        if _has(lib, "TCMalloc_Internal_GetStats"):
            gs = lib.TCMalloc_Internal_GetStats
            gs.argtypes = (ctypes.c_char_p, ctypes.c_size_t)
            gs.restype = ctypes.c_size_t
            gs(buf, len(buf))
            text = buf.value.decode("utf-8", errors="replace")
    else:
        getp = lib.MallocExtension_GetNumericProperty
        getp.argtypes = (ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t))
        getp.restype = ctypes.c_int
        names = tcmalloc_stats.GPERFTOOLS_PROPERTIES
        gs = lib.MallocExtension_GetStats
        gs.argtypes = (ctypes.c_char_p, ctypes.c_int)
        gs(buf, len(buf))
        text = buf.value.decode("utf-8", errors="replace")
    cell = ctypes.c_size_t()
    for name in names:
        raw = name.encode()
        ok = getp(raw, len(raw), ctypes.byref(cell)) if google else getp(raw, ctypes.byref(cell))
        if ok:
            props[name] = cell.value
    stats = tcmalloc_stats.parse_getstats(text) if text else None
    version = None
    if _has(lib, "tc_version"):
        tv = lib.tc_version
        tv.argtypes = (ctypes.POINTER(ctypes.c_int),) * 2 + (ctypes.POINTER(ctypes.c_char_p),)
        tv.restype = ctypes.c_char_p
        version = tv(None, None, None).decode()
    native = {"properties": props, "getstats": stats, "version": version, "path": path,
              "variant": "minimal" if "minimal" in os.path.basename(path or "") else None,
              "side_effects": []}
    return native, tcmalloc_stats.normalise_tcmalloc(
        props, stats, flavor="google" if google else "gperftools")


def _mimalloc(lib, path):
    lines = []
    OUT = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_void_p)
    cb = OUT(lambda msg, arg: lines.append(msg.decode("utf-8", errors="replace")))
    native = {"path": path, "side_effects": [
        "mi_stats_print_out calls back into Python, which allocates while it prints"]}
    version = lib.mi_version
    version.restype = ctypes.c_int
    native["version"] = version()
    pinfo = (ctypes.c_size_t * 8)()
    pi = lib.mi_process_info
    pi.argtypes = (ctypes.POINTER(ctypes.c_size_t),) * 8
    pi(*(ctypes.cast(ctypes.byref(pinfo, i * ctypes.sizeof(ctypes.c_size_t)),
                     ctypes.POINTER(ctypes.c_size_t)) for i in range(8)))
    process_info = mimalloc_stats.process_info_dict(list(pinfo))
    parsed = None
    if _has(lib, "mi_stats_get_json"):
        gj = lib.mi_stats_get_json
        gj.argtypes = (ctypes.c_size_t, ctypes.c_char_p)
        gj.restype = ctypes.c_void_p
        ptr = gj(0, None)
        if ptr:
            text = ctypes.string_at(ptr).decode("utf-8", errors="replace")
            lib.mi_free.argtypes = (ctypes.c_void_p,)
            lib.mi_free(ptr)
            parsed = mimalloc_stats.parse_stats_json(text)
    if parsed is None:
        pr = lib.mi_stats_print_out
        pr.argtypes = (OUT, ctypes.c_void_p)
        pr(cb, None)
        parsed = mimalloc_stats.parse_stats_text("".join(lines))
    native.update(stats=parsed, process_info=process_info)
    return native, mimalloc_stats.normalise_mimalloc(parsed, process_info)


def snapshot_self():
    """-> (kind, native, stats) for the calling process.

    kind: glibc|jemalloc|tcmalloc|tcmalloc-google|mimalloc.  Raises
    Unsupported when the allocator serving malloc is not one of these.
    """
    kind, path, lib = detect()
    if kind == "glibc":
        native, stats = _glibc(lib, path)
    elif kind == "jemalloc":
        native, stats = _jemalloc(lib, path)
    elif kind in ("tcmalloc", "tcmalloc-google"):
        native, stats = _tcmalloc(lib, path, google=(kind == "tcmalloc-google"))
    elif kind == "mimalloc":
        native, stats = _mimalloc(lib, path)
    else:
        raise Unsupported(f"malloc is served by {path or 'an unknown object'}, "
                          "which is not an allocator allocdiag knows")
    native.setdefault("path", path)
    return kind, native, stats
