"""Text hygiene shared by the output formats."""

from __future__ import annotations

import re

# C0 controls except \t and \n, DEL, and C1 controls. \r is handled separately (see below).
_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# Lone surrogates come from undecodable bytes (surrogateescape) or broken engine output;
# they cannot be encoded as UTF-8 and would make the write fail, so they go too.
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Remove characters that have no business in a Markdown/JSON file.

    Windows/old-Mac line ends become \\n (dropping \\r would glue lines together); NUL,
    other control characters and lone surrogates are removed. Nothing else is escaped.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL_RE.sub("", text)
    return _SURROGATE_RE.sub("", text)
