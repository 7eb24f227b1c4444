"""Helpers the allocator modules share: symbol checks, stdio streams over
scratch memory, and reading text the allocator wrote."""

from __future__ import annotations

import time
from typing import Any

from diag.model.errors import MalformedData, RemoteCallError, Unsupported

# What a remote call's rax holds, by the C return type (x86-64 SysV ABI: an
# int is eax, a bool al; the upper bits are left as the callee had them).
INT_RETURN = (1 << 32) - 1
BOOL_RETURN = 0xFF
U64 = (1 << 64) - 1           # a negative C long/int argument passed in a 64-bit register

SCRATCH_TEXT = 48 * 1024      # bytes of the buffer (Call.buffer, never the stack) for text/XML
IONBF = 2                     # stdio.h _IONBF: no stdio buffer (nothing malloc'd for it)


class KeptValues:
    """Values read from one process (knob properties, options), kept per
    process key for REFRESH_S seconds so that the snapshots of one allocdiag
    process (TUI, record, exporter) read them again only that often; at most
    KEPT processes, the oldest dropped.  ``clear()`` after allocdiag's own
    ``set``."""

    def __init__(self, refresh_s: float, kept: int = 256) -> None:
        self.refresh_s, self.kept = refresh_s, kept
        self._values: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any) -> Any:
        """KEY's values if read less than REFRESH_S ago, else None."""
        got = self._values.get(key) if key is not None else None
        return got[1] if got and time.monotonic() - got[0] < self.refresh_s else None

    def put(self, key: Any, values: Any) -> None:
        if key is None:
            return
        self._values.pop(key, None)
        self._values[key] = (time.monotonic(), values)
        while len(self._values) > self.kept:
            del self._values[next(iter(self._values))]

    def clear(self) -> None:
        self._values.clear()


def need(addr: int | None, name: str, kind: str) -> int:
    if addr is None:
        raise Unsupported(f"{kind}: symbol {name} not found (stripped build?)")
    return addr


def libc_stdio(res: Any) -> dict[str, int]:
    return {n: need(res.libc(n), n, "libc") for n in ("fmemopen", "setvbuf", "fclose", "fputs")}


def mapper(res: Any) -> tuple[int | None, int | None]:
    """(mmap, munmap) of the target's libc, for the engine's Call.buffer."""
    return (res.libc("mmap"), res.libc("munmap"))


def fmemopen(c: Any, addrs: dict[str, int], buf: int, size: int) -> int:
    """FILE* of an unbuffered fmemopen stream writing into SIZE bytes at
    BUF.  glibc's fmemopen keeps the written text NUL-terminated while there
    is room.  Caller must fclose."""
    mode = c.scratch(16)
    c.write(mode, b"w\0")
    f = c.call(addrs["fmemopen"], buf, size, mode)
    if f == 0:
        raise RemoteCallError("fmemopen failed in the target")
    c.call(addrs["setvbuf"], f, 0, IONBF, 0)
    return f


def text_at(c: Any, addr: int, size: int, first: int | None = None) -> tuple[bytes, bool]:
    """The NUL-terminated text in SIZE bytes at ADDR, read in one go (one
    process_vm_readv: fewer syscalls than a page-by-page scan), or FIRST
    bytes first and the rest only when no NUL lies in them.  Returns (text,
    terminated): terminated is False when no NUL lies inside SIZE."""
    data = c.read(addr, min(first or size, size))
    end = data.find(b"\0")
    if end < 0 and len(data) < size:
        data += c.read(addr + len(data), size - len(data))
        end = data.find(b"\0")
    return (data, False) if end < 0 else (data[:end], True)


def signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


class Retry(MalformedData):
    """What a gather brought back cannot be parsed, but another way of
    gathering (OPTS merged into the options) can: the caller makes one more
    stop with them."""

    def __init__(self, msg, opts):
        super().__init__(msg)
        self.opts = opts


def int_value(value: Any, name: str) -> int:
    """VALUE (a string from the command line) as an integer for knob NAME."""
    try:
        return int(str(value), 0)
    except ValueError:
        raise Unsupported(f"{name} needs an integer, got {value!r}") from None


def true_false(v: Any) -> str:
    return "true" if v else "false"


def start_options(options, env, option):
    """Compare-variant knobs in order: keys in capitals are environment
    variables and pass through to ENV; each lower-case option name goes to
    OPTION(key, value, env)."""
    for key, value in options:
        if key.upper() == key:
            env[key] = value
        else:
            option(key, value, env)


class KnobsBase:
    """What most allocators' ``Knobs`` (interface.Knobs) share: no
    configuration strings read out of the process, no refusal hint.  A
    subclass names its runtime knobs and binds its module's ``read`` and
    ``start_env``."""

    runtime: tuple[str, ...] = ()
    conf_strings: bool = False

    def conf_sources(self, image: Any, obj: Any, prefix: str | None) -> dict[str, Any]:
        return {}

    def refusal_hint(self, name: str) -> str | None:
        return None
