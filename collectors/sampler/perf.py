"""perf_event_open(2) from ctypes: the attribute struct, the syscall, the
ioctls and the mmapped ring buffer.

ABI from include/uapi/linux/perf_event.h (offsets checked on this kernel,
reference/cpu-wall.md): ``struct perf_event_attr`` is 136 bytes
(PERF_ATTR_SIZE_VER8); the kernel accepts a shorter size with a zero tail.
We pass PERF_ATTR_SIZE_VER5 (112: everything up to ``aux_watermark``,
``sample_max_stack``), which every kernel since 4.8 knows.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
from typing import Any

# include/uapi/linux/perf_event.h: enum perf_type_id
PERF_TYPE_SOFTWARE, PERF_TYPE_TRACEPOINT = 1, 2
# include/uapi/linux/perf_event.h: enum perf_sw_ids
PERF_COUNT_SW_CPU_CLOCK = 0
PERF_COUNT_SW_PAGE_FAULTS = 2
PERF_COUNT_SW_CONTEXT_SWITCHES = 3
PERF_COUNT_SW_PAGE_FAULTS_MIN = 5
PERF_COUNT_SW_PAGE_FAULTS_MAJ = 6
# include/uapi/linux/perf_event.h: enum perf_event_sample_format
PERF_SAMPLE_IP = 1 << 0
PERF_SAMPLE_TID = 1 << 1
PERF_SAMPLE_TIME = 1 << 2
PERF_SAMPLE_PERIOD = 1 << 8
PERF_SAMPLE_REGS_USER = 1 << 12
PERF_SAMPLE_STACK_USER = 1 << 13
PERF_SAMPLE_IDENTIFIER = 1 << 16
# struct perf_event_attr (include/uapi/linux/perf_event.h): byte offsets of the
# fields we set.  type u32 @0, size u32 @4, config u64 @8, sample_period or
# sample_freq u64 @16, sample_type u64 @24, read_format u64 @32, the bit-field
# word u64 @40, ..., sample_regs_user u64 @80, sample_stack_user u32 @88,
# clockid s32 @92.
ATTR_HEAD_OFF = 0               # "<IIQQQQQ": type .. flags, packed in one go
ATTR_HEAD = struct.Struct("<IIQQQQQ")
ATTR_FLAGS_OFF = 40
ATTR_REGS_USER_OFF = 80
ATTR_STACK_USER_OFF = 88        # "<Ii": sample_stack_user, clockid
# the bit-field word at ATTR_FLAGS_OFF (bit = position in the declaration)
F_DISABLED = 1 << 0
F_EXCLUDE_KERNEL = 1 << 5
F_EXCLUDE_HV = 1 << 6
F_FREQ = 1 << 10
F_SAMPLE_ID_ALL = 1 << 18
F_USE_CLOCKID = 1 << 25
F_CONTEXT_SWITCH = 1 << 26
PERF_ATTR_SIZE_VER5 = 112              # perf_event.h: up to sample_max_stack
PERF_FLAG_FD_CLOEXEC = 1 << 3           # perf_event.h: perf_event_open flags
# include/uapi/asm-generic/ioctl.h: dir << 30 | size << 16 | type << 8 | nr
_IOC_NRSHIFT, _IOC_TYPESHIFT, _IOC_SIZESHIFT, _IOC_DIRSHIFT = 0, 8, 16, 30
_IOC_NONE, _IOC_READ = 0, 2
PERF_IOC_MAGIC = ord("$")               # perf_event.h: the '$' ioctl type


def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << _IOC_DIRSHIFT | size << _IOC_SIZESHIFT |
            PERF_IOC_MAGIC << _IOC_TYPESHIFT | nr << _IOC_NRSHIFT)


# perf_event.h: ioctls; ENABLE/DISABLE/SET_OUTPUT are _IO (argument by value)
PERF_EVENT_IOC_ENABLE = _ioc(_IOC_NONE, 0, 0)                          # 0x2400
PERF_EVENT_IOC_DISABLE = _ioc(_IOC_NONE, 1, 0)                         # 0x2401
PERF_EVENT_IOC_SET_OUTPUT = _ioc(_IOC_NONE, 5, 0)                      # 0x2405
PERF_EVENT_IOC_ID = _ioc(_IOC_READ, 7, ctypes.sizeof(ctypes.c_uint64))  # _IOR('$', 7, __u64 *)
SYS_perf_event_open = 298               # arch/x86/entry/syscalls/syscall_64.tbl
CLOCK_MONOTONIC = 1                     # include/uapi/linux/time.h
CPU_ANY = -1                            # perf_event_open(2): cpu -1, the task on any CPU
NO_GROUP = -1                           # perf_event_open(2): group_fd -1, a group leader
COUNT = struct.Struct("<Q")             # read(2) of a counter, read_format 0: one u64
# x86-64 perf register indices (arch/x86/include/uapi/asm/perf_regs.h):
# AX BX CX DX SI DI BP SP IP = 0..8, R8..R15 = 16..23.  DS-GS (12-15) -> EINVAL.
REGS_MASK = 0x1FF | (0xFF << 16)
REG_NAMES = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "rip",
             "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")
# DWARF numbers (collectors.binary.unwind.DWARF_REGS) of the registers above, in order
REG_DWARF = (0, 3, 2, 1, 4, 5, 6, 7, 16, 8, 9, 10, 11, 12, 13, 14, 15)
# ring: struct perf_event_mmap_page (perf_event.h), byte offsets
DATA_HEAD_OFF, DATA_TAIL_OFF, DATA_OFFSET_OFF, DATA_SIZE_OFF = 1024, 1032, 1040, 1048
PAGE = mmap.PAGESIZE
RING_DATA_PAGES = 256     # 1 MiB: kept up with 999 Hz x 16 KiB stacks (reference/cpu-wall.md)
TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_ioctl = _libc.ioctl
_ioctl.restype = ctypes.c_int


class PerfError(OSError):
    """perf_event_open or an ioctl failed; ``errno`` is the kernel's."""


def attr(type_: int, config: int, *, sample_period: int = 0, freq: int = 0,
         sample_type: int = 0, flags: int = 0, regs_user: int = 0, stack_user: int = 0,
         clockid: int = CLOCK_MONOTONIC) -> Any:
    """A perf_event_attr (PERF_ATTR_SIZE_VER5 bytes) as a ctypes buffer."""
    buf = ctypes.create_string_buffer(PERF_ATTR_SIZE_VER5)
    ATTR_HEAD.pack_into(buf, ATTR_HEAD_OFF, type_, PERF_ATTR_SIZE_VER5, config,
                        freq or sample_period, sample_type, 0, flags | (F_FREQ if freq else 0))
    struct.pack_into("<Q", buf, ATTR_REGS_USER_OFF, regs_user)
    struct.pack_into("<Ii", buf, ATTR_STACK_USER_OFF, stack_user,
                     clockid if flags & F_USE_CLOCKID else 0)
    return buf


def open_event(buf: Any, tid: int, group_fd: int = NO_GROUP) -> int:
    """perf_event_open(BUF, tid, cpu=-1, group_fd, FD_CLOEXEC): the fd, or PerfError."""
    fd = _syscall(ctypes.c_long(SYS_perf_event_open), buf, ctypes.c_int(tid),
                  ctypes.c_int(CPU_ANY), ctypes.c_int(group_fd),
                  ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        e = ctypes.get_errno()
        raise PerfError(e, os.strerror(e))
    return fd


def ioctl(fd: int, request: int, arg: int = 0) -> None:
    if _ioctl(ctypes.c_int(fd), ctypes.c_ulong(request), ctypes.c_ulong(arg)) < 0:
        e = ctypes.get_errno()
        raise PerfError(e, os.strerror(e))


def event_id(fd: int) -> int:
    out = ctypes.c_uint64()
    if _ioctl(ctypes.c_int(fd), ctypes.c_ulong(PERF_EVENT_IOC_ID), ctypes.byref(out)) < 0:
        e = ctypes.get_errno()
        raise PerfError(e, os.strerror(e))
    return out.value


def read_count(fd: int) -> int | None:
    """The counter's value (read_format 0: one u64), or None once unreadable."""
    try:
        data = os.read(fd, COUNT.size)
    except OSError:
        return None
    return int(COUNT.unpack(data)[0]) if len(data) == COUNT.size else None


def tracepoint_id(name: str) -> int:
    """The id of tracepoint syscalls:NAME (e.g. sys_enter_mmap), or raise
    PermissionError / FileNotFoundError (tracefs is 0700 root here)."""
    last: OSError = FileNotFoundError(errno.ENOENT, "tracefs not mounted", TRACEFS[0])
    for root in TRACEFS:
        path = os.path.join(root, "events", "syscalls", name, "id")
        try:
            with open(path, "rb") as f:
                return int(f.read().strip())
        except FileNotFoundError as exc:
            last = exc
    raise last


PERMISSION_FIX = ("sampling needs root, CAP_PERFMON (or CAP_SYS_ADMIN), or "
                  "kernel.perf_event_paranoid <= 1 for a process of your own user "
                  "(sysctl -w kernel.perf_event_paranoid=1); in a container, the runtime "
                  "must allow perf_event_open (seccomp profile, --cap-add PERFMON)")


class Ring:
    """The mmapped ring of one event: 1 header page + 2^n data pages.
    ``drain()`` returns the bytes of every complete record since the last
    call and publishes data_tail (x86-64 is TSO: no fence needed between the
    head load and the record copies, nor before the tail store)."""

    def __init__(self, fd: int, pages: int = RING_DATA_PAGES) -> None:
        self.size = pages * PAGE
        self.map = mmap.mmap(fd, (pages + 1) * PAGE, mmap.MAP_SHARED,
                             mmap.PROT_READ | mmap.PROT_WRITE)
        self.offset = struct.unpack_from("<Q", self.map, DATA_OFFSET_OFF)[0] or PAGE
        size = struct.unpack_from("<Q", self.map, DATA_SIZE_OFF)[0]
        if size:
            self.size = size

    def drain(self) -> bytes:
        m = self.map
        head = struct.unpack_from("<Q", m, DATA_HEAD_OFF)[0]
        tail = struct.unpack_from("<Q", m, DATA_TAIL_OFF)[0]
        if head == tail:
            return b""
        start, end = tail % self.size, head % self.size
        base = self.offset
        if head - tail >= self.size or end <= start:
            data = m[base + start:base + self.size] + m[base:base + end]
        else:
            data = m[base + start:base + end]
        struct.pack_into("<Q", m, DATA_TAIL_OFF, head)
        return data

    def close(self) -> None:
        try:
            self.map.close()
        except (BufferError, ValueError):
            pass
