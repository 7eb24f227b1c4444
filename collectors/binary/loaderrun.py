"""A program started through its dynamic loader: ``ld.so [OPTIONS] PROGRAM``.

The kernel then executes the loader itself, so /proc/PID/exe and auxv's
AT_PHDR name ld.so, a shared object with no PT_INTERP, and the loader maps
PROGRAM as it maps a library (glibc elf/rtld.c ``dl_main``, "the loader was
run as a program").  Read as it looks, such a process is a static
executable whose libraries were all dlopen()ed.  What it really is: the
program first in the lookup order, then the ``--preload`` libraries, then
DT_NEEDED breadth first, as for an ordinary start.

The program is the mapped object whose PT_INTERP names the running loader
and which no mapped object needs (glibc's libc.so.6 has a PT_INTERP too, and
is needed).  Its requested preloads come from the command line, which the
kernel keeps as it was given: ld.so moves its argv pointers past its own
options, not the strings /proc/PID/cmdline reads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

# glibc elf/rtld.c dl_main (2.36): the loader's own options, read before
# PROGRAM.  Those that take a value take the next argument.
RTLD_OPTIONS_WITH_VALUE = frozenset({
    "--library-path", "--inhibit-rpath", "--audit", "--preload", "--argv0",
    "--glibc-hwcaps-prepend", "--glibc-hwcaps-mask"})
RTLD_OPTIONS = frozenset({
    "--list", "--verify", "--inhibit-cache", "--list-tunables", "--list-diagnostics",
    "--help", "--version"})
# handle_preload_list: "--preload" is split as LD_PRELOAD is
PRELOAD_SEPARATORS = " :"
PRELOAD_SOURCE = "ld.so --preload"


def loader_options(argv: Sequence[str]) -> dict[str, list[str]]:
    """{option: [values]} of the loader's options in ARGV (the command line
    of a process the loader runs as a program; ARGV[0] is the loader), read
    as dl_main reads them: up to the first argument that is not one."""
    out: dict[str, list[str]] = {}
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in RTLD_OPTIONS_WITH_VALUE and i + 1 < len(argv):
            out.setdefault(arg, []).append(argv[i + 1])
            i += 2
        elif arg in RTLD_OPTIONS:
            out.setdefault(arg, [])
            i += 1
        else:
            break
    return out


def preloads(options: dict[str, list[str]]) -> list[str]:
    """The libraries ``--preload`` asks for, in order."""
    out = []
    for value in options.get("--preload", ()):
        for sep in PRELOAD_SEPARATORS[1:]:
            value = value.replace(sep, PRELOAD_SEPARATORS[0])
        out.extend(value.split())
    return out


def program_run_by(image: Any, exe: Any) -> Any:
    """The object EXE (the process's executable in IMAGE) maps as the
    program when EXE is a dynamic loader run as a program, else None."""
    if exe is None or exe.elf is None or exe.elf.interp is not None:
        return None
    candidates = [o for o in image.objects
                  if o is not exe and o.elf is not None and o.elf.interp
                  and image.same_file(exe, o.elf.interp)]
    if not candidates:
        return None          # a static executable: nothing names it as its loader
    needed = {name for o in image.objects if o.elf is not None for name in o.elf.needed}
    program = [o for o in candidates
               if os.path.basename(o.path) not in needed and (o.elf.soname or "") not in needed]
    return program[0] if len(program) == 1 else None
