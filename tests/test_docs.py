"""The README and the guide describe every command and link only to files
that exist: docs that match behaviour."""

import os
import re

import pytest

from diag.commands import MODULES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ("README.md", "docs/guide.md", "docs/heap-profiles.md", "docs/exporter.md",
        "docs/report.md", "docs/target-writes.md", "docs/wall.md", "examples/deploy/README.md",
        "bench/README.md", "docs/contributing.md", "docs/architecture.md")


def text(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("doc", ["README.md", "docs/guide.md"])
def test_every_command_is_described(doc):
    body = text(doc)
    missing = [name for name in MODULES if f"`allocdiag {name}" not in body
               and not (name == "top" and "`allocdiag top`" in body)]
    assert not missing, f"{doc} does not describe: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_resolve(doc):
    base = os.path.dirname(os.path.join(ROOT, doc))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text(doc)):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not os.path.exists(os.path.normpath(os.path.join(base, path))):
            broken.append(target)
    assert not broken, f"{doc}: links to missing files: {broken}"
