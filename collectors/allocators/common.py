"""Helpers the allocator modules share: symbol checks, stdio streams over
scratch memory, and reading text the allocator wrote."""

from __future__ import annotations

import time
from typing import Any

from collectors.binary import diskcache
from collectors.newest import keep_newest
from diag.model.errors import MalformedData, RemoteCallError, Unsupported

# What a remote call's rax holds, by the C return type (x86-64 SysV ABI: an
# int is eax, a bool al; the upper bits are left as the callee had them).
INT_RETURN = (1 << 32) - 1
BOOL_RETURN = 0xFF
U64 = (1 << 64) - 1           # a negative C long/int argument passed in a 64-bit register

SCRATCH_TEXT = 48 * 1024      # bytes of the buffer (Call.buffer) for text/XML
IONBF = 2                     # stdio.h _IONBF: no stdio buffer (nothing malloc'd for it)


class KeptValues:
    """Values read from one process (knob properties, options), kept per
    process key for REFRESH_S seconds so that the snapshots of one allocdiag
    process (TUI, record, exporter) read them again only that often; at most
    KEPT processes, the oldest dropped.  With PART, they are also kept on
    disk (collectors.binary.diskcache, live-process entries) so the next CLI
    run within REFRESH_S reads them back instead of making the calls again:
    its stop is then the same as a recording's.  The disk is never touched
    inside a stop: ``get`` and ``put`` work in memory, ``load`` (before the
    stop) and ``store`` (after it) do the file work; ``before_stop`` and
    ``after_stop`` run them for an allocator module's ``KEPT``.  ``clear()``
    after allocdiag's own ``set`` (on disk too)."""

    def __init__(self, refresh_s: float, kept: int = 256, part: str | None = None) -> None:
        self.refresh_s, self.kept, self.part = refresh_s, kept, part
        self._values: dict[Any, tuple[float, Any]] = {}
        self._unstored: dict[Any, tuple[float, Any]] = {}

    def _fresh(self, got: tuple[float, Any] | None) -> bool:
        return got is not None and time.monotonic() - got[0] < self.refresh_s

    def get(self, key: Any) -> Any:
        """KEY's values if read less than REFRESH_S ago, else None."""
        got = self._values.get(key) if key is not None else None
        return got[1] if got is not None and self._fresh(got) else None

    def put(self, key: Any, values: Any) -> None:
        if key is None:
            return
        got = (time.monotonic(), values)
        self._keep(key, got)
        if self._disk_key(key) is not None:
            self._unstored[key] = got

    def _keep(self, key: Any, got: tuple[float, Any]) -> None:
        keep_newest(self._values, key, got, self.kept)

    def _disk_key(self, key: Any) -> Any:
        """(boot id, pid, start time, path) for a live process's key
        (collectors.livestats: (pid, start time, object path)), else None."""
        if not self.part or not (isinstance(key, tuple) and len(key) == 3 and
                                 isinstance(key[0], int) and isinstance(key[1], int) and
                                 isinstance(key[2], str)):
            return None
        boot = diskcache.boot_id()
        return (boot, key[0], key[1], key[2]) if boot else None

    def load(self, key: Any) -> None:
        """KEY's values from disk into memory, unless memory has them fresh."""
        if self._fresh(self._values.get(key)):
            return
        disk = self._disk_key(key)
        got = diskcache.load_process(disk, self.part, "kept values") \
            if disk and self.part else None
        if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], float) and \
                self._fresh(got):
            self._keep(key, got)

    def store(self) -> None:
        """Write the values put since the last store to disk."""
        while self._unstored and self.part:
            key, got = self._unstored.popitem()
            diskcache.store_process(self._disk_key(key), self.part, got, "kept values")

    def clear(self) -> None:
        self._values.clear()
        self._unstored.clear()
        if self.part:
            diskcache.forget_process(self.part)


def before_stop(mod: Any, key: Any) -> None:
    """Before a stop for the allocator module MOD: its kept values for the
    process KEY read from disk (outside the stop)."""
    for kept in getattr(mod, "KEPT", ()):
        kept.load(key)


def after_stop(mod: Any) -> None:
    """After the stop: MOD's newly read values written to disk."""
    for kept in getattr(mod, "KEPT", ()):
        kept.store()


def need(addr: int | None, name: str, kind: str) -> int:
    if addr is None:
        raise Unsupported(f"{kind}: symbol {name} not found (stripped build?)")
    return addr


def libc_stdio(res: Any) -> dict[str, int]:
    return {n: need(res.libc(n), n, "libc") for n in ("fmemopen", "setvbuf", "fclose", "fputs")}


def mapper(res: Any) -> tuple[int | None, int | None]:
    """(mmap, munmap) of the target's libc, for the engine's Call.buffer."""
    return (res.libc("mmap"), res.libc("munmap"))


def fmemopen(c: Any, addrs: dict[str, int], buf: int, size: int, buffered: bool = False) -> int:
    """FILE* of an fmemopen stream writing into SIZE bytes at BUF:
    unbuffered (one more call, setvbuf) unless BUFFERED, when stdio
    mallocs its own BUFSIZ buffer at the first write and fclose writes it
    out and frees it.  glibc's fmemopen keeps the written text
    NUL-terminated while there is room.  Caller must fclose."""
    mode = c.scratch(16)
    c.write(mode, b"w\0")
    f = c.call(addrs["fmemopen"], buf, size, mode)
    if f == 0:
        raise RemoteCallError("fmemopen failed in the target")
    if not buffered:
        c.call(addrs["setvbuf"], f, 0, IONBF, 0)
    return f


# Length of the text last read per (process, call) (text_at's SEEN): the
# next stop reads that and TEXT_MARGIN more first, not the whole buffer
# (inside the stop, measured cold: 48 KiB ~14 us, 8 KiB ~4 us).
TEXT_MARGIN = 4096
_text_lengths = KeptValues(float("inf"))


def text_at(c: Any, addr: int, size: int, first: int | None = None,
            seen: Any = None) -> tuple[bytes, bool]:
    """The NUL-terminated text in SIZE bytes at ADDR, read in one go (one
    process_vm_readv: fewer syscalls than a page-by-page scan), or FIRST
    bytes first and the rest only when no NUL lies in them.  SEEN: a key
    (process and call) under which the text's length is kept; the next read
    with it asks for that length and TEXT_MARGIN first.  Returns (text,
    terminated): terminated is False when no NUL lies inside SIZE."""
    last = _text_lengths.get(seen)
    if last is not None:
        first = last + TEXT_MARGIN
    data = c.read(addr, min(first or size, size))
    end = data.find(b"\0")
    if end < 0 and len(data) < size:
        data += c.read(addr + len(data), size - len(data))
        end = data.find(b"\0")
    if end < 0:
        return data, False
    _text_lengths.put(seen, end)
    return data[:end], True


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
