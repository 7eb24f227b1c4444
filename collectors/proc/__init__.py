"""/proc readers: the kernel's view of a process, read without stopping it.

- ``procfs``: ``ProcFS``, the reader (one procfs root; reads to EOF as bytes;
  errors translated) and the process layer of the vocabulary (``memory``);
- one parser per file format: ``maps`` (the one maps parser), ``stat`` (the
  one start-time, state and flags reader), ``status``, ``smaps``, ``auxv``,
  ``environ`` (allocator variables only), ``cgroup`` (and the memory cgroup);
- ``pagemap``: resident pages of address ranges;
- ``readall``: the one raw read of a whole /proc or /sys file (four system
  calls, where ``open().read()`` makes nine);
- ``oserror``: the one place an ``OSError`` about a target becomes the
  project's error (diag.model.errors).

Logger: ``collectors.proc``.
"""
