"""C++ (Itanium ABI) demangling through the system's ``abi::__cxa_demangle``.

``char *__cxa_demangle(const char *mangled_name, char *output_buffer,
size_t *length, int *status)`` (libstdc++ ``cxxabi.h``): with a NULL buffer it
returns a ``malloc``ed string that the caller frees with ``free``; ``status``
is 0 on success, -1 on allocation failure, -2 when the name is not a valid
mangled name, -3 on an invalid argument.  Any failure leaves the name as it
was.  Results are cached: a profile repeats the same few hundred symbols.

No dependency: libstdc++.so.6 is on every system that runs C++ (and Python
itself does not need it: when it cannot be loaded, names stay mangled).
"""
import ctypes
import ctypes.util
import functools
import threading

LIBSTDCXX = "libstdc++.so.6"
# libstdc++ __cxa_demangle's *status (cxxabi.h): 0 success, -1 out of
# memory, -2 not a valid mangled name, -3 an invalid argument
STATUS_OK = 0
STATUS_INVALID_ARGUMENT = -3
CACHE_SIZE = 65536
# Itanium mangled names start with _Z (and __Z on some platforms' symbol tables).
MANGLED_PREFIXES = ("_Z", "__Z")

_lock = threading.Lock()
_funcs = None


def _load():
    """(__cxa_demangle, free) as ctypes functions, or None."""
    global _funcs
    with _lock:
        if _funcs is None:
            try:
                cxx = ctypes.CDLL(LIBSTDCXX)
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                dem = cxx.__cxa_demangle
            except (OSError, AttributeError):
                _funcs = False
            else:
                dem.restype = ctypes.c_void_p       # keep the pointer: we must free it
                dem.argtypes = [ctypes.c_char_p, ctypes.c_void_p,
                                ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
                free = libc.free
                free.restype = None
                free.argtypes = [ctypes.c_void_p]
                _funcs = (dem, free)
        return _funcs or None


def available() -> bool:
    return _load() is not None


@functools.lru_cache(maxsize=CACHE_SIZE)
def demangle(name: str) -> str:
    """NAME demangled ("ns::Class::method(int)"), or NAME unchanged when it is
    not a mangled C++ name or the demangler refuses it."""
    if not name or not name.startswith(MANGLED_PREFIXES):
        return name
    funcs = _load()
    if funcs is None:
        return name
    dem, free = funcs
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        return name
    if b"\0" in raw:
        return name
    status = ctypes.c_int(STATUS_INVALID_ARGUMENT)
    ptr = dem(raw, None, None, ctypes.byref(status))
    if not ptr:
        return name
    try:
        if status.value != STATUS_OK:
            return name
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        free(ptr)
