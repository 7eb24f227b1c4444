"""/proc readers: status, smaps_rollup (or smaps), maps, auxv, environ, cgroup.

Everything is read as bytes and parsed without regexes on the hot paths.  The
procfs root is a parameter (``ProcFS(root=...)``) so tests can feed a
captured tree.  OS errors are translated here, once, into the exception
family of ``diag.model.errors``.

Nothing here stops or traces the target: every file read needs only
PTRACE_MODE_READ (``maps``, ``smaps*``, ``environ``, ``auxv``) or nothing.
"""

import functools
import os

from diag.model.errors import AccessDenied, MalformedData, NoSuchProcess, Unsupported
from collectors.proc import oserror
from collectors.proc.maps import Mapping, parse_maps  # noqa: F401  (the one maps parser)
from diag.model import CgroupMemory, ProcessMemory

_READ_CHUNK = 1 << 17
AT_SECURE = 23
AT_BASE = 7
# include/linux/sched.h: "I am a kernel thread" (task->flags, field 9 of /proc/PID/stat)
PF_KTHREAD = 0x00200000
# fs/proc/array.c task_state_array: a task that exited and awaits its parent's wait()
ZOMBIE_STATES = (b"Z", b"X")

# Environment variables that configure allocators.  DESIGN.md "Secrets": only
# these are ever read out of a process's environment; everything else is
# dropped while parsing, before it reaches any other code.
ALLOCATOR_ENV_EXACT = frozenset((
    b"LD_PRELOAD", b"GLIBC_TUNABLES", b"PYTHONMALLOC", b"GODEBUG", b"MALLOC_CONF",
    b"MALLOC_ARENA_MAX", b"MALLOC_ARENA_TEST",
))
ALLOCATOR_ENV_PREFIXES = (b"TCMALLOC_", b"MIMALLOC_", b"HEAPPROFILE", b"HEAP_PROFILE_")


def is_allocator_var(name):
    """True for the allocator-related variable names DESIGN.md allows.

    Covers ``MALLOC_CONF`` and its prefixed forms (``JE_MALLOC_CONF``,
    ``_RJEM_MALLOC_CONF``), glibc's ``MALLOC_*_`` (``MALLOC_TRIM_THRESHOLD_``),
    ``TCMALLOC_*``, ``MIMALLOC_*`` (mimalloc matches case-insensitively, so
    lower-case forms count too).
    """
    if isinstance(name, str):
        name = name.encode()
    if name in ALLOCATOR_ENV_EXACT or name.endswith(b"MALLOC_CONF"):
        return True
    if name.startswith(b"MALLOC_") and name.endswith(b"_"):
        return True
    return name.upper().startswith(ALLOCATOR_ENV_PREFIXES)


def _translate(pid, exc, what):
    return oserror.translate(exc, pid, f"reading {what}")


class ProcFS:
    """Access to one procfs tree (``/proc`` by default)."""

    def __init__(self, root="/proc"):
        self.root = root

    def path(self, pid, *parts):
        return os.path.join(self.root, str(pid), *parts)

    def read(self, pid, name):
        """Bytes of /proc/PID/NAME, errors translated."""
        try:
            with open(self.path(pid, name), "rb", buffering=0) as f:
                # Read to EOF: a short read is not the end for seq_file
                # (maps of a process with 20k mappings comes in pieces).
                chunks = []
                while True:
                    b = f.read(_READ_CHUNK)
                    if not b:
                        break
                    chunks.append(b)
                return b"".join(chunks)
        except OSError as exc:
            # A vanished pid surfaces as ENOENT, ESRCH or even EACCES; decide
            # by whether the pid directory still exists.  A missing file of a
            # live process (smaps_rollup before 4.14) stays an OSError.
            if not os.path.exists(self.path(pid)):
                raise NoSuchProcess(pid) from None
            if isinstance(exc, FileNotFoundError):
                raise
            if isinstance(exc, ProcessLookupError) and name not in ("status", "stat"):
                # ESRCH with /proc/PID still there: a kernel thread or a
                # zombie has no mm; say which (raises), else "no such process".
                self.check_user_process(pid)
            raise _translate(pid, exc, f"/proc/{pid}/{name}") from None

    def pids(self):
        """Numeric entries of the procfs root, sorted."""
        return sorted(int(n) for n in os.listdir(self.root) if n.isdigit())

    # -- status ------------------------------------------------------------

    def status(self, pid):
        """/proc/PID/status as {bytes key: bytes value}."""
        out = {}
        for line in self.read(pid, "status").split(b"\n"):
            key, sep, value = line.partition(b":")
            if sep:
                out[key] = value.strip()
        if not out:
            raise NoSuchProcess(pid)
        return out

    def is_kernel_thread(self, pid, status=None):
        """True for a kernel thread (kthreadd, kworker/...): no user address
        space, so no allocator.  ``Kthread:`` in status (Linux 6.10+), else
        PF_KTHREAD in the flags field of /proc/PID/stat."""
        st = status if status is not None else self.status(pid)
        flag = st.get(b"Kthread")
        if flag is not None:
            return flag == b"1"
        fields = self.read(pid, "stat").rpartition(b")")[2].split()
        try:
            return bool(int(fields[6]) & PF_KTHREAD)   # fields[0] is field 3, state
        except (IndexError, ValueError):
            return False

    def check_user_process(self, pid, status=None):
        """Raise what a snapshot of PID cannot be: a zombie (NoSuchProcess,
        exit 3: it has exited, only its parent's wait() is missing) or a
        kernel thread (Unsupported, exit 5: it has no allocator).  Both would
        otherwise fail later, on smaps_rollup, as a bare "no such process"."""
        st = status if status is not None else self.status(pid)
        name = st.get(b"Name", b"?").decode(errors="replace")
        if st.get(b"State", b"")[:1] in ZOMBIE_STATES:
            ppid = st.get(b"PPid", b"?").decode(errors="replace")
            raise NoSuchProcess(pid, f"{name} is a zombie: it has exited and its parent (pid "
                                     f"{ppid}) has not reaped it yet; nothing is left to read")
        if self.is_kernel_thread(pid, st):
            raise Unsupported(f"{name} is a kernel thread: it has no user-space memory and no "
                              "allocator to read", pid=pid)

    # -- memory ------------------------------------------------------------

    def smaps_rollup(self, pid):
        """Summed smaps fields in bytes, and which file they came from.

        ``smaps_rollup`` (Linux 4.14+) is tried first.  It can be missing (old
        kernel, gVisor) or fail with ESRCH/EACCES for live processes while the
        full ``smaps`` still reads (psutil learned this the hard way), so we
        fall back to summing ``smaps``.  Fields the kernel does not print
        (``LazyFree`` before 4.12) are simply absent from the result.
        """
        try:
            return _sum_kb_lines(self.read(pid, "smaps_rollup")), "smaps_rollup"
        except (NoSuchProcess, AccessDenied, OSError) as first:
            try:
                return _sum_kb_lines(self.read(pid, "smaps")), "smaps"
            except NoSuchProcess:
                raise
            except (AccessDenied, OSError):
                raise first from None

    def memory(self, pid, status=None, rollup=True):
        """The process layer of the vocabulary (diag.fields, layer "process").

        rss/rss_anon/rss_file/rss_shmem come from ``status`` (the kernel's
        per-mm counters, no page-table walk); lazyfree, anon_thp, swap, pss and
        private/shared need ``smaps_rollup``.  ``rollup=False`` skips that walk.
        """
        st = status if status is not None else self.status(pid)
        kb = functools.partial(_kb_field, st)
        fields = dict(rss=kb(b"VmRSS"), rss_anon=kb(b"RssAnon"), rss_file=kb(b"RssFile"),
                      rss_shmem=kb(b"RssShmem"), vm_size=kb(b"VmSize"), swap=kb(b"VmSwap"))
        threads = st.get(b"Threads")
        fields["threads"] = _status_int(b"Threads", threads) if threads else None
        source = "status"
        if rollup:
            try:
                sm, source = self.smaps_rollup(pid)
            except (AccessDenied, OSError):
                sm = {}
            if sm:
                fields.update(
                    lazyfree=sm.get(b"LazyFree"),
                    anon_thp=sm.get(b"AnonHugePages"),
                    swap=sm.get(b"Swap", fields["swap"]),
                    pss=sm.get(b"Pss"),
                    private=_sum_present(sm, b"Private_Clean", b"Private_Dirty"),
                    shared=_sum_present(sm, b"Shared_Clean", b"Shared_Dirty"),
                )
            else:
                source = "status"
        return ProcessMemory(source=source, **fields)

    # -- maps ---------------------------------------------------------------

    def maps(self, pid):
        """/proc/PID/maps as a list of Mapping, in address order."""
        return parse_maps(self.read(pid, "maps"))

    # -- auxv, environ, cmdline ------------------------------------------------

    def auxv(self, pid):
        """The auxiliary vector as {a_type: a_val} (64-bit little endian)."""
        return parse_auxv(self.read(pid, "auxv"))

    def environ(self, pid):
        """The allocator-related variables of the process's *initial*
        environment, as {str: str}.  Every other variable is dropped unread.

        /proc/PID/environ is the block the process was started with; a
        ``setenv`` after start is not visible (nor does it matter to an
        allocator that read its configuration at start-up).
        """
        out = {}
        for entry in self.read(pid, "environ").split(b"\0"):
            name, sep, value = entry.partition(b"=")
            if sep and is_allocator_var(name):
                out[name.decode(errors="replace")] = value.decode(errors="replace")
        return out

    def cmdline(self, pid):
        return [a.decode(errors="replace") for a in self.read(pid, "cmdline").split(b"\0") if a]

    def exe(self, pid):
        """Target of /proc/PID/exe, or None when unreadable (kernel thread,
        permission)."""
        try:
            return os.readlink(self.path(pid, "exe"))
        except FileNotFoundError:
            if not os.path.exists(self.path(pid)):
                raise NoSuchProcess(pid) from None
            return None
        except (PermissionError, OSError):
            return None

    # -- cgroup -------------------------------------------------------------

    def cgroup_paths(self, pid):
        """{controller or "": path} from /proc/PID/cgroup ("" is the v2 entry)."""
        out = {}
        for line in self.read(pid, "cgroup").split(b"\n"):
            parts = line.split(b":", 2)
            if len(parts) != 3:
                continue
            _hid, controllers, path = parts
            path = path.decode(errors="replace")
            if not controllers:
                out[""] = path
            for c in controllers.split(b","):
                if c:
                    out[c.decode(errors="replace")] = path
        return out


def cgroup_memory(paths, cgroup_root="/sys/fs/cgroup"):
    """The cgroup layer for a process whose /proc/PID/cgroup gave PATHS.

    v1 when a ``memory`` controller line exists and its directory is
    mounted under ``cgroup_root/memory``; v2 otherwise (unified at the root,
    or at ``cgroup_root/unified`` on hybrid hosts when it has memory files).
    working_set = max(0, usage - inactive_file), as cAdvisor and
    ``kubectl top`` compute it.
    """
    candidates = []
    if "memory" in paths:
        candidates.append((1, os.path.join(cgroup_root, "memory", paths["memory"].lstrip("/")),
                           paths["memory"]))
    if "" in paths:
        rel = paths[""].lstrip("/")
        candidates.append((2, os.path.join(cgroup_root, rel), paths[""]))
        candidates.append((2, os.path.join(cgroup_root, "unified", rel), paths[""]))
    for version, directory, path in candidates:
        usage_file = "memory.usage_in_bytes" if version == 1 else "memory.current"
        usage = _read_int(os.path.join(directory, usage_file))
        if usage is None:
            continue
        stat = _read_kv(os.path.join(directory, "memory.stat"))
        if version == 1:
            limit = _read_int(os.path.join(directory, "memory.limit_in_bytes"))
            # v1 reports "no limit" as a huge page-aligned number.
            if limit is not None and limit >= (1 << 62):
                limit = None
            # total_* includes descendants, like usage_in_bytes does.
            inactive = stat.get(b"total_inactive_file", stat.get(b"inactive_file"))
        else:
            limit = _read_int(os.path.join(directory, "memory.max"))  # "max" -> None
            inactive = stat.get(b"inactive_file")
        working = max(0, usage - inactive) if inactive is not None else None
        return CgroupMemory(version=version, path=path, usage=usage, limit=limit,
                            inactive_file=inactive, working_set=working)
    where = ", ".join(f"{k or 'v2'}:{v}" for k, v in sorted(paths.items())
                      if k in ("memory", "")) or "no memory controller line"
    return CgroupMemory(error=f"no readable memory cgroup for {where} under {cgroup_root}")


# -- parsing helpers (pure, exported for tests) -------------------------------

def parse_auxv(data):
    import struct
    out = {}
    for a_type, a_val in struct.iter_unpack("<QQ", data[: len(data) // 16 * 16]):
        if a_type == 0:
            break
        out[a_type] = a_val
    return out


def _sum_kb_lines(data):
    """Sum every ``Key:   N kB`` line (one block for rollup, many for smaps)."""
    out = {}
    for line in data.split(b"\n"):
        if not line.endswith(b" kB"):
            continue
        key, sep, rest = line.partition(b":")
        if not sep:
            continue
        try:
            value = int(rest[:-3]) * 1024
        except ValueError:
            continue
        out[key] = out.get(key, 0) + value
    return out


def _kb_field(status, key):
    v = status.get(key)
    if not v or not v.endswith(b" kB"):
        return None
    return _status_int(key, v[:-3]) * 1024


def _status_int(key, text):
    try:
        return int(text)
    except ValueError:
        raise MalformedData(f"status {key.decode(errors='replace')}: not a number: "
                            f"{text[:40]!r}") from None


def _sum_present(d, *keys):
    vals = [d[k] for k in keys if k in d]
    return sum(vals) if vals else None


def _read_int(path):
    try:
        with open(path, "rb") as f:
            v = f.read().strip()
    except OSError:
        return None
    if v == b"max":
        return None
    try:
        return int(v)
    except ValueError:
        return None


def _read_kv(path):
    out = {}
    try:
        with open(path, "rb") as f:
            for line in f:
                k, _, v = line.partition(b" ")
                try:
                    out[k] = int(v)
                except ValueError:
                    pass
    except OSError:
        pass
    return out
