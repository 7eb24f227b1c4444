"""collectors.lazyre: a pattern compiled on its first search, with what
re gives."""

import re

from collectors import lazyre
from collectors.binary import elf, image

MAPS = (b"55d0c0a00000-55d0c0a01000 r-xp 00001000 fe:00 123 /usr/bin/cat\n"
        b"7f0000000000-7f0000001000 rw-p 00000000 00:00 0 \n"
        b"7f0000002000-7f0000003000 r-xp 00000000 fe:00 77 /lib/libc.so.6\n")


def test_compiled_on_first_use_and_equal_to_re():
    pat = lazyre.lazy(rb"^\S+ ..x. \S+ \S+ [1-9][0-9]* +(\S.*)$", re.MULTILINE)
    assert pat._compiled is None
    want = re.compile(rb"^\S+ ..x. \S+ \S+ [1-9][0-9]* +(\S.*)$", re.MULTILINE)
    assert pat.findall(MAPS) == want.findall(MAPS) == [b"/usr/bin/cat", b"/lib/libc.so.6"]
    assert pat._compiled is want        # re's own cache: the same object
    assert [m.span() for m in pat.finditer(MAPS)] == [m.span() for m in want.finditer(MAPS)]
    assert pat.search(MAPS, 10).group(1) == want.search(MAPS, 10).group(1)
    assert lazyre.lazy("x").search("abc") is None


def test_the_cold_patterns_are_lazy():
    """What a warm run does not use is declared lazy: the version banners
    (read only when a file is parsed) and the loader's $LIB-style tokens."""
    assert all(isinstance(p, lazyre.LazyPattern) for p in elf.VERSION_PATTERNS.values())
    assert isinstance(image.DST, lazyre.LazyPattern)
