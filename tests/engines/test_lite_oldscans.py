"""What old scans need from the lite engine: lines read the right way up without PP-OCR's
line classifier, and a layout "table" that is running prose read as text.

Synthetic pages hold each rule (tests/docgen.py); the real typewritten pages in
bench/realscans/ (BnF, CC BY 4.0 transcriptions: MANIFEST.tsv there) hold it where it
first went wrong: show-through made the classifier turn upright lines over, and a column
of dialogue came out as a grid of empty cells.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PIL import Image

from daemon.document.page import TABLE, PageInput, PageOptions, no_progress
from daemon.engines.lite.compose import compose_page
from daemon.engines.lite.engine import LiteEngine
from daemon.engines.lite.lines import Line
from daemon.engines.lite.ocr import OcrReader
from daemon.engines.lite.regions import Region
from daemon.engines.lite.tables import Cell, reads_as_prose
from tests import docgen
from tests.conftest import REPO

REALSCANS = REPO / "bench" / "realscans" / "images"
UPRIGHT = [
    "The committee met on Tuesday morning",
    "and read the letters of the members",
    "who could not travel to the meeting.",
]
TURNED = "Every reply was answered in writing"


@pytest.fixture(scope="module")
def reader() -> Iterator[OcrReader]:
    yield OcrReader(threads=1)


def test_a_line_printed_upside_down_on_an_upright_page_is_read_turned(
    reader: OcrReader,
) -> None:
    # The line classifier is not asked (it turns show-through lines over); a line the
    # recogniser is unsure of is read again turned 180 degrees.
    page = docgen.render_text([*UPRIGHT, ""], size=(1400, 700), font_px=40)
    turned = docgen.render_text([TURNED], size=(1400, 120), font_px=40, margin=30)
    page.paste(turned.rotate(180), (0, 540))
    texts = [ln.text for ln in reader.lines(page)]
    assert texts[:3] == UPRIGHT
    assert TURNED in texts


def page_input(image: Image.Image) -> PageInput:
    return PageInput(image=image.convert("RGB"), page_idx=0, page_count=1, dpi=None)


@pytest.mark.skipif(not REALSCANS.is_dir(), reason="no bench/realscans in this checkout")
def test_show_through_does_not_turn_the_lines_of_a_typewritten_page(
    lite_engine: LiteEngine,
) -> None:
    # The back page's typing shows through, mirrored; with the classifier these lines read
    # "sas t e rts e me" and "C aa n pdr".
    image = Image.open(REALSCANS / "tapus-gallica-btv1b10583038c-f25.jpg")
    result = lite_engine.parse_page(page_input(image), PageOptions(), no_progress)
    text = " ".join(" ".join(b.text.split()) for b in result.blocks)
    assert "sais, je les veux frites et dorées comme" in text
    assert "Claudel qui a promis de venir à" in text


def dialogue() -> list[str]:
    out: list[str] = []
    for speaker, reply in [
        ("Claudel", "-Ca va bien, Jammes? Vous avez l'air"),
        ("Moi", "-Oui. Vous, on ne vous le demande pas."),
        ("Claudel", "-Nous allons entendre de la musique."),
        ("Moi", "-Il le serait davantage s'il n'était"),
    ]:
        out += [f"        {speaker}", reply]
    return out


def lines_of(image: Image.Image, reader: OcrReader) -> list[Line]:
    return reader.lines(image)


def test_a_table_of_dialogue_is_prose_and_a_price_list_is_a_table(reader: OcrReader) -> None:
    page = docgen.render_text(dialogue(), size=(1300, 1100), font_px=40)
    lines = lines_of(page, reader)
    table = Region(kind="table", bbox=(0.0, 0.0, 1.0, 1.0), score=0.7)
    laid = compose_page(lines, [table], source="ocr", progress=no_progress, page_aspect=1100 / 1300)
    assert TABLE not in [b.type for b in laid.blocks]
    text = " ".join(b.text for b in laid.blocks)
    assert "Claudel -Ca va bien, Jammes?" in text
    # A price list: cells side by side, figures.
    prices = [
        Cell("Bread", (0.1, 0.1, 0.3, 0.14)), Cell("2.40", (0.6, 0.1, 0.7, 0.14)),
        Cell("Butter", (0.1, 0.2, 0.3, 0.24)), Cell("3.10", (0.6, 0.2, 0.7, 0.24)),
        Cell("Cheese", (0.1, 0.3, 0.3, 0.34)), Cell("5.95", (0.6, 0.3, 0.7, 0.34)),
    ]
    assert not reads_as_prose(prices)
    # A table whose rows the detector read as one line each: figures make it a table.
    merged = [
        Cell(f"Region {k} 1,204 3,991 12.5 %", (0.1, 0.1 * k, 0.8, 0.1 * k + 0.04))
        for k in range(1, 7)
    ]
    assert not reads_as_prose(merged)


@pytest.mark.skipif(not REALSCANS.is_dir(), reason="no bench/realscans in this checkout")
def test_a_typewritten_dialogue_page_is_text_not_a_table(lite_engine: LiteEngine) -> None:
    # The layout model calls each column of this page a table (a speaker's name centred
    # over each reply); built as grids they read as rows of empty cells.
    image = Image.open(REALSCANS / "tapus-gallica-btv1b10583038c-f31.jpg")
    result = lite_engine.parse_page(page_input(image), PageOptions(), no_progress)
    assert TABLE not in [b.type for b in result.blocks]
    text = " ".join(" ".join(b.text.split()) for b in result.blocks)
    assert "passiez vos vacances dans un charmant cottage de Normandie" in text
    assert "Chez Adrienne Monnier" in text
    # Column 1 ends before column 2 starts.
    assert text.find("tendre de la musique") < text.find("les laissais retomber")
