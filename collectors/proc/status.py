"""/proc/PID/status (fs/proc/array.c ``proc_pid_status``): "Key:\\tvalue"
lines, memory figures in kB."""

from __future__ import annotations

from diag.model.errors import MalformedData

KB = 1024
KB_SUFFIX = b" kB"


def parse_status(data: bytes) -> dict[bytes, bytes]:
    """/proc/PID/status bytes as {bytes key: bytes value} (values stripped)."""
    out = {}
    for line in data.split(b"\n"):
        key, sep, value = line.partition(b":")
        if sep:
            out[key] = value.strip()
    return out


def kb_field(status: dict[bytes, bytes], key: bytes) -> int | None:
    """STATUS[KEY] ("N kB") in bytes; None when absent or not in kB."""
    v = status.get(key)
    if not v or not v.endswith(KB_SUFFIX):
        return None
    return status_int(key, v.removesuffix(KB_SUFFIX)) * KB


def status_int(key: bytes, text: bytes) -> int:
    """TEXT, the value of KEY, as an int; MalformedData naming KEY if it is not one."""
    try:
        return int(text)
    except ValueError:
        raise MalformedData(f"status {key.decode(errors='replace')}: not a number: "
                            f"{text[:40]!r}") from None
