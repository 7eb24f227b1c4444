"""Human text of the snapshot commands (inspect, preload, explain, release):
renderers of diag's model, next to the primitives in ``diag.render``."""

import os
import sys

from collectors.allocators.registry import for_kind
from diag import render


def alloc_line(a):
    text = a.kind
    if a.version:
        text += f" {a.version}"
    extra = [x for x in (a.variant, a.linkage, f"prefix {a.prefix}" if a.prefix else None) if x]
    if extra:
        text += f" ({', '.join(extra)})"
    if a.path:
        text += f"  {a.path}"
    return text


def print_preload(snap, out=None):
    out = out or sys.stdout
    p = snap.preload
    print(f"pid {snap.pid}  {snap.comm or '?'}  {snap.exe or ''}".rstrip(), file=out)
    pairs = [("requested", ", ".join(p.requested) or "nothing (no LD_PRELOAD, no /etc/ld.so.preload)"),
             ("verdict", p.verdict),
             ("malloc from", alloc_line(snap.allocator))]
    for b in p.bindings:
        if b.symbol == "malloc":
            state = ("-> " + (b.target_path or "?")) if b.resolved else \
                ("not bound yet (lazy)" if b.resolved is False else "unreadable")
            pairs.append(("GOT slot", f"{os.path.basename(b.object)} malloc @ {b.slot:#x} {state}"))
    render.kv(pairs, out=out, indent="")
    for r in p.reasons:
        print(f"  why: {r}", file=out)
    for n in p.notes:
        print(f"  note: {n}", file=out)


def print_inspect(snap, out=None, native=False):
    """Human text of one snapshot; NATIVE adds the allocator's own numbers
    (every leaf of ``snap.native`` in its collectors.schema unit, see
    diag.render.native_rows)."""
    out = out or sys.stdout
    a, p, m, c = snap.allocator, snap.preload, snap.process, snap.cgroup
    print(f"pid {snap.pid}  {snap.comm or '?'}  {snap.exe or ''}".rstrip(), file=out)
    pairs = [("allocator", alloc_line(a))]
    for e in a.evidence:
        pairs.append(("  evidence", e))
    for o in a.others:
        pairs.append(("  also loaded", alloc_line(o)))
        for e in o.evidence[1:]:
            pairs.append(("", e))
    pairs.append(("preload", p.verdict))
    for r in p.reasons:
        pairs.append(("  why", r))
    for n in p.notes:
        pairs.append(("  note", n))
    hb = render.human_bytes
    pairs.append(("RSS", f"{hb(m.rss)} = anon {hb(m.rss_anon)} + file {hb(m.rss_file)} "
                         f"+ shmem {hb(m.rss_shmem)}"))
    lazy = hb(m.lazyfree) if m.lazyfree is not None else "not reported by this kernel"
    pairs.append(("  LazyFree", f"{lazy} {render.pct(m.lazyfree, m.rss)} of RSS".rstrip()
                  if m.lazyfree else lazy))
    pairs.append(("  THP / swap", f"{hb(m.anon_thp)} / {hb(m.swap)}"))
    pairs.append(("  PSS", f"{hb(m.pss)}  (source: {m.source})"))
    pairs.append(("  threads", str(m.threads if m.threads is not None else "-")))
    if c.usage is not None:
        lim = hb(c.limit) if c.limit is not None else "none"
        pairs.append(("cgroup", f"v{c.version} {c.path}"))
        pairs.append(("  usage", f"{hb(c.usage)}  working set {hb(c.working_set)} "
                                  f"(usage - inactive_file {hb(c.inactive_file)})  limit {lim}"))
    else:
        pairs.append(("cgroup", c.error or "unknown"))
    known = {k: v for k, v in snap.stats.items() if v.value is not None}
    remote = snap.collectors.get("remote")
    if known:
        head = "allocator stats"
        if remote is not None and remote.pause_us is not None:
            thread = snap.native.get("borrowed_thread") or {}
            head_v = (f"borrowed thread {thread.get('tid')} ({thread.get('syscall') or thread.get('kind')}) "
                      f"for {remote.pause_us} us")
        else:
            head_v = ""
        pairs.append((head, head_v))
        for k, v in known.items():
            pairs.append((f"  {render.label(k)}", f"{hb(v.value):>10}  {v.provenance}: {v.source}"))
        unknown = [render.label(k) for k, v in snap.stats.items() if v.value is None]
        if unknown:
            pairs.append(("  unknown", ", ".join(unknown)))
    else:
        why = remote.error if remote is not None and remote.error else "not collected (--no-attach)"
        pairs.append(("allocator stats", f"unknown: {why}"))
    render.kv(pairs, out=out, indent="")
    if native and snap.native:
        print("\nallocator's own numbers (units from collectors.schema):", file=out)
        render.kv([(lab, text) for lab, text, _meaning in
                   render.native_rows(snap.allocator.kind, snap.native)], out=out)
    failed = [f"{n}: {s.error}" for n, s in snap.collectors.items() if not s.ok]
    if failed:
        print("partial: " + "; ".join(failed), file=out)


def print_explain(snap, out=None):
    from diag import breakdown
    out = out or sys.stdout
    hb = render.human_bytes
    p, c = snap.process, snap.cgroup
    whose = for_kind(snap.allocator.kind).vocabulary.whose_heap
    if whose:
        # A static Go binary has no malloc: say whose heap it is instead.
        print(f"pid {snap.pid} {snap.comm or '?'}: "
              + whose.format(allocator=alloc_line(snap.allocator)), file=out)
    else:
        print(f"pid {snap.pid} {snap.comm or '?'}: malloc is served by "
              f"{alloc_line(snap.allocator)}", file=out)
    print(f"\nWhere the RSS goes ({hb(p.rss)}):", file=out)
    rows = []
    for layer in breakdown.layers(snap):
        indent = "  " * (layer.depth + 1)
        how = layer.note or ""
        if layer.raw is not None:
            how += f" (raw {hb(layer.raw)})"
        rows.append([indent + layer.label, hb(layer.bytes), render.pct(layer.bytes, p.rss), how])
    if rows:
        render.table(rows, ["layer", "bytes", "of RSS", "how known"], right={1, 2}, out=out)
    for name, v in snap.stats.items():
        if v.raw is not None:
            print(f"  {render.label(name)} adjusted from {hb(v.raw)} ({v.raw_provenance}) to "
                  f"{hb(v.value)}: {v.source}", file=out)
    held, _ = breakdown.allocator_held(snap)
    if held is None:
        remote = snap.collectors.get("remote")
        why = remote.error if remote is not None and remote.error else "not attached"
        print(f"  (allocator share unknown: {why})", file=out)
    print("\nFindings, most bytes at stake first:" if snap.findings else "\nFindings: none", file=out)
    for i, f in enumerate(snap.findings, 1):
        stake = f" [{hb(f.expected_effect_bytes)} at stake]" if f.expected_effect_bytes else ""
        print(f"  {i}. {f.severity}: {f.title}{stake}", file=out)
        if f.evidence:
            width = max(len(k) for k in f.evidence)
            print("     evidence:", file=out)
            for k, v in f.evidence.items():
                print(f"       {k:<{width}}  {render.evidence_text(k, v, p.rss)}", file=out)
        if f.knob is not None:
            k = f.knob
            line = f"     knob {k.name}"
            if k.current is not None:
                line += f" = {k.current} ({k.source})"
            if k.suggested:
                line += f"; suggested: {k.suggested}"
            print(line, file=out)
            if k.how:
                print(f"     how: {k.how}", file=out)
    print("\nWhat dashboards show:", file=out)
    print(f"  an RSS panel (ps, top, process_resident_memory_bytes) shows {hb(p.rss)}", file=out)
    if c.usage is not None:
        print(f"  a cgroup working-set panel (kubectl top, cAdvisor) shows {hb(c.working_set)} for "
              f"the whole cgroup: usage {hb(c.usage)} minus inactive_file {hb(c.inactive_file)}", file=out)
        if p.lazyfree:
            print(f"  they differ partly because {hb(p.lazyfree)} of LazyFree pages count in RSS but sit "
                  "on the cgroup's inactive list, so the working set leaves them out", file=out)
        else:
            print("  the cgroup also counts page cache and other processes, and drops inactive file "
                  "pages; RSS counts only this process's mapped pages", file=out)


def stack_rows(snap):
    p = snap.process
    rows = [("RSS", p.rss), ("anon", p.rss_anon), ("LazyFree", p.lazyfree)]
    for name in ("allocated", "active", "resident", "committed", "mapped", "dirty", "muzzy",
                 "retained"):
        v = snap.stats.get(name)
        if v is not None and v.value is not None:
            rows.append((render.label(name), v.value))
    return rows
