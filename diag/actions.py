"""``allocdiag release`` and ``allocdiag set``: explicit actions with
before/after measurements, so the gain is measured, not guessed."""

import time

from collectors import actions as remote_actions
from collectors.detect import detect
from collectors.binary.image import ProcessImage
from collectors.proc.procfs import ProcFS
from diag import snapshot


def _image(pid, procfs):
    image = ProcessImage(pid, procfs)
    return image, detect(image)


def release(pid, procfs=None, settle_s=0.2):
    """Snapshot, release call, settle, snapshot.  Returns a dict with
    ``before``/``after`` Snapshots, the ``call`` made, its return value,
    the pause, and the call's syscalls the target's seccomp filter made
    allocdiag skip (``skipped_syscalls``)."""
    procfs = procfs or ProcFS()
    before, _ = snapshot.take(pid, procfs=procfs)
    image, det = _image(pid, procfs)
    call, rv, pause, skipped = remote_actions.release(image, det)
    # madvise is synchronous, but let the kernel's counters settle.
    time.sleep(settle_s)
    after, _ = snapshot.take(pid, procfs=procfs)
    return {"call": call, "return": rv, "pause_us": pause, "skipped_syscalls": skipped,
            "before": before, "after": after}


def set_knob(pid, name, value, procfs=None):
    procfs = procfs or ProcFS()
    image, det = _image(pid, procfs)
    old, new, detail = remote_actions.set_knob(image, det, name, value)
    return {"knob": name, "old": old, "new": new, "detail": detail,
            "allocator": det.allocator.kind}


def describe_release(pid, procfs=None):
    """What `release` would call, for the confirmation prompt."""
    image, det = _image(pid, procfs or ProcFS())
    kind = det.allocator.kind
    return kind, remote_actions.RELEASE_CALLS.get(kind)


# -- heap profiles: the allocator's own profiler (collectors.heapcontrol) ------

def heap_status(pid):
    from collectors import heapcontrol
    return heapcontrol.status(pid)


def heap_start(pid):
    from collectors import heapcontrol
    return heapcontrol.start(pid)


def heap_stop(pid, force=False):
    from collectors import heapcontrol
    return heapcontrol.stop(pid, force=force)


def heap_dump(pid):
    """(diag.heapview.ProfileView, info): the profile now, parsed and
    symbolized through the process's own root (containers)."""
    from collectors import heapcontrol, heapprofile
    from diag import heapview
    data, info = heapcontrol.dump(pid)
    view = heapview.view_of(heapprofile.parse(data), root=ProcFS().path(pid, "root"), pid=pid)
    return view, info


def detach_orphans(pid):
    """Restore and detach PID's threads that did not stop in time (held as
    orphans by the remote engine); the tids still held."""
    from collectors.engine import remote
    return remote.detach_orphans(pid)
