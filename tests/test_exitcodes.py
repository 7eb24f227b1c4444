"""The exit codes' help text (diag.model.exitcodes.HELP), wrapped without
textwrap: the same lines textwrap.fill gives."""

import textwrap

import pytest

from diag.model import exitcodes

# plain sentences as the table holds them, and the edges of a line: words
# that end a line exactly (a word of 80 after the 5-character indent, then
# one of 1, make 87 and 88 characters)
SENTENCES = [*exitcodes.MEANINGS.values(), "", "one", "a " * 60,
             "exactly eighty-eight characters " * 3, "x" * 80 + " y", "x" * 80 + " y z"]
WIDTHS = [40, 60, exitcodes.HELP_WIDTH]
INDENT = 5


@pytest.mark.parametrize("text, width", [
    (text, width) for text in SENTENCES for width in WIDTHS
    # what _fill is for: no word longer than a line
    if max(map(len, text.split()), default=0) <= width - INDENT])
def test_fill_is_textwraps(text, width):
    want = textwrap.fill(text, width, initial_indent="  2  ", subsequent_indent="     ",
                         break_on_hyphens=False)
    assert exitcodes._fill(text, width, "  2  ", "     ") == (want or "  2  ")


def test_help_lists_every_code_once():
    lines = exitcodes.HELP.splitlines()
    assert lines[0] == "exit codes:"
    listed = [int(line.split()[0]) for line in lines[1:] if not line.startswith("     ")]
    assert listed == [int(c) for c in exitcodes.MEANINGS]
    assert max(map(len, lines)) <= exitcodes.HELP_WIDTH
