"""A drop cap the text detector left unboxed still starts its word.

The page is typeset by tests/magazine.py with a three-line drop cap ("W" of "When"); the
typeset lines stand in for the detector's boxes, minus the cap, as a detector that
misses it returns them. The hole the cap leaves is found, its glyph read by the real
recogniser, and the paragraph reads "When in the Course", not "hen in the Course".
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from daemon.document.page import no_progress
from daemon.engines.lite.compose import compose_page
from daemon.engines.lite.dropcaps import missed_drop_caps
from daemon.engines.lite.lines import Box, Line
from daemon.engines.lite.ocr import OcrReader
from tests.engines.test_lite_magazine import DECLARATION, FONT_PX, SIZE
from tests.magazine import Article, SetPage, typeset


def page_with_cap(columns: int = 2, drop_cap: bool = True) -> SetPage:
    return typeset([Article("Declaration", DECLARATION, columns, 1.0, None, drop_cap=drop_cap)],
                   size=SIZE, font_px=FONT_PX)


def lines_of(page: SetPage, *, cap: bool) -> list[Line]:
    w, h = page.image.size
    return [
        Line(ln.text, (ln.box[0] / w, ln.box[1] / h, ln.box[2] / w, ln.box[3] / h), ln.size)
        for ln in page.lines
        if cap or ln.role != "dropcap"
    ]


def gray(page: SetPage) -> np.ndarray:
    return np.asarray(page.image.convert("L"), dtype=np.float64)


def test_the_hole_of_a_missed_cap_is_found_on_the_glyph() -> None:
    page = page_with_cap()
    (cap,) = [ln for ln in page.lines if ln.role == "dropcap"]
    w, h = page.image.size
    (box,) = missed_drop_caps(lines_of(page, cap=False), gray(page))
    px = (box[0] * w, box[1] * h, box[2] * w, box[3] * h)
    assert all(abs(a - b) <= 3 for a, b in zip(px, cap.box, strict=True)), (px, cap.box)


def test_a_boxed_cap_and_a_page_without_caps_have_no_hole() -> None:
    page = page_with_cap()
    assert missed_drop_caps(lines_of(page, cap=True), gray(page)) == []
    plain = page_with_cap(drop_cap=False)
    # Paragraph indents (one em, one line each) are no cap's hole.
    assert missed_drop_caps(lines_of(plain, cap=True), gray(plain)) == []


@pytest.fixture(scope="module")
def reader() -> Iterator[OcrReader]:
    yield OcrReader(threads=1)


def test_the_missed_cap_is_read_and_joined_to_its_word(reader: OcrReader) -> None:
    page = page_with_cap()
    bgr = np.ascontiguousarray(np.asarray(page.image.convert("RGB"))[:, :, ::-1])
    lines = reader._with_missed_caps(lines_of(page, cap=False), bgr, gray(page))
    laid = compose_page(lines, (), source="ocr", progress=no_progress,
                        page_aspect=SIZE[1] / SIZE[0])
    text = " ".join(b.text for b in laid.blocks)
    assert "When in the Course" in text
    assert "hen in the Course" not in text.replace("When in the Course", "")


def test_a_cap_the_layout_detector_boxes_as_a_picture_is_no_picture() -> None:
    # The detector may box the big glyph as a small figure of its own: kept, the empty
    # picture cut the first paragraph after its first line.
    from daemon.engines.lite.regions import Region

    page = page_with_cap()
    (cap,) = [ln for ln in page.lines if ln.role == "dropcap"]
    w, h = page.image.size
    pad = 4
    region = Region(kind="figure", bbox=((cap.box[0] - pad) / w, (cap.box[1] - pad) / h,
                                         (cap.box[2] + pad) / w, (cap.box[3] + pad) / h),
                    score=0.8)
    laid = compose_page(lines_of(page, cap=True), [region], source="ocr", progress=no_progress,
                        page_aspect=h / w)
    assert "image" not in [b.type for b in laid.blocks]
    assert laid.blocks[1].text.startswith("When in the Course of human events, it becomes")


def _column_around_a_cap(beside: int, height: int) -> tuple[list[Line], np.ndarray, Box]:
    """A column of 12 lines on a 1000 x 600 page, its first `beside` lines starting
    right of a dark glyph four lines tall; boxes `height` px tall at a 24 px pitch (OCR's
    boxes of one column overlap when they are taller than the pitch)."""
    w, h = 1000, 600
    page = np.full((h, w), 255.0)
    glyph = (105, 100, 145, 100 + 4 * 24 - 4)
    page[glyph[1] : glyph[3], glyph[0] : glyph[2]] = 0.0
    lines = [
        Line(
            f"line {i} of the column",
            (
                (150 if i < beside else 100) / w,
                (100 + 24 * i) / h,
                600 / w,
                (100 + 24 * i + height) / h,
            ),
            float(height),
        )
        for i in range(12)
    ]
    return lines, page, (glyph[0] / w, glyph[1] / h, glyph[2] / w, glyph[3] / h)


def test_a_cap_beside_five_lines_is_found() -> None:
    # A four-line cap whose fifth line is indented too ("W" of a 1931 magazine page).
    lines, page, glyph = _column_around_a_cap(beside=5, height=20)
    (box,) = missed_drop_caps(lines, page)
    assert box == pytest.approx(glyph, abs=1e-3)


def test_a_cap_is_found_when_the_line_below_overlaps_the_hole() -> None:
    # Boxes 28 px tall at a 24 px pitch: the line below the cap reaches 4 px into the
    # hole, which is not a cap the detector boxed.
    lines, page, glyph = _column_around_a_cap(beside=4, height=28)
    (box,) = missed_drop_caps(lines, page)
    assert box == pytest.approx(glyph, abs=1e-3)
