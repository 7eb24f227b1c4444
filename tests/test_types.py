"""Type hints are checked: mypy over collectors/, diag/ and tui/ with the
settings in pyproject.toml (strict for the engine and the model), and each
package ships py.typed (PEP 561) so a program that imports it is checked too."""

import importlib.resources
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mypy_passes():
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_strict_sections_name_the_engine_and_the_model():
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        conf = tomllib.load(f)["tool"]["mypy"]
    strict = [o for o in conf["overrides"] if o.get("disallow_untyped_defs")]
    modules = {m for o in strict for m in o["module"]}
    assert {"collectors.engine.*", "diag.model", "diag.model.*"} <= modules


@pytest.mark.parametrize("package", ["collectors", "diag", "tui"])
def test_package_ships_py_typed(package):
    assert importlib.resources.files(package).joinpath("py.typed").is_file()
