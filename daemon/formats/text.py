"""Text hygiene and geometry shared by the output formats."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from daemon.page import CODE, EQUATION, FOOTER, HEADER, IMAGE, PAGE_NUMBER, TEXT, TITLE, Block

# C0 controls except \t and \n, DEL, and C1 controls. \r is handled separately (see below).
_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# Lone surrogates come from undecodable bytes (surrogateescape) or broken engine output;
# they cannot be encoded as UTF-8 and would make the write fail, so they go too.
_SURROGATE_RE = re.compile("[\ud800-\udfff]")

# Page furniture: MinerU leaves it out of the Markdown (it repeats on every page and breaks
# paragraphs), but it stays in content_list.json so nothing the engine saw is lost.
MD_DROPPED = frozenset({HEADER, FOOTER, PAGE_NUMBER, "aside_text"})
TITLE_TYPES = frozenset({TITLE, "doc_title", "paragraph_title"})
CODE_TYPES = frozenset({CODE, "algorithm"})
EQUATION_TYPES = frozenset({EQUATION, "equation_block"})
IMAGE_TYPES = frozenset({IMAGE, "chart", "image_block"})


def clean_text(text: str) -> str:
    """Remove characters that have no business in a Markdown/JSON file.

    Windows/old-Mac line ends become \\n (dropping \\r would glue lines together); NUL,
    other control characters and lone surrogates are removed. Nothing else is escaped.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL_RE.sub("", text)
    return _SURROGATE_RE.sub("", text)


def strip_lines(text: str) -> str:
    """No trailing whitespace on any line, no blank lines at either end."""
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")


def unwrap_latex(latex: str) -> str:
    """Drop display-math delimiters an engine may already have put around the formula,
    so it is not wrapped twice."""
    s = latex.strip()
    for left, right in (("$$", "$$"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            return s[len(left) : len(s) - len(right)].strip()
    return s


def bbox_1000(bbox: Sequence[float]) -> list[int]:
    """0..1 page fractions -> MinerU's 0..1000 integer grid (clamped; NaN -> 0)."""
    out: list[int] = []
    for v in list(bbox)[:4]:
        f = float(v)
        out.append(min(1000, max(0, round(f * 1000))) if math.isfinite(f) else 0)
    return out + [0] * (4 - len(out))


def heading_level(block: Block) -> int:
    """0 for body text, else 1..6. A title without a level is a top heading."""
    if block.type in TITLE_TYPES:
        return min(max(block.text_level, 1), 6)
    if block.type == TEXT and block.text_level > 0:
        # MinerU marks headings as text with a text_level; honour that from engines too.
        return min(block.text_level, 6)
    return 0
