"""Where an allocator's settings come from, read without stopping the
target: each allocator's home reads its own (jemalloc's conf strings in
collectors/allocators/jemalloc/config.py, glibc's tunables and MALLOC_*
variables in glibc/knobs.py, mimalloc's MIMALLOC_* in mimalloc/knobs.py,
gperftools' TCMALLOC_* in gperftools/knobs.py).  Kept for the names other
code imported from here."""

from collectors.allocators.glibc.knobs import glibc_tunables  # noqa: F401
from collectors.allocators.jemalloc.config import jemalloc_sources, parse_conf  # noqa: F401
from collectors.allocators.mimalloc.knobs import prefixed_env  # noqa: F401
