"""Exit codes of every allocdiag command (DESIGN.md "Output contracts"),
defined once.  The exception family (diag.model.errors) carries the code of
each error class; the CLI, --help texts and docs read them from here.  Like
diag.model it imports nothing of allocdiag's, so collectors may import it."""

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    INTERNAL = 1        # a bug: re-run with --debug for the traceback
    USAGE = 2
    NO_PROCESS = 3      # no such process, or it exited while being read
    DENIED = 4          # permission denied (ptrace rights, /proc access)
    UNSUPPORTED = 5     # allocator not detected, or unsupported for what was asked
    PARTIAL = 6         # some collectors failed; the document is still printed
    INTERRUPTED = 130   # Ctrl-C (128 + SIGINT, the shell's convention)


MEANINGS = {
    ExitCode.OK: "ok",
    ExitCode.INTERNAL: "internal error (a bug: please report it with the traceback from --debug)",
    ExitCode.USAGE: "usage error; also a named file that does not exist, is a directory or is "
                    "not what the command reads (the message says what was expected), and a "
                    "missing optional package (the message names the pip install line)",
    ExitCode.NO_PROCESS: "no such process (or it exited while being read, or is a zombie)",
    ExitCode.DENIED: "permission denied (run as root, or grant CAP_SYS_PTRACE; see the message)",
    ExitCode.UNSUPPORTED: "allocator not detected, or unsupported for what was asked (a kernel "
                          "thread has none)",
    ExitCode.PARTIAL: "partial: some collectors failed; the document is still printed",
}

HELP_WIDTH = 88


def _fill(text: str, width: int, first: str, rest: str) -> str:
    """TEXT's words in lines of at most WIDTH characters, the first after
    FIRST and the others after REST: textwrap.fill's greedy wrap for plain
    sentences (no word longer than a line; a hyphenated word is not broken
    at its hyphen), without importing textwrap, ~1 ms of every CLI run for a
    text only --help shows.  tests/test_exitcodes.py compares the two."""
    lines, line, empty = [], first, True
    for word in text.split():
        if not empty and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = rest + word
        else:
            line += word if empty else " " + word
        empty = False
    return "\n".join([*lines, line])


HELP = "exit codes:\n" + "".join(
    _fill(m, HELP_WIDTH, f"  {int(c)}  ", "     ") + "\n" for c, m in MEANINGS.items())
