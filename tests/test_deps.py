"""tools/packages.txt is the one list of Debian packages; tests/deps.py makes
a build or a test that needs something outside it fail with the package's
name.  These tests use a reduced copy of the list to show each check fires."""

import os
import subprocess

import pytest

import deps
import targets


def _without(name):
    return [p for p in deps.load() if p.name != name]


def test_list_parses_and_names_what_the_targets_need():
    names = {p.name for p in deps.load()}
    assert {"libjemalloc2", "libgoogle-perftools-dev", "libmimalloc-dev", "gcc"} <= names
    assert deps.provider("<mimalloc.h>") == "libmimalloc-dev"
    assert deps.provider("-ltcmalloc") == "libgoogle-perftools-dev"


def test_build_against_an_unlisted_package_fails_naming_it(tmp_path):
    src = os.path.join(targets.SOURCES, "capture_mimalloc.c")
    cmd = ["gcc", "-O1", "-o", str(tmp_path / "t"), src, "-lmimalloc", "-lpthread"]
    with pytest.raises(pytest.fail.Exception) as e:
        deps.check_build(cmd, src, packages=_without("libmimalloc-dev"))
    assert "libmimalloc-dev" in str(e.value) and "mimalloc.h" in str(e.value)
    # with the real list the same build passes
    assert deps.check_build(cmd, src).returncode == 0


def test_missing_package_is_named_before_the_compiler_runs(tmp_path):
    src = os.path.join(targets.SOURCES, "capture_tcmalloc.c")
    fake = [deps.Package("no-such-package-allocdiag", "test", ("<gperftools/malloc_extension_c.h>",))]
    cmd = ["gcc", "-o", str(tmp_path / "t"), src]
    with pytest.raises(pytest.fail.Exception) as e:
        deps.check_build(cmd, src, packages=fake + deps.load())
    assert "install Debian package no-such-package-allocdiag" in str(e.value)


def test_need_names_the_package():
    fake = [deps.Package("no-such-package-allocdiag", "test", ("no-such-command-allocdiag",))]
    with pytest.raises(pytest.fail.Exception) as e:
        deps.need("no-such-command-allocdiag", packages=fake)
    assert "no-such-package-allocdiag" in str(e.value)
    assert deps.need("gcc") == "gcc"


def test_presuite_check_passes_here():
    r = subprocess.run(["python3", os.path.join(deps.ROOT, "tests", "deps.py"), "check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
