"""Whether a stopped thread is inside a restartable sequence (rseq).

A thread that registered a ``struct rseq`` (glibc 2.35+ does for every
thread) may run a critical section whose contract is: if the thread is
preempted, migrated or signalled before the section's commit, the kernel
moves it to the section's abort handler on its way back to user mode
(kernel/rseq.c ``rseq_ip_fixup``).  Per-CPU data structures (google
tcmalloc's per-CPU caches, LTTng-UST, librseq users) rely on it.

A call made in such a thread breaks that contract: the kernel's fixup on
the way into the call sees the call's pc outside the section and clears
``rseq->rseq_cs``; the release then puts the thread back inside the section
with nothing left to abort it, and it commits after a preemption it never
noticed (measured: five calls into a thread spinning in a section gave five
commits with ``rseq_cs`` cleared; tests/targets/rseq_spin.c).  So a running
thread stopped inside a section is not borrowed (a section is a few
instructions long: the next round finds it outside).  Only a running
thread can be inside one: a section makes no syscall.

The thread's registration is read with PTRACE_GET_RSEQ_CONFIGURATION
(Linux 5.13); the layouts are include/uapi/linux/rseq.h's.
"""

from __future__ import annotations

import struct

from diag.model.records import record
from collectors.engine import abi, memory, ptrace
from diag.model.errors import RemoteCallError

# struct ptrace_rseq_configuration { u64 rseq_abi_pointer; u32 rseq_abi_size;
# u32 signature; u32 flags; u32 pad; }
_CONFIGURATION = struct.Struct("<QIIII")
# struct rseq { u32 cpu_id_start; u32 cpu_id; u64 rseq_cs; ... }
RSEQ_CS_OFFSET = 8
_RSEQ_CS_POINTER = struct.Struct("<Q")
# struct rseq_cs { u32 version; u32 flags; u64 start_ip; u64 post_commit_offset;
# u64 abort_ip; }
_RSEQ_CS = struct.Struct("<IIQQQ")


@record(frozen=True)
class CriticalSection:
    start_ip: int
    post_commit_offset: int
    abort_ip: int

    def holds(self, pc: int) -> bool:
        """The kernel's in_rseq_cs(): unsigned ip - start_ip < post_commit_offset."""
        return (pc - self.start_ip) & abi.U64_MASK < self.post_commit_offset


def registered_area(tid: int, pid: int) -> int | None:
    """The address of ptrace-stopped TID's struct rseq, 0 when it has none,
    or None when the kernel cannot say (before 5.13)."""
    try:
        raw = ptrace.get_rseq_configuration(tid, pid)
    except RemoteCallError:
        return None
    if len(raw) < _CONFIGURATION.size:
        return None
    pointer, _size, _signature, _flags, _pad = _CONFIGURATION.unpack(raw)
    return int(pointer)


def section_at(pid: int, area: int, pc: int) -> CriticalSection | None:
    """The critical section the thread whose struct rseq is at AREA is
    inside at PC, or None.  An active section that cannot be read is taken
    for one holding PC (the kernel would fault the thread on it too)."""
    raw = memory.try_read(pid, area + RSEQ_CS_OFFSET, _RSEQ_CS_POINTER.size)
    if raw is None:
        return CriticalSection(pc, 1, 0)
    (cs,) = _RSEQ_CS_POINTER.unpack(raw)
    if cs == 0:
        return None
    desc = memory.try_read(pid, cs, _RSEQ_CS.size)
    if desc is None:
        return CriticalSection(pc, 1, 0)
    _version, _flags, start, length, abort = _RSEQ_CS.unpack(desc)
    section = CriticalSection(start, length, abort)
    return section if section.holds(pc) else None
