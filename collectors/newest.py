"""Caches bounded by count: a dict that keeps its newest entries.

The engine's and the allocator homes' module-wide and per-object caches
(libc's function ranges, waiters seen back asleep, look-ahead walks, values
read by a stop) each keep at most a fixed number of entries, the oldest
written dropped first (a dict keeps insertion order).
"""

from __future__ import annotations

from typing import Any


def keep_newest(table: dict[Any, Any], key: Any, value: Any, most: int) -> None:
    """TABLE[KEY] = VALUE as its newest entry, then the oldest entries
    dropped until at most MOST are left."""
    table.pop(key, None)
    table[key] = value
    while len(table) > most:
        del table[next(iter(table))]
