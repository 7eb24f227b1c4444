"""Heap profiling in a running process (issue 10): what it can do, and
start / dump / stop through the allocator's own profiler, called on one
borrowed thread at a safe point (collectors.engine.remote; DESIGN.md rule 7: only
on an explicit user action).

gperftools (full ``libtcmalloc.so.4``; src/gperftools/heap-profiler.h):
  ``HeapProfilerStart(prefix)`` installs hooks that record EVERY later
  allocation with its stack (no sampling: measurable cost, see
  bench/heapprof_cost.py); it sees nothing allocated before the start, so a
  profile started here is the growth since the start.  ``GetHeapProfile()``
  returns a ``malloc``ed text (legacy ``heapprofile`` format) that is read
  out and handed to the target's ``free``.  ``HeapProfilerStop()`` removes
  the hooks and drops the data.  ``_minimal`` has none of these.
jemalloc (built with ``config.prof``; src/ctl.c): ``opt.prof`` is fixed at
  start; with it, ``prof.active`` (bool) switches sampling on and off and
  ``prof.dump`` (a ``const char *`` path) writes the sampled profile.
  Without ``prof:true`` the only way is a restart with the recipe
  ``restart_recipe`` prints.  Measured on Debian's 5.3.0: without
  ``opt.prof``, reading and writing ``prof.active`` return 0 and do nothing,
  ``prof.dump`` returns ENOENT (2); with it, ``prof.dump`` to a path the
  target cannot create returns EFAULT (14).  So ``opt.prof`` decides, never
  the return value of ``prof.active``.

Files the target must write (the ``HeapProfilerStart`` prefix, interval
dumps, ``prof.dump``) go to one directory per process that allocdiag
creates inside the target's own root with the target's uid/gid
(``work_dir``) and removes: on ``stop`` and, for jemalloc, right after the
dump is copied out.  Profiles the program writes on its own (``HEAPPROFILE``,
jemalloc ``prof_prefix``) are found through ``/proc/PID/cwd`` and
``/proc/PID/root`` (``existing_files``).

Environment values are secret (DESIGN.md): besides the allocator variables
ProcFS.environ allows, only ``HEAPPROFILE`` and ``HEAP_PROFILE_*`` are read
here, for finding those files.
"""

import glob
import os
import shutil
import stat

from collectors import livestats

from collectors.allocators import common
from collectors.allocators.registry import for_kind
from collectors.detect import detect
from diag.model.errors import AccessDenied, MalformedData, Unsupported
from collectors.binary.image import ProcessImage
from collectors.proc.procfs import ProcFS
from collectors.proc.stat import start_time

# GetHeapProfile walks every bucket under the profiler's lock; with many
# sites that takes a while.  A call still running then is abandoned (and the
# process quarantined), so be generous.
CALL_TIMEOUT_S = 10.0
DEADLINE_S = 2.0                  # to find a safe thread
PROFILE_MAX = 256 << 20           # refuse to copy a bigger profile text
# The environment variables read here and nowhere else (gperftools heap-profiler.cc).
GPERF_ENV = (b"HEAPPROFILE", b"HEAPPROFILESIGNAL")
GPERF_ENV_PREFIX = b"HEAP_PROFILE_"
# jemalloc's default lg_prof_sample (5.3: 2^19 = 512 KiB between samples).
JE_LG_SAMPLE_DEFAULT = 19
WORK_DIR_PARENT = "/tmp"          # in the target's own root
WORK_DIR_NAME = "allocdiag-heap-{pid}-{start}"
GPERF_PREFIX = "heap"             # HeapProfilerStart(WORK_DIR/heap): files heap.NNNN.heap

LIBTCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"
LIBJEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


class Target:
    """One process as the heap commands see it: image, detection, procfs."""

    def __init__(self, pid, procfs=None):
        self.pid = pid
        self.procfs = procfs or ProcFS()
        self.image = ProcessImage(pid, self.procfs)
        self.det = detect(self.image)
        self.alloc = self.det.allocator
        self.kind = self.alloc.kind
        self.res = livestats.Resolver(self.image)

    @property
    def root(self):
        return self.procfs.path(self.pid, "root")

    def session(self):
        # stack_need: the engine's default (these calls' needs are not measured)
        return livestats.open_remote(self.image, self.det, deadline_s=DEADLINE_S,
                                     call_timeout_s=CALL_TIMEOUT_S, procfs=self.procfs.root)

    def fn(self, name):
        return common.need(self.res.address(self.det.serving, name), name, self.kind)

    @property
    def profiler(self):
        """The allocator's heap profiler driver (its home's heapprof module), or None."""
        return for_kind(self.kind).profiler()

    def mallctl(self):
        return self.fn((self.alloc.prefix or "") + "mallctl")


# -- what the process can do ------------------------------------------------------

def profiler_env(procfs, pid):
    """{name: value} of HEAPPROFILE, HEAPPROFILESIGNAL and HEAP_PROFILE_* from
    the initial environment; nothing else is kept.  gperftools sets the high
    bit of HEAPPROFILE's first byte in place (GetUniquePathFromEnv, so that
    children add their pid): it is cleared here."""
    try:
        raw = procfs.read(pid, "environ")
    except (AccessDenied, OSError):
        return {}
    out = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and (name in GPERF_ENV or name.startswith(GPERF_ENV_PREFIX)):
            if name == b"HEAPPROFILE" and value and value[0] & 0x80:
                value = bytes([value[0] & 0x7F]) + value[1:]
            out[name.decode()] = value.decode(errors="replace")
    return out


def restart_recipe(t, lg_sample=JE_LG_SAMPLE_DEFAULT):
    """The exact way to make heap profiling possible, for the allocator T has."""
    image = t.image
    exe = image.exe_path or "PROGRAM"
    comm = getattr(image, "comm", None)
    if image.loader is not None and image.exe is not None:
        # started as `ld.so PROGRAM`: the exe link names the loader, comm too
        exe = image.exe.path
    elif comm and image.exe_path and not os.path.basename(exe).startswith(comm[:15]):
        # Debian's redis-server is a symlink to redis-check-rdb: name both
        exe = f"{exe} (the program started as {comm})"
    arm = f"prof:true,prof_active:false,lg_prof_sample:{lg_sample}"
    prof = t.profiler
    own = prof.restart(t, arm, exe) if prof is not None else None
    if own is not None:
        return own
    return (f"restart it under an allocator with a heap profiler, e.g.\n"
            f"  LD_PRELOAD={LIBJEMALLOC} MALLOC_CONF={arm} {exe}\n"
            f"  (then `allocdiag heap start PID` / `heap dump PID`; package libjemalloc2), or\n"
            f"  LD_PRELOAD={LIBTCMALLOC} {exe}\n"
            f"  (gperftools with its heap profiler; package libgoogle-perftools4; "
            f"HEAPPROFILE=/tmp/prof profiles from the start)")


def status(pid, procfs=None):
    """What heap profiling PID can do, and why.  A dict:
    ``possible`` (a profile can be started or dumped now), ``running``
    (True/False/None unknown), ``how`` (the calls used), ``reason``,
    ``remedy`` (when not possible), ``notes``, ``values`` (the allocator's own
    switches), ``env`` (HEAPPROFILE & co), ``files`` (profiles on disk),
    ``work_dir`` (allocdiag's directory for the target, when it exists)."""
    return _status(Target(pid, procfs))


def _status(t):
    a, pid = t.alloc, t.pid
    doc = {"pid": pid, "allocator": {"kind": a.kind, "variant": a.variant, "version": a.version,
                                     "path": a.path, "prefix": a.prefix},
           "possible": False, "running": None, "how": None, "reason": None, "remedy": None,
           "notes": [], "values": {}, "env": {}, "files": [], "work_dir": None, "pause_us": []}
    wd = work_dir(t, create=False)
    doc["work_dir"] = wd.inside if wd.exists() else None
    prof = t.profiler
    if prof is not None:
        prof.status(t, doc)
    else:
        doc["reason"] = f"{t.kind} malloc has no heap profiler allocdiag can drive"
        doc["remedy"] = restart_recipe(t)
    doc["files"] = existing_files(t, doc)
    return doc


# -- files on disk -----------------------------------------------------------------

def _in_target(t, path, relative_to_cwd=True):
    """PATH as the target sees it, opened from here: absolute paths under
    /proc/PID/root, relative ones under /proc/PID/cwd."""
    if path.startswith("/"):
        return os.path.join(t.root, path.lstrip("/"))
    return os.path.join(t.procfs.path(t.pid, "cwd"), path)


def existing_files(t, doc=None):
    """[{path (as the target sees it), local (openable here), bytes, mtime,
    source}] of heap profiles already on disk, newest last: the gperftools
    HEAPPROFILE prefix, jemalloc's opt.prof_prefix, and allocdiag's own work
    directory (interval dumps of a profile it started)."""
    doc = doc or {}
    prefixes = []
    env = doc.get("env") or {}
    if env.get("HEAPPROFILE"):
        prefixes.append((env["HEAPPROFILE"], "*.heap", "HEAPPROFILE"))
    pp = (doc.get("values") or {}).get("opt.prof_prefix")
    if pp and (doc.get("values") or {}).get("opt.prof"):
        prefixes.append((pp, f"{t.pid}.*.heap", "opt.prof_prefix"))
    wd = work_dir(t, create=False)
    if wd.exists():
        prefixes.append((os.path.join(wd.inside, GPERF_PREFIX), "*.heap", "allocdiag work dir"))
    out = []
    for prefix, pattern, source in prefixes:
        local_prefix = _in_target(t, prefix)
        for local in glob.glob(glob.escape(local_prefix) + "." + pattern):
            try:
                st = os.stat(local)
            except OSError:
                continue
            inside = os.path.join(os.path.dirname(prefix), os.path.basename(local)) \
                if os.path.dirname(prefix) else os.path.basename(local)
            out.append({"path": inside, "local": local, "bytes": st.st_size,
                        "mtime": st.st_mtime, "source": source})
    out.sort(key=lambda f: (f["mtime"], f["path"]))
    return out


class WorkDir:
    """allocdiag's directory for one target process, inside the target's root."""

    def __init__(self, t):
        start = start_time(t.pid, t.procfs.root)
        self.inside = os.path.join(WORK_DIR_PARENT, WORK_DIR_NAME.format(pid=t.pid, start=start))
        self.local = os.path.join(t.root, self.inside.lstrip("/"))
        self.uid, self.gid = _fs_ids(t)

    def exists(self):
        try:
            return self._check(os.lstat(self.local))
        except FileNotFoundError:
            return False

    def _check(self, st):
        """Refuse anything but a plain directory of the target's uid (or ours)
        that only its owner can write: /tmp is shared."""
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (self.uid, os.geteuid()) or \
                st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise AccessDenied(None, msg=f"{self.local} exists and is not allocdiag's "
                                         f"private directory; not using it", remediation=None)
        return True

    def create(self):
        if self.exists():
            return self
        try:
            os.mkdir(self.local, 0o700)
            os.chown(self.local, self.uid, self.gid, follow_symlinks=False)
        except FileExistsError:
            self.exists()
        except OSError as exc:
            raise AccessDenied(None, msg=f"cannot create {self.local} for the target "
                                         f"({exc.strerror})", remediation=None) from None
        return self

    def remove(self):
        """Remove the directory and what the target wrote in it.  rmtree
        works on file descriptors and refuses a symlink at the top, so a
        target that swaps entries cannot redirect it."""
        try:
            if self.exists():
                shutil.rmtree(self.local)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise AccessDenied(None, msg=f"cannot remove {self.local} ({exc})",
                               remediation=None) from None


def read_target_file(local, uid, limit=PROFILE_MAX):
    """The bytes of LOCAL, a file the target (file-system uid UID) wrote.
    allocdiag runs as root and the target may be anyone: the file must be
    a regular file of that uid with one link, opened without following a
    symlink, so a target cannot make allocdiag copy out a file it could not
    read itself."""
    try:
        fd = os.open(local, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise AccessDenied(None, msg=f"{local}: {exc.strerror} (not opened: symlinks are not "
                                     f"followed)", remediation=None) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != uid:
            raise AccessDenied(None, msg=f"{local}: not a plain file written by the target "
                                         f"(uid {st.st_uid}, links {st.st_nlink}); not copied",
                               remediation=None)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise MalformedData(f"{local}: larger than {limit} bytes; not copied")
    return data


def work_dir(t, create=True):
    wd = WorkDir(t)
    return wd.create() if create else wd


def _fs_ids(t):
    """(uid, gid) the target creates files with (the fs ids of /proc/PID/status)."""
    st = t.procfs.status(t.pid)
    uid = int(st.get(b"Uid", b"0 0 0 0").split()[-1])
    gid = int(st.get(b"Gid", b"0 0 0 0").split()[-1])
    return uid, gid


# -- start / dump / stop -------------------------------------------------------------

def start_wording(doc):
    """What starting the profiler of status DOC does, in words for a confirmation."""
    prof = for_kind(doc["allocator"]["kind"]).profiler()
    return getattr(prof, "START", None) or "start the heap profiler"


def not_possible(doc):
    """The Unsupported error (exit 5) for a status DOC that says no."""
    return Unsupported(f"heap profiling is not possible: {doc['reason']}", pid=doc["pid"],
                       remediation="how: " + doc["remedy"])


def _require(pid, procfs):
    t = Target(pid, procfs)
    doc = _status(t)
    if not doc["possible"]:
        raise not_possible(doc)
    return t, doc


def start(pid, procfs=None):
    """Start (gperftools) or activate (jemalloc) the heap profiler.
    Returns {call, was_running, running, notes, work_dir, pause_us}."""
    t, doc = _require(pid, procfs)
    return t.profiler.start(t, doc)


def stop(pid, procfs=None, force=False):
    """Stop (gperftools: HeapProfilerStop, which drops the data) or
    deactivate (jemalloc: prof.active false; samples already taken stay)
    and remove allocdiag's work directory.  A gperftools profile the
    program started itself (HEAPPROFILE) is left running unless FORCE."""
    t, doc = _require(pid, procfs)
    wd = work_dir(t, create=False)
    ours = wd.exists()
    return t.profiler.stop(t, doc, wd, ours, force)


def dump(pid, procfs=None):
    """The profile text now: gperftools GetHeapProfile (read out, then the
    target's free), jemalloc prof.dump into the work directory (copied out,
    directory removed).  Returns (bytes, info dict)."""
    t, doc = _require(pid, procfs)
    return t.profiler.dump(t, doc)


def latest(pid, procfs=None):
    """(bytes, file dict, status doc) of the newest profile the program
    wrote itself (existing_files); Unsupported when there is none."""
    t = Target(pid, procfs)
    doc = _status(t)
    if not doc["files"]:
        raise Unsupported("the program has written no heap profile (no HEAPPROFILE, "
                          "prof_prefix or interval files found)", pid=pid,
                          remediation=f"allocdiag heap status {pid}")
    newest = doc["files"][-1]
    return read_target_file(newest["local"], _fs_ids(t)[0]), newest, doc


