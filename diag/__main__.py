import sys

from diag.cli import entry

sys.exit(entry())
