"""A process's loaded objects, read once without stopping it.

``ProcessImage`` gathers what detection and the preload verdict need: the
maps, the executable, the auxiliary vector, the allocator variables of the
initial environment, and each mapped ELF object with its load bias.
"""

from __future__ import annotations

import os
from collections import namedtuple

from collectors import lazylog
from collectors.binary import loaderrun
from collectors.binary.elf import CACHE, ElfCache, ObjectFile
from collectors.proc.auxv import AT_SECURE
from collectors.lazyre import lazy
from collectors.proc.environ import UNREADABLE
from collectors.proc.maps import DELETED_TEXT, Mapping
from collectors.proc.procfs import ProcFS
from diag.model.errors import AccessDenied, MalformedData, NoSuchProcess

log = lazylog.getLogger("collectors.binary")

# include/uapi/linux/auxvec.h
AT_PHDR = 3          # the program headers of the executable, as mapped
AT_ENTRY = 9         # the executable's entry point

# The loader's dynamic string tokens, $NAME or ${NAME} (glibc elf/dl-load.c
# is_dst: a bare name ends where no identifier character follows), as they
# may appear in LD_PRELOAD ("/usr/$LIB/libjemalloc.so.2").
DST = lazy(r"\$(?:\{(ORIGIN|PLATFORM|LIB)\}|(ORIGIN|PLATFORM|LIB)(?![A-Za-z0-9_]))")
# What $LIB is in the C libraries this runs on (compiled into ld.so): Debian
# and Ubuntu multiarch, lib64 (Fedora, RHEL, SUSE), lib; $PLATFORM: the
# kernel's AT_PLATFORM string on x86-64.  A requested file is matched to a
# mapped one by device and inode, so a wrong guess matches nothing.
DST_VALUES = {"LIB": ("lib/x86_64-linux-gnu", "lib64", "lib"), "PLATFORM": ("x86_64",)}

# One mapped ELF object.  ``elf`` is None when it could not be read; then
# ``error`` says why.  ``ranges`` are the [start, end) of its mappings.
LoadedObject = namedtuple("LoadedObject",
                          "path start end bias elf error opener ranges deleted dev inode")


class ProcessImage:
    def __init__(self, pid: int, procfs: ProcFS | None = None, cache: ElfCache = CACHE,
                 status: dict[bytes, bytes] | None = None) -> None:
        self.pid = pid
        self.procfs = procfs or ProcFS()
        self.status = status if status is not None else self.procfs.status(pid)
        self.comm = self.status.get(b"Name", b"").decode(errors="replace") or None
        self.maps = self.procfs.maps(pid)
        self.exe_path = self.procfs.exe(pid)
        if self.exe_path:
            self.exe_path = self.exe_path.removesuffix(DELETED_TEXT)
        self.environ: dict[str, str] | None
        # why environ is None: not readable, or overwritten by the program
        self.environ_why: str | None = None
        try:
            self.environ, self.environ_why = self.procfs.environ_or_why(pid)
        except AccessDenied:
            self.environ, self.environ_why = None, UNREADABLE
        try:
            self.auxv = self.procfs.auxv(pid)
        except AccessDenied:
            self.auxv = {}
        self._by_name: dict[str, list[LoadedObject]] | None = None
        self._requested_ids: dict[str, tuple[int, int, int] | None] = {}
        self.objects = self._load_objects(cache)
        self.exe = self._find_exe()
        # `ld.so [OPTIONS] PROGRAM`: the kernel ran the loader (self.loader),
        # which mapped the program (self.exe from then on)
        self.loader: LoadedObject | None = None
        self.loader_options: dict[str, list[str]] = {}
        program = loaderrun.program_run_by(self, self.exe)
        if program is not None:
            self.loader, self.exe = self.exe, program
            try:
                self.loader_options = loaderrun.loader_options(self.procfs.cmdline(pid))
            except (AccessDenied, OSError):
                pass            # no --preload seen; detection still infers one

    @property
    def secure(self) -> bool | None:
        """AT_SECURE from the auxiliary vector (setuid/setgid/capabilities
        exec): the loader then ignores LD_PRELOAD paths with a slash.  None
        when auxv is unreadable."""
        if not self.auxv:
            return None
        return bool(self.auxv.get(AT_SECURE, 0))

    def _load_objects(self, cache):
        groups = {}
        order = []
        for m in self.maps:
            if not m.path or m.path.startswith("[") or m.inode == 0:
                continue
            key = (m.dev, m.inode, m.path)
            if key not in groups:
                groups[key] = []
                order.append(key)
            groups[key].append(m)
        out = []
        for key in order:
            ms = groups[key]
            # Only objects with executable code are ELF objects we care
            # about (skips locale-archive, fonts, data files).
            if not any("x" in m.perms for m in ms):
                continue
            first = min(ms, key=lambda m: m.start)
            opener = ObjectFile(self.procfs.root, self.pid, first.start, first.end, first.path)
            elf, error, bias = None, None, None
            try:
                elf = cache.get(opener, identity=key)
            except MalformedData as exc:
                error = str(exc)
            except FileNotFoundError:
                error = f"{first.path}: file not found (deleted, or outside our view)"
            except PermissionError:
                error = f"{first.path}: permission denied"
            except OSError as exc:
                error = f"{first.path}: {exc.strerror or exc}"
            if error is not None:
                log.debug("pid %d: %s not read: %s", self.pid, first.path, error)
            if elf is not None:
                for m in sorted(ms, key=lambda m: m.start):
                    bias = elf.load_bias(m.start, m.offset)
                    if bias is not None:
                        break
            out.append(LoadedObject(first.path, min(m.start for m in ms), max(m.end for m in ms),
                                    bias, elf, error, opener,
                                    tuple((m.start, m.end) for m in ms), first.deleted,
                                    first.dev, first.inode))
        if not out and not os.path.exists(self.procfs.path(self.pid)):
            raise NoSuchProcess(self.pid)
        return out

    def _find_exe(self):
        phdr = self.auxv.get(AT_PHDR) if self.auxv else None
        if phdr:
            obj = self.object_at(phdr)
            if obj is not None:
                return obj
        for obj in self.objects:
            if obj.path == self.exe_path:
                return obj
        return None

    def object_at(self, addr: int) -> LoadedObject | None:
        """The loaded object with a mapping that contains ADDR, or None."""
        for obj in self.objects:
            for start, end in obj.ranges:
                if start <= addr < end:
                    return obj
        return None

    def mapping_at(self, addr: int) -> Mapping | None:
        for m in self.maps:
            if m.start <= addr < m.end:
                return m
        return None

    def by_name(self, name: str) -> list[LoadedObject]:
        """Loaded objects whose DT_SONAME or file name is NAME."""
        if self._by_name is None:
            index: dict[str, list[LoadedObject]] = {}
            for obj in self.objects:
                if obj.elf is None:
                    continue
                for n in {obj.elf.soname, os.path.basename(obj.path)}:
                    if n:
                        index.setdefault(n, []).append(obj)
            self._by_name = index
        return self._by_name.get(name, [])

    def expand_dst(self, path: str) -> list[str]:
        """PATH with the loader's dynamic string tokens ($ORIGIN: the
        executable's directory; $LIB, $PLATFORM: DST_VALUES) replaced, each
        way they may read; [PATH] when it has none."""
        if "$" not in path:
            return [path]
        values = dict(DST_VALUES)
        values["ORIGIN"] = (os.path.dirname(self.exe.path),) if self.exe is not None else ()
        out, pos = [""], 0
        for m in DST.finditer(path):
            out = [o + path[pos:m.start()] + v for o in out for v in values[m.group(1) or m.group(2)]]
            pos = m.end()
        return [o + path[pos:] for o in out]

    def same_file(self, obj: LoadedObject, requested: str) -> bool:
        """True when the loaded object OBJ is the file REQUESTED names (a
        path in the target's root, or a bare library name; with the loader's
        $LIB-style tokens expanded), compared by the device and inode the
        kernel lists in maps."""
        if obj.path == requested:
            return True
        if "$" in requested and DST.search(requested):
            return any(self.same_file(obj, p) for p in self.expand_dst(requested))
        if "/" not in requested:
            return os.path.basename(obj.path) == requested or \
                (obj.elf is not None and obj.elf.soname == requested)
        ident = self._requested_ids.get(requested, False)
        if ident is False:
            try:
                st = os.stat(self.in_root(requested))
                ident = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
            except OSError:
                ident = None
            self._requested_ids[requested] = ident
        if ident is None:
            return False
        major, _, minor = obj.dev.partition(":")
        return (int(major, 16), int(minor, 16), obj.inode) == ident

    def in_root(self, path: str) -> str:
        """PATH as seen from the target's root directory (containers)."""
        return os.path.join(self.procfs.path(self.pid, "root"), path.lstrip("/"))
