"""Office documents are converted to PDF with LibreOffice, or fail saying what to install."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

from daemon.common.errors import DocumentError, FailureKind
from daemon.config.settings import EngineConfig, LimitsConfig
from daemon.document.formats import DEFAULT_PATTERNS
from daemon.input import office, sniff
from daemon.input.raster import render_page
from daemon.input.textlayer import with_text_layer
from tests import docgen
from tests.conftest import REPO

PARAGRAPHS = ["The quarterly report shows steady growth.", "Costs fell by four percent."]


@pytest.fixture()
def docx(tmp_path: Path) -> Path:
    return docgen.make_docx(tmp_path / "report.docx", PARAGRAPHS, heading="Quarterly Report")


def office_format(path: Path, head: bytes) -> str | None:
    found = sniff.sniff(path, head)
    return None if found is None else found.name


def test_office_formats_are_recognised_by_content(docx: Path, tmp_path: Path) -> None:
    head = docx.read_bytes()[:1024]
    assert office_format(docx, head) == "DOCX"
    rtf = tmp_path / "memo.rtf"
    rtf.write_bytes(b"{\\rtf1\\ansi Hello}")
    assert office_format(rtf, rtf.read_bytes()) == "RTF"
    odt = tmp_path / "memo.odt"
    with zipfile.ZipFile(odt, "w") as zf:
        zf.writestr(
            zipfile.ZipInfo("mimetype"), "application/vnd.oasis.opendocument.text"
        )  # stored first and uncompressed, as ODF requires
        zf.writestr("content.xml", "<office:document-content/>")
    assert office_format(odt, odt.read_bytes()[:1024]) == "ODT"
    plain_zip = tmp_path / "photos.zip"
    with zipfile.ZipFile(plain_zip, "w") as zf:
        zf.writestr("a.txt", "x")
    assert office_format(plain_zip, plain_zip.read_bytes()[:1024]) is None
    assert {"*.docx", "*.xlsx", "*.pptx", "*.odt", "*.ods", "*.odp", "*.rtf"} <= set(
        DEFAULT_PATTERNS
    )


def test_without_libreoffice_the_reason_says_what_to_install(
    docx: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(office, "soffice", lambda: None)
    with pytest.raises(DocumentError) as caught:
        sniff.inspect(docx, passwords=(), limits=LimitsConfig())
    assert caught.value.kind is FailureKind.UNSUPPORTED
    assert "Word document" in str(caught.value)
    assert "apt-get install libreoffice-writer-nogui" in str(caught.value)


def test_a_zip_named_docx_is_not_a_word_document(tmp_path: Path) -> None:
    fake = tmp_path / "fake.docx"
    with zipfile.ZipFile(fake, "w") as zf:
        zf.writestr("a.txt", "x")
    with pytest.raises(DocumentError) as caught:
        sniff.inspect(fake, passwords=(), limits=LimitsConfig())
    assert caught.value.kind is FailureKind.UNSUPPORTED
    assert "not a Word document" in str(caught.value)


@pytest.mark.skipif(office.soffice() is None, reason="LibreOffice (soffice) is not installed")
def test_docx_is_converted_and_read_from_its_text_layer(docx: Path) -> None:
    from daemon.document.page import SOURCE_TEXT_LAYER, TITLE, PageOptions, no_progress
    from daemon.engines.lite.engine import LiteEngine

    before = sorted(p.name for p in docx.parent.iterdir())
    info = sniff.inspect(docx, passwords=(), limits=LimitsConfig())
    assert (info.kind, info.format, info.page_count) == ("pdf", "DOCX", 1)
    assert info.converted_pdf is not None and info.converted_pdf.is_file()
    # LibreOffice worked on a private copy: no lock file or output beside the original.
    assert sorted(p.name for p in docx.parent.iterdir()) == before
    page = render_page(docx, info, 0, dpi=100, max_long_side=2000, max_image_pixels=10**9)
    page = with_text_layer(page, PageOptions())
    engine = LiteEngine(EngineConfig(name="lite", threads=2))
    engine.load()
    try:
        result = engine.parse_page(page, PageOptions(), no_progress)
    finally:
        engine.close()
    assert result.info["source"] == SOURCE_TEXT_LAYER
    assert result.blocks[0].type == TITLE and result.blocks[0].text == "Quarterly Report"
    assert " ".join(b.text for b in result.blocks[1:]) == " ".join(PARAGRAPHS)
    # The next conversion (or the worker's exit) removes the previous temporary folder.
    folder = info.converted_pdf.parent.parent
    office._forget_previous()
    assert not folder.exists()
    assert shutil.which("soffice") is not None


def test_parse_converts_a_docx_and_reads_a_heic_photo_end_to_end(
    docx: Path, tmp_path: Path
) -> None:
    """Through the real CLI, worker process and outbox writer."""
    import os
    import subprocess
    import sys

    import pillow_heif

    pillow_heif.register_heif_opener()
    heic = tmp_path / "receipt.heic"
    docgen.render_text(["Receipt 0042", "Paid in full"], size=(900, 300), font_px=40).save(
        heic, "HEIF", quality=90
    )
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "daemon", "parse", str(docx), str(heic), "-o", str(out),
         "--engine", "lite"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert "Receipt 0042" in (out / "receipt" / "receipt.md").read_text()
    if office.soffice() is None:
        assert r.returncode == 1
        assert "apt-get install libreoffice-writer-nogui" in r.stderr
    else:
        assert r.returncode == 0, r.stderr
        md = (out / "report" / "report.md").read_text()
        assert md.startswith("# Quarterly Report") and PARAGRAPHS[1] in md
    assert docx.exists() and heic.exists()  # parse never moves the originals
