"""Live allocator stats: the allocator's own functions, called inside the
target on one borrowed thread (collectors.engine.remote).  What is called and how
it is parsed lives in one module per allocator (collectors.allocators.*:
plan, gather, parse, normalise, and the table of native fields); this module
resolves addresses, borrows the thread, and runs them.  Self mode
(collectors.selfstats) runs the same gather code in-process.

Addresses come from the ELF collector: load bias from maps + ``st_value``
from .dynsym (or .symtab for static and prefixed builds).  Every call below
is a read: nothing here changes allocator behaviour (DESIGN.md rule 7).

What each allocator costs the target, per snapshot (one stop; figures in
bench/README.md):
- glibc: one heap walk: ``malloc_info`` into an unbuffered ``fmemopen``
  stream over scratch memory (``mallinfo2`` is derived from it exactly;
  called only where malloc_info is unavailable).  fmemopen mallocs its FILE.
- jemalloc: one ``malloc_stats_print(strcat, buf, OPTIONS)``: a process's
  first snapshot prints the general section as a table ("dablxeh", JSON
  "Jdablxeh" where the table's layout is not known), later ones within
  GENERAL_REFRESH_S the stats alone as JSON ("Jgdablxeh").
- gperftools: ``MallocExtension_GetStats`` and a property call for each
  knob it does not print and memory does not give (kept for a while).
- mimalloc: ``mi_stats_print_out(fputs, FILE*)`` through a buffered
  ``fmemopen`` stream (fmemopen, the print, fclose).  The committed bytes
  and the options are read before the stop (``_mi_stats_main`` once checked
  against one ``mi_process_info`` call; mimalloc's option table, else
  ``mi_option_get`` per option); ``mi_stats_get_json`` where the version
  has it.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections import namedtuple
from typing import Any

from collectors import allocators
from collectors.allocators import go
from collectors.allocators.registry import for_kind


from collectors.engine import remote, seccomp
from collectors.allocators import common
from diag.model.errors import Unsupported
from collectors.proc.stat import start_time
from collectors.engine.remote import RemoteProcess

LiveStats = namedtuple("LiveStats", "kind native stats pause_us thread")

# A stats call that has not returned by then is abandoned: the thread is
# restored and the process quarantined.  Generous on purpose: under arena
# contention glibc's mallinfo2 took up to 1.3 s in-process on a saturated
# 2-core box, and abandoning a call that holds an allocator lock would leave
# it held.  A timeout is for a call that is truly stuck.
CALL_TIMEOUT_S = 5.0
STT_GNU_IFUNC = 10            # elf.h


class Resolver:
    """Absolute addresses of functions in the loaded objects of an image."""

    def __init__(self, image):
        self.image = image

    def address(self, obj, name):
        if obj is None or obj.elf is None or obj.bias is None:
            return None
        sym = obj.elf.lookup(name, obj.opener.open)
        if sym is None or not sym.defined:
            return None
        return obj.bias + sym.st_value

    def libc(self, name):
        """NAME from the C library (glibc or musl) mapped in the process."""
        for obj in self.image.objects:
            if obj.elf is not None and obj.elf.defines(name) and (
                    obj.elf.soname or "").startswith(("libc.so", "libc.musl")):
                return obj.bias + obj.elf.dynamic(name).st_value
        # Static executables carry their libc inside.
        return self.address(self.image.exe, name)

    def libc_impl(self, name):
        """For an IFUNC NAME of the target's libc: the address of the
        implementation the resolver selects, computed in this process when
        the target maps the very same libc file (same device and inode) --
        the offset of the implementation within the file is then the same.
        Saves a call into the target.  The CPU is the same, so the variant
        chosen here runs there (a target's GLIBC_TUNABLES may make its own
        resolver choose a different, equally valid variant).  None when the
        files differ (a container with its own libc): resolve in the target."""
        target = self._libc_object(name)
        own = _own_ifunc(name)
        if target is None or own is None:
            return None
        (major, minor, inode), offset = own
        t_major, _, t_minor = target.dev.partition(":")
        if (int(t_major, 16), int(t_minor, 16), target.inode) != (major, minor, inode):
            return None
        return target.bias + offset

    def _libc_object(self, name):
        for obj in self.image.objects:
            if obj.elf is not None and obj.elf.defines(name) and obj.bias is not None and (
                    obj.elf.soname or "").startswith(("libc.so", "libc.musl")):
                return obj
        return None

    def libc_ifunc(self, name):
        """True when libc's NAME is an STT_GNU_IFUNC: its address is the
        resolver, which returns the implementation for this CPU (x86-64
        glibc's string functions are all IFUNCs)."""
        for obj in self.image.objects:
            if obj.elf is not None and obj.elf.defines(name) and (
                    obj.elf.soname or "").startswith(("libc.so", "libc.musl")):
                return obj.elf.dynamic(name).type == STT_GNU_IFUNC
        sym = self.image.exe.elf.lookup(name, self.image.exe.opener.open) \
            if self.image.exe is not None and self.image.exe.elf is not None else None
        return sym is not None and sym.type == STT_GNU_IFUNC

    def maps(self):
        return self.image.maps

    def process_key(self, obj):
        """(pid, start time, object): a key a recycled pid cannot match."""
        image = self.image
        return (image.pid, start_time(image.pid, image.procfs.root), obj.path)


class _LinkMap(ctypes.Structure):
    _fields_ = [("l_addr", ctypes.c_size_t), ("l_name", ctypes.c_char_p)]


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


_RTLD_DL_LINKMAP = 2          # dlfcn.h
_own_ifuncs: dict[object, object] = {}


def _own_ifunc(name):
    """((major, minor, inode) of this process's libc, offset of the
    implementation of NAME its IFUNC selected here from the load bias), or
    None."""
    if name in _own_ifuncs:
        return _own_ifuncs[name]
    out = None
    try:
        libc = ctypes.CDLL(None)
        impl = ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
        info, lm = _DlInfo(), ctypes.POINTER(_LinkMap)()
        dladdr1 = libc.dladdr1
        dladdr1.argtypes = (ctypes.c_void_p, ctypes.POINTER(_DlInfo), ctypes.c_void_p, ctypes.c_int)
        if impl and dladdr1(impl, ctypes.byref(info), ctypes.byref(lm), _RTLD_DL_LINKMAP) and lm:
            st = os.stat(os.fsdecode(info.dli_fname))
            out = ((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino), impl - lm.contents.l_addr)
    except (AttributeError, OSError, ValueError):
        out = None
    _own_ifuncs[name] = out
    return out


from collectors.allocators.code import forbidden_parts, forbidden_ranges  # noqa: E402
from collectors.engine.safepoints import GoRuntime  # noqa: E402,F401  (re-exported for callers)


def open_remote(image, detection, *, stack_need=None, procfs=None, **kw):
    """The RemoteProcess every live path uses: forbidden ranges from the
    detection, libc's mmap/munmap for Call.buffer, and STACK_NEED, the
    bytes of stack the calls use on the borrowed thread (None: the engine's
    default for calls whose need was not measured)."""
    ranges, undelimited = forbidden_parts(image, detection)
    return RemoteProcess(image.pid, forbidden_ranges=ranges, undelimited=undelimited,
                         procfs=(procfs or image.procfs.root),
                         stack_need=stack_need or remote.DEFAULT_STACK_NEED,
                         mapper=common.mapper(Resolver(image)),
                         go_runtime=GoRuntime.of(image.exe), **kw)


GO_HEAP = go.NO_STATS


def collect(image, detection, *, deadline_s=2.0, call_timeout_s=CALL_TIMEOUT_S, glibc_xml=True,
            per_arena=False, procfs=None, **options):
    """LiveStats for the allocator that serves malloc in IMAGE: one
    ``LiveReader`` used once (see there).

    Raises Unsupported for an allocator with no stats interface (Go runtime,
    musl, unknown), RemoteCallError / Quarantined / AccessDenied /
    NoSuchProcess from the engine.
    """
    return LiveReader(image, detection, deadline_s=deadline_s, call_timeout_s=call_timeout_s,
                      glibc_xml=glibc_xml, per_arena=per_arena, procfs=procfs,
                      **options).collect()


class LiveReader:
    """The live stats of one process, snapshot after snapshot.

    Three steps, so the target thread is stopped only for the middle one:
    ``plan`` resolves every address from the ELF collector (raises
    Unsupported when a symbol is missing), ``gather`` makes the calls and
    copies raw bytes and integers out, ``parse`` turns them into ``native``
    after the thread runs again (collectors.allocators).

    What depends only on the process's mappings is made once and kept
    (``record`` and the exporter take a snapshot every second or so, and
    redoing it was most of their CPU): the resolved addresses and the
    remote handle, whose engine keeps its stack judge (libc facts, unwind
    tables) while the maps stay the same.  ``renew(image, detection)``
    gives the reader the image of changed mappings: the addresses are
    resolved again, and the remote handle is kept when what it was built
    from (forbidden ranges, executable, libc's mmap/munmap) did not move.
    ``plans`` and ``remotes`` count what was made (tests).

    Raises Unsupported (no stats interface, a symbol missing) when made.
    """

    def __init__(self, image: Any, detection: Any, *, deadline_s: float = 2.0,
                 call_timeout_s: float = CALL_TIMEOUT_S, glibc_xml: bool = True,
                 per_arena: bool = False, procfs: str | None = None, **options: Any) -> None:
        kind = detection.allocator.kind
        self.kind = kind
        self.mod: Any = allocators.module(kind)     # the allocator's stats reader module
        if self.mod is None:
            raise Unsupported(for_kind(kind).vocabulary.no_stats or
                              f"no live stats for a {kind} allocator (no stats interface)",
                              pid=image.pid)
        self.opts = {"glibc_xml": glibc_xml, "per_arena": per_arena, **options}
        self.deadline_s = deadline_s
        self._remote_kw = {"call_timeout_s": call_timeout_s, "procfs": procfs,
                           "stack_need": getattr(self.mod, "STACK_NEED", None)}
        self.rp: RemoteProcess | None = None
        self._remote_of = None      # what self.rp was built from (_remote_identity)
        self.plans = self.remotes = 0
        self.renew(image, detection)

    def renew(self, image: Any, detection: Any) -> None:
        """Use IMAGE and DETECTION (of the same process and allocator kind)
        from now on: addresses resolved again, the remote handle kept when
        what it was built from is unchanged."""
        self.image, self.detection = image, detection
        self.addrs = self._plan()
        identity = _remote_identity(image, detection)
        if self.rp is None or identity != self._remote_of:
            self.rp = open_remote(image, detection, deadline_s=self.deadline_s,
                                  **self._remote_kw)
            self._remote_of = identity
            self.remotes += 1

    def _plan(self):
        self.plans += 1
        return self.mod.plan(Resolver(self.image), self.detection.serving,
                             self.detection.allocator, self.opts)

    def stack_pointers(self, maps: bytes) -> list[int] | None:
        """The threads' stack pointers the remote handle found, when MAPS
        is the /proc/PID/maps it read then (RemoteProcess.stack_pointers)."""
        return self.rp.stack_pointers(maps) if self.rp is not None else None

    def collect(self, deadline_s: float | None = None, maps: bytes | None = None
                ) -> LiveStats:
        """One read: LiveStats.  DEADLINE_S (default: the reader's) bounds
        the wait for a safe thread.  MAPS: the process's /proc/PID/maps the
        caller has just read (RemoteProcess.borrow).  Raises as ``collect``."""
        mod, rp, image = self.mod, self.rp, self.image
        assert rp is not None, "renew() made it"
        rp.deadline_s = float(self.deadline_s if deadline_s is None else deadline_s)
        t0 = time.perf_counter()
        pauses = []
        key = self.addrs.get("process_key") if isinstance(self.addrs, dict) else None
        prefetch = getattr(mod, "prefetch", None)
        for attempt in range(2):
            common.before_stop(mod, key)
            # what the module reads of the target before the stop, for this gather only
            addrs = {**self.addrs, **prefetch(image, self.addrs)} if prefetch else self.addrs
            with rp.borrow(maps=None if attempt else maps) as c:
                raw = mod.gather(c, addrs, self.opts)
                thread = {"tid": c.tid, "kind": c.kind, "syscall": c.syscall}
            pauses.extend(rp.pause_us)
            skipped = list(rp.skipped_syscalls)
            try:
                native = mod.parse(raw, self.detection.allocator)
                common.after_stop(mod)
                break
            except common.Retry as retry:
                # The fast way's output was unusable (see the module); the
                # fallback it names costs one more stop now, and is the
                # reader's way from now on.
                if attempt:
                    raise
                self.opts.update(retry.opts)
                self.addrs = self._plan()
        collect_s = time.perf_counter() - t0
        native["collect_s"] = round(collect_s, 6)
        if skipped:
            native.setdefault("side_effects", []).extend(skipped_effects(skipped))
        stats = mod.normalise(native)
        complete = getattr(mod, "complete", None)
        if complete is not None:
            # what the allocator's calls leave unknown, read from the kernel
            # (glibc: resident from smaps and pagemap)
            complete(image, native, stats)
        return LiveStats(self.kind, native, stats, pauses, thread)


def skipped_effects(skipped):
    """The side-effect lines of a gather's syscalls that the target's
    seccomp filter made the engine skip (RemoteProcess.skipped_syscalls):
    the figures were read with those syscalls failing (ENOSYS)."""
    return [f"{n} {name} syscall{'s' if n > 1 else ''} of the stats call skipped (ENOSYS), "
            f"not run: {why}" for name, why, n in seccomp.tally(skipped)]


def _remote_identity(image, detection):
    """What ``open_remote`` builds a RemoteProcess from, as a comparable
    value: the forbidden ranges, the executable (its Go runtime stubs) and
    libc's mmap/munmap."""
    exe = image.exe
    return (tuple(forbidden_ranges(image, detection)),
            None if exe is None else (exe.path, exe.bias, exe.dev, exe.inode),
            tuple(common.mapper(Resolver(image))))
