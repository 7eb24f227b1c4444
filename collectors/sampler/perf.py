"""perf_event_open(2) from ctypes: the attribute struct, the syscall, the
ioctls and the mmapped ring buffer.

ABI from include/uapi/linux/perf_event.h (offsets checked on this kernel,
reference/cpu-wall.md): ``struct perf_event_attr`` is 136 bytes
(PERF_ATTR_SIZE_VER8); the kernel accepts a shorter size with a zero tail.
We pass PERF_ATTR_SIZE_VER5 (112: everything up to ``aux_watermark``,
``sample_max_stack``), which every kernel since 4.8 knows.
"""

import ctypes
import errno
import mmap
import os
import struct

# perf_event.h: enum perf_type_id
PERF_TYPE_SOFTWARE, PERF_TYPE_TRACEPOINT = 1, 2
# enum perf_sw_ids
PERF_COUNT_SW_CPU_CLOCK = 0
PERF_COUNT_SW_PAGE_FAULTS = 2
PERF_COUNT_SW_CONTEXT_SWITCHES = 3
PERF_COUNT_SW_PAGE_FAULTS_MIN = 5
PERF_COUNT_SW_PAGE_FAULTS_MAJ = 6
# enum perf_event_sample_format
PERF_SAMPLE_IP = 1 << 0
PERF_SAMPLE_TID = 1 << 1
PERF_SAMPLE_TIME = 1 << 2
PERF_SAMPLE_PERIOD = 1 << 8
PERF_SAMPLE_REGS_USER = 1 << 12
PERF_SAMPLE_STACK_USER = 1 << 13
PERF_SAMPLE_IDENTIFIER = 1 << 16
# the bit-field word at offset 40 of perf_event_attr
F_DISABLED = 1 << 0
F_EXCLUDE_KERNEL = 1 << 5
F_EXCLUDE_HV = 1 << 6
F_FREQ = 1 << 10
F_SAMPLE_ID_ALL = 1 << 18
F_USE_CLOCKID = 1 << 25
F_CONTEXT_SWITCH = 1 << 26
PERF_ATTR_SIZE_VER5 = 112
PERF_FLAG_FD_CLOEXEC = 1 << 3
# ioctls (_IO('$', n)); argument by value
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_SET_OUTPUT = 0x2405
PERF_EVENT_IOC_ID = 0x80082407          # _IOR('$', 7, __u64 *)
SYS_perf_event_open = 298               # arch/x86/entry/syscalls/syscall_64.tbl
CLOCK_MONOTONIC = 1                     # time.h
# x86-64 perf register indices (arch/x86/include/uapi/asm/perf_regs.h):
# AX BX CX DX SI DI BP SP IP = 0..8, R8..R15 = 16..23.  DS-GS (12-15) -> EINVAL.
REGS_MASK = 0x1FF | (0xFF << 16)
REG_NAMES = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "rip",
             "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")
# DWARF numbers (collectors.binary.unwind.DWARF_REGS) of the registers above, in order
REG_DWARF = (0, 3, 2, 1, 4, 5, 6, 7, 16, 8, 9, 10, 11, 12, 13, 14, 15)
# ring: perf_event_mmap_page
DATA_HEAD_OFF, DATA_TAIL_OFF, DATA_OFFSET_OFF, DATA_SIZE_OFF = 1024, 1032, 1040, 1048
PAGE = mmap.PAGESIZE
TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_ioctl = _libc.ioctl
_ioctl.restype = ctypes.c_int


class PerfError(OSError):
    """perf_event_open or an ioctl failed; ``errno`` is the kernel's."""


def attr(type_, config, *, sample_period=0, freq=0, sample_type=0, flags=0,
         regs_user=0, stack_user=0, clockid=CLOCK_MONOTONIC):
    """A perf_event_attr (PERF_ATTR_SIZE_VER5 bytes) as a ctypes buffer."""
    buf = ctypes.create_string_buffer(PERF_ATTR_SIZE_VER5)
    struct.pack_into("<IIQQQQQ", buf, 0, type_, PERF_ATTR_SIZE_VER5, config,
                     freq or sample_period, sample_type, 0, flags | (F_FREQ if freq else 0))
    struct.pack_into("<Q", buf, 80, regs_user)
    struct.pack_into("<Ii", buf, 88, stack_user, clockid if flags & F_USE_CLOCKID else 0)
    return buf


def open_event(buf, tid, group_fd=-1):
    """perf_event_open(BUF, tid, cpu=-1, group_fd, FD_CLOEXEC): the fd, or PerfError."""
    fd = _syscall(ctypes.c_long(SYS_perf_event_open), buf, ctypes.c_int(tid),
                  ctypes.c_int(-1), ctypes.c_int(group_fd), ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        e = ctypes.get_errno()
        raise PerfError(e, os.strerror(e))
    return fd


def ioctl(fd, request, arg=0):
    if _ioctl(ctypes.c_int(fd), ctypes.c_ulong(request), ctypes.c_ulong(arg)) < 0:
        e = ctypes.get_errno()
        raise PerfError(e, os.strerror(e))


def event_id(fd):
    out = ctypes.c_uint64()
    if _ioctl(ctypes.c_int(fd), ctypes.c_ulong(PERF_EVENT_IOC_ID), ctypes.byref(out)) < 0:
        e = ctypes.get_errno()
        raise PerfError(e, os.strerror(e))
    return out.value


def read_count(fd):
    """The counter's value (read_format 0: one u64), or None once unreadable."""
    try:
        data = os.read(fd, 8)
    except OSError:
        return None
    return struct.unpack("<Q", data)[0] if len(data) == 8 else None


def tracepoint_id(name):
    """The id of tracepoint syscalls:NAME (e.g. sys_enter_mmap), or raise
    PermissionError / FileNotFoundError (tracefs is 0700 root here)."""
    last = FileNotFoundError(errno.ENOENT, "tracefs not mounted", TRACEFS[0])
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

    def __init__(self, fd, pages=256):
        self.size = pages * PAGE
        self.map = mmap.mmap(fd, (pages + 1) * PAGE, mmap.MAP_SHARED,
                             mmap.PROT_READ | mmap.PROT_WRITE)
        self.offset = struct.unpack_from("<Q", self.map, DATA_OFFSET_OFF)[0] or PAGE
        size = struct.unpack_from("<Q", self.map, DATA_SIZE_OFF)[0]
        if size:
            self.size = size

    def drain(self):
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

    def close(self):
        try:
            self.map.close()
        except (BufferError, ValueError):
            pass
