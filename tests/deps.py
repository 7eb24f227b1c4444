"""The Debian packages the project needs, read from ``tools/packages.txt``
(the one list that ``tools/bootstrap.sh`` installs), and the checks that keep
a green run on a developer's machine from hiding a missing install step.

Used three ways:

- by the tests: ``need("redis-server")``, ``need("<mimalloc.h>")``,
  ``need("-lmimalloc")`` fail the test with the package's name when what it
  provides is missing (never a compiler error);
- by ``tests/targets.py`` around every C/C++ build: ``check_build`` runs the
  compiler with ``-MD`` (every header it read) and ``-Wl,--trace`` (every
  library and object it linked) and fails when one of them comes from a
  package the list does not name (nor pulls in as a dependency);
- as a script, before the suite (``sh tools/bootstrap.sh test`` and so
  ``.ci/run``): ``python3 tests/deps.py check`` verifies that every listed
  package is installed and preprocesses every C/C++ source of the repository
  the same way.

No pytest import at module level: the script runs with the system python.
"""

import contextlib
import functools
import os
import re
import shutil
import subprocess
import sys
from collections import namedtuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES_FILE = os.path.join(ROOT, "tools", "packages.txt")

Package = namedtuple("Package", "name purpose provides")

# What the compiler itself ships (gcc's own headers such as <stddef.h>, crt
# objects, libgcc): allowed because "gcc" is on the list, found through its
# dependency closure below.  Source directories whose builds are checked:
SOURCE_DIRS = ("tests/targets", "examples", "bench")
SOURCE_EXTS = (".c", ".cc", ".cpp")


class MissingDependency(Exception):
    """Something a test or build needs is not installed, or comes from a
    package that tools/packages.txt does not name."""


def load(path=PACKAGES_FILE):
    """[Package] in file order."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].split()
            if not line:
                continue
            if len(line) < 2 or line[1] not in ("run", "test"):
                raise ValueError(f"{path}: bad line {' '.join(line)!r} "
                                 "(expected PACKAGE run|test PROVIDES...)")
            out.append(Package(line[0], line[1], tuple(line[2:])))
    return out


def provider(what, packages=None):
    """The listed package that provides WHAT (a command, <header>, -lNAME or
    an absolute path), or None."""
    for p in packages or load():
        if what in p.provides:
            return p.name
    return None


@functools.lru_cache(maxsize=None)
def _dpkg_status():
    """{package: (installed, [dependency names])} of every package dpkg knows."""
    if shutil.which("dpkg-query") is None:
        return {}
    res = subprocess.run(["dpkg-query", "-W", "-f",
                          "${Package}\t${Status}\t${Depends}, ${Pre-Depends}\t${Provides}\n"],
                         capture_output=True, text=True)
    out = {}
    for line in res.stdout.splitlines():
        name, status, deps, provides = (line.split("\t") + ["", "", ""])[:4]
        installed = status.endswith(" installed")
        names = [alt.split()[0].split(":")[0]
                 for dep in deps.split(",") for alt in dep.split("|") if alt.strip()]
        entry = (installed, names)
        if installed or name not in out:
            out[name] = entry
        # a virtual package name resolves to the real ones that provide it
        for virt in provides.split(","):
            virt = virt.strip().split(" ")[0]
            if virt and installed:
                prev = out.get(virt, (True, []))
                out[virt] = (True, prev[1] + [name])
    return out


def installed(name):
    st = _dpkg_status()
    return not st or st.get(name, (False, []))[0]   # no dpkg: nothing to check


def allowed_packages(packages=None):
    """The listed packages and everything they depend on (installed ones)."""
    return _closure(frozenset(p.name for p in (packages or load())))


@functools.lru_cache(maxsize=None)
def _closure(names):
    st = _dpkg_status()
    todo = list(names)
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        ok, deps = st.get(name, (False, []))
        if ok:
            todo.extend(deps)
    return frozenset(seen)


def need(what, packages=None):
    """Fail (in a test) or raise when WHAT is missing, naming its package."""
    pkg = provider(what, packages)
    present = _present(what)
    if present and (pkg is None or installed(pkg)):
        return what
    if pkg is None:
        msg = (f"{what} is needed but no package in tools/packages.txt provides it: "
               "add the Debian package that does")
    else:
        msg = (f"{what} is missing: install Debian package {pkg} "
               "(sh tools/bootstrap.sh test installs everything in tools/packages.txt)")
    _fail(msg)


def go():
    """The Go toolchain of the Debian package (golang-go), never another one
    on PATH (a /usr/local/go on a development box is not what a fresh
    machine has: its pprof, for one, prints merged samples differently)."""
    return need(GO)


GO = "/usr/bin/go"


def _present(what):
    if what.startswith("/"):
        return os.path.exists(what)
    if what.startswith("<"):
        return _header_path(what[1:-1]) is not None
    if what.startswith("-l"):
        return _library_path(what[2:]) is not None
    return shutil.which(what) is not None


def _header_path(header):
    res = subprocess.run(["gcc", "-M", "-x", "c", "-"], input=f"#include <{header}>\n",
                         capture_output=True, text=True)
    for word in res.stdout.split():
        if word.endswith("/" + header):
            return word
    return None


def _library_path(lib):
    for ext in (".so", ".a"):
        res = subprocess.run(["gcc", f"-print-file-name=lib{lib}{ext}"],
                             capture_output=True, text=True)
        if os.path.isabs(res.stdout.strip()):
            return res.stdout.strip()
    return None


def _fail(msg):
    if "pytest" in sys.modules:
        import pytest
        pytest.fail(msg, pytrace=False)
    raise MissingDependency(msg)


# ---- which package owns a file ------------------------------------------------

_owner_cache = {}


def owners(paths):
    """{path: package or None} for files on disk (dpkg -S, cached)."""
    todo = []
    for p in paths:
        if p not in _owner_cache:
            todo.append(p)
    if todo and shutil.which("dpkg") is not None:
        # dpkg records paths as the package shipped them: try the path as
        # given, normalised, and resolved (usrmerge: /lib -> /usr/lib).
        variants = {}
        for p in todo:
            for v in {p, os.path.normpath(p), os.path.realpath(p),
                      re.sub(r"^/usr(/lib|/bin|/sbin)", r"\1", os.path.realpath(p))}:
                variants.setdefault(v, set()).add(p)
        res = subprocess.run(["dpkg", "-S", *sorted(variants)], capture_output=True, text=True)
        for line in res.stdout.splitlines():
            pkgs, _, path = line.partition(": ")
            if "diversion" in pkgs or path not in variants:
                continue
            for orig in variants[path]:
                _owner_cache[orig] = pkgs.split(",")[0].split(":")[0].strip()
    for p in todo:
        _owner_cache.setdefault(p, None)
    return {p: _owner_cache[p] for p in paths}


def unlisted(paths, packages=None):
    """[(path, package)] of PATHS owned by packages outside the allowed set.
    Files no package owns (built here, in a temp dir) are fine."""
    allowed = allowed_packages(packages)
    out = []
    for path, pkg in owners([p for p in paths if p.startswith("/") and
                             not p.startswith(ROOT)]).items():
        if pkg is not None and pkg not in allowed:
            out.append((path, pkg))
    return out


def check_build(cmd, source, packages=None):
    """Run the compiler command CMD (a list; its output path after -o) with
    dependency tracing and check that every header and library it used comes
    from a listed package.  Returns the CompletedProcess; raises
    MissingDependency (or fails the test) naming the package."""
    packages = packages or load()
    _precheck(source, cmd, packages)
    depfile = cmd[cmd.index("-o") + 1] + ".d"
    traced = [*cmd, "-MD", "-MF", depfile]
    linking = not any(f in cmd for f in ("-c", "-E", "-S", "-fsyntax-only"))
    if linking:
        traced.append("-Wl,--trace")
    res = subprocess.run(traced, capture_output=True, text=True)
    if res.returncode != 0:
        return res
    used = []
    with contextlib.suppress(OSError):
        with open(depfile) as f:
            used += f.read().replace("\\\n", " ").split()[1:]
    with contextlib.suppress(OSError):
        os.unlink(depfile)
    if linking:
        for line in res.stdout.splitlines():
            line = line.strip()
            m = re.match(r"^(?:\S+\()?(/[^()\s]+)\)?$", line)
            if m:
                used.append(m.group(1))
    bad = unlisted(sorted(set(used)), packages)
    if bad:
        lines = "; ".join(f"{path} (package {pkg})" for path, pkg in bad[:8])
        _fail(f"building {os.path.relpath(source, ROOT)} used files from packages that "
              f"tools/packages.txt does not name: {lines}. Add them there so a fresh "
              "machine installs them.")
    return res


def _precheck(source, cmd, pkgs):
    """Name the package before the compiler fails on a missing header or -l."""
    wanted = []
    try:
        with open(source, errors="replace") as f:
            wanted += [f"<{h}>" for h in re.findall(r"#\s*include\s*<([^>]+)>", f.read())]
    except OSError:
        pass
    wanted += [a for a in cmd if a.startswith("-l")]
    wanted += [a for a in cmd if a.startswith("/usr/")]
    for what in wanted:
        pkg = provider(what, pkgs)
        if pkg is not None and not installed(pkg):
            _fail(f"{os.path.relpath(source, ROOT)} needs {what}: install Debian package {pkg} "
                  "(sh tools/bootstrap.sh test installs everything in tools/packages.txt)")


# ---- the pre-suite check --------------------------------------------------------

def repo_sources():
    out = []
    for d in SOURCE_DIRS:
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            if "/." in base:
                continue
            out += [os.path.join(base, f) for f in files if f.endswith(SOURCE_EXTS)]
    return sorted(out)


def check(purpose="test"):
    """Problems, as lines: listed packages not installed; headers of the
    repository's C/C++ sources that come from unlisted packages."""
    problems = []
    pkgs = [p for p in load() if purpose == "test" or p.purpose == "run"]
    for p in pkgs:
        if not installed(p.name):
            problems.append(f"package {p.name} ({p.purpose}) is not installed")
    if problems:
        return problems
    for src in repo_sources():
        compiler = "g++" if src.endswith((".cc", ".cpp")) else "gcc"
        res = subprocess.run([compiler, "-M", "-w", src], capture_output=True, text=True)
        if res.returncode != 0:
            err = res.stderr.strip().splitlines()
            problems.append(f"{os.path.relpath(src, ROOT)}: cannot be preprocessed: "
                            f"{err[0] if err else 'compiler failed'}")
            continue
        words = res.stdout.replace("\\\n", " ").split()[2:]
        for path, pkg in unlisted(words):
            problems.append(f"{os.path.relpath(src, ROOT)} includes {path} from package {pkg}, "
                            "which tools/packages.txt does not name")
    return problems


def main(argv):
    if argv[1:2] == ["list"]:
        purpose = argv[2] if len(argv) > 2 else "test"
        print(" ".join(p.name for p in load() if purpose == "test" or p.purpose == "run"))
        return 0
    if argv[1:2] == ["check"]:
        problems = check(argv[2] if len(argv) > 2 else "test")
        for line in problems:
            print(f"deps: {line}", file=sys.stderr)
        if not problems:
            print(f"deps: {len(load())} packages in tools/packages.txt installed; "
                  f"{len(repo_sources())} C/C++ sources use only listed packages", file=sys.stderr)
        return 1 if problems else 0
    print("usage: python3 tests/deps.py list [run|test] | check [run|test]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
