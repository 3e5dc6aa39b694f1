"""A low-resolution page image (a 72-dpi render, a fax, a screenshot of a page) is read
scaled up: at its own size PP-OCR's detector runs lines of small print together and the
recogniser reads them as letter salad.

The corpus's two-page TIFF of an arXiv paper is stored at 612 x 792 px; its first page's
copyright note read "classm ue is rae thut provde ta cos are no made or dred" before.
"""

from __future__ import annotations

import pytest
from PIL import Image

from daemon.config.settings import LimitsConfig
from daemon.document.page import PageOptions, no_progress
from daemon.engines.lite.engine import LEGIBLE_LONG_SIDE, LOW_RES_LONG_SIDE, LiteEngine, legible
from daemon.input import raster, sniff
from tests.conftest import CORPUS

TIFF = CORPUS / "images" / "docling__2206.01062.tif"


def test_only_a_low_resolution_image_is_scaled_up() -> None:
    small = Image.new("RGB", (612, 792), "white")
    scaled = legible(small)
    assert max(scaled.size) == LEGIBLE_LONG_SIDE
    assert abs(scaled.width / scaled.height - 612 / 792) < 0.002  # the page keeps its shape
    for size in [(1654, 2339), (LOW_RES_LONG_SIDE, 900), (900, LOW_RES_LONG_SIDE)]:
        page = Image.new("RGB", size, "white")
        assert legible(page) is page


@pytest.mark.skipif(not TIFF.is_file(), reason="development corpus not present")
def test_the_small_print_of_a_72_dpi_page_is_read(lite_engine: LiteEngine) -> None:
    info = sniff.inspect(TIFF, passwords=(), limits=LimitsConfig())
    page = raster.render_page(TIFF, info, 0, dpi=200, max_long_side=4000, max_image_pixels=10**9)
    assert page.image.size == (612, 792) and page.dpi is None  # an image file's own pixels
    result = lite_engine.parse_page(page, PageOptions(), no_progress)
    text = " ".join(" ".join(b.text.split()) for b in result.blocks)
    assert "classroom use is granted without fee" in text
    assert "For all other uses, contact the owner" in text
    # Boxes stay in the page's frame (0..1), whatever size the page was read at.
    assert all(0.0 <= v <= 1.0 for b in result.blocks for v in b.bbox)
