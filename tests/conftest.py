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
