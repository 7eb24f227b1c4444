"""The allocators the code knows, one line each; ``for_kind`` returns one.

Order is the order ``collectors.detect`` tries their signatures in: the Go
runtime first (a Go binary may define anything), the allocators whose
marker symbols are unique, then the libcs, and last "unknown" (defines
malloc, matches nothing).
"""

from __future__ import annotations


from collectors import lazylog
from collectors.allocators import go, other
from collectors.allocators.glibc.home import ALLOCATOR as GLIBC
from collectors.allocators.google_tcmalloc.home import ALLOCATOR as GOOGLE_TCMALLOC
from collectors.allocators.gperftools.home import ALLOCATOR as GPERFTOOLS
from collectors.allocators.interface import Allocator
from collectors.allocators.jemalloc.home import ALLOCATOR as JEMALLOC
from collectors.allocators.mimalloc.home import ALLOCATOR as MIMALLOC

log = lazylog.getLogger("collectors.allocators")

ALL: tuple[Allocator, ...] = (
    go.ALLOCATOR,
    JEMALLOC,
    GOOGLE_TCMALLOC,
    GPERFTOOLS,
    MIMALLOC,
    other.MUSL,
    GLIBC,
    other.UNKNOWN,
)

# A stripped static executable names no allocator symbol: the version banners
# in its .rodata are tried, in this order.
STRIPPED_STATIC: tuple[Allocator, ...] = (JEMALLOC, GLIBC)

UNKNOWN: Allocator = other.UNKNOWN
# `allocdiag inspect --from FILE`: the stats readers whose ``looks_like``
# recognises a file, tried in this order.
FILE_FORMATS: tuple[Allocator, ...] = (GLIBC, JEMALLOC, GPERFTOOLS, MIMALLOC)

_BY_KIND = {a.kind: a for a in ALL}


def for_kind(kind: str | None) -> Allocator:
    """The allocator object for KIND ("unknown"'s for None or a kind nobody registered)."""
    a = _BY_KIND.get(kind or "unknown")
    if a is None:
        log.debug("no allocator registered for kind %r: unknown", kind)
        return other.UNKNOWN
    return a


def kinds() -> tuple[str, ...]:
    """Every registered kind, in detection order."""
    return tuple(_BY_KIND)
