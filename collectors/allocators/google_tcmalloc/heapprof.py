"""google/tcmalloc has no heap profiler allocdiag can drive: only the
C++ MallocExtension::SnapshotCurrent, no C entry point."""

from __future__ import annotations

from typing import Any

from collectors.heapcontrol import restart_recipe


START = None           # never possible: status says why


def status(t: Any, doc: dict[str, Any]) -> None:
    doc["reason"] = ("google/tcmalloc profiles only through the C++ "
                     "MallocExtension::SnapshotCurrent; there is no C entry point to call")
    doc["remedy"] = ("have the program export its own profile (tcmalloc's "
                     "MallocExtension::SnapshotCurrent(ProfileType::kHeap) to pprof), or "
                     + restart_recipe(t))


def restart(t: Any, arm: str, exe: str) -> str | None:
    return None
