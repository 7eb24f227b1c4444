"""The records of a perf ring (include/uapi/linux/perf_event.h, enum
perf_event_type), for the one sample layout the sampler asks for:
``IDENTIFIER | IP | TID | TIME | PERIOD | REGS_USER | STACK_USER`` with
``sample_id_all`` (so non-sample records end with pid, tid, time, identifier).

SAMPLE body: identifier u64; ip u64; pid u32, tid u32; time u64; period u64;
abi u64; regs[n] u64 (absent when abi == PERF_SAMPLE_REGS_ABI_NONE); size
u64; data[size]; dyn_size u64 (when size != 0) -- only the first dyn_size
bytes of the copy are valid.
"""

from __future__ import annotations

import struct
from collections import namedtuple
from collections.abc import Iterator
from typing import Union

from collectors.sampler.perf import REG_DWARF

# include/uapi/linux/perf_event.h: enum perf_event_type
PERF_RECORD_LOST = 2
PERF_RECORD_EXIT = 4
PERF_RECORD_THROTTLE = 5
PERF_RECORD_SAMPLE = 9
PERF_RECORD_LOST_SAMPLES = 13
PERF_RECORD_SWITCH = 14
# include/uapi/linux/perf_event.h: struct perf_event_header misc bits
PERF_RECORD_MISC_CPUMODE_MASK = 0x7
PERF_RECORD_MISC_KERNEL = 1
PERF_RECORD_MISC_SWITCH_OUT = 1 << 13
PERF_RECORD_MISC_SWITCH_OUT_PREEMPT = 1 << 14
PERF_SAMPLE_REGS_ABI_NONE = 0          # enum perf_sample_regs_abi

_HDR = struct.Struct("<IHH")                 # perf_event_header: type misc size
_SAMPLE_HEAD = struct.Struct("<QQIIQQQ")     # identifier ip pid tid time period abi
_NREGS = len(REG_DWARF)
_REGS = struct.Struct(f"<{_NREGS}Q")
_U64 = struct.Struct("<Q")
_SWITCH = struct.Struct("<IIQQ")             # sample_id: pid tid time identifier
_LOST = struct.Struct("<QQ")                 # id lost
RSP_DWARF = 7                                # the stack pointer's DWARF number (psABI)

Sample = namedtuple("Sample", "ident ip tid time period kernel regs stack")
Switch = namedtuple("Switch", "tid time out preempt")
Lost = namedtuple("Lost", "count")


Record = Union[Sample, Switch, Lost]


def decode(data: bytes) -> Iterator[Record]:
    """Records of DATA (the bytes ``Ring.drain`` returned), in order:
    Sample (regs: {DWARF regnum: value} or None; stack: (sp, bytes) or
    None), Switch, Lost.  Other record types are skipped."""
    pos, n = 0, len(data)
    while pos + _HDR.size <= n:
        type_, misc, size = _HDR.unpack_from(data, pos)
        if size < _HDR.size or pos + size > n:
            break
        body = pos + _HDR.size
        if type_ == PERF_RECORD_SAMPLE:
            ident, ip, _pid, tid, time, period, abi = _SAMPLE_HEAD.unpack_from(data, body)
            off = body + _SAMPLE_HEAD.size
            regs = stack = None
            if abi != PERF_SAMPLE_REGS_ABI_NONE:
                vals = _REGS.unpack_from(data, off)
                off += _REGS.size
                regs = dict(zip(REG_DWARF, vals))
            copy, = _U64.unpack_from(data, off)
            off += _U64.size
            if copy:
                dyn, = _U64.unpack_from(data, off + copy)
                if regs is not None and dyn:
                    stack = (regs[RSP_DWARF], bytes(data[off:off + min(dyn, copy)]))
            kernel = (misc & PERF_RECORD_MISC_CPUMODE_MASK) == PERF_RECORD_MISC_KERNEL
            yield Sample(ident, ip, tid, time, period, kernel, regs, stack)
        elif type_ == PERF_RECORD_SWITCH:
            _pid, tid, time, _ident = _SWITCH.unpack_from(data, body)
            yield Switch(tid, time, bool(misc & PERF_RECORD_MISC_SWITCH_OUT),
                         bool(misc & PERF_RECORD_MISC_SWITCH_OUT_PREEMPT))
        elif type_ == PERF_RECORD_LOST:
            _id, lost = _LOST.unpack_from(data, body)
            yield Lost(lost)
        elif type_ == PERF_RECORD_LOST_SAMPLES:
            lost, = _U64.unpack_from(data, body)
            yield Lost(lost)
        pos += size
