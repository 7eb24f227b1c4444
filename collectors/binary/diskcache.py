"""The on-disk store of what was learnt from an ELF file, between runs.

Parsing the objects a process maps costs a CLI run 80-150 ms (pyelftools'
section headers, notes and dynamic tags, the symbol tables); the facts are a
pure function of the file, so a second ``allocdiag inspect`` of the same
binaries reads them back instead (a few milliseconds).

One file per (ELF identity, part): the identity is the file's (st_dev,
st_ino, st_size, st_mtime_ns) from ``fstat`` of the descriptor actually
parsed, plus its build-id read from that descriptor; the part is what the
entry holds (``elf``: the facts detection needs; ``symtab``; ``rodata``: the
version banners found; ``cfi``: the ``.eh_frame_hdr`` index; ``libcfuncs``:
a C library's wait, malloc and exported function ranges, for the stack judge).  A part is read
only when a command asks for it.  Each file holds plain data only (``marshal``
of dicts, lists, tuples, strings, bytes and numbers; never a pickled object) behind a
header naming the format, the producer (a digest of the source of the modules
whose code computes the facts, so a file written by another version of
allocdiag is never trusted) and the identity and part again.

Safety: a corrupt, truncated, foreign or unreadable entry is ignored (one
debug line) and rewritten; a directory that cannot be created or written
disables the store for the run and never fails a command; entries are written
to a temporary file and renamed into place (a reader never sees half an
entry); the directory is 0700 and the files 0600, and a directory or file not
owned by the effective user is not used (``marshal`` trusts what it reads, so
only the user's own entries are read).  The store is bounded: beyond
``MAX_BYTES`` or ``MAX_ENTRIES`` the least recently used entries are
removed, checked by a run that stores something, at most every
``EVICT_EVERY_S``.  "Used" is the file's mtime: a hit on an entry whose
mtime is ``REFRESH_AFTER_S`` old or more sets it to now (one ``futimens``
per entry per interval; atime is not kept on most mounts).

Where: ``$XDG_CACHE_HOME/allocdiag/``, default ``~/.cache/allocdiag/``.
Bypass: ``configure(enabled=False)`` (the CLI's ``--no-cache``) or
``ALLOCDIAG_NO_CACHE=1`` in the environment: nothing is read or written.
"""

from __future__ import annotations

import marshal
import os
import stat
import sys
import threading
import time
import zlib
from typing import Any

from collectors import lazylog

log = lazylog.getLogger("collectors.binary")

FORMAT = 1                    # bump when the header or a part's layout changes
ENV_DISABLE = "ALLOCDIAG_NO_CACHE"
DIR_NAME = "allocdiag"
MAX_BYTES = 64 << 20          # the store's bound on disk
MAX_ENTRIES = 4096
EVICT_TO = 0.75               # eviction removes the least used down to this share of a bound
EVICT_EVERY_S = 600.0        # the bounds are checked at most this often (evict_if_due)
EVICT_MARKER = ".evicted"    # its mtime: when they were last checked
# A hit refreshes an entry's mtime when it is this old: eviction goes by
# last use, not by first write.  By first write, the entries every run
# reads (the C library's, written on the first day) were the first removed
# when the store reached its bound, and every run parsed them again.
REFRESH_AFTER_S = 3600.0
DIR_MODE, FILE_MODE = 0o700, 0o600
# The modules whose code decides what an entry holds (paths under the
# collectors package): a change to any of them makes every entry foreign.
# engine/safepoints.py computes the libcfuncs part; detect.py, the registry
# (its order: the first signature that matches wins) and each allocator's
# home the signature part (tests/test_diskcache.py keeps the homes listed).
_PRODUCER_MODULES = ("binary/diskcache.py", "binary/elf.py", "binary/unwind.py",
                     "engine/safepoints.py", "detect.py", "allocators/interface.py",
                     "allocators/registry.py", "allocators/glibc/home.py",
                     "allocators/jemalloc/home.py", "allocators/gperftools/home.py",
                     "allocators/google_tcmalloc/home.py", "allocators/mimalloc/home.py",
                     "allocators/go.py", "allocators/other.py")

# (st_dev, st_ino, st_size, st_mtime_ns, build-id hex or None)
Key = tuple[int, int, int, int, "str | None"]


class _State:
    """The store's settings and counters for this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.configured: bool | None = None     # configure(); None: enabled by default
        self.directory: str | None = None       # checked directory, once usable
        self.unusable = False                   # the directory failed: off for the run
        self.producer: str | None = None
        self.evicted = False                    # the bound is checked once per run
        self.counts = {"hit": 0, "miss": 0, "ignored": 0, "stored": 0}


_state = _State()


def configure(enabled: bool) -> None:
    """Turn the store on or off for this process (the CLI's ``--no-cache``).
    ``ALLOCDIAG_NO_CACHE=1`` turns it off whatever this says."""
    with _state.lock:
        _state.configured = enabled


def enabled() -> bool:
    """True when entries are read and written in this process."""
    if os.environ.get(ENV_DISABLE, "") not in ("", "0"):
        return False
    return _state.configured is not False and not _state.unusable


def counts() -> dict[str, int]:
    """{"hit", "miss", "ignored", "stored": n} so far in this process."""
    with _state.lock:
        return dict(_state.counts)


def reset() -> None:
    """Forget the settings, counters and the checked directory (tests)."""
    global _state
    _state = _State()


def cache_dir() -> str:
    """``$XDG_CACHE_HOME/allocdiag`` (an absolute XDG_CACHE_HOME only, as the
    XDG base directory spec says), else ``$HOME/.cache/allocdiag``, else the
    user's home directory from the password database."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        home = os.environ.get("HOME", "") or _home_from_passwd()
        base = os.path.join(home, ".cache")
    return os.path.join(base, DIR_NAME)


def _home_from_passwd() -> str:
    import pwd
    try:
        return pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        return "/"


def _count(what: str) -> None:
    with _state.lock:
        _state.counts[what] += 1


def _producer() -> str | None:
    """A checksum of FORMAT, the Python version (marshal's format follows
    it) and the source of the producing modules; None when the source cannot
    be read (then the store stays off: entries could not be told apart).
    zlib's CRC-32, not hashlib: importing hashlib costs a run 2 ms, and the
    header check needs to tell versions apart, not resist an adversary."""
    if _state.producer is None:
        crc = zlib.crc32(f"{FORMAT} {sys.version_info[:2]}".encode())
        size = 0
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        try:
            for name in _PRODUCER_MODULES:
                with open(os.path.join(here, name), "rb") as f:
                    source = f.read()
                crc = zlib.crc32(source, crc)
                size += len(source)
        except OSError as exc:
            log.debug("disk cache off: the source of %s is unreadable (%s)", name, exc.strerror)
            return None
        _state.producer = f"{crc:08x}-{size:x}"
    return _state.producer


def _directory() -> str | None:
    """The store's directory, created 0700 if missing; None (and the store
    off for the run) when it cannot be used."""
    if _state.directory is not None:
        return _state.directory
    if _state.unusable or _producer() is None:
        return None
    path = cache_dir()
    try:
        # A directory in another user's tree is not ours to fill (root under
        # sudo with the invoking user's HOME would leave root-owned files there)
        parent = os.path.dirname(path)
        if os.path.isdir(parent) and os.stat(parent).st_uid != os.geteuid():
            raise PermissionError(0, f"{parent} belongs to another user")
        os.makedirs(path, mode=DIR_MODE, exist_ok=True)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise PermissionError(0, "not a directory owned by this user")
        if stat.S_IMODE(st.st_mode) != DIR_MODE:
            os.chmod(path, DIR_MODE)
    except OSError as exc:
        log.debug("disk cache off: %s unusable (%s)", path, exc.strerror or exc)
        _state.unusable = True
        return None
    _state.directory = path
    return path


def _file_name(key: Key, part: str) -> str:
    """DEV-INO-SIZE-MTIME-BUILDID.PART, in hex: readable, unique by
    construction (the header repeats the key and is checked on load)."""
    dev, ino, size, mtime_ns, build_id = key
    return f"{dev:x}-{ino:x}-{size:x}-{mtime_ns:x}-{build_id or 'none'}.{part}"


def load(key: Key, part: str, what: str) -> Any:
    """The payload stored for KEY's PART, or None (absent, disabled, or an
    entry that is not exactly ours: ignored, to be rewritten).  WHAT names
    the file in the debug line."""
    return _load(_file_name(key, part), key, part, what)


def _load(name: str, key: Any, part: str, what: str) -> Any:
    if not enabled():
        return None
    directory = _directory()
    if directory is None:
        return None
    path = os.path.join(directory, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        _count("miss")
        log.debug("disk cache miss: %s %s", what, part)
        return None
    except OSError as exc:
        return _ignored(what, part, exc.strerror or str(exc))
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.geteuid():
                return _ignored(what, part, "owned by another user")
            data = f.read()
            if time.time() - st.st_mtime >= REFRESH_AFTER_S:
                _used_now(f.fileno())
    except OSError as exc:
        return _ignored(what, part, exc.strerror or str(exc))
    try:
        header, payload = marshal.loads(data)
    except (EOFError, ValueError, TypeError) as exc:
        return _ignored(what, part, f"unreadable ({type(exc).__name__})")
    if header != (FORMAT, _producer(), key, part):
        return _ignored(what, part, "written by another version or for another file")
    _count("hit")
    log.debug("disk cache hit: %s %s", what, part)
    return payload


def _used_now(fd: int) -> None:
    """Mark an entry used now (its mtime, which eviction goes by)."""
    try:
        os.utime(fd)
    except OSError:         # a read-only store: eviction by first write then
        pass


def _ignored(what: str, part: str, why: str) -> None:
    _count("ignored")
    log.debug("disk cache entry ignored: %s %s: %s", what, part, why)
    return None


def store(key: Key, part: str, payload: Any, what: str) -> None:
    """Write PAYLOAD (plain data) as KEY's PART.  Never raises: a store that
    cannot be written is off for the rest of the run."""
    _store(_file_name(key, part), key, part, payload, what)


def _store(name: str, key: Any, part: str, payload: Any, what: str) -> None:
    if not enabled():
        return
    directory = _directory()
    if directory is None:
        return
    try:
        data = marshal.dumps(((FORMAT, _producer(), key, part), payload))
    except ValueError as exc:          # not plain data: a bug, but never a failed command
        log.debug("disk cache: %s %s not stored (%s)", what, part, exc)
        return
    tmp = None
    try:
        # in the store's own directory, so the rename below is atomic
        fd, tmp = _create_temp(directory, name)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(directory, name))
        tmp = None
    except OSError as exc:
        log.debug("disk cache off: %s not writable (%s)", directory, exc.strerror or exc)
        _state.unusable = True
        return
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    _count("stored")
    log.debug("disk cache stored: %s %s (%d bytes)", what, part, len(data))
    if not _state.evicted:
        _state.evicted = True
        evict_if_due(directory)


# ---- values kept from a live process ---------------------------------------
# What a snapshot reads from a live process but need not read on every stop
# (jemalloc's general stats section, gperftools' knob properties, mimalloc's
# options: collectors.allocators.common.KeptValues) is kept here too, for
# the next CLI run within its lifetime.  Key: (boot id, pid, start time,
# object path), which no other process matches, in this boot or another.
# The payload holds the CLOCK_MONOTONIC time it was read: the boot id makes
# that comparable.
ProcessKey = tuple[str, int, int, str]
PROCESS_PREFIX = "proc-"
_boot_id: list[str | None] = []


def boot_id() -> str | None:
    """This boot's id (/proc/sys/kernel/random/boot_id), or None."""
    if not _boot_id:
        try:
            with open("/proc/sys/kernel/random/boot_id", "rb") as f:
                _boot_id.append(f.read().strip().decode("ascii") or None)
        except (OSError, UnicodeDecodeError):
            _boot_id.append(None)
    return _boot_id[0]


def _process_file_name(key: ProcessKey, part: str) -> str:
    boot, pid, start, path = key
    return (f"{PROCESS_PREFIX}{boot.replace('-', '')[:12]}-{pid:x}-{start:x}-"
            f"{zlib.crc32(path.encode(errors='surrogateescape')):08x}.{part}")


def load_process(key: ProcessKey, part: str, what: str) -> Any:
    """The payload kept for the live process KEY's PART, or None."""
    return _load(_process_file_name(key, part), key, part, what)


def store_process(key: ProcessKey, part: str, payload: Any, what: str) -> None:
    _store(_process_file_name(key, part), key, part, payload, what)


def forget_process(part: str) -> int:
    """Remove every process's PART entry (after allocdiag's own ``set``:
    the values kept are stale).  Returns how many were removed."""
    if not enabled():
        return 0
    directory = _directory()
    if directory is None:
        return 0
    removed = 0
    try:
        with os.scandir(directory) as it:
            for e in it:
                if e.name.startswith(PROCESS_PREFIX) and e.name.endswith("." + part):
                    try:
                        os.unlink(e.path)
                        removed += 1
                    except OSError:
                        pass
    except OSError:
        pass
    return removed


_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _create_temp(directory: str, name: str) -> tuple[int, str]:
    """(fd, path) of a new FILE_MODE file .tmp-PID-THREAD-NAME in DIRECTORY
    (not tempfile.mkstemp: importing tempfile costs 2 ms).  One left by a
    crashed run of the same pid and thread is removed first."""
    path = os.path.join(directory, f".tmp-{os.getpid()}-{threading.get_ident()}-{name}")
    try:
        return os.open(path, _TEMP_FLAGS, FILE_MODE), path
    except FileExistsError:
        os.unlink(path)
        return os.open(path, _TEMP_FLAGS, FILE_MODE), path


def evict_if_due(directory: str, now: float | None = None) -> int:
    """evict(DIRECTORY) when its last eviction (the mtime of EVICT_MARKER)
    is EVICT_EVERY_S old or more, or in the future; the marker is touched
    first, so that concurrent runs do not all scan.  Checking the bounds
    means a stat of every entry: 15-22 ms for 2,100 entries on the slow
    guest, in every run that stores anything (a jemalloc process's kept
    values are stored again after 10 s), where this is one stat.  Between
    two checks the directory may exceed its bounds by what was stored in
    the interval."""
    marker = os.path.join(directory, EVICT_MARKER)
    now = time.time() if now is None else now
    try:
        age = now - os.stat(marker).st_mtime
    except FileNotFoundError:
        age = None
    except OSError:
        return 0
    if age is not None and 0 <= age < EVICT_EVERY_S:
        return 0
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE))
        os.utime(marker, (now, now))
    except OSError:
        return 0
    return evict(directory)


def evict(directory: str, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES) -> int:
    """Remove the least recently used entries of DIRECTORY (by modification
    time, which a hit refreshes) while it holds more than MAX_BYTES or
    MAX_ENTRIES, down to EVICT_TO of the bound.  Returns how many were
    removed."""
    entries = []
    try:
        with os.scandir(directory) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and e.name != EVICT_MARKER:
                    entries.append((st.st_mtime_ns, st.st_size, e.path))
    except OSError:
        return 0
    total = sum(size for _m, size, _p in entries)
    if total <= max_bytes and len(entries) <= max_entries:
        return 0
    entries.sort()
    removed = 0
    for _mtime, size, path in entries:
        if total <= max_bytes * EVICT_TO and len(entries) - removed <= max_entries * EVICT_TO:
            break
        try:
            os.unlink(path)
        except OSError:
            continue
        total -= size
        removed += 1
    log.debug("disk cache: %d old entries removed from %s", removed, directory)
    return removed
