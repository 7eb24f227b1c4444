"""Addresses found in a library's code by a pattern, where the library
exports no symbol for them, used only once a stop checked them against the
library's own answer.

Two allocator homes read a value from memory this way instead of calling
for it inside the stop (a call is ~45-80 us of a stop on the guest this was
built on): mimalloc's ``_mi_stats_main`` (``mi_process_info``) and
gperftools' aggressive-decommit switch (``GetNumericProperty``).  Each finds
its address in the library file (its own module: what pattern, which
function), and asks this module for the rest:

- per library file (its memory key: the ELF's identity key, else path,
  device and inode), the facts ``{"vaddr": int | None, "found_by": str |
  None, "checked": bool, "disagreed": int}``, kept in memory for this
  allocdiag process and in the detection cache (by file identity, under the
  home's PART) for the next CLI run;
- the address is given out (``address``) until DISAGREE_MAX checks refuted
  it; until one check agreed (``checked``) the home makes the call as before,
  reads the value at the address right after it in the same stop, and hands
  both to ``judge``: a disagreement counts against the address only when the
  value held still around the call (read before the stop too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from collectors import lazylog
from collectors.binary import diskcache

log = lazylog.getLogger("collectors.allocators")

FACT_KEYS = frozenset({"vaddr", "found_by", "checked", "disagreed"})
# where the facts came from (not stored: the entry's own identity)
DISK = "disk"


def new_facts(vaddr: int | None, found_by: str | None) -> dict[str, Any]:
    return {"vaddr": vaddr, "found_by": found_by, "checked": False, "disagreed": 0}


def stored_facts(stored: Any) -> bool:
    """STORED (from the detection cache) has the shape ``new_facts`` gives."""
    return isinstance(stored, dict) and set(stored) == FACT_KEYS and \
        isinstance(stored["vaddr"], (int, type(None))) and \
        isinstance(stored["found_by"], (str, type(None))) and \
        isinstance(stored["checked"], bool) and isinstance(stored["disagreed"], int)


PF_X, PF_W = 1, 2                       # ELF p_flags


def in_load(elf: Any, flag: int) -> Callable[[int], bool]:
    """Whether a virtual address of ELF lies in a PT_LOAD with FLAG."""
    return lambda v: any(p_vaddr <= v < p_vaddr + memsz and flags & flag
                         for p_vaddr, _, memsz, flags in elf.loads)


# Finder: the library object -> (file virtual address or None, how it was found).
Finder = Callable[[Any], tuple[int | None, str | None]]
# A pattern's locate: (CODE_AT(vaddr, n) over the file, the entry's vaddr,
# the ElfObject) -> the file virtual address it finds, or None.
Locate = Callable[[Callable[[int, int], bytes | None], int, Any], int | None]


def find_in_code(obj: Any, entry: str, locate: Locate, found_by: str
                 ) -> tuple[int | None, str | None]:
    """A Finder's answer from the code of the function ENTRY of the library
    OBJ (its symbol, .dynsym then .symtab): (LOCATE's address, FOUND_BY), or
    (None, None) when the function or the pattern is not there."""
    elf, opener = obj.elf, obj.opener.open
    sym = elf.lookup(entry, opener)
    if sym is None:
        return None, None
    try:
        found = locate(lambda v, n: elf.text_bytes(v, n, opener), sym.st_value, elf)
    except OSError as exc:
        log.debug("%s: code of %s not read: %s", obj.path, entry, exc)
        return None, None
    return (found, found_by) if found is not None else (None, None)


# How one check came out (``judge``)
SAME, DIFFERENT, MOVED = "same", "different", "moved"


class CheckedAddresses:
    """One home's checked addresses, per library file."""

    def __init__(self, part: str, disagree_max: int) -> None:
        self.part = part
        self.disagree_max = disagree_max
        self.facts: dict[Any, dict[str, Any]] = {}

    def address(self, obj: Any, find: Finder) -> tuple[int, Any] | None:
        """(runtime address, facts key) in the mapped library OBJ, or None:
        not found in its code, refuted DISAGREE_MAX times, or OBJ not a
        mapped ELF file.  FIND(obj) is asked once per library file."""
        elf = getattr(obj, "elf", None)
        if elf is None or getattr(obj, "bias", None) is None:
            return None
        mkey = elf.key or (obj.path, getattr(obj, "dev", None), getattr(obj, "inode", None))
        facts = self.facts.get(mkey)
        if facts is None and elf.key is not None:
            stored = diskcache.load(elf.key, self.part, obj.path)
            if stored_facts(stored):
                facts = stored
        if facts is None:
            facts = new_facts(*find(obj))
            if elf.key is not None:
                diskcache.store(elf.key, self.part, facts, obj.path)
        facts[DISK] = (elf.key, obj.path)
        self.facts[mkey] = facts
        if facts["vaddr"] is None or facts["disagreed"] >= self.disagree_max:
            return None
        return obj.bias + facts["vaddr"], mkey

    def checked(self, ref: tuple[int, Any] | None) -> bool:
        """True when REF (what ``address`` gave) was checked by a stop."""
        if ref is None:
            return False
        return bool(self.facts.get(ref[1], {}).get("checked", False))

    def found_by(self, mkey: Any) -> str | None:
        found: str | None = self.facts.get(mkey, {}).get("found_by")
        return found

    def judge(self, mkey: Any, read: Any, truth: Any, before: Any) -> str:
        """One check of the address MKEY names: READ (the value there right
        after the call) against TRUTH (what the call returned), BEFORE (the
        value read before the stop).  A disagreement counts against the
        address only when the value held still around the call; else the
        next stop checks again.  SAME, DIFFERENT or MOVED."""
        if read == truth:
            self.verdict(mkey, True)
            return SAME
        if before == read:
            self.verdict(mkey, False)
            return DIFFERENT
        return MOVED

    def verdict(self, mkey: Any, agreed: bool) -> None:
        """Keep what one check found, in memory and on disk."""
        facts = self.facts.get(mkey)
        if facts is None:
            return
        if agreed:
            facts["checked"] = True
        else:
            facts["disagreed"] += 1
        disk_key, path = facts.get(DISK, (None, None))
        if disk_key is not None:
            diskcache.store(disk_key, self.part,
                            {k: v for k, v in facts.items() if k != DISK}, path)
