"""Where a borrowed thread's stack ends: the bounds every byte the remote
engine writes on it must respect (docs/target-writes.md).

"Readable" is never the test: a neighbouring thread's stack, its descriptor
and its TLS are readable too.  The bounds come from the mapping that holds
the thread's stack pointer:

- the main thread's stack is the mapping the kernel labels ``[stack]``.
  process_vm_writev below its current start does *not* grow it (measured on
  6.18: EFAULT, mapping unchanged; a write through /proc/PID/mem, a
  FOLL_FORCE access, did grow it by a page), so only the mapping as it is
  counts;
- a thread glibc created lives in an anonymous private read-write mapping
  (its stack block: stack, static TLS, ``struct pthread`` at the top, the
  thread pointer ``fs_base`` pointing at it) with its guard, a ``---p``
  mapping, directly below (glibc nptl/allocate_stack.c mprotects the guard
  to PROT_NONE, which splits it off).  Required here: the guard below, the
  thread's own fs_base inside the mapping above its stack pointer (proof the
  block is this thread's, not a heap or goroutine stack a thread happens to
  run on), and no other thread's stack pointer inside it (stacks without a
  guard merge into one mapping).

Anything else (a stack in ``[heap]``, in a file mapping, a user-supplied
stack without guard, a coroutine stack) is not a candidate: the engine never
writes where it cannot prove the bytes are the borrowed thread's own unused
stack.  Inside a proven mapping the lowest page and ``MARGIN`` above it are
never used either (a guard installed inside the mapping with
MADV_GUARD_INSTALL would not show in the maps).
"""

import bisect
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from collectors.engine import abi
from collectors.proc.maps import Mapping

PAGE_SIZE = abi.PAGE_SIZE
MARGIN = 4096                 # bytes kept free above the mapping's lowest page

class Bounds(NamedTuple):
    """A thread's stack mapping [start, end) and FLOOR, the lowest address
    anything may be written or used; KIND 'main' or 'thread'."""

    start: int
    end: int
    floor: int
    kind: str


class StackMaps:
    """The mappings of one process (collectors.proc.maps.parse_maps), for
    stack-bound lookups."""

    def __init__(self, maps: Sequence[Mapping]) -> None:
        self.maps = maps
        self._starts = [m.start for m in maps]

    def index(self, addr: int) -> int | None:
        i = bisect.bisect_right(self._starts, addr) - 1
        return i if i >= 0 and addr < self.maps[i].end else None

    def holders(self, sps: Iterable[tuple[int, int | None]]
                ) -> dict[int, list[tuple[int, int]]]:
        """{mapping index: [(tid, sp), ...]} of the threads whose stack
        pointer in SPS ((tid, sp) pairs) lies in a mapping, in SPS's order:
        a stack mapping's other threads for bounds() without a look at
        every thread of the process."""
        out: dict[int, list[tuple[int, int]]] = {}
        for tid, sp in sps:
            if sp is None:
                continue
            i = self.index(sp)
            if i is not None:
                out.setdefault(i, []).append((tid, sp))
        return out

    def bounds(self, sp: int, fs_base: int | None = None,
               others: Sequence[tuple[int, int | None]] = ()
               ) -> tuple[Bounds, None] | tuple[None, str]:
        """(Bounds, None) for the stack that holds SP, or (None, why not).
        FS_BASE: the thread's thread pointer (known once it is stopped);
        OTHERS: {tid: sp} of the process's other threads."""
        i = self.index(sp)
        if i is None:
            return None, f"its stack pointer {sp:#x} is in no mapping"
        m = self.maps[i]
        if not (m.perms.startswith("rw") and m.perms.endswith("p")):
            return None, f"its stack pointer is in a {m.perms} mapping"
        if m.path == "[stack]":
            return Bounds(m.start, m.end, m.start + PAGE_SIZE + MARGIN, "main"), None
        if m.path:
            return None, f"its stack pointer is in {m.path}, not a thread stack"
        where = f"{m.start:#x}-{m.end:#x}"
        below = self.maps[i - 1] if i > 0 else None
        if below is None or below.end != m.start or below.perms != "---p":
            return None, (f"no guard page below its stack mapping {where}: where its "
                          "stack ends is not provable")
        for tid, other in others:
            if other is not None and m.start <= other < m.end and other != sp:
                return None, f"its stack mapping {where} also holds thread {tid}'s stack"
        if fs_base is not None and not sp < fs_base < m.end:
            return None, (f"its thread descriptor ({fs_base:#x}) is not in the stack mapping "
                          f"{where} above its stack pointer: not the thread's own stack")
        return Bounds(m.start, m.end, m.start + PAGE_SIZE + MARGIN, "thread"), None


def room(bounds: Bounds, sp: int, red_zone: int) -> int:
    """Bytes between the red zone below SP and the floor of BOUNDS."""
    return sp - red_zone - bounds.floor
