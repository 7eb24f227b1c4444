"""Human-readable text for the CLI: byte sizes, aligned tables, sections."""

import os
import sys

from diag import terminal
from diag.fields import BY_NAME, evidence_unit

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
        max_width = terminal.columns(160) if out.isatty() else 10_000
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


# -- native fields, with units from collectors.schema ---------------------------
# The native document keeps the allocator's own names; its units are declared
# once per field in collectors.schema (never guessed from the key's spelling).
# Both the TUI's allocator tables and the CLI's `inspect` text use these.

def _native_path(path):
    """Keys into a native document -> the schema's path (list indices as "*")."""
    return tuple("*" if isinstance(p, int) else str(p) for p in path)


def native_field(kind, path):
    """The collectors.schema NativeField at PATH of KIND's native doc, or None."""
    from collectors import schema
    try:
        return schema.lookup(kind, _native_path(path))
    except Exception:          # an allocator the schema does not know
        return None


def native_page_size(kind, native):
    """Bytes per page as KIND's native document NATIVE declares it, or None
    (no kind, or a document that does not say)."""
    if not kind:
        return None
    from collectors import schema
    try:
        return schema.page_size(kind, native or {})
    except Exception:          # an allocator the schema does not know
        return None


def native_value(kind, path, value, page=None):
    """Text of one native number in its declared unit: bytes as bytes,
    pages as pages and bytes (PAGE = bytes per page, when the document says),
    ms as ms; undeclared fields as the bare number, never with a guessed unit."""
    f = native_field(kind, path) if kind else None
    unit = f.unit if f is not None else None
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if unit == "bytes":
            return f"{value:,} B" if abs(value) < 1024 else f"{value:,} ({human_bytes(value)})"
        if unit == "pages":
            n = "page" if value == 1 else "pages"
            return f"{value:,} {n} ({human_bytes(value * page)})" if page else f"{value:,} {n}"
        if unit == "ms":
            return f"{value:,} ms"
        if unit == "flag":
            return "true" if value else "false"
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:g} ms" if unit == "ms" else f"{value:g}"
    return str(value)


def native_rows(kind, native):
    """[(label, formatted, meaning)] for every scalar leaf of NATIVE: label is
    the dotted path, formatted is the value in its schema unit, meaning the
    schema's sentence ("" when the field is not declared)."""
    from collectors import schema
    try:
        page = schema.page_size(kind, native)
    except Exception:
        page = None
    rows = []

    def walk(value, path):
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(v, path + (k,))
        elif isinstance(value, list) and value and not all(
                v is None or isinstance(v, (str, int, float, bool)) for v in value):
            for i, v in enumerate(value):
                walk(v, path + (i,))
        else:
            f = native_field(kind, path)
            if isinstance(value, list):
                text = ", ".join(native_value(kind, path + (i,), v, page)
                                 for i, v in enumerate(value)) or "[]"
            elif isinstance(value, dict):
                text = "{}"
            else:
                text = native_value(kind, path, value, page)
            rows.append((".".join(str(p) for p in path), text, f.meaning if f else ""))
    walk(native or {}, ())
    return rows


# -- findings' evidence: one formatter for the TUI, explain and the report ----------

def evidence_text(key, value, rss=None):
    """One evidence value as the page shows it."""
    unit = evidence_unit(key)
    if value is None:
        return "unknown"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ", ".join(map(str, value)) if isinstance(value, list) else str(value)
    if unit == "bytes":
        text = f"{value:,} B ({human_bytes(value)})"
        if rss:
            text += f" = {100.0 * value / rss:.1f}% of RSS"
        return text
    if unit == "percent":
        return f"{value:g}%"
    if unit == "ratio":
        return f"{value:g}×"
    if unit == "seconds":
        return f"{value:.1f} s"
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"
