"""``allocdiag inspect --from FILE``: a Snapshot from a saved stats file.

Recognised by content, not by name: glibc ``malloc_info`` XML, jemalloc
``malloc_stats_print`` JSON (opts "J"), gperftools ``MallocExtension_GetStats``
text, mimalloc ``mi_stats_print`` text; each parsed by its allocator's
module (collectors.allocators) into the native shape live and self mode
produce.  Anything else, or a file that claims a format but does not parse,
is BadInput saying what was expected (exit 2: the user named the wrong file).
"""

import json
import os

from collectors import allocators
from collectors.allocators import registry
from diag.model.errors import AccessDenied, AllocdiagError, BadInput, BadPath
from diag.fields import STATS_FIELDS
from diag.model import Allocator, CollectorStatus, Snapshot, Value

MAX_BYTES = 64 << 20
EXPECTED = ("expected malloc_info XML, jemalloc stats JSON (malloc_stats_print opts 'J'), "
            "gperftools MallocExtension_GetStats text or mimalloc stats text")


SNIFF_BYTES = 4096      # how much of a file's start the formats are recognised from


def detect_format(data):
    head = data.lstrip()[:SNIFF_BYTES]
    for a in registry.FILE_FORMATS:
        if a.stats().looks_like(head):
            return a.kind
    return None


def snapshot_from_file(path):
    try:
        size = os.path.getsize(path)
        if size > MAX_BYTES:
            raise BadInput(f"{path}: {size} bytes is larger than any stats file ({MAX_BYTES}; "
                           f"{EXPECTED})")
        with open(path, "rb") as f:
            data = f.read()
    except PermissionError:
        raise AccessDenied(None, msg=f"{path}: permission denied", remediation=None) from None
    except OSError as exc:          # missing, a directory, a path through a file
        raise BadPath.from_oserror(exc, path) from None
    kind = detect_format(data)
    if kind is None:
        raise BadInput(f"{path}: not a recognised stats file ({EXPECTED})")
    mod = allocators.module(kind)
    try:
        # The allocator's module parses into the same native shape the live
        # and self paths produce (fields the file cannot carry are None).
        native = mod.parse_file(data)
        stats = mod.normalise(native)
    except AllocdiagError as exc:
        raise BadInput(f"{path}: looks like {kind} stats but does not parse: {exc.msg}") from None
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise BadInput(f"{path}: looks like {kind} stats but does not parse: {exc}") from None
    full = {name: Value() for name in STATS_FIELDS}
    full.update(stats)
    return Snapshot(pid=None, comm=None, exe=None, taken_at=os.path.getmtime(path),
                    allocator=Allocator(kind=kind, evidence=(f"read from file {path}",)),
                    stats=full, native=native,
                    collectors={"file": CollectorStatus(True, None, 0.0)})
