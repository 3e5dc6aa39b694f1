"""`<stem>_content_list.json`: MinerU's flat block list, in reading order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from daemon.formats.text import (
    CODE_TYPES,
    EQUATION_TYPES,
    IMAGE_TYPES,
    TITLE_TYPES,
    bbox_1000,
    clean_text,
    heading_level,
    strip_lines,
    unwrap_latex,
)
from daemon.page import LIST, TABLE, Block


def _content_entry(block: Block, page_idx: int) -> dict[str, Any]:
    entry: dict[str, Any]
    text = clean_text(block.text)
    if block.type == TABLE:
        entry = {
            "type": "table",
            "img_path": "",
            "table_caption": [],
            "table_footnote": [],
            "table_body": clean_text(block.html) if block.html else "",
        }
        if not block.html and text:
            # No HTML structure was recognised; keep the plain text rather than lose it.
            entry["text"] = text
    elif block.type in EQUATION_TYPES:
        latex = unwrap_latex(clean_text(block.latex if block.latex else block.text))
        entry = {"type": "equation", "text": f"$$\n{latex}\n$$", "text_format": "latex"}
    elif block.type in IMAGE_TYPES:
        entry = {"type": block.type, "img_path": "", "image_caption": [], "image_footnote": []}
    elif block.type == LIST:
        # MinerU 2.5 (VLM backend) lists: sub_type + one string per item.
        items = [line.rstrip() for line in text.split("\n") if line.strip()]
        entry = {"type": "list", "sub_type": "text", "list_items": items}
    elif block.type in CODE_TYPES:
        entry = {
            "type": "code",
            "sub_type": block.type,  # "code" | "algorithm"
            "code_body": strip_lines(text),
            "code_caption": [],
        }
    else:
        level = heading_level(block)
        # MinerU has no "title" entry type: a title is text with a text_level.
        entry = {"type": "text" if block.type in TITLE_TYPES else block.type, "text": text}
        if level > 0:
            entry["text_level"] = level
    entry["bbox"] = bbox_1000(block.bbox)
    entry["page_idx"] = page_idx
    return entry


def content_list(pages: Sequence[Sequence[Block]]) -> list[dict[str, Any]]:
    """MinerU-compatible `<stem>_content_list.json` entries, every block, in reading order
    (page furniture included, as MinerU 2.5 does)."""
    return [_content_entry(b, page_idx) for page_idx, page in enumerate(pages) for b in page]
