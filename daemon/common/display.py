"""Names and text made safe to show in one log line or one terminal line.

File names come from other machines and users: they may hold newlines (forged log lines),
right-to-left overrides, terminal escapes or bytes that are not UTF-8. Every module that
logs or prints a path goes through `safe_display`.
"""

from __future__ import annotations

import os


def safe_display(path_or_name: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> str:
    """A file name made harmless for one log line.

    Printable text is kept as is (so ordinary names, including non-Latin ones, read
    normally). Newlines, control and format characters (e.g. the right-to-left override)
    are shown as Python escapes, undecodable bytes as \\xNN, and a backslash is doubled so
    an escape in the output cannot be mistaken for one in the name.
    """
    raw = os.fspath(path_or_name)
    text = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that was not valid UTF-8 (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch == "\\":
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(repr(ch)[1:-1])
    return "".join(out)
