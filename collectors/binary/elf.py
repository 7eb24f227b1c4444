"""ELF facts about the objects a process maps, read with pyelftools.

Objects are opened through ``/proc/PID/map_files/START-END`` (the exact file
the kernel mapped, even if it was replaced or deleted since) or
``/proc/PID/root/PATH`` (the target's own filesystem: a process in a
container is read from its image, not from the host), falling back to the
plain path.  Parsed objects are cached by (device, inode, size, mtime), so
scanning a thousand processes that run the same binary parses it once, and
their facts are kept on disk between runs (``collectors.binary.diskcache``,
keyed by the identity of the descriptor read and its build-id): a second
command reads them back without pyelftools, which is imported only to parse.

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
import marshal
import os
import struct
import threading
import time
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any

from collectors import lazylog
from collectors.binary import diskcache
from collectors.lazyre import lazy
from diag.model.errors import MalformedData

# Symbol: name, st_value, st_size, st_info type (STT_*), binding (STB_*),
# defined (st_shndx != SHN_UNDEF).
Symbol = namedtuple("Symbol", "name st_value st_size type bind defined")

log = lazylog.getLogger("collectors.binary")

# ELF spec values (elf.h; pyelftools' elftools.elf.enums has the same numbers
# under the same names, but importing pyelftools costs ~10 ms a run that the
# disk cache (collectors.binary.diskcache) lets a second run skip entirely)
STT_OBJECT, STT_FUNC = 1, 2
STT_GNU_IFUNC = 10                                       # GNU's name for STT_LOOS
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
SHN_UNDEF = 0
R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT = 6, 7
R_AARCH64_GLOB_DAT, R_AARCH64_JUMP_SLOT = 1025, 1026
DF_BIND_NOW = 0x8                                        # DT_FLAGS
DF_1_NOW = 0x1                                           # DT_FLAGS_1
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

# .rodata strings worth reading: allocator and libc version banners (compiled
# when a file is parsed: a warm run reads the banners from the disk cache).
VERSION_PATTERNS = {
    "glibc": lazy(rb"GNU C Library \([^)]*\) [a-z ]*release version (\d+\.\d+(?:\.\d+)?)"),
    # JEMALLOC_VERSION: `git describe --long --abbrev=40` (jemalloc's
    # configure.ac), a string of its own: a 40-digit hash, NULs around it.
    # (A shorter git-describe string is someone else's: Chromium's .rodata
    # holds libvpx's "WebM Project VP9 Encoder v1.17.0-63-gde61454cf".)
    "jemalloc": lazy(rb"(?:\A|\0)(\d+\.\d+\.\d+-\d+-g[0-9a-f]{40})\0"),
    "gperftools": lazy(rb"gperftools (\d+\.\d+(?:\.\d+)?)\0"),
    "go": lazy(rb"(go1\.\d+(?:\.\d+)?(?:rc\d+|beta\d+)?)"),
    "musl": lazy(rb"musl libc \(x86_64\)|Version (\d+\.\d+\.\d+)\n"),
}


# A Symbol without its name, packed (st_value, st_size, type, bind, defined):
# the disk cache keeps a symbol table as its names and one bytes object, so
# reading it back makes no tuple per symbol (libstdc++: 6,000; python3's
# .symtab: 20,000) for the garbage collector to count and scan.
_SYMBOL_PACK = struct.Struct("<QQBBB")


def pack_symbols(symbols: list[Symbol]) -> tuple[list[str], bytes]:
    """(names, packed rest) of SYMBOLS, for the disk cache."""
    return ([s.name for s in symbols],
            b"".join(_SYMBOL_PACK.pack(s.st_value, s.st_size, s.type, s.bind, s.defined)
                     for s in symbols))


def _unpacked(name: str, packed: bytes, i: int) -> Symbol:
    st_value, st_size, st_type, bind, defined = _SYMBOL_PACK.unpack_from(packed, i * _SYMBOL_PACK.size)
    return Symbol(name, st_value, st_size, st_type, bind, bool(defined))


def unpack_symbols(names: list[str], packed: bytes) -> list[Symbol]:
    """The Symbols ``pack_symbols`` gave NAMES and PACKED for."""
    if len(packed) != len(names) * _SYMBOL_PACK.size:
        raise ValueError("symbol names and packed rows differ in number")
    return [Symbol(n, v, sz, t, b, bool(d))
            for n, (v, sz, t, b, d) in zip(names, _SYMBOL_PACK.iter_unpack(packed))]


def _defined_flags(packed: bytes) -> bytes:
    """The ``defined`` byte of each packed row (the last of _SYMBOL_PACK)."""
    return packed[_SYMBOL_PACK.size - 1::_SYMBOL_PACK.size]


def _index_by_name(names: list[str], defined: Iterable[Any]) -> dict[str, int]:
    """{name: index} of a symbol table's NAMES (DEFINED: one truth value
    each).  A name seen twice (versioned definitions, a definition and a
    reference): the last definition wins, else the first reference.  The
    null symbol's empty name is left out."""
    index = dict(zip(names, range(len(names))))
    if len(index) != len(names):
        index = {}
        for i, (name, is_defined) in enumerate(zip(names, defined)):
            if is_defined or name not in index:
                index[name] = i
    index.pop("", None)
    return index


class StoredSymbols(Mapping[str, Symbol]):
    """{name: Symbol} over a disk cache entry's names and packed rows: a
    Symbol is made when its name is looked up (a lookup wants a handful)."""

    def __init__(self, names: list[str], packed: bytes) -> None:
        if len(packed) != len(names) * _SYMBOL_PACK.size:
            raise ValueError("symbol names and packed rows differ in number")
        self._names, self._packed = names, packed
        self._index = _index_by_name(names, _defined_flags(packed))

    def __getitem__(self, name: str) -> Symbol:
        return _unpacked(name, self._packed, self._index[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, name: object) -> bool:
        return name in self._index


# The attributes one parse computes, in the order the disk cache's ``elf``
# part holds them (collectors.binary.diskcache)
FACTS = ("elfclass", "e_machine", "e_type", "little_endian", "interp", "loads", "sections",
         "needed", "soname", "bind_now", "build_id", "is_go", "go_version", "dynsym", "got")


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
        self._init_state(path)
        # pyelftools is imported here, not at the top: a run whose objects
        # all come from the disk cache never needs it
        from elftools.common.exceptions import ELFError
        from elftools.construct.core import ConstructError   # a struct pyelftools cannot unpack
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

    def _init_state(self, path: str) -> None:
        self.path = path
        # the file's identity (diskcache.Key) when its facts are kept on disk:
        # the lazy parts (.symtab, version banners) are stored under it too
        self.key: diskcache.Key | None = None
        self.stat_key: tuple[int, int, int, int] | None = None   # set by load()
        self._lock = threading.Lock()
        self._symtab: Mapping[str, Symbol] | None = None
        self._rodata_hits: dict[str, str | None] | None = None
        self._dynsym: list[Symbol] | None = None
        # from the disk cache: .dynsym and the exports as one marshal blob,
        # unmarshalled when first asked for (see facts())
        self._symbols_blob: bytes | None = None
        self._symbols_unpacked: tuple[list[str], bytes, list[str]] | None = None
        self._dynsym_by_name: Mapping[str, Symbol] | None = None
        self._exports: frozenset[str] | None = None
        self._defined: dict[str, bool] = {}      # defines()' answers from the blob
        # {symbol name: [GOT slot vaddr, ...]}; from the disk cache as a
        # marshal blob, unmarshalled when first asked for
        self._got: dict[str, list[int]] | None = None
        self._got_blob: bytes | None = None

    @property
    def got(self) -> dict[str, list[int]]:
        """{symbol name: [GOT slot vaddr, ...]} of the GLOB_DAT/JUMP_SLOT
        relocations (``_read_got_relocs``)."""
        if self._got is None:
            got = self._unmarshal(self._got_blob, "GOT relocations")
            if not isinstance(got, dict):
                raise MalformedData(f"{self.path}: disk cache entry with unreadable GOT "
                                    f"relocations (not a dict)")
            self._got = got
        return self._got

    @property
    def dynsym(self) -> list[Symbol]:
        """The .dynsym entries, in table order."""
        if self._dynsym is None:
            names, packed, _exports = self._stored_symbols()
            self._dynsym = unpack_symbols(names, packed)
        return self._dynsym

    @property
    def exports(self) -> frozenset[str]:
        """Names of the defined .dynsym entries that are not STB_LOCAL (what
        the object offers the dynamic linker; detection's signatures)."""
        if self._exports is None:
            if self._symbols_blob is not None:
                self._exports = frozenset(self._stored_symbols()[2])
            else:
                self._exports = frozenset(s.name for s in self.dynsym
                                          if s.defined and s.bind != STB_LOCAL)
        return self._exports

    def _stored_symbols(self) -> tuple[list[str], bytes, list[str]]:
        """(names, packed rows, exports) from the disk cache's blob."""
        if self._symbols_unpacked is not None:
            return self._symbols_unpacked
        log.debug("ELF %s symbols unpacked from the disk cache", self.path)
        stored = self._unmarshal(self._symbols_blob, "symbol table")
        try:
            names, packed, exports = stored
            if len(packed) != len(names) * _SYMBOL_PACK.size:
                raise ValueError("symbol names and packed rows differ in number")
        except (ValueError, TypeError) as exc:
            raise MalformedData(f"{self.path}: disk cache entry with unreadable symbol "
                                f"table ({type(exc).__name__})") from None
        self._symbols_unpacked = (names, packed, exports)
        return self._symbols_unpacked

    def _unmarshal(self, blob: bytes | None, what: str) -> Any:
        """A blob of the disk cache's ``elf`` part (facts()), unmarshalled."""
        try:
            return marshal.loads(blob or b"")
        except (EOFError, ValueError, TypeError) as exc:
            raise MalformedData(f"{self.path}: disk cache entry with unreadable {what} "
                                f"({type(exc).__name__})") from None

    def _by_name(self) -> Mapping[str, Symbol]:
        if self._dynsym_by_name is None and self._dynsym is None \
                and self._symbols_blob is not None:
            # a few lookups in a table still packed: a Symbol for each name
            # asked, not 3,000 for libc's (detection, livestats' libc calls)
            names, packed, _exports = self._stored_symbols()
            self._dynsym_by_name = StoredSymbols(names, packed)
        if self._dynsym_by_name is None:
            syms = self.dynsym
            self._dynsym_by_name = {name: syms[i] for name, i in _index_by_name(
                [s.name for s in syms], [s.defined for s in syms]).items()}
        return self._dynsym_by_name

    # -- plain data, for the disk cache ----------------------------------------

    def facts(self) -> tuple[Any, ...]:
        """What one parse learnt, as plain data: the disk cache's ``elf``
        part.  FACTS in order, .dynsym as one marshal blob of (``pack_symbols``
        names, packed rows, sorted exports) and the GOT relocations as
        another: reading an entry back copies those bytes, and only the
        objects whose symbols or GOT a run looks into unmarshal them (they
        are most of an entry: libstdc++'s 480 KB took 3 ms to unmarshal on
        the slow guest, libcrypto's 3,170 GOT names 2 ms; detection reads each
        object's signature from its own part, collectors.detect)."""
        out = []
        for name in FACTS:
            if name == "dynsym":
                out.append(self._symbols_facts())
            elif name == "got":
                out.append(self._got_blob if self._got_blob is not None
                           else marshal.dumps(self.got))
            else:
                out.append(getattr(self, name))
        return tuple(out)

    def _symbols_facts(self) -> bytes:
        if self._symbols_blob is not None:
            return self._symbols_blob
        names, packed = pack_symbols(self.dynsym)
        return marshal.dumps((names, packed, sorted(self.exports)))

    @classmethod
    def from_facts(cls, path: str, facts: tuple[Any, ...]) -> ElfObject:
        """The object ``facts()`` described, without reading the file.
        Raises ValueError when FACTS does not have that shape."""
        if not isinstance(facts, tuple) or len(facts) != len(FACTS):
            raise ValueError("not the facts of an ElfObject")
        obj = cls.__new__(cls)
        obj._init_state(path)
        for name, value in zip(FACTS, facts):
            if name == "dynsym":
                obj._symbols_blob = value
            elif name == "got":
                obj._got_blob = value
            else:
                setattr(obj, name, value)
        if not isinstance(obj._got_blob, bytes) or not isinstance(obj._symbols_blob, bytes):
            raise ValueError("not the facts of an ElfObject")
        return obj

    # -- parsing --------------------------------------------------------------

    def _parse(self, f):
        from elftools.elf.elffile import ELFFile
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
        self._dynsym = self._read_symbols(f, ".dynsym", ".dynstr") \
            if self.elfclass == ELFCLASS64 else []
        self._got = self._read_got_relocs(f) if self.elfclass == ELFCLASS64 else {}

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
        dynsym = self.dynsym          # a property: once, not per relocation
        for name, (_a, _o, _s, sh_type) in self.sections.items():
            if sh_type != "SHT_RELA" or not name.startswith((".rela.plt", ".rela.dyn")):
                continue
            data = self._section_bytes(f, name)
            usable = len(data) // _RELA64.size * _RELA64.size
            for r_offset, r_info, _addend in _RELA64.iter_unpack(data[:usable]):
                if (r_info & R_TYPE_MASK) in _GOT_RELOC_TYPES:
                    idx = r_info >> R_SYM_SHIFT
                    if 0 < idx < len(dynsym):
                        out.setdefault(dynsym[idx].name, []).append(r_offset)
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
        return self._by_name().get(name)

    def defines(self, name: str) -> bool:
        """True when the object exports a definition of NAME (.dynsym).
        Asked of every object (which one holds ``_PyRuntime``, ``mi_malloc``):
        where the symbols are still the disk cache's blob, a name absent from
        its bytes is not there, and the blob stays packed (marshal writes a
        string's UTF-8 bytes whole at its first occurrence)."""
        if self._exports is not None:
            return name in self._exports
        answer = self._defined.get(name)
        if answer is None:
            if self._dynsym is None and self._symbols_blob is not None \
                    and name.encode("utf-8", "surrogateescape") not in self._symbols_blob:
                answer = False
            else:
                answer = name in self.exports
            # a host scan asks each object the same names for every process
            # that maps it: one search of the blob per name
            self._defined[name] = answer
        return answer

    def lookup(self, name: str,
               f_opener: Callable[[], IO[bytes]] | None = None) -> Symbol | None:
        """NAME from .dynsym, else from .symtab (read lazily, needs the file
        again: ``f_opener`` returns an open binary file)."""
        s = self._by_name().get(name)
        if s is not None and s.defined:
            return s
        return self.symtab(f_opener).get(name)

    def symtab(self, f_opener: Callable[[], IO[bytes]] | None = None) -> Mapping[str, Symbol]:
        """{name: Symbol} of defined .symtab entries (empty when stripped)."""
        with self._lock:
            if self._symtab is not None:
                return self._symtab
            if ".symtab" not in self.sections:
                self._symtab = {}
                return self._symtab
            stored = self.load_part("symtab")
            if stored is not None:
                try:
                    self._symtab = StoredSymbols(*stored)
                    return self._symtab
                except (ValueError, TypeError):      # not what symtab() stores: parse again
                    pass
            if f_opener is None:
                return {}
            with f_opener() as f:
                syms = self._read_symbols(f, ".symtab", ".strtab")
                same = self._same_file(f)
            self._symtab = {s.name: s for s in syms if s.defined and s.name}
            if same:
                self.store_part("symtab", pack_symbols(list(self._symtab.values())))
            return self._symtab

    def rodata_version(self, kind: str, f_opener: Callable[[], IO[bytes]]) -> str | None:
        """The version banner of KIND found in .rodata (VERSION_PATTERNS), or
        None.  Cached per kind."""
        with self._lock:
            if self._rodata_hits is None:
                stored = self.load_part("rodata")
                self._rodata_hits = stored if isinstance(stored, dict) else {}
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
            same = self._same_file(f)
        with self._lock:
            self._rodata_hits[kind] = hit
            if same:
                self.store_part("rodata", dict(self._rodata_hits))
        return hit

    # -- the lazy parts on disk ------------------------------------------------

    def load_part(self, part: str) -> Any:
        """What was stored as PART of this file (plain data), or None: not
        stored, the store off, or a file whose identity is unknown.  PART's
        producer checks the shape: the store vouches for the identity and
        the version of allocdiag that wrote it, not for the payload."""
        return diskcache.load(self.key, part, self.path) if self.key is not None else None

    def store_part(self, part: str, payload: Any) -> None:
        """Keep PAYLOAD (plain data, computed from this very file) as PART
        of its facts on disk."""
        if self.key is not None:
            diskcache.store(self.key, part, payload, self.path)

    def _same_file(self, f):
        """True when F (opened again for a lazy part) is still the file this
        object was parsed from: only then is what it gives stored under
        this object's identity."""
        if self.key is None:
            return False
        st = os.fstat(f.fileno())
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == self.key[:STAT_KEY_LEN]

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


STAT_KEY_LEN = 4          # (st_dev, st_ino, st_size, st_mtime_ns): a diskcache.Key's head


def stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    """A file's identity from its stat: (st_dev, st_ino, st_size, st_mtime_ns)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def load(opener: ObjectFile) -> ElfObject:
    """The ElfObject of the file OPENER opens (``load_open``)."""
    with opener.open() as f:
        return load_open(opener.display_path, f)


def load_open(display: str, f: IO[bytes]) -> ElfObject:
    """The ElfObject of the open file F: from the disk cache when an entry
    for this very file (the identity of the open descriptor and its
    build-id) is there, else parsed from F (and stored)."""
    ident = stat_key(os.fstat(f.fileno()))
    key: diskcache.Key | None = None
    if diskcache.enabled():
        key = ident + (read_build_id(f),)
        facts = diskcache.load(key, "elf", display)
        if facts is not None:
            try:
                obj = ElfObject.from_facts(display, facts)
            except (ValueError, TypeError, AttributeError) as exc:
                log.debug("disk cache entry of %s unusable (%s): parsed again", display, exc)
            else:
                obj.key, obj.stat_key = key, ident
                return obj
    obj = ElfObject(display, f)
    obj.key, obj.stat_key = key, ident
    log.debug("ELF %s parsed from %s: build-id %s, %d dynamic symbols",
              display, getattr(f, "name", display), obj.build_id, len(obj.dynsym))
    if key is not None:
        diskcache.store(key, "elf", obj.facts(), display)
    return obj


# ELF64 header (elf.h Elf64_Ehdr): e_ident's EI_CLASS and EI_DATA, e_phoff,
# e_phentsize, e_phnum; Elf64_Phdr; Elf64_Nhdr
EI_CLASS, EI_DATA = 4, 5
ELFCLASS64_ID, ELFDATA2LSB = 2, 1
_EHDR64_PH = struct.Struct("<Q14xHH")       # e_phoff (at 32), e_phentsize (at 54), e_phnum (at 56)
EHDR64_PHOFF = 32
_PHDR64 = struct.Struct("<IIQQQQQQ")        # p_type, p_flags, p_offset, ..., p_filesz, p_memsz, p_align
_NHDR = struct.Struct("<III")               # n_namesz, n_descsz, n_type
PT_NOTE = 4
NT_GNU_BUILD_ID = 3
GNU_NOTE_NAME = b"GNU\0"
NOTE_ALIGN = 4                              # note fields are 4-byte aligned (8 when p_align is 8)
MAX_PHDRS = 256                             # more program headers than any real object has
MAX_NOTE_BYTES = 1 << 16                    # a PT_NOTE segment larger than this is not read


def read_build_id(f: IO[bytes]) -> str | None:
    """The GNU build-id (hex) of the ELF64 little-endian file F from its
    PT_NOTE segments, read with pread (F's position is left alone), or None.
    A few hundred bytes: cheap enough to check on every disk cache lookup."""
    fd = f.fileno()
    head = os.pread(fd, EHDR64_PHOFF + _EHDR64_PH.size, 0)
    if len(head) < EHDR64_PHOFF + _EHDR64_PH.size or not head.startswith(b"\x7fELF") or \
            head[EI_CLASS] != ELFCLASS64_ID or head[EI_DATA] != ELFDATA2LSB:
        return None
    phoff, phentsize, phnum = _EHDR64_PH.unpack_from(head, EHDR64_PHOFF)
    if phentsize < _PHDR64.size or not 0 < phnum <= MAX_PHDRS:
        return None
    table = os.pread(fd, phentsize * phnum, phoff)
    for i in range(len(table) // phentsize):
        p_type, _fl, p_offset, _va, _pa, p_filesz, _ms, p_align = \
            _PHDR64.unpack_from(table, i * phentsize)
        if p_type != PT_NOTE or p_filesz > MAX_NOTE_BYTES:
            continue
        align = p_align if p_align in (NOTE_ALIGN, 2 * NOTE_ALIGN) else NOTE_ALIGN
        notes = os.pread(fd, p_filesz, p_offset)
        pos = 0
        while pos + _NHDR.size <= len(notes):
            namesz, descsz, n_type = _NHDR.unpack_from(notes, pos)
            name_at = pos + _NHDR.size
            desc_at = _align_up(name_at + namesz, align)
            if n_type == NT_GNU_BUILD_ID and notes[name_at:name_at + namesz] == GNU_NOTE_NAME:
                desc = notes[desc_at:desc_at + descsz]
                return desc.hex() if len(desc) == descsz else None
            pos = _align_up(desc_at + descsz, align)
    return None


def _align_up(n: int, align: int) -> int:
    return -(-n // align) * align


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
        key = stat_key(opener.stat())
        with self._lock:
            obj = self._objects.get(key)
        if obj is None:
            obj = load(opener)
            # the identity of the file actually read (it may have been
            # replaced since the stat above)
            key = obj.stat_key or key
            with self._lock:
                obj = self._objects.setdefault(key, obj)
        if identity is not None:
            with self._lock:
                self._recent[identity] = (now, key)
        return obj

    def of_open(self, display: str, f: IO[bytes]) -> ElfObject:
        """The ElfObject of the open file F (for a reader that needs the
        file's bytes too: one open serves both)."""
        ident = stat_key(os.fstat(f.fileno()))
        with self._lock:
            obj = self._objects.get(ident)
        if obj is None:
            obj = load_open(display, f)
            with self._lock:
                obj = self._objects.setdefault(ident, obj)
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
        # the candidates are spelt out at the first open or stat: a host scan
        # makes one of these for each object of each process (~2,700 over 430
        # processes) and opens none whose facts the cache holds
        self._where = (procfs_root, pid, start, end)
        self._chosen: str | None = None

    def _candidates(self) -> list[str]:
        root, pid, start, end = self._where
        return [os.path.join(root, str(pid), "map_files", f"{start:x}-{end:x}"),
                os.path.join(root, str(pid), "root", self.display_path.lstrip("/")),
                self.display_path]

    @property
    def chosen_path(self) -> str | None:
        """The candidate path opened (None before the first open or stat)."""
        return self._chosen

    def _pick(self) -> str:
        if self._chosen is None:
            last: OSError | None = None
            for cand in self._candidates():
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
