"""Capture /proc/PID/maps and /proc/PID/stat of a real process whose comm and
executable path hold spaces and parentheses, and whose executable was deleted
while it ran: tests/fixtures/proc-stat-comm-parens.txt and
proc-maps-deleted-spaces.txt (tests/test_proc_parts.py parses them).

    python3 tests/targets/capture_proc.py tests/fixtures
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

NAME = "a) (b c"        # a comm with spaces and ")": fs/proc/array.c prints it raw


def main(out_dir):
    tmp = tempfile.mkdtemp(prefix="capture-proc-")
    exe = os.path.join(tmp, NAME)
    shutil.copy2("/bin/sleep", exe)
    p = subprocess.Popen([exe, "60"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:      # wait for the exec to be done
            with open(f"/proc/{p.pid}/comm", "rb") as f:
                if f.read().strip() == NAME.encode():
                    break
            time.sleep(0.01)
        os.unlink(exe)                           # maps then says "(deleted)"
        for src, dest in (("stat", "proc-stat-comm-parens.txt"),
                          ("maps", "proc-maps-deleted-spaces.txt")):
            with open(f"/proc/{p.pid}/{src}", "rb") as f:
                data = f.read()
            with open(os.path.join(out_dir, dest), "wb") as f:
                f.write(data)
    finally:
        p.kill()
        p.wait()
        shutil.rmtree(tmp, True)


if __name__ == "__main__":
    main(sys.argv[1])
