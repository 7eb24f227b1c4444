"""The layout keeps the design: arrows run one way, no import circles.

The allowed arrows are read from docs/architecture.md's layers table, so the
page and this test cannot drift apart.  Every import in collectors/, diag/ and
tui/ counts: module level, inside functions, and literal
``importlib.import_module("...")`` names."""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("collectors", "diag", "tui")
DOC = os.path.join(ROOT, "docs", "architecture.md")


# -- the rules, from the page ---------------------------------------------------

def read_layers(text):
    """{layer: (prefixes, allowed layers)} from the "## Layers" table."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("layer", "") or set(cells[0]) <= set("-"):
            continue
        prefixes = tuple(re.findall(r"`([\w.]+)`", cells[1]))
        allowed = tuple(a.strip() for a in cells[2].split(","))
        layers[cells[0]] = (prefixes, allowed)
    return layers


def layer_of(module, layers):
    best, best_len = None, -1
    for name, (prefixes, _) in layers.items():
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = name, len(p)
    return best


# -- the code's arrows ----------------------------------------------------------

def module_files(root=ROOT):
    """{dotted module name: path} of every module of ours."""
    out = {}
    for pkg in PACKAGES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, pkg)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), root)[:-3]
                    name = rel.replace(os.sep, ".")
                    out[name.removesuffix(".__init__")] = os.path.join(dirpath, f)
    return out


def _target(name, modules):
    """NAME, or the longest prefix of it that is one of our modules."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def arrows(modules):
    """[(from module, to module, line)] for every import of one of ours."""
    out = []
    for mod, path in modules.items():
        is_pkg = path.endswith("__init__.py")
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = mod.split(".")
                    anchor = parts if is_pkg else parts[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # "from pkg import mod" names a module; "from mod import name" does not
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                         for a in node.names]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
                  and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)):
                names = [node.args[0].value]
            for n in names:
                t = _target(n, modules)
                if t and t != mod:
                    out.append((mod, t, node.lineno))
    return out


def forbidden(arrow_list, layers, modules):
    bad = []
    for src, dst, line in arrow_list:
        a, b = layer_of(src, layers), layer_of(dst, layers)
        if a is None or b is None or b not in layers[a][1]:
            bad.append(f"{os.path.relpath(modules[src], ROOT)}:{line}: {src} ({a}) imports "
                       f"{dst} ({b}); {a} may import {', '.join(layers[a][1]) if a else '?'}")
    return bad


def circles(arrow_list):
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {}
    for src, dst, _ in arrow_list:
        graph.setdefault(src, set()).add(dst)
        graph.setdefault(dst, set())
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


# -- the tests ------------------------------------------------------------------

@pytest.fixture(scope="module")
def layout():
    with open(DOC, encoding="utf-8") as f:
        layers = read_layers(f.read())
    modules = module_files()
    return layers, modules, arrows(modules)


def test_the_page_names_five_layers(layout):
    layers, _, _ = layout
    assert set(layers) == {"app", "tui", "core", "collectors", "model"}
    assert layers["model"][1] == ("model",)


def test_every_module_is_in_a_layer(layout):
    layers, modules, _ = layout
    assert [m for m in modules if layer_of(m, layers) is None] == []


def test_arrows_run_one_way(layout):
    layers, modules, arrow_list = layout
    bad = forbidden(arrow_list, layers, modules)
    assert not bad, "imports the layers table does not allow:\n" + "\n".join(bad)


def test_no_import_circles(layout):
    _, modules, arrow_list = layout
    found = circles(arrow_list)
    detail = []
    for comp in found:
        ties = [f"  {s} -> {d} (line {n})" for s, d, n in arrow_list if s in comp and d in comp]
        detail.append(" <-> ".join(comp) + "\n" + "\n".join(ties))
    assert not found, "import circles:\n" + "\n".join(detail)


def test_the_page_describes_every_collectors_package(layout):
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    pkgs = sorted(d for d in os.listdir(os.path.join(ROOT, "collectors"))
                  if os.path.isfile(os.path.join(ROOT, "collectors", d, "__init__.py")))
    assert [p for p in pkgs if f"`collectors/{p}/`" not in text] == []


# the checker itself: it must see what it is meant to catch

def test_checker_names_a_backward_arrow_and_a_circle(tmp_path):
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "diag" / "model").mkdir()
    (tmp_path / "diag" / "model" / "__init__.py").write_text("")
    (tmp_path / "collectors" / "a.py").write_text("def f():\n    from diag import b\n")
    (tmp_path / "diag" / "b.py").write_text("import importlib\nimportlib.import_module('collectors.a')\n")
    (tmp_path / "tui" / "c.py").write_text("from collectors import a\n")
    with open(DOC, encoding="utf-8") as f:
        layers = read_layers(f.read())
    modules = module_files(str(tmp_path))
    arrow_list = arrows(modules)
    bad = forbidden(arrow_list, layers, modules)
    assert any("collectors.a (collectors) imports diag.b (core)" in b and ":2:" in b for b in bad)
    assert any("tui.c (tui) imports collectors.a (collectors)" in b for b in bad)
    assert circles(arrow_list) == [["collectors.a", "diag.b"]]
