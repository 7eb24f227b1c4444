import os
import sys

# Run from a checkout without installing: make the packages importable.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    config.addinivalue_line("markers", "soak: long safety runs (CI runs a bounded version)")
    config.addinivalue_line("markers", "fuzz: long property-based parser runs (CI runs a "
                                       "bounded, derandomized version)")
    config.addinivalue_line("markers", "needs_go: needs the Go toolchain")



# -- invariant hook: every snapshot any test takes (in this process, in a
# module fixture, or in a CLI subprocess, which inherits the variable) is
# checked by diag.model.invariant_violations (see diag.invariants); a
# violation fails the test during which it was written, with both numbers.
import signal  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

_INVARIANTS = {"path": None, "seen": 0}
# The suite's own detection cache (collectors.binary.diskcache), shared by
# its tests and their CLI subprocesses and removed at the end: a run must
# neither fill the user's ~/.cache/allocdiag nor meet entries another
# checkout wrote there (each tree's entries are foreign to the other's).
_CACHE = {"dir": None}


def pytest_sessionstart(session):
    from diag import invariants
    # A suite started as a background job without job control (`cmd &` in a
    # script, nohup) inherits SIGINT ignored, and every process it starts
    # would too: the tests that press Ctrl-C on allocdiag would wait for
    # nothing.  A handled signal is reset to its default across exec, an
    # ignored one is not: take SIGINT back for this process and its children.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _CACHE["dir"] = tempfile.mkdtemp(prefix="allocdiag-test-cache-")
    os.environ["XDG_CACHE_HOME"] = _CACHE["dir"]
    fd, path = tempfile.mkstemp(prefix="allocdiag-invariants-")
    os.close(fd)
    _INVARIANTS["path"] = path
    os.environ[invariants.ENV] = path


def pytest_sessionfinish(session):
    if _INVARIANTS["path"]:
        os.unlink(_INVARIANTS["path"])
    if _CACHE["dir"]:
        import shutil
        shutil.rmtree(_CACHE["dir"], ignore_errors=True)


@pytest.fixture(autouse=True)
def _snapshot_invariants():
    yield
    with open(_INVARIANTS["path"], "rb") as f:
        f.seek(_INVARIANTS["seen"])
        new = f.read()
    _INVARIANTS["seen"] += len(new)
    if new:
        pytest.fail("snapshot invariant violated:\n" + new.decode(errors="replace"),
                    pytrace=False)
