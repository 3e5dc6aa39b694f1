"""Titles and headlines below or across the columns go by their place in the article's
flow: after the columns above them, before those below, never into a column.

Boxes are drawn here (page units, 0..1), so the right order is known. A headline two
lines tall and narrower than half the page, centred under the gutter, used to pass for
lines joined across the gutter (read with the column it starts in) or for a picture the
columns run around; a title in large type across the foot of a two-page spread, likewise.
"""

from __future__ import annotations

from daemon.document.page import TITLE, no_progress
from daemon.engines.lite.compose import compose_page
from daemon.engines.lite.lines import Line
from daemon.engines.lite.reading_order import Box, read_page
from daemon.engines.lite.regions import Region

Item = tuple[str, Box]
LINE, PITCH = 0.012, 0.02


def column(name: str, x0: float, x1: float, top: float, rows: int) -> list[Item]:
    return [(f"{name}{k}", (x0, top + k * PITCH, x1, top + k * PITCH + LINE)) for k in range(rows)]


def names(items: list[Item], heads: set[str]) -> list[str]:
    reading = read_page(items, lambda it: it[1], heading=lambda it: it[0] in heads)
    return [name for name, _ in reading.order]


def test_a_narrow_headline_under_the_columns_comes_after_them() -> None:
    left = column("L", 0.08, 0.48, 0.1, 30)
    right = column("R", 0.52, 0.92, 0.1, 22)  # columns of unequal height
    head = ("head", (0.35, 0.75, 0.65, 0.8))  # two lines, under both, narrow
    order = names([*left, *right, head], {"head"})
    assert order == [n for n, _ in left + right] + ["head"]


def test_a_narrow_headline_over_the_columns_comes_before_them() -> None:
    head = ("head", (0.3, 0.05, 0.7, 0.1))
    left = column("L", 0.08, 0.48, 0.15, 25)
    right = column("R", 0.52, 0.92, 0.15, 25)
    order = names([head, *left, *right], {"head"})
    assert order == ["head"] + [n for n, _ in left + right]


def test_a_title_across_the_foot_of_a_spread_comes_after_both_pages() -> None:
    # Two pages of two columns, the fold in the middle; the title in type four lines
    # tall runs across the fold at the foot, text nowhere beside it.
    pages = [
        column("a", 0.04, 0.235, 0.1, 30),
        column("b", 0.255, 0.46, 0.1, 30),
        column("c", 0.54, 0.745, 0.1, 30),
        column("d", 0.765, 0.96, 0.1, 28),
    ]
    title = ("title", (0.3, 0.72, 0.7, 0.78))
    order = names([title, *[it for page in pages for it in page]], {"title"})
    assert order == [n for page in pages for n, _ in page] + ["title"]


def test_compose_reads_a_title_region_as_a_heading() -> None:
    left = column("L", 0.08, 0.48, 0.1, 30)
    right = column("R", 0.52, 0.92, 0.1, 22)
    lines = [Line(text=f"{n} words of the column", bbox=b, size=12.0) for n, b in left + right]
    head = [
        Line(text="A headline set", bbox=(0.38, 0.75, 0.62, 0.772), size=24.0),
        Line(text="in two lines", bbox=(0.4, 0.778, 0.6, 0.8), size=24.0),
    ]
    region = Region(kind="title", bbox=(0.37, 0.745, 0.63, 0.805), score=0.9)
    laid = compose_page([*head, *lines], [region], source="ocr", progress=no_progress,
                        page_aspect=1.4)
    assert laid.blocks[-1].type == TITLE
    assert laid.blocks[-1].text == "A headline set in two lines"
    text = " ".join(b.text for b in laid.blocks[:-1])
    assert text.index("L29 words") < text.index("R0 words")


def test_a_section_heading_at_the_foot_of_one_column_stays_in_it() -> None:
    # The last page of a paper: the second column is short, and the first ends with the
    # heading of a section that goes on at the head of the second column.
    left = column("L", 0.08, 0.48, 0.1, 30)
    head = ("head", (0.08, 0.72, 0.3, 0.735))
    right = column("R", 0.52, 0.92, 0.1, 12)
    order = names([*left, head, *right], {"head"})
    assert order == [n for n, _ in left] + ["head"] + [n for n, _ in right]
