"""ELF, call-frame information (CFI) and symbols of the objects a process maps.

- ``elf``: facts about one ELF object (pyelftools), cached per file identity;
  ``ObjectFile`` opens a mapped object container-safe;
- ``diskcache``: those facts (and the CFI index and rows) kept on disk
  between runs, under ``$XDG_CACHE_HOME/allocdiag/``;
- ``image``: a process's loaded objects (maps, auxv, the executable);
- ``unwind``: stack walks from the ``.eh_frame`` CFI;
- ``symbolize``: function names (``.symtab``, the debug file, ``.dynsym``);
- ``demangle``: C++ names through libstdc++'s ``__cxa_demangle``;
- ``ranges``: point lookup in sorted address ranges.

Logger: ``collectors.binary`` (which symbol source named each object, CFI
that could not be loaded, objects not read, disk cache hits, misses and
entries ignored).
"""
