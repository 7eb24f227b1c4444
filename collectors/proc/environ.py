"""/proc/PID/environ: only the allocator-related variables, every other
variable dropped while parsing (DESIGN.md "Secrets")."""

from __future__ import annotations

import re

# Environment variables that configure allocators.  DESIGN.md "Secrets": only
# these are ever read out of a process's environment; everything else is
# dropped while parsing, before it reaches any other code.
ALLOCATOR_ENV_EXACT = frozenset((
    b"LD_PRELOAD", b"GLIBC_TUNABLES", b"PYTHONMALLOC", b"GODEBUG", b"MALLOC_CONF",
    b"MALLOC_ARENA_MAX", b"MALLOC_ARENA_TEST",
))
ALLOCATOR_ENV_PREFIXES = (b"TCMALLOC_", b"MIMALLOC_", b"HEAPPROFILE", b"HEAP_PROFILE_")


def is_allocator_var(name: str | bytes) -> bool:
    """True for the allocator-related variable names DESIGN.md allows.

    Covers ``MALLOC_CONF`` and its prefixed forms (``JE_MALLOC_CONF``,
    ``_RJEM_MALLOC_CONF``), glibc's ``MALLOC_*_`` (``MALLOC_TRIM_THRESHOLD_``),
    ``TCMALLOC_*``, ``MIMALLOC_*`` (mimalloc matches case-insensitively, so
    lower-case forms count too).
    """
    if isinstance(name, str):
        name = name.encode()
    if name in ALLOCATOR_ENV_EXACT or name.endswith(b"MALLOC_CONF"):
        return True
    if name.startswith(b"MALLOC_") and name.endswith(b"_"):
        return True
    return name.upper().startswith(ALLOCATOR_ENV_PREFIXES)


# Every name is_allocator_var accepts holds one of these once upper-cased:
# only the entries around a hit are looked at (a host scan parses hundreds of
# environments of a few dozen variables, mostly with none or one of them;
# searching the upper-cased block is ~4x cheaper than re.IGNORECASE).
_CANDIDATE = re.compile(rb"MALLOC|LD_PRELOAD|GLIBC_TUNABLES|GODEBUG|HEAPPROFILE|HEAP_PROFILE_")


def parse_allocator_environ(data: bytes) -> dict[str, str]:
    """The allocator-related NAME=VALUE entries of an environ block (NUL
    separated), as {str: str}; every other variable is dropped unread."""
    out: dict[str, str] = {}
    upper = data.upper()
    last_start = -1
    for hit in _CANDIDATE.finditer(upper):
        start = upper.rfind(b"\0", 0, hit.start()) + 1
        if start == last_start:         # a second hit in the same entry
            continue
        last_start = start
        end = upper.find(b"\0", hit.end())
        name, sep, value = data[start:end if end >= 0 else len(data)].partition(b"=")
        if sep and is_allocator_var(name):
            out[name.decode(errors="replace")] = value.decode(errors="replace")
    return out


# Why a process's initial environment cannot be read: no right to read
# /proc/PID/environ, or the program wrote over the block.
UNREADABLE = "cannot read /proc/PID/environ (permission denied)"
OVERWRITTEN = ("the process overwrote its initial environment (/proc/PID/environ holds no "
               "NAME=VALUE entry: redis, nginx and other servers reuse that memory for their "
               "process title)")


def overwritten(data: bytes) -> bool:
    """True when the environ block DATA holds bytes but no NAME=VALUE entry:
    the program reused its memory (setproctitle: the title written over argv
    and environ, the rest zeroed), so the environment it was started with is
    gone.  A process started with an empty environment has an empty block."""
    return bool(data) and b"=" not in data
