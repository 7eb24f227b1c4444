"""The pieces of a native-field table (collectors.schema describes the
tables): one NativeField per field and the units.  A leaf module: the
allocator readers declare their FIELDS with it, and collectors.schema,
which finds the readers through the registry, re-exports it."""

from __future__ import annotations

from collections import namedtuple

NativeField = namedtuple("NativeField", "name unit meaning source")

BYTES, PAGES, COUNT, MS, FLAG, TEXT, RATIO = "bytes", "pages", "count", "ms", "flag", "text", "ratio"
UNITS = (BYTES, PAGES, COUNT, MS, FLAG, TEXT, RATIO)
