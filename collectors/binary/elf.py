"""ELF facts about the objects a process maps, read with pyelftools.

Objects are opened through ``/proc/PID/map_files/START-END`` (the exact file
the kernel mapped, even if it was replaced or deleted since) or
``/proc/PID/root/PATH`` (the target's own filesystem: a process in a
container is read from its image, not from the host), falling back to the
plain path.  Parsed objects are cached by (device, inode, size, mtime), so
scanning a thousand processes that run the same binary parses it once.

pyelftools gives the structure (ELF header, program headers, section
headers, dynamic tags, notes).  The symbol and relocation tables themselves
are unpacked with ``struct`` in one pass: pyelftools builds one Python object
per entry, which for libc's ~3,000 dynamic symbols or libpython's tens of
thousands of relocations costs tens of milliseconds per object (measured);
a flat unpack costs about one.

Names follow the ELF spec (``DT_NEEDED``, ``PT_INTERP``, ``st_value``).
Missing facts are ``None``; an object that cannot be parsed raises
``MalformedData`` naming the object and what was wrong with it.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import struct
import threading
import time
from collections import namedtuple
from collections.abc import Callable
from typing import IO, Any

from elftools.common.exceptions import ELFError
from elftools.construct.core import ConstructError   # a struct pyelftools cannot unpack
from elftools.elf.elffile import ELFFile
from elftools.elf.enums import (ENUM_DT_FLAGS, ENUM_DT_FLAGS_1, ENUM_RELOC_TYPE_AARCH64,
                                ENUM_RELOC_TYPE_x64, ENUM_ST_INFO_BIND, ENUM_ST_INFO_TYPE,
                                ENUM_ST_SHNDX)

from diag.model.errors import MalformedData

# Symbol: name, st_value, st_size, st_info type (STT_*), binding (STB_*),
# defined (st_shndx != SHN_UNDEF).
Symbol = namedtuple("Symbol", "name st_value st_size type bind defined")

log = logging.getLogger("collectors.binary")

# ELF spec values under pyelftools' names (elftools.elf.enums)
STT_FUNC = ENUM_ST_INFO_TYPE["STT_FUNC"]                 # 2
STT_OBJECT = ENUM_ST_INFO_TYPE["STT_OBJECT"]             # 1
STT_GNU_IFUNC = ENUM_ST_INFO_TYPE["STT_LOOS"]            # 10: GNU's name for STT_LOOS
STB_LOCAL = ENUM_ST_INFO_BIND["STB_LOCAL"]               # 0
STB_GLOBAL = ENUM_ST_INFO_BIND["STB_GLOBAL"]             # 1
STB_WEAK = ENUM_ST_INFO_BIND["STB_WEAK"]                 # 2
SHN_UNDEF = ENUM_ST_SHNDX["SHN_UNDEF"]                   # 0
R_X86_64_GLOB_DAT = ENUM_RELOC_TYPE_x64["R_X86_64_GLOB_DAT"]              # 6
R_X86_64_JUMP_SLOT = ENUM_RELOC_TYPE_x64["R_X86_64_JUMP_SLOT"]            # 7
R_AARCH64_GLOB_DAT = ENUM_RELOC_TYPE_AARCH64["R_AARCH64_GLOB_DAT"]        # 1025
R_AARCH64_JUMP_SLOT = ENUM_RELOC_TYPE_AARCH64["R_AARCH64_JUMP_SLOT"]      # 1026
DF_BIND_NOW = ENUM_DT_FLAGS["DF_BIND_NOW"]               # 0x8
DF_1_NOW = ENUM_DT_FLAGS_1["DF_1_NOW"]                   # 0x1
# ELF64_ST_TYPE / ELF64_ST_BIND (include/uapi/linux/elf.h): st_info's low
# nibble is the type, the rest the binding
ST_TYPE_MASK, ST_BIND_SHIFT = 0xF, 4
# ELF64_R_TYPE / ELF64_R_SYM: r_info's low 32 bits, high 32 bits
R_TYPE_MASK, R_SYM_SHIFT = 0xFFFFFFFF, 32
PAGE = 4096                                              # x86-64 (and load_bias's default)
ELFCLASS64 = 64          # pyelftools' ElfFile.elfclass of an ELFCLASS64 file (32 for ELFCLASS32)
_GOT_RELOC_TYPES = {R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT,
                    R_AARCH64_GLOB_DAT, R_AARCH64_JUMP_SLOT}

_SYM64 = struct.Struct("<IBBHQQ")     # Elf64_Sym
_RELA64 = struct.Struct("<QQq")       # Elf64_Rela
_GO_BUILDINFO_MAGIC = b"\xff Go buildinf:"
# go/src/debug/buildinfo/buildinfo.go: a 32-byte header whose byte 15 holds
# flags; flagsVersionInl (Go 1.18+): the version string follows inline,
# uvarint length-prefixed (encoding/binary: 7 bits a byte, high bit "more")
GO_BUILDINFO_HEADER_SIZE = 32
GO_BUILDINFO_FLAGS_OFF = 15
GO_FLAGS_VERSION_INL = 0x2
GO_BUILDINFO_READ = 4096                # enough for the header and the version
UVARINT_BITS, UVARINT_MORE, UVARINT_SHIFT = 0x7F, 0x80, 7

# .rodata strings worth reading: allocator and libc version banners.
VERSION_PATTERNS = {
    "glibc": re.compile(rb"GNU C Library \([^)]*\) [a-z ]*release version (\d+\.\d+(?:\.\d+)?)"),
    "jemalloc": re.compile(rb"(\d+\.\d+\.\d+-\d+-g[0-9a-f]{7,40})\0"),
    "gperftools": re.compile(rb"gperftools (\d+\.\d+(?:\.\d+)?)\0"),
    "go": re.compile(rb"(go1\.\d+(?:\.\d+)?(?:rc\d+|beta\d+)?)"),
    "musl": re.compile(rb"musl libc \(x86_64\)|Version (\d+\.\d+\.\d+)\n"),
}


class ElfObject:
    """Immutable facts about one ELF file, plus lazy symbol lookups.

    Attributes (spec names where there is one): ``path``, ``elfclass``
    (32/64), ``e_machine``, ``e_type``, ``PT_INTERP`` (``interp``),
    ``DT_NEEDED`` (``needed``), ``DT_SONAME`` (``soname``), ``build_id``,
    ``loads`` (list of (p_vaddr, p_offset, p_memsz, p_flags)),
    ``sections`` ({name: (sh_addr, sh_offset, sh_size)}), ``is_go``,
    ``go_version``.
    """

    def __init__(self, path: str, f: IO[bytes]) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._symtab: dict[str, Symbol] | None = None
        self._rodata_hits: dict[str, str | None] = {}
        try:
            self._parse(f)
        except (ELFError, ConstructError, struct.error, ValueError, KeyError, IndexError,
                AssertionError, UnicodeDecodeError, TypeError, OverflowError) as exc:
            raise MalformedData(f"{path}: not a readable ELF object ({type(exc).__name__}: {exc})") from None
        except OSError as exc:
            if exc.errno != errno.EINVAL:       # EIO and the like: not the file's content
                raise
            # a header offset that makes seek() negative
            raise MalformedData(f"{path}: not a readable ELF object (an offset outside "
                                "the file)") from None

    # -- parsing --------------------------------------------------------------

    def _parse(self, f):
        elf = ELFFile(f)
        self.elfclass = elf.elfclass
        self.e_machine = elf["e_machine"]
        self.e_type = elf["e_type"]
        self.little_endian = elf.little_endian
        self.interp = None
        self.loads = []
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_INTERP":
                self.interp = seg.get_interp_name()
            elif seg["p_type"] == "PT_LOAD":
                self.loads.append((seg["p_vaddr"], seg["p_offset"], seg["p_memsz"], seg["p_flags"]))
        self.sections = {}
        for sec in elf.iter_sections():
            self.sections[sec.name] = (sec["sh_addr"], sec["sh_offset"], sec["sh_size"], sec["sh_type"])
        self.needed = []
        self.soname = None
        self.bind_now = False
        dyn = elf.get_section_by_name(".dynamic")
        if dyn is not None:
            for tag in dyn.iter_tags():
                if tag.entry.d_tag == "DT_NEEDED":
                    self.needed.append(tag.needed)
                elif tag.entry.d_tag == "DT_SONAME":
                    self.soname = tag.soname
                elif tag.entry.d_tag == "DT_BIND_NOW":
                    self.bind_now = True
                elif tag.entry.d_tag == "DT_FLAGS" and tag.entry.d_val & DF_BIND_NOW:
                    self.bind_now = True
                elif tag.entry.d_tag == "DT_FLAGS_1" and tag.entry.d_val & DF_1_NOW:
                    self.bind_now = True
        self.build_id = None
        for sec in elf.iter_sections():
            if sec["sh_type"] == "SHT_NOTE":
                for note in sec.iter_notes():
                    # SystemTap's .note.stapsdt reuses n_type 3 under the name
                    # "stapsdt": only the "GNU" owner's note is the build-id.
                    if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU" \
                            and self.build_id is None:
                        self.build_id = note["n_desc"]
        self.is_go = ".go.buildinfo" in self.sections or ".gopclntab" in self.sections
        self.go_version = self._go_version(f) if self.is_go else None
        # The dynamic symbol table is small and always needed: read it now.
        self.dynsym = self._read_symbols(f, ".dynsym", ".dynstr") \
            if self.elfclass == ELFCLASS64 else []
        self._dynsym_by_name = {}
        for s in self.dynsym:
            # A defined entry beats an undefined reference of the same name.
            if s.name and (s.defined or s.name not in self._dynsym_by_name):
                self._dynsym_by_name[s.name] = s
        self.got = self._read_got_relocs(f) if self.elfclass == ELFCLASS64 else {}

    def _section_bytes(self, f, name, limit=None):
        sec = self.sections.get(name)
        if sec is None or sec[3] == "SHT_NOBITS":
            return None
        _addr, off, size, _t = sec
        if limit is not None:
            size = min(size, limit)
        # a damaged sh_size must not become a read of that many bytes
        if off + size > f.seek(0, os.SEEK_END):
            raise ValueError(f"section {name} lies past the end of the file")
        f.seek(off)
        data = f.read(size)
        if len(data) != size:
            raise ValueError(f"section {name} is truncated ({len(data)} of {size} bytes)")
        return data

    def _read_symbols(self, f, symname, strname):
        data = self._section_bytes(f, symname)
        strs = self._section_bytes(f, strname)
        if not data or strs is None:
            return []
        out = []
        usable = len(data) // _SYM64.size * _SYM64.size
        for st_name, st_info, _other, st_shndx, st_value, st_size in _SYM64.iter_unpack(data[:usable]):
            end = strs.find(b"\0", st_name)
            name = strs[st_name:end if end >= 0 else None].decode("utf-8", "replace")
            out.append(Symbol(name, st_value, st_size, st_info & ST_TYPE_MASK,
                              st_info >> ST_BIND_SHIFT, st_shndx != SHN_UNDEF))
        return out

    def _read_got_relocs(self, f):
        """{symbol name: [GOT slot vaddr, ...]} for GLOB_DAT/JUMP_SLOT relocations.

        These slots are what the dynamic linker fills with the address a
        symbol resolved to; reading them from the live process tells which
        object really serves the call.
        """
        out = {}
        for name, (_a, _o, _s, sh_type) in self.sections.items():
            if sh_type != "SHT_RELA" or not name.startswith((".rela.plt", ".rela.dyn")):
                continue
            data = self._section_bytes(f, name)
            usable = len(data) // _RELA64.size * _RELA64.size
            for r_offset, r_info, _addend in _RELA64.iter_unpack(data[:usable]):
                if (r_info & R_TYPE_MASK) in _GOT_RELOC_TYPES:
                    idx = r_info >> R_SYM_SHIFT
                    if 0 < idx < len(self.dynsym):
                        out.setdefault(self.dynsym[idx].name, []).append(r_offset)
        return out

    def _go_version(self, f):
        """The Go release from .go.buildinfo (Go 1.18+ inline-string format)."""
        data = self._section_bytes(f, ".go.buildinfo", limit=GO_BUILDINFO_READ)
        if data and data.startswith(_GO_BUILDINFO_MAGIC) and \
                len(data) > GO_BUILDINFO_HEADER_SIZE + 1 and \
                data[GO_BUILDINFO_FLAGS_OFF] & GO_FLAGS_VERSION_INL:
            n, i, shift = 0, GO_BUILDINFO_HEADER_SIZE, 0
            while i < len(data):          # uvarint length prefix
                b = data[i]
                n |= (b & UVARINT_BITS) << shift
                i += 1
                shift += UVARINT_SHIFT
                if not b & UVARINT_MORE:
                    break
            return data[i:i + n].decode("ascii", "replace") or None
        return None

    # -- queries ---------------------------------------------------------------

    def dynamic(self, name: str) -> Symbol | None:
        """The .dynsym entry NAME (defined preferred), or None."""
        return self._dynsym_by_name.get(name)

    def defines(self, name: str) -> bool:
        """True when the object exports a definition of NAME (.dynsym)."""
        s = self._dynsym_by_name.get(name)
        return bool(s and s.defined and s.bind != STB_LOCAL)

    def lookup(self, name: str,
               f_opener: Callable[[], IO[bytes]] | None = None) -> Symbol | None:
        """NAME from .dynsym, else from .symtab (read lazily, needs the file
        again: ``f_opener`` returns an open binary file)."""
        s = self._dynsym_by_name.get(name)
        if s is not None and s.defined:
            return s
        return self.symtab(f_opener).get(name)

    def symtab(self, f_opener: Callable[[], IO[bytes]] | None = None) -> dict[str, Symbol]:
        """{name: Symbol} of defined .symtab entries (empty when stripped)."""
        with self._lock:
            if self._symtab is not None:
                return self._symtab
            if ".symtab" not in self.sections:
                self._symtab = {}
                return self._symtab
            if f_opener is None:
                return {}
            with f_opener() as f:
                syms = self._read_symbols(f, ".symtab", ".strtab")
            self._symtab = {s.name: s for s in syms if s.defined and s.name}
            return self._symtab

    def rodata_version(self, kind: str, f_opener: Callable[[], IO[bytes]]) -> str | None:
        """The version banner of KIND found in .rodata (VERSION_PATTERNS), or
        None.  Cached per kind."""
        with self._lock:
            if kind in self._rodata_hits:
                return self._rodata_hits[kind]
        hit = None
        with f_opener() as f:
            for sec in (".rodata", ".rodata.str1.1", ".rodata.str1.8", ".go.buildinfo"):
                data = self._section_bytes(f, sec)
                if not data:
                    continue
                m = VERSION_PATTERNS[kind].search(data)
                if m:
                    hit = (m.group(1) or m.group(0)).decode("ascii", "replace")
                    break
        with self._lock:
            self._rodata_hits[kind] = hit
        return hit

    def text_bytes(self, vaddr: int, n: int,
                   f_opener: Callable[[], IO[bytes]]) -> bytes | None:
        """N bytes of the file at virtual address VADDR (from a PT_LOAD)."""
        for p_vaddr, p_offset, p_memsz, _flags in self.loads:
            if p_vaddr <= vaddr < p_vaddr + p_memsz:
                with f_opener() as f:
                    f.seek(p_offset + vaddr - p_vaddr)
                    return f.read(n)
        return None

    def load_bias(self, map_start: int, map_offset: int, page: int = PAGE) -> int | None:
        """Load bias from one mapping of this file: the PT_LOAD whose
        page-aligned p_offset equals the mapping's offset was mapped at
        ``bias + (p_vaddr & ~(page-1))``.  None when no segment matches."""
        mask = ~(page - 1)
        for p_vaddr, p_offset, _memsz, _flags in self.loads:
            if p_offset & mask == map_offset:
                return map_start - (p_vaddr & mask)
        return None

    def in_plt(self, vaddr: int) -> bool:
        """True when VADDR (unrelocated) lies in this object's PLT: a lazy
        JUMP_SLOT that was never called still points back there."""
        for name in (".plt", ".plt.sec", ".plt.got"):
            sec = self.sections.get(name)
            if sec and sec[0] <= vaddr < sec[0] + sec[2]:
                return True
        return False


class ElfCache:
    """Parsed ElfObjects keyed by (st_dev, st_ino, st_size, st_mtime_ns).

    Validating the key costs a stat per object per process.  A host scan sees
    the same few files in hundreds of processes, so an identity the kernel
    listed in /proc/PID/maps (device, inode, path) that was validated less
    than ``trust_s`` ago is taken as is (measured: this halves `ps` time).
    """

    def __init__(self, trust_s: float = 2.0) -> None:
        self._objects: dict[tuple[int, int, int, int], ElfObject] = {}
        self._recent: dict[Any, tuple[float, tuple[int, int, int, int]]] = {}      # maps identity -> (monotonic time, key)
        self._lock = threading.Lock()
        self.trust_s = trust_s

    def get(self, opener: ObjectFile, identity: Any = None) -> ElfObject:
        """The ElfObject for the file OPENER opens (an ``ObjectFile``).
        IDENTITY: (dev, inode, path) from maps, for the short-term memo."""
        now = time.monotonic()
        if identity is not None:
            with self._lock:
                hit = self._recent.get(identity)
                if hit is not None and now - hit[0] < self.trust_s:
                    return self._objects[hit[1]]
        st = opener.stat()
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            obj = self._objects.get(key)
        if obj is None:
            with opener.open() as f:
                obj = ElfObject(opener.display_path, f)
            log.debug("ELF %s parsed from %s: build-id %s, %d dynamic symbols",
                      opener.display_path, opener.chosen_path, obj.build_id, len(obj.dynsym))
            with self._lock:
                obj = self._objects.setdefault(key, obj)
        if identity is not None:
            with self._lock:
                self._recent[identity] = (now, key)
        return obj

    def __len__(self) -> int:
        return len(self._objects)


CACHE = ElfCache()


class ObjectFile:
    """How to open one mapped object of a process, container-safe.

    Tries ``/proc/PID/map_files/START-END`` first (the very file the kernel
    mapped), then ``/proc/PID/root/PATH`` (the target's own mount
    namespace), then PATH as the host sees it.
    """

    def __init__(self, procfs_root: str, pid: int | None, start: int, end: int, path: str) -> None:
        self.display_path = path
        self._candidates = [
            os.path.join(procfs_root, str(pid), "map_files", f"{start:x}-{end:x}"),
            os.path.join(procfs_root, str(pid), "root", path.lstrip("/")),
            path,
        ]
        self._chosen: str | None = None

    @property
    def chosen_path(self) -> str | None:
        """The candidate path opened (None before the first open or stat)."""
        return self._chosen

    def _pick(self) -> str:
        if self._chosen is None:
            last: OSError | None = None
            for cand in self._candidates:
                try:
                    os.stat(cand)
                    self._chosen = cand
                    break
                except OSError as exc:
                    last = exc
            else:
                raise last or FileNotFoundError(self.display_path)
        return self._chosen

    def stat(self) -> os.stat_result:
        return os.stat(self._pick())

    def open(self) -> IO[bytes]:
        return open(self._pick(), "rb")
