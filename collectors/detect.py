"""Which allocator serves ``malloc`` in a process, and which others are loaded.

Out-of-process, no stop.  The order of evidence, strongest first:

1. The executable's GOT slot for ``malloc`` (JUMP_SLOT or GLOB_DAT), read
   from live memory: the address the dynamic linker bound it to names the
   object that serves the program's calls.  Other objects' slots (libpython,
   libstdc++) are read the same way when the executable has none.
2. No resolved slot (lazy binding not done yet, or the executable never
   calls malloc): the first object in the loader's lookup order (executable,
   LD_PRELOAD libraries, then DT_NEEDED breadth first) that defines
   ``malloc``; that is where the first call will bind.
3. A static executable: its own symbols (.dynsym, then .symtab), then the
   version banners in its .rodata.

Each object is classified by signature symbols (names from the allocators'
own public APIs; allocators.md §9): jemalloc ``[prefix]mallctl`` with
``[prefix]malloc_stats_print``; gperftools ``MallocExtension_GetNumericProperty``
(``HeapProfilerStart`` only in the full library); google/tcmalloc
``TCMalloc_Internal_GetStats``; mimalloc ``mi_version``; glibc
``__libc_malloc`` with ``malloc_info``; musl ``__malloc_donate`` or its
loader name; Go ``.go.buildinfo``.  An object's signature is kept with its
facts in the disk cache (part ``signature``): a warm run neither reads an
object's symbol table nor scans it for jemalloc's prefix.
"""

import os

from collectors import lazylog
from collectors.allocators import registry
from collectors.allocators.interface import Signature  # noqa: F401  (collectors.detect.Signature)
from collectors.allocators.jemalloc import home as jemalloc_home
from collectors.binary import loaderrun
from diag.model.errors import AccessDenied
from collectors.engine.memory import MemoryReader
from diag.model import Allocator, AllocatorRef, Binding

log = lazylog.getLogger("collectors.allocators")

JEMALLOC_PREFIXES = jemalloc_home.PREFIXES


def classify(obj, use_symtab=False):
    """Signature of a LoadedObject.  ``use_symtab`` also reads .symtab (for
    executables, where static allocators hide)."""
    elf = obj.elf
    if elf is None:
        return Signature()
    cache_key = "_sig_symtab" if use_symtab else "_sig"
    cached = getattr(elf, cache_key, None)
    if cached is not None:
        return cached
    part = SIGNATURE_PART + ("-symtab" if use_symtab else "")
    sig = _stored_signature(elf.load_part(part), obj.path)
    if sig is None:
        dyn = elf.exports
        names = dyn
        where = ".dynsym"
        if use_symtab:
            symtab = elf.symtab(obj.opener.open)
            if symtab:
                names = dyn | set(symtab)
                where = ".dynsym/.symtab"
        sig = _classify_names(elf, obj.path, names, where)
        elf.store_part(part, (obj.path, sig.kind, sig.variant, sig.prefix, list(sig.evidence),
                              sig.defines_malloc))
    if sig.kind is not None:
        log.debug("%s: %s%s (%s)", os.path.basename(obj.path), sig.kind,
                  f" prefix {sig.prefix!r}" if sig.prefix else "", "; ".join(sig.evidence))
    setattr(elf, cache_key, sig)
    return sig


# The disk cache part holding an object's signature: (path, kind, variant,
# prefix, evidence, defines_malloc).  The path is part of it because the
# evidence names the file and musl is told by its path: the same file seen
# under another path is classified again.
SIGNATURE_PART = "signature"


def _stored_signature(payload, path):
    """The Signature of a stored PAYLOAD for PATH, or None (none stored, one
    for another path, or not that shape)."""
    if not isinstance(payload, tuple) or len(payload) != 6 or payload[0] != path:
        return None
    _path, kind, variant, prefix, evidence, defines_malloc = payload
    if not (isinstance(evidence, list) and all(isinstance(e, str) for e in evidence)):
        return None
    return Signature(kind, variant, prefix, evidence, bool(defines_malloc))


def _classify_names(elf, path, names, where):
    base = os.path.basename(path)
    for alloc in registry.ALL:
        sig = alloc.signature(elf, names, base, path, where)
        if sig is not None:
            return sig
    return Signature(defines_malloc=False)


def version_of(obj, kind):
    """The allocator's version, read without stopping the process."""
    if obj.elf is None:
        return None
    try:
        return registry.for_kind(kind).version(obj)
    except OSError:
        return None


# -- bindings ---------------------------------------------------------------

def read_bindings(image, mem, symbols=("malloc", "free"), objects=None):
    """Binding for each GOT slot of SYMBOLS in OBJECTS (default: the
    executable), read from the live process."""
    out = []
    for obj in objects if objects is not None else ([image.exe] if image.exe else []):
        if obj is None or obj.elf is None or obj.bias is None:
            continue
        for sym in symbols:
            for slot_vaddr in obj.elf.got.get(sym, ()):
                slot = obj.bias + slot_vaddr
                target = mem.read_u64(slot) if mem is not None else None
                if target is None:
                    out.append(Binding(obj.path, sym, slot, None, None, None))
                    continue
                tobj = image.object_at(target)
                if target == 0:
                    resolved, tpath = False, None
                elif tobj is obj and obj.elf.in_plt(target - obj.bias):
                    resolved, tpath = False, obj.path
                else:
                    resolved = True
                    tpath = tobj.path if tobj else _mapping_name(image, target)
                out.append(Binding(obj.path, sym, slot, target, tpath, resolved))
    return out


def _mapping_name(image, addr):
    m = image.mapping_at(addr)
    if m is None:
        return None
    return m.path or "[anonymous]"


def lookup_order(image, preload_paths=()):
    """Objects in the dynamic linker's symbol lookup order: the executable,
    the LD_PRELOAD libraries, then DT_NEEDED breadth first.  Loaded objects
    not reached this way were dlopen()ed (or loaded by the loader itself)."""
    order = []
    seen = set()

    def add(obj):
        if obj is not None and id(obj) not in seen:
            seen.add(id(obj))
            order.append(obj)

    add(image.exe)
    for p in preload_paths:
        for obj in image.objects:
            if image.same_file(obj, p):
                add(obj)
    i = 0
    while i < len(order):
        obj = order[i]
        i += 1
        for name in (obj.elf.needed if obj.elf else ()):
            for dep in image.by_name(name):
                add(dep)
    return order


def requested_preloads(image):
    """[(path, source)] from LD_PRELOAD (initial environment), the
    loader's ``--preload`` (a program started as ``ld.so --preload LIB
    PROGRAM``) and the target root's /etc/ld.so.preload, in the order
    rtld.c dl_main loads them.  ld.so splits LD_PRELOAD on spaces and
    colons."""
    out = []
    env = image.environ or {}
    for part in env.get("LD_PRELOAD", "").replace(":", " ").split():
        out.append((part, "LD_PRELOAD"))
    for part in loaderrun.preloads(image.loader_options):
        out.append((part, loaderrun.PRELOAD_SOURCE))
    try:
        with open(image.in_root("/etc/ld.so.preload"), "r", errors="replace") as f:
            for line in f:
                for part in line.split("#", 1)[0].replace(":", " ").split():
                    out.append((part, "/etc/ld.so.preload"))
    except OSError:
        pass
    return out


# -- detection ----------------------------------------------------------------

# Detection.how, in the words of the -v line
HOW_WORDS = {"got": "read from a malloc GOT slot", "lookup-order": "by symbol lookup order",
             "static": "a static executable", "go": "a Go binary"}


class Detection:
    """The result: ``allocator`` (model), plus what the preload verdict needs."""

    def __init__(self, allocator, serving, bindings, order, how):
        self.allocator = allocator
        self.serving = serving        # LoadedObject or None
        self.bindings = bindings      # [Binding]
        self.order = order            # lookup order
        self.how = how                # "got" | "lookup-order" | "static" | "go" | None
        # False when the process's memory could not be read (no ptrace
        # rights): GOT slots unread, the verdict comes from lookup order.
        self.memory_readable = True


def detect(image, mem=None, all_bindings=False):
    """Detect the serving allocator of ProcessImage IMAGE.

    MEM is an open ``collectors.engine.memory.MemoryReader`` (None: opened here;
    when reading memory is denied, detection falls back to lookup order and
    says so in the evidence).
    """
    own_mem = False
    evidence = []
    if mem is None:
        try:
            mem = MemoryReader(image.pid, image.procfs.root)
            own_mem = True
        except AccessDenied:
            mem = None
            evidence.append("process memory not readable (no ptrace rights): "
                            "GOT slots not read, verdict from the loader's lookup order")
    try:
        det = _detect(image, mem, evidence, all_bindings)
        det.memory_readable = mem is not None
        return det
    finally:
        if own_mem:
            mem.close()


def _detect(image, mem, evidence, all_bindings):
    exe = image.exe
    if image.loader is not None and exe is not None:
        evidence.append(f"started through its dynamic loader {os.path.basename(image.loader.path)} "
                        f"(LOADER [OPTIONS] PROGRAM): the program, {exe.path}, is read as the "
                        "executable")
    preloads = [p for p, _src in requested_preloads(image)]
    order = lookup_order(image, preloads) if exe else list(image.objects)
    serving, how = None, None
    bindings = []
    bound_in_order = False

    if exe is not None and exe.elf is not None and exe.elf.is_go and exe.elf.interp is None:
        # A static Go binary: no C allocator at all.  A dynamically linked
        # (cgo) one calls malloc from its C side like any program: the
        # GOT/lookup-order path below finds that allocator, and the Go heap
        # is named among the others (_others).
        serving, how = exe, "go"
        evidence.append(f"{os.path.basename(exe.path)} is a Go binary"
                        + (f" ({exe.elf.go_version})" if exe.elf.go_version else "")
                        + ": the Go runtime manages its heap itself; malloc serves only cgo/C code")
    elif exe is not None and exe.elf is not None and exe.elf.interp is None and not exe.elf.needed:
        serving, how = exe, "static"
        evidence.append(f"{os.path.basename(exe.path)} is statically linked (no PT_INTERP): "
                        "the allocator is inside the executable")
    else:
        targets = [exe] if exe else []
        if all_bindings:
            targets += [o for o in image.objects if o is not exe and o.elf and "malloc" in o.elf.got]
        bindings = read_bindings(image, mem, objects=targets) if mem is not None else []
        resolved = [b for b in bindings if b.symbol == "malloc" and b.resolved]
        if not resolved and mem is not None and not all_bindings:
            # The executable has no resolved malloc slot: ask the objects that
            # do call malloc (libpython, libstdc++...).
            others = [o for o in order if o is not exe and o.elf and "malloc" in o.elf.got]
            extra = read_bindings(image, mem, symbols=("malloc",), objects=others)
            bindings += extra
            resolved = [b for b in extra if b.resolved]
        if resolved:
            b = resolved[0]
            serving = image.object_at(b.target)
            how = "got"
            bound_in_order = any(o.path == b.object for o in order)
            evidence.append(f"malloc GOT slot of {os.path.basename(b.object)} at {b.slot:#x} -> "
                            f"{b.target:#x} in {b.target_path}")
        else:
            for b in bindings:
                if b.symbol == "malloc" and b.resolved is False:
                    evidence.append(f"malloc GOT slot of {os.path.basename(b.object)} not bound yet "
                                    "(lazy binding: no call through it so far)")
                    break
            for obj in order:
                sig = classify(obj, use_symtab=(obj is exe))
                if sig.defines_malloc:
                    serving, how = obj, "lookup-order"
                    evidence.append(f"first object defining malloc in the loader's lookup order: "
                                    f"{os.path.basename(obj.path)}")
                    break

    if how == "got" and bound_in_order and serving is not None and serving is not exe and \
            all(o is not serving for o in order):
        # A slot of the executable or of a library it needs (bound through
        # the global scope) points to an object none of them needs: only a
        # preload is searched before them (a dlopen()ed library is searched
        # after libc, never winning malloc there; RTLD_DEEPBIND changes only
        # the dlopen()ed library's own slots), so it was preloaded, by a
        # request the environment no longer shows.
        evidence.append(_inferred_preload(image, serving))
        preloads.append(serving.path)
        order = lookup_order(image, preloads)
    ref = _describe(serving, how, image, preloads)
    serving_ref = ref
    if ref is not None:
        serving_ref = AllocatorRef(kind=ref.kind, version=ref.version, linkage=ref.linkage,
                                   path=ref.path, prefix=ref.prefix, variant=ref.variant,
                                   evidence=tuple(evidence) + ref.evidence)
    others = _others(image, serving, order, preloads)
    if serving_ref is None:
        allocator = Allocator(kind="unknown", evidence=tuple(evidence) or
                              ("no loaded object defines malloc",), others=tuple(others))
    else:
        allocator = Allocator(**{f: getattr(serving_ref, f) for f in
                                 ("kind", "version", "linkage", "path", "prefix", "variant", "evidence")},
                              others=tuple(others))
    log.info("pid %s: malloc served by %s (%s), %s", image.pid, allocator.kind,
             allocator.linkage or "-", HOW_WORDS.get(how, "no object defines malloc"))
    return Detection(allocator, serving, bindings, order, how)


def _inferred_preload(image, serving):
    """The evidence line of a serving object found preloaded although no
    request for it is visible (why it is not)."""
    name = os.path.basename(serving.path)
    why = image.environ_why if image.environ is None else \
        "LD_PRELOAD and /etc/ld.so.preload do not name it (the loader's --preload?)"
    return (f"{name} is not among the libraries the executable needs (DT_NEEDED), yet malloc "
            f"binds to it: it was preloaded; {why}")


def _describe(obj, how, image, preloads):
    if obj is None:
        return None
    is_exe = obj is image.exe
    sig = classify(obj, use_symtab=is_exe)
    kind = sig.kind or "unknown"
    ev = list(sig.evidence)
    if is_exe and how is not None and registry.for_kind(kind) is registry.UNKNOWN \
            and obj.elf is not None:
        # Stripped static executable: fall back to .rodata banners.
        for alloc in registry.STRIPPED_STATIC:
            try:
                v = obj.elf.rodata_version(alloc.banner, obj.opener.open)
            except OSError:
                v = None
            if v:
                kind = alloc.kind
                log.debug("%s: stripped static executable, %s banner %s", obj.path, kind, v)
                ev.append(f"{os.path.basename(obj.path)} .rodata holds the {kind} version string {v}")
                break
    if is_exe and kind == sig.kind and sig.prefix:
        # A prefixed allocator (jemalloc) in the executable does not serve malloc.
        kind = "unknown"
    if is_exe:
        linkage = "static"
    elif any(image.same_file(obj, p) for p in preloads):
        linkage = "preload"
    else:
        linkage = "dynamic"
    return AllocatorRef(kind=kind, version=version_of(obj, kind), linkage=linkage, path=obj.path,
                        prefix=sig.prefix if kind == sig.kind else None,
                        variant=sig.variant, evidence=tuple(ev))


def _others(image, serving, order, preloads=()):
    in_order = {id(o) for o in order}
    out = []
    for obj in image.objects:
        sig = classify(obj, use_symtab=(obj is image.exe))
        # The serving object is the allocator itself, not an "other" --
        # unless it is an executable with a prefixed jemalloc inside, beside
        # the malloc it serves (a static Rust binary).
        if obj is serving and not (obj is image.exe and sig.prefix):
            continue
        if not sig.kind or (not sig.defines_malloc and registry.for_kind(sig.kind) is registry.UNKNOWN):
            continue
        own_heap = registry.for_kind(sig.kind).vocabulary.own_heap_note
        if own_heap and obj is image.exe:
            if obj is not serving:
                out.append(AllocatorRef(
                    kind=sig.kind, version=version_of(obj, sig.kind), linkage="static", path=obj.path,
                    evidence=tuple(sig.evidence) + (own_heap,)))
            continue
        ev = list(sig.evidence)
        if sig.prefix:
            ev.append(f"symbols are prefixed ({sig.prefix}malloc): they do not interpose malloc; "
                      f"configured by {sig.prefix.upper()}MALLOC_CONF")
        if id(obj) not in in_order:
            ev.append("not in the loader's lookup order: loaded by dlopen() after start")
            linkage = "dlopen"
        elif obj is image.exe:
            linkage = "static"
        elif any(image.same_file(obj, p) for p in preloads):
            # preloaded, but an object before it in the lookup order serves malloc
            ev.append(f"preloaded, but malloc binds to {os.path.basename(serving.path)}, "
                      "before it in the lookup order" if serving is not None else "preloaded")
            linkage = "preload"
        else:
            linkage = "dynamic"
        out.append(AllocatorRef(kind=sig.kind, version=version_of(obj, sig.kind), linkage=linkage,
                                path=obj.path, prefix=sig.prefix,
                                variant=sig.variant, evidence=tuple(ev)))
    return out


def detect_pid(pid, procfs=None):
    """Convenience: (ProcessImage, Detection) for PID."""
    from collectors.binary.image import ProcessImage
    image = ProcessImage(pid, procfs)
    return image, detect(image)
