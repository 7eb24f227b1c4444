"""Human-readable text for the CLI: byte sizes, aligned tables, sections."""

import os
import shutil
import sys

from diag.fields import BY_NAME

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n):
    """1536 -> '1.5 KiB'; None -> '-' (unknown is never shown as 0)."""
    if n is None:
        return "-"
    v = float(n)
    for unit in _UNITS:
        if abs(v) < 1024 or unit == _UNITS[-1]:
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return str(n)


def pct(part, whole):
    if part is None or not whole:
        return ""
    return f"{100.0 * part / whole:.0f}%"


def table(rows, headers, right=(), out=None, max_width=None):
    """Print ROWS (lists of str) under HEADERS, columns aligned; indexes in
    RIGHT are right-aligned.  The last column is cut to the terminal width."""
    out = out or sys.stdout
    cols = len(headers)
    widths = [len(h) for h in headers]
    for r in rows:
        for i in range(cols):
            widths[i] = max(widths[i], len(r[i]))
    if max_width is None:
        max_width = shutil.get_terminal_size((160, 24)).columns if out.isatty() else 10_000
    fixed = sum(widths[:-1]) + 2 * (cols - 1)
    widths[-1] = max(8, min(widths[-1], max_width - fixed))

    def fmt(r):
        cells = []
        for i in range(cols):
            cell = r[i] if i < cols - 1 else r[i][:widths[i]]
            cells.append(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]))
        return "  ".join(cells).rstrip()

    print(fmt(headers), file=out)
    for r in rows:
        print(fmt(r), file=out)


def kv(pairs, out=None, indent="  "):
    """Aligned 'label  value' lines."""
    out = out or sys.stdout
    width = max((len(k) for k, _ in pairs), default=0)
    for k, v in pairs:
        print(f"{indent}{k.ljust(width)}  {v}", file=out)


def label(name):
    return BY_NAME[name].label


def use_color(stream=sys.stdout):
    return stream.isatty() and "NO_COLOR" not in os.environ
