"""The LD_PRELOAD verdict: was an allocator preload requested, is it mapped,
and does the process's ``malloc`` actually bind to it?  If not, why not.

Every reason is named after what the dynamic loader really does (ld.so(8)):
it ignores a preload it cannot open or whose ELF class differs; in secure
mode (AT_SECURE: setuid/setgid/file capabilities) it ignores preload paths
containing a slash; a static executable or a static Go binary never runs the
loader; a library mapped later by dlopen() is not in the global lookup scope
of symbols already bound, so it does not interpose; a prefixed jemalloc
exports ``_rjem_malloc``, not ``malloc``.
"""

import os

from collectors.detect import classify, requested_preloads
from diag.model import Preload

_ELFCLASS = {1: 32, 2: 64}


def _elf_class_of(path):
    try:
        with open(path, "rb") as f:
            head = f.read(5)
    except OSError:
        return None, "unreadable"
    if head[:4] != b"\x7fELF":
        return None, "not an ELF file"
    return _ELFCLASS.get(head[4]), None


def verdict(image, detection, parent_environ=None, expect=None):
    """Preload model for ProcessImage IMAGE given its Detection.

    PARENT_ENVIRON: the allocator variables of the parent process (to name
    a wrapper that dropped LD_PRELOAD).  EXPECT: an allocator kind or
    library name the user expected to be preloaded (``--expect``).
    """
    requested = requested_preloads(image)
    exe = image.exe
    serving = detection.serving
    reasons, notes = [], []
    effective = None
    verdict_text = "none requested"

    python = _python_note(image)
    if python:
        notes.append(python)
    exe_path = image.exe.path if image.exe else None
    for b in detection.bindings:
        if b.symbol == "malloc" and b.resolved is False and b.object == exe_path:
            notes.append(f"malloc's GOT slot in {os.path.basename(b.object)} is not bound yet "
                         "(lazy binding: the program has not called it through that slot); "
                         "the binding shown follows the loader's lookup order")
            break

    if not requested and serving is not None and detection.allocator.linkage == "preload":
        # found preloaded by the binding itself (detect: not needed by the
        # executable, yet serving malloc), with no request left to read
        reasons.append(image.environ_why or "LD_PRELOAD and /etc/ld.so.preload do not name it")
        _dlopen_reasons(detection, reasons)
        return Preload(requested=(serving.path,), effective=True,
                       verdict=f"in effect: malloc binds to {serving.path}, preloaded "
                               "(inferred: the executable does not need it)",
                       reasons=tuple(reasons), notes=tuple(notes),
                       bindings=tuple(detection.bindings))
    if not requested:
        if image.environ is None:
            verdict_text = "unknown: environment not readable"
            reasons.append(image.environ_why)
        elif expect or (parent_environ and parent_environ.get("LD_PRELOAD")):
            effective = False
            verdict_text = "not in effect: LD_PRELOAD is not in this process's environment"
            if parent_environ and parent_environ.get("LD_PRELOAD"):
                reasons.append(
                    f"the parent process has LD_PRELOAD={parent_environ['LD_PRELOAD']} but this "
                    "process started without it: something between them (sudo's env_reset, "
                    "systemd, env -i, an exec wrapper) dropped it")
            else:
                reasons.append(
                    "LD_PRELOAD is not in this process's initial environment: a variable set in a "
                    "shell without `export`, set after the process started, or removed by a "
                    "wrapper (sudo, systemd, env -i) never reaches it")
        _dlopen_reasons(detection, reasons)
        return Preload(requested=(), effective=effective, verdict=verdict_text,
                       reasons=tuple(reasons), notes=tuple(notes),
                       bindings=tuple(detection.bindings))

    paths = [p for p, _src in requested]
    exe_class = exe.elf.elfclass if exe and exe.elf else None
    mapped, missing = [], []
    for path, source in requested:
        obj = next((o for o in image.objects if image.same_file(o, path)), None)
        if obj is not None:
            mapped.append((path, obj))
            continue
        missing.append(path)
        if "/" in path:
            # the first of its readings ($LIB...) that exists, as the loader's search
            real = next((r for r in map(image.in_root, image.expand_dst(path))
                         if os.path.exists(r)), None)
            if real is None:
                reasons.append(f"{path} ({source}): file not found in the target's filesystem; "
                               "the loader printed 'cannot be preloaded ... ignored'")
                continue
            cls, err = _elf_class_of(real)
            if err:
                reasons.append(f"{path} ({source}): {err}")
            elif exe_class and cls and cls != exe_class:
                reasons.append(f"{path} ({source}): wrong ELF class (ELFCLASS{cls} library, "
                               f"ELFCLASS{exe_class} process); the loader ignored it")
        if image.secure:
            reasons.append(f"{path}: the process runs in secure mode (AT_SECURE=1: setuid/setgid or "
                           "file capabilities), where the loader ignores LD_PRELOAD entries with a "
                           "slash and loads bare names only from system directories if they are "
                           "setuid themselves")
        if exe is not None and exe.elf is not None:
            if exe.elf.is_go and exe.elf.interp is None:
                reasons.append(f"{os.path.basename(exe.path)} is a static Go binary: no dynamic "
                               "loader runs, LD_PRELOAD is never read")
            elif exe.elf.interp is None:
                reasons.append(f"{os.path.basename(exe.path)} is a static executable: no dynamic "
                               "loader runs, LD_PRELOAD is never read")
    if missing and not any(m in r for m in missing for r in reasons):
        reasons.append(f"{', '.join(missing)}: not mapped in the process (the loader did not load it)")

    if exe is not None and exe.elf is not None and exe.elf.is_go and exe.elf.interp is not None:
        notes.append("Go binary with cgo: the preload can serve C allocations only; the Go heap is "
                     "managed by the Go runtime, not malloc")

    serving_requested = serving is not None and any(image.same_file(serving, p) for p in paths)
    if serving_requested:
        effective = True
        verdict_text = f"in effect: malloc binds to {serving.path}"
        for path, obj in mapped:
            sig = classify(obj)
            if obj is not serving and sig.defines_malloc and not sig.prefix:
                # two allocators preloaded: the first in the list wins
                notes.append(f"{path} is preloaded too, but {os.path.basename(serving.path)} "
                             "comes before it in the lookup order and serves malloc: "
                             f"{os.path.basename(obj.path)} interposes nothing")
    else:
        effective = False
        for path, obj in mapped:
            sig = classify(obj)
            if sig.prefix:
                reasons.append(f"{obj.path} is a prefixed {sig.kind} build: it exports {sig.prefix}malloc, "
                               "not malloc, so it does not interpose")
            elif not sig.defines_malloc:
                reasons.append(f"{obj.path} is loaded but does not define malloc")
            elif serving is not None:
                why = ""
                if serving is exe:
                    why = " (the executable defines malloc itself, which wins over any preload)"
                reasons.append(f"{obj.path} is loaded but malloc binds to {serving.path}{why}")
        target = serving.path if serving is not None else "an unknown object"
        if not mapped:
            verdict_text = "not in effect: requested preload not loaded"
        else:
            verdict_text = f"not in effect: malloc binds to {target}"
    _dlopen_reasons(detection, reasons)
    return Preload(requested=tuple(paths), effective=effective, verdict=verdict_text,
                   reasons=tuple(reasons), notes=tuple(notes), bindings=tuple(detection.bindings))


def _dlopen_reasons(detection, reasons):
    for other in detection.allocator.others:
        if other.linkage == "dlopen":
            reasons.append(f"{other.path} ({other.kind}) was loaded by dlopen() after start: "
                           "mapped but not interposing malloc")


def _python_note(image):
    names = [os.path.basename(o.path) for o in image.objects]
    exe = os.path.basename(image.exe.path) if image.exe else ""
    if not (exe.startswith("python") or any(n.startswith("libpython") for n in names)):
        return None
    mode = (image.environ or {}).get("PYTHONMALLOC")
    if mode in ("malloc", "malloc_debug"):
        return f"Python with PYTHONMALLOC={mode}: every object allocation goes through malloc"
    return ("Python: objects of 512 bytes or less are served by pymalloc's own arenas "
            "(256 KiB/1 MiB mmap'd chunks), not by malloc, unless PYTHONMALLOC=malloc")
