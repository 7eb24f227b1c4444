"""``allocdiag heap``: placeholder while it is being built (owned by one helper)."""

from diag.commands.common import add_command
from diag.exitcodes import ExitCode

NAME = "heap"


def add_parser(sub):
    return add_command(sub, NAME, help="(being built)", description="(being built)")


def run(args):
    print("allocdiag heap: not built yet")
    return ExitCode.USAGE
