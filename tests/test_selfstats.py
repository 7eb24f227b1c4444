"""Self mode: a Python subprocess under each allocator's LD_PRELOAD reads its
own allocator's numbers with collectors.selfstats.snapshot_self()."""

import json
import os
import subprocess
import sys

import pytest

import targets
from diag.fields import STATS_FIELDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUFFER = 64 << 20

CODE = f"""
import json
buf = bytearray({BUFFER})           # > 512 bytes: PyMem_RawMalloc -> malloc
buf[::4096] = b"x" * len(buf[::4096])
from collectors.selfstats import snapshot_self
kind, native, stats = snapshot_self()
print(json.dumps({{"kind": kind, "path": native.get("path"), "version": native.get("version"),
                  "side_effects": native.get("side_effects"),
                  "stats": {{k: v.to_json() for k, v in stats.items()}}}}))
"""

# allocator -> (kind, provenance of "allocated")
EXPECT = {
    "glibc": ("glibc", "derived"),              # uordblks + hblkhd: a formula
    "jemalloc": ("jemalloc", "measured"),       # stats.allocated
    "tcmalloc": ("tcmalloc", "measured"),       # generic.current_allocated_bytes
    "tcmalloc_minimal": ("tcmalloc", "measured"),
    "mimalloc": ("mimalloc", "unknown"),        # release 2.0.9 does not count
}


def run_self(allocator):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    lib = targets.preload_path(allocator)
    if lib:
        env["LD_PRELOAD"] = lib
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", CODE], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("allocator", sorted(EXPECT))
def test_snapshot_self(allocator):
    out = run_self(allocator)
    kind, prov = EXPECT[allocator]
    assert out["kind"] == kind
    lib = targets.PRELOADS[allocator]
    if lib:
        assert os.path.realpath(out["path"]) == os.path.realpath(lib)
    else:
        assert "libc.so" in out["path"]
    stats = out["stats"]
    assert set(stats) == set(STATS_FIELDS)
    alloc = stats["allocated"]
    assert alloc["provenance"] == prov
    if prov == "unknown":
        assert alloc["value"] is None
        # what mimalloc does say: committed bytes, its own field -- not
        # resident (that is measured from its segments' pages by a snapshot)
        assert stats["committed"]["provenance"] == "measured"
        assert stats["committed"]["value"] > BUFFER
        assert "current_commit" in stats["committed"]["source"]
        assert stats["resident"]["value"] is None
    else:
        assert alloc["value"] > BUFFER
        assert stats["mapped"]["value"] >= alloc["value"]
    for name, v in stats.items():
        assert (v["value"] is None) == (v["provenance"] == "unknown"), name


def test_glibc_self_reports_side_effect():
    out = run_self("glibc")
    assert out["version"].startswith("2.")
    assert any("fmemopen" in s for s in out["side_effects"])
    # One heap walk: malloc_info, from which mallinfo2 is derived exactly.
    assert "malloc_info" in out["stats"]["allocated"]["source"]


def test_jemalloc_self_ordering():
    s = run_self("jemalloc")["stats"]
    assert s["allocated"]["value"] <= s["active"]["value"] <= s["resident"]["value"]
    assert s["dirty"]["provenance"] == "derived"


def test_detect_in_this_process():
    from collectors.selfstats import detect
    kind, path, _ = detect()
    expected = {"": "glibc"}.get(os.environ.get("LD_PRELOAD", ""), None)
    if expected:
        assert kind == expected
    assert kind in ("glibc", "jemalloc", "tcmalloc", "tcmalloc-google", "mimalloc")
    assert path
