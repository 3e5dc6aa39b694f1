"""Lines of one column into paragraphs and headings, and the words a layout broke mended.

A paragraph starts at a vertical gap, an indent after a short line, a change of size or
weight, or a line beside the previous one; a line-end hyphen between letters rejoins the
word. Size against the page's body size makes a heading and its level; a short bold line on
a page mostly not bold is a sub-heading; a lone number or short line in the page's top or
bottom band is furniture (page number, running head or foot). A drop cap joins the word it
starts; a word hyphenated at a column's foot or above a picture gets its tail from the
block where the paragraph goes on.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from daemon.document.page import FOOTER, HEADER, PAGE_NUMBER, TEXT, TITLE, Block
from daemon.engines.lite.lines import Box, Line

# A line at least this many times the body size is a heading; this much more is level 1.
HEADING_RATIO = 1.3
TOP_HEADING_RATIO = 1.7
_HEADING_MAX_CHARS = 200
_HEADING_MAX_LINES = 3
_BOLD_HEADING_MAX_CHARS = 120

# A letter this many body lines tall with text beside it is a drop cap.
_DROP_CAP_LINES = 1.8

# A vertical gap between two lines larger than this many line heights starts a paragraph.
_PARAGRAPH_GAP = 0.7

# "7", "- 7 -", "Page 7", "7 / 12", "7 of 12", and roman front-matter numbers ("iii").
_PAGE_NUMBER_RE = re.compile(
    r"^\W*(page\s*)?(\d{1,4}|[ivxlc]{1,7})(\s*(/|of)\s*\d{1,4})?\W*$", re.IGNORECASE
)
_PAGE_MARGIN = 0.08  # top/bottom share of the page where page numbers live
# A single short line wholly inside these top/bottom bands is a running head or foot (a
# chapter name above every page), not a heading: headings sit below the top margin.
_HEADER_ZONE = 0.06
_FOOTER_ZONE = 0.95
_FURNITURE_MAX_CHARS = 100


@dataclass(frozen=True)
class Capped:
    """A page's lines with its drop caps joined to their words, and where the caps were
    (a layout detector may box a cap as a picture of its own)."""

    lines: list[Line]
    caps: list[Box]


def join_drop_caps(lines: Sequence[Line]) -> Capped:
    """A drop cap joined to the word it starts ("S" + "HE MOPED" -> "SHE MOPED").

    A drop cap is a letter or two, at least `_DROP_CAP_LINES` body lines tall, with body
    lines starting just right of it. The first of those lines gets the letter; every line
    beside the cap starts where the cap starts, so the paragraph keeps its left edge
    instead of looking indented.
    """
    if len(lines) < 3:
        return Capped(list(lines), [])
    caps: list[Box] = []
    typical = statistics.median(ln.height for ln in lines)
    out = list(lines)
    for cap in [ln for ln in lines if _drop_cap_shaped(ln, typical)]:
        reach = cap.bbox[2] + (cap.bbox[2] - cap.bbox[0]) * 1.5
        beside = sorted(
            (
                ln
                for ln in out
                if ln is not cap
                # OCR's boxes are loose: the line's box may reach back over the cap's.
                and cap.bbox[0] + 0.5 * (cap.bbox[2] - cap.bbox[0]) <= ln.bbox[0] <= reach
                and ln.bbox[1] < cap.bbox[3]
                and ln.bbox[3] > cap.bbox[1]
                and ln.height < 1.5 * typical
            ),
            key=lambda ln: ln.bbox[1],
        )
        if not beside or beside[0].cy > cap.bbox[1] + 0.5 * cap.height:
            continue
        first = beside[0]
        caps.append(cap.bbox)
        moved = {id(ln): ln for ln in beside}
        out = [
            replace(
                ln,
                text=cap.text.strip() + ln.text if ln is first else ln.text,
                bbox=(cap.bbox[0], *ln.bbox[1:]),
            )
            if id(ln) in moved
            else ln
            for ln in out
            if ln is not cap
        ]
    return Capped(out, caps)


def _drop_cap_shaped(ln: Line, typical: float) -> bool:
    text = ln.text.strip()
    return 1 <= len(text) <= 2 and text.isalpha() and ln.height >= _DROP_CAP_LINES * typical


_SPLIT_WORD_HEAD = re.compile(r"[^\W\d_]-$")
# How many blocks (a picture, its caption, a running foot) may stand between a word's
# head at a column's foot and its tail.
_SPLIT_WORD_REACH = 3


def mend_split_words(blocks: list[Block]) -> list[Block]:
    """A word hyphenated at the foot of a column, or above a picture, made whole again.

    The paragraph goes on at the head of the next column (or below the picture), which
    is another block, maybe after the picture and its caption: a text block that starts
    in lower case after a block ending in "letter-" is that paragraph's continuation.
    The head of the word ("conse-") gets its tail ("ctetuer") and the next block starts
    after it.
    """
    out = list(blocks)
    for k, block in enumerate(out):
        if block.type != TEXT or not block.text[:1].islower():
            continue
        for j in range(k - 1, max(-1, k - 1 - _SPLIT_WORD_REACH), -1):
            prev = out[j]
            if prev.type == TITLE:
                break
            if prev.type == TEXT and _SPLIT_WORD_HEAD.search(prev.text):
                tail, _, rest = block.text.partition(" ")
                out[j] = replace(prev, text=prev.text[:-1] + tail)
                out[k] = replace(block, text=rest)
                break
    return out


def is_page_number(text: str) -> bool:
    # "−1" or "-1" alone is a number in a formula, not a page number ("- 7 -" is one).
    stripped = text.strip()
    if stripped[:1] in ("-", "−", "–") and stripped[-1:] not in ("-", "−", "–"):
        return False
    return bool(_PAGE_NUMBER_RE.match(stripped))


def _heading_level(size: float, body: float) -> int:
    if body <= 0 or size < HEADING_RATIO * body:
        return 0
    return 1 if size >= TOP_HEADING_RATIO * body else 2


def starts_paragraph(para: list[Line], ln: Line, body: float) -> bool:
    prev = para[-1]
    if ln.bbox[0] >= prev.bbox[2] or ln.bbox[2] <= prev.bbox[0]:
        return True  # side by side, not one under the other: another column or cell
    height = min(prev.height, ln.height)
    if ln.bbox[1] - prev.bbox[3] > _PARAGRAPH_GAP * height:
        return True
    if ln.bbox[1] < prev.bbox[1] - 0.5 * height:  # moved up: not a continuation
        return True
    if _heading_level(ln.size, body) != _heading_level(prev.size, body):
        return True
    if ln.bold != prev.bold:  # a bold run-in heading line, or bold emphasis paragraph
        return True
    # Book style (LaTeX, most typeset prose): no space between paragraphs, but the last
    # line stops short and the next one is indented.
    left = min(p.bbox[0] for p in para)
    right = max(p.bbox[2] for p in para)
    width = max(right - left, 1e-6)
    stops_short = prev.bbox[2] < right - 0.1 * width
    indented = 0.01 < ln.bbox[0] - left < 0.15 * width
    if len(para) > 1 and stops_short and indented:
        return True
    return not 0.8 <= ln.size / max(prev.size, 1e-6) <= 1.25


def join_text(lines: Sequence[Line]) -> str:
    text = ""
    for ln in lines:
        piece = ln.text.strip()
        if not text:
            text = piece
        elif text.endswith("-") and len(text) >= 2 and text[-2].isalpha() and piece[:1].islower():
            # A word hyphenated at the line end: rejoin it ("infor-" + "mation").
            text = text[:-1] + piece
        else:
            text = f"{text} {piece}"
    return text


def _mostly_letters(text: str) -> bool:
    # Bold numbers are table cells or totals, not headings.
    visible = [ch for ch in text if not ch.isspace()]
    return sum(ch.isalpha() for ch in visible) * 2 >= len(visible) > 0


def paragraph_block(para: list[Line], body: float, source: str, bold_marks: bool) -> Block:
    bbox = (
        min(ln.bbox[0] for ln in para),
        min(ln.bbox[1] for ln in para),
        max(ln.bbox[2] for ln in para),
        max(ln.bbox[3] for ln in para),
    )
    text = join_text(para)
    level = _heading_level(statistics.median(ln.size for ln in para), body)
    block_type = TEXT
    in_margin = bbox[3] <= _PAGE_MARGIN or bbox[1] >= 1 - _PAGE_MARGIN
    if len(para) == 1 and in_margin and is_page_number(text):
        return Block(type=PAGE_NUMBER, bbox=bbox, text=text, source=source)
    if len(para) == 1 and len(text) <= _FURNITURE_MAX_CHARS:
        if bbox[3] <= _HEADER_ZONE:
            return Block(type=HEADER, bbox=bbox, text=text, source=source)
        if bbox[1] >= _FOOTER_ZONE:
            return Block(type=FOOTER, bbox=bbox, text=text, source=source)
    if level and len(para) <= _HEADING_MAX_LINES and len(text) <= _HEADING_MAX_CHARS:
        block_type = TITLE
    elif (
        bold_marks
        and all(ln.bold for ln in para)
        and len(para) <= 2
        and len(text) <= _BOLD_HEADING_MAX_CHARS
        and not text.endswith((".", ",", ";", ":"))
        and _mostly_letters(text)
    ):
        # A short bold line at body size on a page that is mostly not bold: a sub-heading
        # ("5.1 Hyper Parameter Optimization"). Sentences in bold end with punctuation.
        block_type, level = TITLE, 2
    else:
        level = 0
    return Block(type=block_type, bbox=bbox, text=text, text_level=level, source=source)
