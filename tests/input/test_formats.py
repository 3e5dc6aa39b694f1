"""Phone and archive image formats: HEIC/HEIF, AVIF, JPEG 2000 and Netpbm.

Each file is written by the real encoder (pillow-heif for HEIC, Pillow's own AVIF,
OpenJPEG and PNM writers), then sniffed, inspected and rendered as the worker does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from daemon.common.errors import DocumentError, FailureKind
from daemon.config.settings import LimitsConfig
from daemon.document.formats import DEFAULT_PATTERNS
from daemon.input import sniff
from daemon.input.raster import render_page
from tests import docgen

LINES = ["Invoice 2024-117", "Total due 348.20 EUR"]

CASES = [
    ("photo.heic", "HEIF", "HEIF"),
    ("photo.avif", "AVIF", "AVIF"),
    ("scan.jp2", "JPEG2000", "JPEG2000"),
    ("scan.j2k", "JPEG2000", "JPEG2000"),
    ("scan.ppm", "PPM", "PPM"),
    ("scan.pgm", "PPM", "PPM"),
]


def write(path: Path, pillow_format: str) -> Path:
    image = docgen.render_text(LINES, size=(900, 300), font_px=40)
    if path.suffix == ".pgm":
        image = image.convert("L")
    if pillow_format == "HEIF":
        import pillow_heif

        pillow_heif.register_heif_opener()
    lossy = pillow_format in ("HEIF", "AVIF")
    image.save(path, pillow_format, **({"quality": 90} if lossy else {}))
    return path


@pytest.mark.parametrize(("name", "pillow_format", "expected"), CASES)
def test_format_is_sniffed_inspected_and_rendered(
    tmp_path: Path, name: str, pillow_format: str, expected: str
) -> None:
    path = write(tmp_path / name, pillow_format)
    found = sniff.sniff(None, path.read_bytes()[:1024])
    assert found is not None and (found.reader.kind, found.name) == ("image", expected)
    info = sniff.inspect(path, passwords=(), limits=LimitsConfig())
    assert (info.kind, info.format, info.page_count) == ("image", expected, 1)
    page = render_page(path, info, 0, dpi=200, max_long_side=4000, max_image_pixels=10**8)
    assert page.image.mode == "RGB" and page.image.size == (900, 300)
    assert f"*{path.suffix}" in DEFAULT_PATTERNS


def test_heic_named_jpg_is_refused_with_both_names(tmp_path: Path) -> None:
    path = write(tmp_path / "photo.heic", "HEIF").rename(tmp_path / "photo.jpg")
    with pytest.raises(DocumentError) as caught:
        sniff.inspect(path, passwords=(), limits=LimitsConfig())
    assert caught.value.kind is FailureKind.UNSUPPORTED
    assert "HEIF" in str(caught.value) and ".heic" in str(caught.value)


def test_without_a_decoder_the_reason_names_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path / "photo.heic", "HEIF")
    Image.init()
    without = {k: v for k, v in Image.OPEN.items() if k != "HEIF"}
    monkeypatch.setattr(Image, "OPEN", without)
    with pytest.raises(DocumentError) as caught:
        sniff.inspect(path, passwords=(), limits=LimitsConfig())
    assert caught.value.kind is FailureKind.UNSUPPORTED
    assert "pip install pillow-heif" in str(caught.value)


def test_lite_reads_the_text_of_a_heic_photo(tmp_path: Path) -> None:
    from daemon.config.settings import EngineConfig
    from daemon.document.page import PageOptions, no_progress
    from daemon.engines.lite.engine import LiteEngine

    path = write(tmp_path / "photo.heic", "HEIF")
    info = sniff.inspect(path, passwords=(), limits=LimitsConfig())
    page = render_page(path, info, 0, dpi=200, max_long_side=4000, max_image_pixels=10**8)
    engine = LiteEngine(EngineConfig(name="lite", threads=2))
    engine.load()
    try:
        text = " ".join(b.text for b in engine.parse_page(page, PageOptions(), no_progress).blocks)
    finally:
        engine.close()
    assert "Invoice 2024-117" in text and "348.20" in text
