"""``allocdiag demo --no-tui`` on the two allocation-wall scenes (issue 20
item 6): each prints its wall -- the arena lock wait and finding for
arena_sprawl on one arena, an allocator CPU share and call sites for
alloc_wall."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _demo(*only):
    args = [a for o in only for a in ("--only", o)]
    r = subprocess.run([sys.executable, "-m", "diag", "demo", "--no-tui", *args],
                       capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return r.stdout


def test_demo_no_tui_prints_the_arena_lock_wall():
    out = _demo("arena_sprawl:glibc:busy")
    assert out.count("=== arena_sprawl") == 1 and "MALLOC_ARENA_MAX=1" in out
    wall = out.split("--- allocation wall", 1)[1]
    waited = re.search(r"allocator lock wait\s+([\d.]+) s", wall)
    assert waited and float(waited.group(1)) > 0, wall
    assert "waiting for glibc arena locks" in wall and "knob arena_max" in wall, wall
    assert "replace_one" in wall


def test_demo_no_tui_prints_the_alloc_wall_cpu_share_and_sites():
    out = _demo("alloc_wall")
    wall = out.split("--- allocation wall", 1)[1]
    share = re.search(r"allocator CPU\s+([\d.]+)%", wall)
    assert share and float(share.group(1)) > 5, wall
    assert "Call sites (first frame outside the allocator)" in wall
    assert "Allocator counters" not in wall                 # compact
