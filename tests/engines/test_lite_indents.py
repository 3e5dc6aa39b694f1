"""A column's lines read top to bottom when a paragraph's first line is indented.

OCR boxes of a real scan are loose: on the Library of Congress leaflet
(`loc-blackwell-tribute-spread`) a line's box is 0.027 of the page tall and the lines are
0.012 apart, so each box overlaps the next by more than half. Taken as rows, a
paragraph's indented first line was level with the line below it, and that line, further
left, was read first. The boxes here are those of that page.
"""

from __future__ import annotations

from daemon.document.page import TEXT, TITLE
from daemon.engines.lite.compose import compose_page
from daemon.engines.lite.lines import Line
from daemon.engines.lite.reading_order import read_page
from daemon.engines.lite.regions import TITLE as TITLE_REGION
from daemon.engines.lite.regions import Region

LEFT, RIGHT = 0.558, 0.898
INDENT = 0.017
PITCH, HEIGHT = 0.012, 0.027


def column(paragraphs: list[int], top: float = 0.2) -> list[Line]:
    """Paragraphs of the given line counts, one under the other with no space between:
    the first line of each indented, the last one short (book style)."""
    lines: list[Line] = []
    for p, count in enumerate(paragraphs):
        for k in range(count):
            y0 = top + len(lines) * PITCH
            x0 = LEFT + (INDENT if k == 0 else 0.0)
            x1 = LEFT + 0.1 if k == count - 1 else RIGHT
            lines.append(Line(text=f"p{p} l{k}", bbox=(x0, y0, x1, y0 + HEIGHT), size=68.0))
    return lines


def test_an_indented_first_line_is_read_before_the_line_below_it() -> None:
    lines = column([3, 4, 2])
    order = read_page(lines[::-1], lambda ln: ln.bbox).order
    assert [ln.text for ln in order] == [ln.text for ln in lines]


def test_each_indent_after_a_short_line_starts_a_paragraph_in_order() -> None:
    lines = column([3, 4, 2])
    laid = compose_page(lines[::-1], (), source="ocr", progress=lambda *_: None)
    assert [(b.type, b.text) for b in laid.blocks] == [
        (TEXT, "p0 l0 p0 l1 p0 l2"),
        (TEXT, "p1 l0 p1 l1 p1 l2 p1 l3"),
        (TEXT, "p2 l0 p2 l1"),
    ]


def test_pieces_of_one_line_that_touch_stay_in_one_row() -> None:
    # The recogniser split one line in two; the boxes share a sliver and the right
    # piece's box starts a little higher. Side by side, they read left to right.
    left = Line(text="left piece", bbox=(0.1, 0.301, 0.52, 0.328), size=68.0)
    right = Line(text="right piece", bbox=(0.51, 0.299, 0.9, 0.326), size=68.0)
    below = Line(text="next line", bbox=(0.1, 0.313, 0.9, 0.34), size=68.0)
    order = read_page([below, right, left], lambda ln: ln.bbox).order
    assert [ln.text for ln in order] == ["left piece", "right piece", "next line"]


def test_a_centred_title_of_two_lines_reads_top_to_bottom() -> None:
    # The title region holds both lines; the wider second line starts further left.
    first = Line(text="ALICE STONE", bbox=(0.40, 0.100, 0.60, 0.127), size=90.0)
    second = Line(text="BLACKWELL TRIBUTE", bbox=(0.35, 0.112, 0.65, 0.139), size=90.0)
    body = column([4], top=0.3)
    region = Region(kind=TITLE_REGION, bbox=(0.34, 0.09, 0.66, 0.145), score=0.9)
    laid = compose_page([second, first, *body], [region], source="ocr", progress=lambda *_: None)
    assert (laid.blocks[0].type, laid.blocks[0].text) == (TITLE, "ALICE STONE BLACKWELL TRIBUTE")
