"""`<stem>.md`: the document as Markdown, MinerU-style."""

from __future__ import annotations

import re
from collections.abc import Sequence

from daemon.formats.text import (
    CODE_TYPES,
    EQUATION_TYPES,
    IMAGE_TYPES,
    MD_DROPPED,
    clean_text,
    heading_level,
    strip_lines,
    unwrap_latex,
)
from daemon.page import LIST, TABLE, Block


def _fence(code: str) -> str:
    # A fence longer than any backtick run inside, so code containing ``` stays code.
    longest = max((len(m) for m in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{code}\n{fence}"


def _block_markdown(block: Block, image_path: str | None = None) -> str:
    if block.type in MD_DROPPED:
        return ""
    if block.md is not None:
        return strip_lines(clean_text(block.md))
    text = clean_text(block.text)
    level = heading_level(block)
    if level:
        heading = " ".join(text.split())  # a heading is one line
        return f"{'#' * level} {heading}" if heading else ""
    if block.type == TABLE:
        if block.html:
            return strip_lines(clean_text(block.html))
        return strip_lines(text)
    if block.type in EQUATION_TYPES:
        latex = unwrap_latex(clean_text(block.latex if block.latex else block.text))
        return f"$$\n{strip_lines(latex)}\n$$" if latex else ""
    if block.type in CODE_TYPES:
        code = strip_lines(text)
        return _fence(code) if code else ""
    if block.type in IMAGE_TYPES:
        # No crop was saved for this image, so there is nothing to link to.
        return f"![]({image_path})" if image_path else ""
    if block.type == LIST:
        return strip_lines(text)  # items one per line, as the engine wrote them
    return strip_lines(text.strip())


def pages_to_markdown(pages: Sequence[Sequence[Block]]) -> str:
    """The document's Markdown, MinerU-style, in the reading order given.

    Blocks are separated by one blank line; headers, footers and page numbers are left out
    (they are in content_list.json); the result ends with exactly one newline.
    """
    parts = [md for page in pages for b in page if (md := _block_markdown(b))]
    return "\n\n".join(parts) + "\n"
