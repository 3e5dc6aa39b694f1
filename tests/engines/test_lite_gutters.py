"""Lines the detector returns across a narrow gutter are cut back into one line per column.

The pages are typeset by tests/magazine.py with gutters down to 1 % of the page width, where
PP-OCR's detector (which sees the page at 960 px) boxes the first lines of both columns as
one line. The unit tests hand `split_at_gutters` such bridged boxes directly; the last test
runs the real engine on a page where the detector bridges them.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from daemon.config.settings import EngineConfig
from daemon.document.page import PageInput, PageOptions, no_progress
from daemon.engines.lite.engine import LiteEngine
from daemon.engines.lite.gutters import split_at_gutters
from daemon.engines.lite.lines import Line, union
from tests.engines.test_lite_magazine import DECLARATION
from tests.magazine import Article, SetPage, typeset

SIZE = (1654, 2339)  # A4 at 200 dpi
FONT_PX = 28


def two_columns(gutter: float, columns: int = 2, font_px: int = FONT_PX) -> SetPage:
    text = DECLARATION * (columns - 1)  # enough to fill every column
    return typeset(
        [Article("Declaration of Independence", text, columns, 1.0, None, drop_cap=False)],
        size=SIZE,
        font_px=font_px,
        gutter=gutter,
    )


def as_lines(page: SetPage) -> list[Line]:
    w, h = page.image.size
    return [
        Line(ln.text, (ln.box[0] / w, ln.box[1] / h, ln.box[2] / w, ln.box[3] / h), ln.size)
        for ln in page.lines
    ]


def bridged(lines: list[Line], pairs: int) -> tuple[list[Line], list[int]]:
    """The first `pairs` body lines of column 1 merged with their neighbours level in
    column 2, as the detector boxes them across a narrow gutter; and where they are."""
    body = [ln for ln in lines if ln.size == FONT_PX]
    left = sorted((ln for ln in body if ln.bbox[2] < 0.5), key=lambda ln: ln.bbox[1])
    right = [ln for ln in body if ln.bbox[0] > 0.5]
    merged: list[Line] = []
    used: set[int] = set()
    for a in left[:pairs]:
        b = min(right, key=lambda ln: abs(ln.cy - a.cy))
        merged.append(Line(f"{a.text} {b.text}", union([a.bbox, b.bbox]), FONT_PX))
        used |= {id(a), id(b)}
    rest = [ln for ln in lines if id(ln) not in used]
    out = merged + rest
    return out, list(range(len(merged)))


def gray_of(page: SetPage) -> np.ndarray:
    return np.asarray(page.image.convert("L"), dtype=np.float64)


@pytest.mark.parametrize("gutter", [0.01, 0.015, 0.025])
def test_a_line_across_a_narrow_gutter_is_cut_at_the_gutter(gutter: float) -> None:
    page = two_columns(gutter)
    lines, merged = bridged(as_lines(page), pairs=4)
    found = split_at_gutters(lines, gray_of(page))
    assert sorted(found) == merged  # the bridged boxes, and no column's own line
    middle = SIZE[0] / 2
    for parts in found.values():
        assert len(parts) == 2
        # The cut lies in the gutter: column 1's text ends before the middle of the page,
        # column 2's starts after it.
        assert parts[0].x1 <= middle <= parts[1].x0


def test_word_spaces_and_a_headline_are_no_gutter() -> None:
    one = typeset(
        [Article("Declaration of Independence", DECLARATION, 1, 1.0, None, drop_cap=False)],
        size=SIZE,
        font_px=FONT_PX,
    )
    assert split_at_gutters(as_lines(one), gray_of(one)) == {}


def test_three_columns_bridged_across_both_gutters_give_three_lines() -> None:
    page = two_columns(0.012, columns=3, font_px=22)  # a magazine's small type
    lines = as_lines(page)
    body = [ln for ln in lines if ln.size == 22]
    # The first row where all three columns set a long line (the detector bridges those:
    # a paragraph's short last line leaves a gap wider than it ever bridges).
    rows = [[ln for ln in body if abs(ln.cy - a.cy) < 0.0075] for a in body]
    row = next(
        sorted(r, key=lambda ln: ln.bbox[0])
        for r in sorted(rows, key=lambda r: r[0].cy)
        if len(r) == 3 and all(ln.bbox[2] - ln.bbox[0] > 0.2 for ln in r)
    )
    whole = Line(" ".join(ln.text for ln in row), union([ln.bbox for ln in row]), 22)
    rest = [ln for ln in lines if ln not in row]
    found = split_at_gutters([whole, *rest], gray_of(page))
    assert list(found) == [0] and len(found[0]) == 3


@pytest.fixture(scope="module")
def engine() -> Iterator[LiteEngine]:
    eng = LiteEngine(EngineConfig(name="lite", threads=2))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", _no_network)
        eng.load()
    yield eng
    eng.close()


def _no_network(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("the lite engine tried to use the network")


def test_columns_one_percent_apart_are_read_one_after_the_other(engine: LiteEngine) -> None:
    """At a 1 % gutter the detector bridges most of the first lines (checked: 8 of them on
    this page); the page still reads column 1, then column 2, not line by line across."""
    page = two_columns(0.01)
    result = engine.parse_page(
        PageInput(image=page.image, page_idx=0, page_count=1, dpi=200), PageOptions(), no_progress
    )
    text = " ".join(" ".join(b.text for b in result.blocks).split())
    assert result.info["columns"] == 2
    # Column 1 starts with the first paragraph, column 2 with a later one: every opening
    # set on the page is found, in the order it was set.
    openings = [o for o in (" ".join(p.split()[:6]) for p in DECLARATION) if o in page.text]
    assert len(openings) >= 5
    found = [text.find(o) for o in openings]
    assert -1 not in found and found == sorted(found), list(zip(openings, found, strict=True))
    # No line of column 2 follows a line of column 1 on one line of output.
    assert "political wholesome" not in text


def test_one_box_across_the_gutter_does_not_undo_the_columns() -> None:
    """Two columns of ten lines; one box joins the last words of a left line with the
    first words of the right one level with it. The columns are still read one after the
    other (before, that box left no gutter and the page was read row by row)."""
    from daemon.engines.lite.reading_order import read_page

    boxes: dict[str, tuple[float, float, float, float]] = {}
    for k in range(10):
        y = 0.1 + k * 0.03
        boxes[f"L{k}"] = (0.1, y, 0.48, y + 0.02)
        boxes[f"R{k}"] = (0.52, y, 0.9, y + 0.02)
    # Line 4 of the left column read together with the first words of the right one.
    boxes["L4"] = (0.1, 0.22, 0.3, 0.24)
    boxes["B4"] = (0.32, 0.22, 0.6, 0.24)
    boxes["R4"] = (0.62, 0.22, 0.9, 0.24)
    reading = read_page(list(boxes), boxes.__getitem__)
    left = [f"L{k}" for k in range(5)] + ["B4"] + [f"L{k}" for k in range(5, 10)]
    assert reading.order == left + [f"R{k}" for k in range(10)]
    assert reading.columns == 2
