"""Attribution: is an unwound stack "inside the allocator", in which of its
functions, entered where, from which call site (issue 20 item 3).

A frame is the allocator's when it lies in an allocator library
(libjemalloc, libtcmalloc*, libmimalloc: their whole text -- they have no
.symtab, reference/cpu-wall.md) or its function is an allocator entry point
or internal function by name (collectors.binary.symbolize's lists, plus the entry
points below and their je_/tc_/mi_/prefixed variants: static and prefixed
builds are recognised by name).  A stack is the allocator's when any frame
is; the OUTERMOST such frame names the entry point and the frame just
outside it is the call site.  Matching the leaf against public symbol ranges
alone is wrong for glibc (_int_malloc, _int_free, unlink_chunk lie between
the exported symbols: 20.9 % vs 36.1 % measured), so the walk decides.

A walk that stopped early (collectors.binary.unwind ``tolerant``) still counts as
application time when it reached the program's own code (an allocator does
not call back into it): a named function outside the system libraries whose
name is not reserved (no leading underscore: static executables carry their
libc), or any frame of an executable that loads libc as a shared object and
defines no malloc (named or stripped, it holds neither); otherwise the
sample is ``unknown`` -- never application time by default.

Names come from collectors.binary.symbolize (``.symtab``, the debug file by
build-id such as libc6-dbg's, else ``.dynsym``) and collectors.binary.demangle.  An
unnamed libc frame under an allocator entry is GLIBC_INTERNAL, an unnamed
frame of an allocator library "jemalloc (internal)" and the like.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

from collectors.proc.maps import Mapping, as_mappings, executable_files
from collectors.binary.symbolize import ALLOCATOR_OBJECT_RE, DEBUG_ROOT, GCC_CLONE_RE, Frame, \
    Symbolizer, is_allocator_frame
from diag.model.wall import GLIBC_INTERNAL

# Entry points (issue 20 item 3); prefixed builds add je_/tc_/mi_/_rjem_ ...
ENTRY_NAMES = frozenset((
    "malloc", "free", "calloc", "realloc", "reallocarray", "posix_memalign", "aligned_alloc",
    "memalign", "valloc", "pvalloc", "malloc_usable_size", "cfree", "mallocx", "rallocx",
    "xallocx", "sallocx", "dallocx", "sdallocx", "nallocx", "free_sized",
    "free_aligned_sized", "mi_free", "mi_usable_size", "mi_expand", "mi_recalloc",
    "mi_reallocf", "mi_strdup", "mi_strndup", "mi_posix_memalign", "mi_aligned_alloc",
    "mi_memalign", "mi_valloc", "mi_pvalloc", "mi_malloc_aligned", "mi_zalloc_aligned",
    "__libc_malloc", "__libc_free", "__libc_calloc", "__libc_realloc", "__libc_memalign",
    "__libc_valloc", "__libc_pvalloc",
))
PREFIXES = ("je_", "tc_", "mi_", "_rjem_", "__libc_")
OPERATORS = ("operator new", "operator delete")
LIBC_RE = re.compile(r"/libc(?:\.so\.6|-[0-9.]+\.so)$")
SYSTEM_RE = re.compile(r"/(?:libc|libm|libpthread|ld-linux[^/]*|libstdc\+\+|libgcc_s)[^/]*$")
SITE_FRAMES = 8                 # frames kept per call site, outward from it
UNKNOWN_SITE = "[call site not reached]"

# Classes of a sample
ALLOCATOR, APPLICATION, UNKNOWN = "allocator", "application", "unknown"


def base_name(fn: str | None) -> str | None:
    return GCC_CLONE_RE.sub("", fn.split("(", 1)[0]) if fn else fn


def is_entry(fn: str | None) -> bool:
    """True for an allocator entry point, prefixed or not."""
    b = base_name(fn)
    if not b:
        return False
    if b in ENTRY_NAMES or b.startswith(OPERATORS):
        return True
    for p in PREFIXES:
        if b.startswith(p) and b[len(p):] in ENTRY_NAMES:
            return True
    return False


def is_allocator(frame: Frame) -> bool:
    """FRAME (collectors.binary.symbolize.Frame) belongs to the allocator."""
    if is_allocator_frame(frame):
        return True
    return is_entry(frame.function)


LIBC_INTERNAL = "libc (internal)"

# Functions of a wait that is not lock contention: condition-variable,
# semaphore and timed sleeps (glibc nptl/futex-internal.c
# __futex_abstimed_wait_common serves pthread_cond_*wait and sem_*wait;
# mutexes wait in __lll_lock_wait* instead, nptl/lowlevellock.c).  An
# allocator's own thread parks in them (jemalloc's background thread in
# pthread_cond_timedwait, src/background_thread.c background_thread_sleep):
# idle, not queueing on a lock.
IDLE_WAIT_RE = re.compile(r"futex_abstimed_wait|pthread_cond_|sem_(timed|clock)?wait|"
                          r"nanosleep|usleep|epoll_wait|epoll_pwait|poll$|select$")


def is_lock_wait(attribution: Attribution) -> bool:
    """A blocked interval with ATTRIBUTION (its switch-out stack) is time
    queued on an allocator lock: allocator frames on the stack and no
    condition-wait or sleep frame among them.  The whole stack is looked at:
    without libc's debug file the leaf is an unnamed libc helper and the
    named frame is pthread_cond_timedwait above it."""
    return attribution.lock_wait


def internal_name(frame: Frame, glibc_malloc: bool) -> str | None:
    """The name of code no symbol names: an unnamed libc frame is
    GLIBC_INTERNAL when glibc's malloc is the entry (GLIBC_MALLOC), else
    "libc (internal)" (a lock or futex helper under another allocator); a
    frame of an allocator library without .symtab is "jemalloc (internal)"
    (tcmalloc, mimalloc: its static functions, and the slow paths its
    exported fast paths tail-call); None for a named frame or other code.
    The folded stacks keep the object+offset."""
    if frame.function is not None or not frame.object:
        return None
    if LIBC_RE.search(frame.object):
        return GLIBC_INTERNAL if glibc_malloc else LIBC_INTERNAL
    m = ALLOCATOR_OBJECT_RE.search(frame.object)
    if m:
        kind = "tcmalloc" if m.group(0).startswith(("libtcmalloc", "libprofiler")) \
            else m.group(0)[3:].split(".")[0]
        return f"{kind} (internal)"
    return None


def _program_code(frame: Frame, program_only: bool = False) -> bool:
    """FRAME is the program's own code: a named function outside the system
    libraries whose name is not reserved to the implementation (a leading
    underscore: a static executable carries libc -- musl's __lock, glibc's
    __libc_* -- inside it); or any frame of an object that holds nothing
    else (PROGRAM_ONLY, Symbolizer.program_only: a stripped executable whose
    libc and allocator are shared objects, as Debian's memcached: a third
    of its samples were unknown, their walk stopped above its 16 KiB
    sendmsg frame)."""
    if not frame.object:
        return False
    if program_only:
        return True
    return bool(frame.function and not frame.function.startswith("_")
                and not SYSTEM_RE.search(frame.object)
                and not ALLOCATOR_OBJECT_RE.search(frame.object))


class Attribution:
    """What one stack says; shared by equal stacks (cached by the caller)."""

    __slots__ = ("cls", "function", "entry", "site", "site_frames", "folded", "lock_wait")

    def __init__(self, cls: str, function: str | None, entry: str | None, site: str | None,
                 site_frames: tuple[str, ...], folded: tuple[str, ...]) -> None:
        self.cls, self.function, self.entry = cls, function, entry
        self.site, self.site_frames, self.folded = site, site_frames, folded
        # judged once per stack (equal stacks share this object), not per interval
        self.lock_wait = cls == ALLOCATOR and not any(IDLE_WAIT_RE.search(f) for f in folded)


class Attributor:
    """Names and classifies the unwound stacks of one process."""

    def __init__(self, pid: int, maps: str | bytes | Iterable[Mapping], procfs: str = "/proc",
                 debug_root: str = DEBUG_ROOT) -> None:
        """MAPS: /proc/PID/maps (text, bytes or parsed); only its executable
        file mappings are named."""
        self.symbolizer = Symbolizer(executable_files(as_mappings(maps)), pid=pid, procfs=procfs, debug_root=debug_root,
                                     root=os.path.join(procfs, str(pid), "root"))

    def frames(self, pcs: Sequence[int]) -> list[Frame]:
        """symbolize.Frame per pc (innermost first): the leaf at its pc, the
        others as return addresses (named at pc - 1)."""
        sym = self.symbolizer
        return [sym.frame(pc + 1 if i == 0 else pc) for i, pc in enumerate(pcs)]

    def classify(self, pcs: Sequence[int], complete: bool) -> Attribution:
        """Attribution of the stack PCS (innermost first; from a walk that
        reached the thread's first frame when COMPLETE)."""
        frames = self.frames(pcs)
        outer = None
        for i in range(len(frames) - 1, -1, -1):
            if is_allocator(frames[i]):
                outer = i
                break
        folded = tuple(f.text for f in reversed(frames))
        if not complete:
            folded = ("[incomplete]",) + folded
        if outer is not None:
            obj = frames[outer].object
            glibc = bool(obj and LIBC_RE.search(obj))
            fn = frames[0].function or internal_name(frames[0], glibc) or frames[0].text
            entry = (frames[outer].function or internal_name(frames[outer], glibc)
                     or frames[outer].text)
            site_frames = tuple(f.text for f in frames[outer + 1:outer + 1 + SITE_FRAMES])
            site = site_frames[0] if site_frames else UNKNOWN_SITE
            return Attribution(ALLOCATOR, fn, entry, site, site_frames, folded)
        only = self.symbolizer.program_only
        if complete or any(_program_code(f, only(f.object)) for f in frames):
            return Attribution(APPLICATION, None, None, None, (), folded)
        return Attribution(UNKNOWN, None, None, None, (), folded or ("[unknown]",))

    def name(self, pc: int) -> str:
        """The function (or object+offset) at PC, for a leaf."""
        return self.symbolizer.frame(pc + 1).text
