"""Exit codes of every allocdiag command (DESIGN.md "Output contracts"),
defined once.  The exception family (diag.model.errors) carries the code of
each error class; the CLI, --help texts and docs read them from here.  Like
diag.model it imports nothing of allocdiag's, so collectors may import it."""

import enum
import textwrap


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

HELP = "exit codes:\n" + "".join(
    textwrap.fill(m, 88, initial_indent=f"  {int(c)}  ", subsequent_indent="     ") + "\n"
    for c, m in MEANINGS.items())
