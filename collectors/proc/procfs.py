"""ProcFS: access to one procfs tree, the reader the rest of allocdiag uses
for /proc/PID/... (status, smaps_rollup or smaps, maps, auxv, environ,
cmdline, cgroup, exe).

It reads (to EOF, as bytes) and translates OS errors once, through
``collectors.proc.oserror``; the parsing lives in one module per file:
``status``, ``smaps``, ``maps``, ``auxv``, ``environ``, ``cgroup``, ``stat``.
The procfs root is a parameter (``ProcFS(root=...)``) so tests can feed a
captured tree.

Nothing here stops or traces the target: every file read needs only
PTRACE_MODE_READ (``maps``, ``smaps*``, ``environ``, ``auxv``) or nothing.
"""

from __future__ import annotations

import functools
import os
from collections import Counter

from collectors import lazylog
from diag.model.errors import AccessDenied, NoSuchProcess, Unsupported
from collectors.proc import oserror
from collectors.proc.auxv import parse_auxv
from collectors.proc.cgroup import parse_cgroup
from collectors.proc.environ import OVERWRITTEN, overwritten, parse_allocator_environ
from collectors.proc.maps import Mapping, parse_maps
from collectors.proc.readall import read_all
from collectors.proc.smaps import sum_kb_lines, sum_present
from collectors.proc.stat import (PF_KTHREAD, STAT_FLAGS_AFTER_COMM, ZOMBIE_STATES,
                                  fields_after_comm)
from collectors.proc.status import kb_field, parse_status, status_int
from diag.model import ProcessMemory

log = lazylog.getLogger("collectors.proc")

# Files whose ESRCH means the pid is gone: every live task has them (a
# kernel thread or a zombie has no mm, so the others fail with ESRCH).
_ALWAYS_READABLE = ("status", "stat")


class ProcFS:
    """Access to one procfs tree (``/proc`` by default)."""

    def __init__(self, root: str = "/proc") -> None:
        self.root = root
        # {file name: reads}: what a host scan really read (its tests and
        # bench count them; a Counter update costs ~0.1 us a read)
        self.reads: Counter[str] = Counter()

    def path(self, pid: int | str, *parts: str) -> str:
        return os.path.join(self.root, str(pid), *parts)

    def read(self, pid: int, name: str) -> bytes:
        """Bytes of /proc/PID/NAME, errors translated."""
        self.reads[name] += 1
        try:
            # (an f-string: os.path.join costs more than the open on a host scan)
            return read_all(f"{self.root}/{pid}/{name}")
        except OSError as exc:
            # A vanished pid surfaces as ENOENT, ESRCH or even EACCES:
            # translate() decides by whether the pid directory still exists.
            # A missing file of a live process (smaps_rollup before 4.14)
            # stays an OSError.
            alive = oserror.process_exists(pid, self.root)
            if isinstance(exc, FileNotFoundError) and alive:
                raise
            if isinstance(exc, ProcessLookupError) and alive and name not in _ALWAYS_READABLE:
                # ESRCH with /proc/PID still there: a kernel thread or a
                # zombie has no mm; say which (raises), else "no such process".
                self.check_user_process(pid)
            raise oserror.translate(exc, pid, f"reading {self.root}/{pid}/{name}",
                                    procfs=self.root) from None

    def pids(self) -> list[int]:
        """Numeric entries of the procfs root, sorted."""
        return sorted(int(n) for n in os.listdir(self.root) if n.isdigit())

    # -- status ------------------------------------------------------------

    def status(self, pid: int) -> dict[bytes, bytes]:
        """/proc/PID/status as {bytes key: bytes value}."""
        out = parse_status(self.read(pid, "status"))
        if not out:
            raise NoSuchProcess(pid)
        return out

    def is_kernel_thread(self, pid: int, status: dict[bytes, bytes] | None = None) -> bool:
        """True for a kernel thread (kthreadd, kworker/...): no user address
        space, so no allocator.  ``Kthread:`` in status (Linux 6.10+), else
        PF_KTHREAD in the flags field of /proc/PID/stat."""
        st = status if status is not None else self.status(pid)
        flag = st.get(b"Kthread")
        if flag is not None:
            return flag == b"1"
        fields = fields_after_comm(self.read(pid, "stat"))
        try:
            return bool(int(fields[STAT_FLAGS_AFTER_COMM]) & PF_KTHREAD)
        except (IndexError, ValueError):
            return False

    def check_user_process(self, pid: int, status: dict[bytes, bytes] | None = None) -> None:
        """Raise what a snapshot of PID cannot be: a zombie (NoSuchProcess,
        exit 3: it has exited, only its parent's wait() is missing) or a
        kernel thread (Unsupported, exit 5: it has no allocator).  Both would
        otherwise fail later, on smaps_rollup, as a bare "no such process"."""
        st = status if status is not None else self.status(pid)
        self.check_not_exited(pid, st)
        if self.is_kernel_thread(pid, st):
            name = st.get(b"Name", b"?").decode(errors="replace")
            raise Unsupported(f"{name} is a kernel thread: it has no user-space memory and no "
                              "allocator to read", pid=pid)

    def check_not_exited(self, pid: int, status: dict[bytes, bytes] | None = None) -> None:
        """Raise when PID's main thread has exited: a zombie (NoSuchProcess)
        or, while other threads run on after its pthread_exit(), a process
        whose memory only those threads show (Unsupported)."""
        st = status if status is not None else self.status(pid)
        name = st.get(b"Name", b"?").decode(errors="replace")
        if st.get(b"State", b"")[:1] in ZOMBIE_STATES:
            live = self.live_threads(pid)
            if live:
                # The main thread left with pthread_exit(); the kernel shows
                # the address space only through the threads still running
                # (the leader's mm is gone: its maps are empty, its mem and
                # smaps_rollup fail with ESRCH).
                raise Unsupported(
                    f"{name}'s main thread has exited (pthread_exit) and {len(live)} other "
                    f"thread{'s run' if len(live) > 1 else ' runs'} on (tid "
                    f"{', '.join(map(str, live[:4]))}{', ...' if len(live) > 4 else ''}): the "
                    f"kernel shows its memory only through those threads (/proc/{pid}/task/"
                    f"{live[0]}/maps), which allocdiag does not read", pid=pid)
            ppid = st.get(b"PPid", b"?").decode(errors="replace")
            raise NoSuchProcess(pid, f"{name} is a zombie: it has exited and its parent (pid "
                                     f"{ppid}) has not reaped it yet; nothing is left to read")

    def live_threads(self, pid: int) -> list[int]:
        """The threads of PID not exited (State not Z or X), leader included."""
        out: list[int] = []
        try:
            tids = sorted(int(t) for t in os.listdir(f"{self.root}/{pid}/task") if t.isdigit())
        except OSError:
            return out
        for tid in tids:
            try:
                st = parse_status(read_all(f"{self.root}/{pid}/task/{tid}/status"))
            except OSError:
                continue
            if st.get(b"State", b"Z")[:1] not in ZOMBIE_STATES:
                out.append(tid)
        return out

    # -- memory ------------------------------------------------------------

    def smaps_rollup(self, pid: int) -> tuple[dict[bytes, int], str]:
        """Summed smaps fields in bytes, and which file they came from.

        ``smaps_rollup`` (Linux 4.14+) is tried first.  It can be missing (old
        kernel, gVisor) or fail with ESRCH/EACCES for live processes while the
        full ``smaps`` still reads (psutil learned this the hard way), so we
        fall back to summing ``smaps``.  Fields the kernel does not print
        (``LazyFree`` before 4.12) are simply absent from the result.
        """
        try:
            return sum_kb_lines(self.read(pid, "smaps_rollup")), "smaps_rollup"
        except (NoSuchProcess, AccessDenied, OSError) as first:
            try:
                return sum_kb_lines(self.read(pid, "smaps")), "smaps"
            except NoSuchProcess:
                raise
            except (AccessDenied, OSError):
                raise first from None

    def memory(self, pid: int, status: dict[bytes, bytes] | None = None,
               rollup: bool = True) -> ProcessMemory:
        """The process layer of the vocabulary (diag.fields, layer "process").

        rss/rss_anon/rss_file/rss_shmem come from ``status`` (the kernel's
        per-mm counters, no page-table walk); lazyfree, anon_thp, swap, pss and
        private/shared need ``smaps_rollup``.  ``rollup=False`` skips that walk.
        """
        st = status if status is not None else self.status(pid)
        kb = functools.partial(kb_field, st)
        fields = dict(rss=kb(b"VmRSS"), rss_anon=kb(b"RssAnon"), rss_file=kb(b"RssFile"),
                      rss_shmem=kb(b"RssShmem"), vm_size=kb(b"VmSize"), swap=kb(b"VmSwap"))
        threads = st.get(b"Threads")
        fields["threads"] = status_int(b"Threads", threads) if threads else None
        source = "status"
        if rollup:
            try:
                sm, source = self.smaps_rollup(pid)
            except (AccessDenied, OSError) as exc:
                log.debug("pid %d: no smaps_rollup or smaps (%s): memory from status only",
                          pid, exc)
                sm = {}
            if sm:
                fields.update(
                    lazyfree=sm.get(b"LazyFree"),
                    anon_thp=sm.get(b"AnonHugePages"),
                    swap=sm.get(b"Swap", fields["swap"]),
                    pss=sm.get(b"Pss"),
                    private=sum_present(sm, b"Private_Clean", b"Private_Dirty"),
                    shared=sum_present(sm, b"Shared_Clean", b"Shared_Dirty"),
                )
            else:
                source = "status"
        return ProcessMemory(source=source, **fields)

    # -- maps ---------------------------------------------------------------

    def maps(self, pid: int) -> list[Mapping]:
        """/proc/PID/maps as a list of Mapping, in address order."""
        return parse_maps(self.read(pid, "maps"))

    # -- auxv, environ, cmdline ------------------------------------------------

    def auxv(self, pid: int) -> dict[int, int]:
        """The auxiliary vector as {a_type: a_val} (64-bit little endian)."""
        return parse_auxv(self.read(pid, "auxv"))

    def environ(self, pid: int) -> dict[str, str]:
        """The allocator-related variables of the process's *initial*
        environment, as {str: str}.  Every other variable is dropped unread.

        /proc/PID/environ is the block the process was started with; a
        ``setenv`` after start is not visible (nor does it matter to an
        allocator that read its configuration at start-up).
        """
        return parse_allocator_environ(self.read(pid, "environ"))

    def environ_or_why(self, pid: int) -> tuple[dict[str, str] | None, str | None]:
        """(``environ``, None), or (None, why) when the block can be read but
        no longer holds the initial environment (environ.overwritten)."""
        data = self.read(pid, "environ")
        if overwritten(data):
            return None, OVERWRITTEN
        return parse_allocator_environ(data), None

    def cmdline(self, pid: int) -> list[str]:
        return [a.decode(errors="replace") for a in self.read(pid, "cmdline").split(b"\0") if a]

    def exe(self, pid: int) -> str | None:
        """Target of /proc/PID/exe, or None when unreadable (kernel thread,
        permission)."""
        self.reads["exe"] += 1
        try:
            return os.readlink(f"{self.root}/{pid}/exe")
        except OSError as exc:
            if oserror.process_exists(pid, self.root):
                return None
            raise oserror.translate(exc, pid, f"reading {self.root}/{pid}/exe",
                                    procfs=self.root) from None

    # -- cgroup -------------------------------------------------------------

    def cgroup_paths(self, pid: int) -> dict[str, str]:
        """{controller or "": path} from /proc/PID/cgroup ("" is the v2 entry)."""
        return parse_cgroup(self.read(pid, "cgroup"))
