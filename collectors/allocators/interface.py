"""What the rest of the code asks of an allocator: one small Protocol.

Each allocator has one home (``collectors/allocators/<name>/``) and one
object there that answers these questions; ``collectors.allocators.registry``
maps a kind (the ``allocator.kind`` of the JSON) to that object.  Code
outside the homes never compares a kind against an allocator's name: it asks
the object (tests/test_allocator_homes.py keeps it so).

The stats reader is the module ``<name>/reader.py`` with ``KINDS``, ``FIELDS`` and
``plan/gather/parse/normalise/parse_file`` (see collectors.allocators).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Collection, Protocol

from diag.model.records import field, record

if TYPE_CHECKING:
    from diag.model import Knob


def has_symbol(lib: Any, name: str) -> bool:
    """LIB (a ctypes handle) defines NAME."""
    try:
        getattr(lib, name)
        return True
    except AttributeError:
        return False


class Signature:
    """What one loaded object is, allocator-wise (cached on the ElfObject by
    collectors.detect.classify)."""

    __slots__ = ("kind", "variant", "prefix", "evidence", "defines_malloc")

    def __init__(self, kind: str | None = None, variant: str | None = None,
                 prefix: str | None = None, evidence: Collection[str] = (),
                 defines_malloc: bool = False) -> None:
        self.kind, self.variant, self.prefix = kind, variant, prefix
        self.evidence = tuple(evidence)
        self.defines_malloc = defines_malloc


@record(frozen=True)
class Release:
    """The call that gives free memory back to the OS now (`allocdiag release`)."""
    text: str                           # what the user sees: "malloc_trim(0)"
    symbol: str                         # function looked up in the serving object (after the prefix)
    run: Callable[[Any, int], int | None]   # (borrowed call, function address) -> its
    #                                       return value, None for a void function


@record(frozen=True)
class LazyFreeAdvice:
    """What lazyfree-inflates-rss says when this allocator frees with MADV_FREE."""
    cause: str                          # "{current}"/"{source}" filled from the knob
    knob: str | None = None             # knob name in the allocator's knob table
    suggested: str | None = None
    how: str | None = None


@record(frozen=True)
class Vocabulary:
    """The words findings, compare and the renderers use for this allocator."""
    findings: tuple[str, ...] = ()      # ids of diag's allocator rules (diag.findings, diag.wall_findings)
    lazyfree: LazyFreeAdvice | None = None
    held_fallback: str | None = None    # stat standing in for `resident` when that is unknown
    held_fallback_label: str | None = None  # what that stat is, for the breakdown's label
    resident_caveat: str | None = None  # why its own `resident` figure can exceed the kernel's
    heap_profile_cost: str | None = None  # what its heap profiler costs (TUI heap tab)
    program_starts_profiler: bool = False  # the program may run the heap profiler itself (HEAPPROFILE)
    library_word: str | None = None     # the word naming it in a library's file name
    always_loaded: bool = False         # present in every process (the libc): not a second allocator
    no_stats: str | None = None         # why there are no live stats (no stats reader)
    whose_heap: str | None = None       # `explain` headline when it is not a malloc at all ({allocator})
    own_heap_note: str | None = None    # named among the others when an executable carries its own heap


class Knobs(Protocol):
    """Read and set the allocator's knobs."""

    runtime: tuple[str, ...]            # the names `allocdiag set` accepts
    conf_strings: bool                  # reads configuration strings out of the process (conf_sources)

    def conf_sources(self, image: Any, obj: Any, prefix: str | None) -> dict[str, Any]:
        """Configuration read from the process with no stop, merged into
        native["config"] (jemalloc: {"jemalloc": {source: conf}, "prefix": P})."""
        ...

    def read(self, native: dict[str, Any]) -> dict[str, Knob]:
        """Each knob's current value, where it came from, how to change it."""
        ...

    def refusal_hint(self, name: str) -> str | None:
        """Why NAME cannot be set at runtime when it looks like one of ours."""
        ...

    def set(self, session: Any, resolve: Callable[[str], int], prefix: str | None,
            name: str, value: str) -> tuple[str | None, str, str]:
        """Change NAME to VALUE in the target: (old, new, detail)."""
        ...

    def start_env(self, options: list[tuple[str, str]], env: dict[str, str]) -> None:
        """Add to ENV, in order, what compare-variant OPTIONS set at start:
        keys in capitals are environment variables and pass through, lower-case
        keys are this allocator's option names (common.start_options)."""
        ...


class Allocator(Protocol):
    """One allocator (or runtime heap) the code knows about."""

    kind: str                           # the JSON kind: "glibc", "tcmalloc-google"...
    name: str                           # for people: "gperftools tcmalloc"
    banner: str | None                  # collectors.binary.elf version banner read when stripped

    def signature(self, elf: Any, names: set[str], base: str, path: str,
                  where: str) -> Signature | None:
        """Its Signature if an object with these defined symbols is this allocator."""
        ...

    def version(self, obj: Any) -> str | None:
        """Its version, read from the loaded object without stopping the process."""
        ...

    def in_process(self, lib: Any, path: str) -> Signature | None:
        """Its Signature if LIB (the ctypes handle of the object defining this
        very process's malloc, at PATH) is this allocator (collectors.selfstats)."""
        ...

    def anchor(self, prefix: str | None, name: str) -> bool:
        """NAME, a global function of an executable this allocator is linked
        into (symbol PREFIX), certainly belongs to the allocator's code: the
        anchors that delimit its span (collectors.allocators.code)."""
        ...

    def self_version(self, lib: Any) -> str | None:
        """Its version, asked in-process through LIB."""
        ...

    def stats(self) -> ModuleType | None:
        """The stats reader module (KINDS, FIELDS, plan, gather, parse, normalise, parse_file)."""
        ...

    release: Release | None             # None: no release call
    knobs: Knobs | None                 # None: no knob allocdiag reads or sets

    def profiler(self) -> ModuleType | None:
        """Its heap profiler driver for collectors.heapcontrol (status, start,
        stop, dump, restart), or None: none allocdiag can drive."""
        ...

    # its live bytes read from its memory with no stop, into a snapshot's
    # stats and native document: (collector runner, image, stats, native), or None
    memory_walk: Callable[[Any, Any, dict[str, Any], dict[str, Any]], None] | None

    def counters(self, reader: Any) -> dict[str, tuple[Any, str, str, str]]:
        """Its own contention/traffic counters for a wall window, read through READER
        (collectors.sampler.counters.Reader: .pid, .image, .det, .native(),
        .resolver(), .session(stack_need), .pause_us):
        {name: (value, unit, "gauge"|"delta", source)}."""
        ...

    vocabulary: Vocabulary


@record
class Base:
    """Defaults for the members an allocator need not have."""
    kind: str
    name: str
    banner: str | None = None
    reader: str | None = None           # dotted module of the stats reader
    release: Release | None = None
    knobs: Knobs | None = None
    heap_profiler: str | None = None    # dotted module of the heap profiler driver
    memory_walk: Callable[[Any, Any, dict[str, Any], dict[str, Any]], None] | None = None
    vocabulary: Vocabulary = field(default_factory=Vocabulary)

    def signature(self, elf: Any, names: set[str], base: str, path: str,
                  where: str) -> Signature | None:
        return None

    def version(self, obj: Any) -> str | None:
        if self.banner is None or obj.elf is None:
            return None
        v: str | None = obj.elf.rodata_version(self.banner, obj.opener.open)
        return v

    def in_process(self, lib: Any, path: str) -> Signature | None:
        return None

    def anchor(self, prefix: str | None, name: str) -> bool:
        return False

    def self_version(self, lib: Any) -> str | None:
        return None

    def stats(self) -> ModuleType | None:
        import importlib
        return importlib.import_module(self.reader) if self.reader else None

    def profiler(self) -> ModuleType | None:
        import importlib
        return importlib.import_module(self.heap_profiler) if self.heap_profiler else None

    def counters(self, reader: Any) -> dict[str, tuple[Any, str, str, str]]:
        # no counters of its own; the read still says why when there are no
        # live stats at all (the Go runtime, musl, unknown: Unsupported)
        reader.native()
        return {}
