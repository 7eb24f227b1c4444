"""What a bench script measures: the checkout it is in.

A script run as ``python bench/X.py`` has bench/ on its path, not the
checkout, so ``import diag`` (and the ``allocdiag`` command it starts)
found whatever allocdiag the Python had installed, however old: a stale
copy was measured without a word.  ``use()`` puts the checkout first, for
this process and, through PYTHONPATH, for the commands it starts; a
PYTHONPATH already set (comparing two versions) is left as it is.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def use() -> str:
    """The tree measured: the checkout, or the given PYTHONPATH."""
    given = os.environ.get("PYTHONPATH")
    if given:
        return given
    os.environ["PYTHONPATH"] = ROOT
    sys.path.insert(0, ROOT)
    return ROOT
