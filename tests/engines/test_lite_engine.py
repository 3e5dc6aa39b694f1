"""The lite engine: text layer or real RapidOCR, grouped into paragraphs and headings."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon.common.cpus import resolve_threads
from daemon.common.errors import EngineUnavailable
from daemon.config.settings import EngineConfig, LimitsConfig
from daemon.document.page import (
    PAGE_NUMBER,
    SOURCE_OCR,
    SOURCE_TEXT_LAYER,
    TEXT,
    TITLE,
    Block,
    PageInput,
    PageOptions,
    PageResult,
    no_progress,
)
from daemon.engines.lite.compose import layout_blocks
from daemon.engines.lite.engine import LiteEngine
from daemon.engines.lite.lines import Line
from daemon.engines.lite.ocr import bundled_models
from daemon.engines.registry import create_engine
from daemon.input import raster, sniff, textlayer
from tests import docgen
from tests.conftest import CORPUS


@pytest.fixture(scope="module")
def engine() -> Iterator[LiteEngine]:
    """One loaded engine for the module; loading is the slow part (ONNX sessions)."""
    eng = create_engine("lite", EngineConfig(name="lite", threads=2))
    assert isinstance(eng, LiteEngine)
    # Any attempt to reach the network while loading fails the whole module: the models
    # must come from the wheel.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", _no_network)
        mp.setattr(socket, "create_connection", _no_network)
        info = eng.load()
    assert info.name == "lite"
    assert info.model_id is not None and info.model_id.startswith("rapidocr ")
    yield eng
    eng.close()


def _no_network(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("the lite engine tried to use the network")


def page_of(path: Path, idx: int = 0, *, dpi: int = 150) -> PageInput:
    info = sniff.inspect(path, passwords=(), limits=LimitsConfig())
    return raster.render_page(path, info, idx, dpi=dpi, max_long_side=4000, max_image_pixels=10**9)


def parse(engine: LiteEngine, page: PageInput, **options: Any) -> PageResult:
    """The page as the worker's pipeline hands it on: with its text layer where used."""
    opts = PageOptions(**options)
    return engine.parse_page(textlayer.with_text_layer(page, opts), opts, no_progress)


def all_text(blocks: list[Block]) -> str:
    return " ".join(b.text for b in blocks).lower()


# ---------------------------------------------------------------------------- OCR


def test_ocr_recovers_known_words(engine: LiteEngine, tmp_path: Path) -> None:
    png = docgen.make_text_image(
        tmp_path / "note.png",
        ["Invoice number 4711", "Delivery to Hamburg harbour"],
        size=(1200, 400),
        font_px=48,
    )
    result = parse(engine, page_of(png))
    text = all_text(result.blocks)
    for word in ("invoice", "4711", "delivery", "hamburg"):
        assert word in text
    assert result.info["source"] == SOURCE_OCR
    for block in result.blocks:
        assert block.source == SOURCE_OCR
        x0, y0, x1, y1 = block.bbox
        assert 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1


def test_ocr_detects_heading_and_paragraph(engine: LiteEngine, tmp_path: Path) -> None:
    png = docgen.make_text_image(
        tmp_path / "doc.png",
        ["# Quarterly Summary", "Sales rose in every region", "while costs stayed flat"],
        size=(1200, 600),
        font_px=40,
    )
    blocks = parse(engine, page_of(png)).blocks
    assert blocks[0].type == TITLE and blocks[0].text_level in (1, 2)
    assert "quarterly" in blocks[0].text.lower()
    body = [b for b in blocks if b.type == TEXT]
    assert len(body) == 1  # the two body lines form one paragraph
    assert "sales" in body[0].text.lower() and "flat" in body[0].text.lower()


def test_scanned_pdf_takes_the_ocr_path(engine: LiteEngine, tmp_path: Path) -> None:
    pdf = docgen.make_scanned_pdf(
        tmp_path / "scan.pdf", [["Scanned contract terms", "Signed in Berlin"]], font_px=64
    )
    result = parse(engine, page_of(pdf, dpi=100))
    assert result.info["source"] == SOURCE_OCR
    assert result.info["text_layer"] == "absent"
    text = all_text(result.blocks)
    assert "contract" in text and "berlin" in text


# ---------------------------------------------------------------------------- text layer


def test_born_digital_pdf_takes_the_text_layer_path(engine: LiteEngine, tmp_path: Path) -> None:
    pdf = docgen.make_text_pdf(
        tmp_path / "report.pdf",
        [["# Annual Report", "The company grew strongly this year.", "Profits doubled."]],
    )
    result = parse(engine, page_of(pdf, dpi=72))
    assert result.info["source"] == SOURCE_TEXT_LAYER
    assert all(b.source == SOURCE_TEXT_LAYER for b in result.blocks)
    title, body = result.blocks
    assert (title.type, title.text_level, title.text) == (TITLE, 1, "Annual Report")
    assert body.type == TEXT
    assert body.text == "The company grew strongly this year. Profits doubled."
    assert title.bbox[3] <= body.bbox[1]


def test_text_layer_off_forces_ocr(engine: LiteEngine, tmp_path: Path) -> None:
    pdf = docgen.make_text_pdf(
        tmp_path / "big.pdf", [["Large printed words for OCR"]], font_size=36
    )
    result = parse(engine, page_of(pdf, dpi=100), text_layer="off")
    assert result.info["source"] == SOURCE_OCR
    assert "printed" in all_text(result.blocks)


def test_bold_line_at_body_size_is_a_subheading(engine: LiteEngine, tmp_path: Path) -> None:
    pdf = docgen.make_text_pdf(
        tmp_path / "sub.pdf",
        [["## Methods and Materials", "We measured everything twice.", "Then once more."]],
    )
    blocks = parse(engine, page_of(pdf, dpi=72)).blocks
    assert (blocks[0].type, blocks[0].text_level) == (TITLE, 2)
    assert blocks[1].type == TEXT


def test_two_columns_are_read_column_by_column(engine: LiteEngine, tmp_path: Path) -> None:
    left = [f"Left line {i} of the first column" for i in range(1, 5)]
    right = [f"Right line {i} of the second column" for i in range(1, 5)]
    pdf = docgen.make_text_pdf(tmp_path / "cols.pdf", [left + right], columns=2, font_size=10)
    result = parse(engine, page_of(pdf, dpi=72))
    assert result.info["columns"] == 2
    text = " ".join(b.text for b in result.blocks)
    assert text.index("Left line 4") < text.index("Right line 1")
    assert [b.text.split()[0] for b in result.blocks] == ["Left", "Right"]


def test_progress_is_reported(engine: LiteEngine, tmp_path: Path) -> None:
    pdf = docgen.make_text_pdf(
        tmp_path / "many.pdf", [[f"Line number {i} with some words" for i in range(40)]]
    )
    calls: list[tuple[int, int, str]] = []
    page = textlayer.with_text_layer(page_of(pdf, dpi=72), PageOptions())
    engine.parse_page(page, PageOptions(), lambda d, t, w: calls.append((d, t, w)))
    assert calls and calls[-1] == (40, 40, "line")
    assert all(what == "line" and 0 <= done <= total for done, total, what in calls)


# ---------------------------------------------------------------------------- layout units


def L(text: str, y: float, *, x0: float = 0.1, x1: float = 0.9, size: float = 10.0) -> Line:
    h = 0.015 * size / 10
    return Line(text=text, bbox=(x0, y, x1, y + h), size=size)


def test_layout_paragraph_gap_and_dehyphenation() -> None:
    lines = [
        L("The infor-", 0.10),
        L("mation age began.", 0.12),
        L("A new paragraph", 0.20),  # gap > 0.7 line heights
    ]
    blocks, columns = layout_blocks(lines, source=SOURCE_OCR, progress=no_progress)
    assert columns == 1
    assert [b.text for b in blocks] == ["The information age began.", "A new paragraph"]


def test_layout_keeps_real_hyphens() -> None:
    blocks, _ = layout_blocks(
        [L("a well-", 0.1), L("Known fact", 0.12)], source=SOURCE_OCR, progress=no_progress
    )
    assert blocks[0].text == "a well- Known fact"


def test_layout_heading_levels_and_page_number() -> None:
    lines = [
        L("Big Title", 0.05, size=20),
        L("Section", 0.10, size=14),
        *[L(f"body text line {i}", 0.15 + 0.018 * i) for i in range(8)],
        L("12", 0.96, x0=0.48, x1=0.52),
    ]
    blocks, _ = layout_blocks(lines, source=SOURCE_TEXT_LAYER, progress=no_progress)
    assert (blocks[0].type, blocks[0].text_level) == (TITLE, 1)
    assert (blocks[1].type, blocks[1].text_level) == (TITLE, 2)
    assert blocks[2].type == TEXT
    assert (blocks[-1].type, blocks[-1].text) == (PAGE_NUMBER, "12")


def test_layout_running_head_and_page_number_are_no_second_column() -> None:
    lines = [
        L("Chapter 3", 0.04, x0=0.1, x1=0.3),
        L("17", 0.04, x0=0.85, x1=0.9),
        *[L(f"body text line {i} of a single column", 0.1 + 0.018 * i) for i in range(12)],
    ]
    _, columns = layout_blocks(lines, source=SOURCE_TEXT_LAYER, progress=no_progress)
    assert columns == 1


def test_layout_a_table_of_short_cells_is_no_page_of_columns() -> None:
    # More cells than body lines, but far less print: the page is one column of text.
    body = [L(f"body text line {i} of a single column", 0.1 + 0.018 * i) for i in range(10)]
    cells = [
        L(f"cell {row}.{col}", 0.35 + 0.03 * row, x0=0.1 + 0.3 * col, x1=0.25 + 0.3 * col)
        for row in range(8)
        for col in range(3)
    ]
    blocks, columns = layout_blocks(body + cells, source=SOURCE_TEXT_LAYER, progress=no_progress)
    assert "cell 7.2" in " ".join(b.text for b in blocks)
    assert columns == 1


def test_layout_empty_page() -> None:
    assert layout_blocks([], source=SOURCE_OCR, progress=no_progress) == ([], 0)


# ---------------------------------------------------------------------------- plumbing


def test_threads_follow_config() -> None:
    import os

    import psutil

    assert resolve_threads(3) == 3
    # 0 = physical cores, but never more than the affinity mask allows (tests/common/test_cpus.py
    # narrows the mask); the bare core count only matched where the two are equal.
    physical = psutil.cpu_count(logical=False) or 1
    assert resolve_threads(0) == max(1, min(physical, len(os.sched_getaffinity(0))))


def test_missing_models_are_engine_unavailable(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailable) as caught:
        bundled_models(tmp_path)
    assert "rapidocr" in caught.value.hint


def test_parse_before_load_is_an_error(tmp_path: Path) -> None:
    png = docgen.make_text_image(tmp_path / "a.png", ["Hi"], size=(200, 100))
    with pytest.raises(RuntimeError):
        LiteEngine(EngineConfig(name="lite")).parse_page(page_of(png), PageOptions(), no_progress)


@pytest.mark.skipif(not CORPUS.is_dir(), reason="development corpus not present")
def test_corpus_two_column_paper(engine: LiteEngine) -> None:
    pdf = CORPUS / "pdf" / "pypdf__multicolumn.pdf"
    if not pdf.is_file():
        pytest.skip("corpus file missing")
    result = parse(engine, page_of(pdf, dpi=72))
    assert result.info["source"] == SOURCE_TEXT_LAYER
    assert result.info["columns"] == 2
    assert result.blocks[0].type == TITLE
    assert "Two-Column Document" in result.blocks[0].text
