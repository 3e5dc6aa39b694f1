"""The input-format registry: one declaration per format, and what is derived from it.

The default inbox patterns, content sniffing, the mislabel check and the README's "What
docinbox reads" table all come from `daemon/document/formats.py`; these tests hold them to it
with files written by real encoders.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from PIL import Image

from daemon.config.settings import InboxConfig
from daemon.document.formats import (
    BY_NAME,
    DEFAULT_PATTERNS,
    FORMATS,
    OFFICE_READER,
    READERS,
    README_BEGIN,
    README_END,
    Head,
    by_extension,
    identify,
    readme_table,
)
from daemon.input import sniff
from daemon.intake.ignore import is_candidate_name
from tests import docgen
from tests.conftest import REPO

# Pillow writes these itself (HEIF through pillow-heif).
PILLOW_WRITES = (
    "PNG", "JPEG", "TIFF", "WEBP", "BMP", "GIF", "HEIF", "AVIF", "JPEG2000", "PPM"
)


def _zip(path: Path, members: dict[str, str], *, mimetype: str | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        if mimetype is not None:
            # ODF: stored first and uncompressed, as the standard requires.
            zf.writestr(zipfile.ZipInfo("mimetype"), mimetype, compress_type=zipfile.ZIP_STORED)
        for name, text in members.items():
            zf.writestr(name, text)
    return path


def sample(tmp_path: Path, name: str) -> Path:
    """A real file of format `name`, under its usual extension."""
    fmt = BY_NAME[name]
    path = tmp_path / f"sample{fmt.usual_extension}"
    if name in PILLOW_WRITES:
        if name == "HEIF":
            import pillow_heif

            pillow_heif.register_heif_opener()
        docgen.render_text(["Hello"], size=(200, 80), font_px=30).save(path, name)
    elif name == "PDF":
        docgen.make_text_pdf(path, [["Hello"]])
    elif name == "DOCX":
        docgen.make_docx(path, ["Hello"])
    elif name in ("XLSX", "PPTX"):
        part = "xl/workbook.xml" if name == "XLSX" else "ppt/presentation.xml"
        _zip(path, {"[Content_Types].xml": "<Types/>", part: "<x/>"})
    elif name in ("ODT", "ODS", "ODP"):
        _zip(path, {"content.xml": "<office:document-content/>"}, mimetype=fmt.mime)
    else:
        assert name == "RTF", f"no sample writer for {name}: add one here"
        path.write_bytes(b"{\\rtf1\\ansi Hello}")
    return path


@pytest.mark.parametrize("name", [fmt.name for fmt in FORMATS])
def test_each_format_is_told_by_its_own_magic_alone(tmp_path: Path, name: str) -> None:
    path = sample(tmp_path, name)
    head = Head(path.read_bytes()[: Head.SIZE], path)
    matching = [fmt.name for fmt in FORMATS if fmt.magic(head)]
    # Exclusive, so the order of FORMATS only matters for PDF's header-anywhere rule.
    assert matching == [name]
    assert sniff.sniff(path, head.data) is BY_NAME[name]


def test_a_pdf_header_after_junk_is_still_a_pdf_and_wins() -> None:
    # Mail gateways prepend junk; readers accept the header within the first 1024 bytes.
    assert identify(Head(b"X-Gateway: scanned\r\n\r\n%PDF-1.7\n")) is BY_NAME["PDF"]
    assert identify(Head(b"\x89PNG\r\n\x1a\n" + b"\0" * 100 + b"%PDF-1.4")) is BY_NAME["PDF"]
    assert identify(Head(b"\0" * Head.SIZE + b"%PDF-1.4")) is None


def test_avif_listing_the_generic_heif_brand_first_is_avif() -> None:
    avif = b"\x00\x00\x00\x1cftypmif1\x00\x00\x00\x00mif1avifmiaf"
    heic = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic"
    assert identify(Head(avif)) is BY_NAME["AVIF"]
    assert identify(Head(heic)) is BY_NAME["HEIF"]
    assert identify(Head(b"\x00\x00\x00\x18ftypisom\x00\x00\x00\x00isomiso2")) is None


def test_a_zip_that_is_no_office_document_is_nothing(tmp_path: Path) -> None:
    path = _zip(tmp_path / "photos.zip", {"a.txt": "x"})
    assert identify(Head(path.read_bytes()[: Head.SIZE], path)) is None
    # Without the file only the first bytes count: OOXML cannot be told then.
    docx = docgen.make_docx(tmp_path / "a.docx", ["Hello"])
    assert identify(Head(docx.read_bytes()[: Head.SIZE])) is None


def test_extensions_are_lower_case_and_claimed_by_one_format() -> None:
    every = [ext for fmt in FORMATS for ext in fmt.extensions]
    assert len(every) == len(set(every)), "an extension is claimed by two formats"
    for ext in every:
        assert ext.startswith(".") and ext == ext.lower() and "*" not in ext
        assert by_extension(ext.upper()) is by_extension(ext)
    assert len(BY_NAME) == len(FORMATS)


def test_every_format_is_taken_by_a_default_inbox() -> None:
    # The trap this guards: a format added to the registry but dropped by the inbox's
    # name filter would never reach the worker.
    inbox = InboxConfig(path=Path("/inbox"))
    assert inbox.patterns == DEFAULT_PATTERNS
    for fmt in FORMATS:
        for ext in fmt.extensions:
            assert is_candidate_name(f"scan{ext}", inbox), ext
            assert is_candidate_name(f"SCAN{ext.upper()}", inbox), ext
    for name in ("notes.txt", "photos.zip", "old.doc", "mail.eml", "scan"):
        assert not is_candidate_name(name, inbox), name


def test_every_reader_has_its_code_and_every_office_format_its_package() -> None:
    assert set(sniff._READERS) == {reader.name for reader in READERS}
    assert {fmt.reader for fmt in FORMATS} == set(READERS)
    for fmt in FORMATS:
        assert (fmt.package is not None) == (fmt.reader is OFFICE_READER), fmt.name
    # Image formats carry Pillow's names: the image reader checks `im.format` against them.
    Image.init()
    assert sniff.SUPPORTED_IMAGE_FORMATS - set(Image.OPEN) <= {"HEIF"}  # pillow-heif's


def test_readme_table_is_generated_from_the_registry() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert README_BEGIN in text and README_END in text
    block = text.split(README_BEGIN, 1)[1].split(README_END, 1)[0]
    assert block == "\n" + readme_table(), "stale: run .venv/bin/python scripts/readme_tables.py"
    for fmt in FORMATS:
        assert f"`{fmt.mime}`" in block
        for ext in fmt.extensions:
            assert f"`{ext}`" in block
