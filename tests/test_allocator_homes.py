"""One home per allocator (issue 22 item 2): outside collectors/allocators/,
no code compares a kind against an allocator's name or keeps a table keyed
by allocator names -- it asks the allocator object
(collectors.allocators.registry.for_kind).  The walk is ast-based; a
failure names file:line."""

import ast
import pathlib

from collectors.allocators import registry

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCANNED = ("collectors", "diag", "tui")
HOMES = ROOT / "collectors" / "allocators"
KINDS = frozenset(registry.kinds())

# (path, the enclosing function or the assigned name) -> why it may stay.  Keep it tiny.
ALLOWED = {
    ("diag/model/__init__.py", "ORDERINGS"):
        "the model imports nothing of ours, so its field-order table cannot ask the registry",
    ("diag/compare.py", "ALLOCATORS"):
        "compare's variant names, a CLI vocabulary (tcmalloc_minimal is a variant, not a kind)",
    ("collectors/binary/elf.py", "VERSION_PATTERNS"):
        "version banner regexes by banner name (helper parts' file; each home names its banner)",
}


def _names_kind(node):
    """NODE is an allocator-kind string, or a tuple/list/set holding one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in KINDS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_kind(e) for e in node.elts)
    return False


def _scopes(tree):
    """{id(node): the name of the innermost function or assignment holding it}."""
    out = {}

    def visit(node, scope):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = node.name
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and scope is None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            scope = names[0] if names else None
        out[id(node)] = scope
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(tree, None)
    return out


def _offences(path):
    src = path.read_text()
    lines = src.splitlines()
    rel = path.relative_to(ROOT).as_posix()
    tree = ast.parse(src, str(path))
    scopes = _scopes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(_names_kind(x) for x in [node.left, *node.comparators]):
            what = "compares against an allocator kind"
        elif isinstance(node, ast.Dict) and sum(_names_kind(k) for k in node.keys if k is not None) >= 2:
            what = "a table keyed by allocator kinds"
        else:
            continue
        if (rel, scopes.get(id(node))) not in ALLOWED:
            yield f"{rel}:{node.lineno}: {what}: {lines[node.lineno - 1].strip()}"


def test_no_allocator_chains_outside_the_homes():
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if HOMES in path.parents:
                continue
            found.extend(_offences(path))
    assert not found, "ask the allocator object (collectors.allocators.registry.for_kind):\n" + \
        "\n".join(found)


def test_the_walk_catches_a_chain(tmp_path):
    """The walk sees the three shapes it forbids (so the test above can fail)."""
    bad = tmp_path / "bad.py"
    bad.write_text('if kind == "jemalloc":\n    pass\n'
                   'ok = a.kind in ("glibc", "musl")\n'
                   'T = {"jemalloc": 1, "mimalloc": 2}\n')
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = list(_offences(bad))
    finally:
        ROOT = saved
    assert [f.split(":")[1] for f in found] == ["1", "3", "4"], found


def test_every_allowed_place_still_exists():
    """An allowlist entry whose function or table is gone is stale: remove it."""
    for (rel, name) in ALLOWED:
        tree = ast.parse((ROOT / rel).read_text())
        assert name in set(_scopes(tree).values()), f"{rel}: {name} is gone: drop it from ALLOWED"


def test_registry_answers_every_kind_detection_reports():
    for kind in KINDS:
        assert registry.for_kind(kind).kind == kind
    assert registry.for_kind(None) is registry.UNKNOWN


def test_homes_do_not_import_the_readers():
    """Detection imports every home; a home (and its knobs) imports its
    package's reader only where it calls it, so that a run pays for the
    reader of the allocator it reads, not for all five (issue 23)."""
    import subprocess
    import sys
    code = ("import sys, collectors.allocators.registry as r\n"
            "assert len(r.ALL) > 5\n"
            "print(sorted(m for m in sys.modules if m.endswith('.reader') or "
            "m.endswith(('tcmalloc_stats', 'mimalloc.stats', 'jemalloc.table', "
            "'mimalloc.segments', 'mimalloc.statsmain'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=60, check=True).stdout
    assert out.strip() == "[]"
    for home in registry.ALL:
        assert registry.for_kind(home.kind) is home
    # and a reader is where its home says
    import importlib
    for home in registry.ALL:
        if home.reader:
            assert hasattr(importlib.import_module(home.reader), "plan"), home.reader
