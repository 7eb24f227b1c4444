"""What makes importing a module slow stays out of allocdiag's modules
(issue 23: a CLI run imports ~100 of them, each time).

A ``typing.NamedTuple`` class under ``from __future__ import annotations``
sees its field annotations as strings, and typing compiles each into a
ForwardRef when the class is made: ~75 us a field on the slow guest, 1.8 ms
of a warm ``inspect`` for the 24 fields of maps, stat, tracee and
stackbounds.  Those modules evaluate their annotations instead."""

import ast

from test_architecture import module_files


def modules():
    """(module, syntax tree) of every module of ours."""
    for name, path in module_files().items():
        with open(path, encoding="utf-8") as f:
            yield name, ast.parse(f.read(), path)


def _postponed(tree):
    return any(isinstance(node, ast.ImportFrom) and node.module == "__future__"
               and any(a.name == "annotations" for a in node.names) for node in tree.body)


def _named_tuples(tree):
    return [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and any(getattr(b, "id", getattr(b, "attr", None)) == "NamedTuple" for b in node.bases)]


def test_no_named_tuple_class_has_string_annotations():
    found = [f"{path}: {', '.join(names)}" for path, tree in modules()
             if _postponed(tree) and (names := _named_tuples(tree))]
    assert found == []


def test_the_check_sees_a_named_tuple_under_postponed_annotations():
    tree = ast.parse("from __future__ import annotations\nimport typing\n"
                     "class A(typing.NamedTuple):\n    x: int\n")
    assert _postponed(tree) and _named_tuples(tree) == ["A"]
