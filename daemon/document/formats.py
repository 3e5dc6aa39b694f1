"""Every input format docinbox reads, declared once.

One `InputFormat` per format says what it is called, the extensions it goes by, its MIME
type, how its content is recognised from the first bytes, and which `Reader` turns it into
pages. Everything else is derived from `FORMATS`: the inboxes' default `patterns` (so a
format in the registry is always taken by default), the content sniffing and the
"named .x but the content is Y" check in `daemon/input/sniff.py`, the LibreOffice
conversions in `daemon/input/office.py`, and the README's "What docinbox reads" table
(`scripts/readme_tables.py`).

A foundation, not a part of the worker's `daemon/input/`: the configuration declares the
inboxes' default patterns from it and the worker reads files by it, so it sits below both
and imports nothing of docinbox. Light on purpose: the daemon process reads it and never
loads Pillow or PDFium (tests/house/test_daemon_imports.py). The readers themselves live in
`daemon/input/sniff.py` (inspect) and `daemon/input/raster.py` (render), worker side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

# What a document's pages are rendered from: a PDF (PDFium/poppler) or an image (Pillow).
DocKind = Literal["pdf", "image"]


@dataclass(frozen=True)
class Reader:
    """How a family of formats becomes pages; each has its code in sniff.py and raster.py."""

    name: Literal["pdf", "image", "office"]
    kind: DocKind  # what the pages are rendered from once the file is read
    how: str  # for the README


PDF_READER: Final = Reader(
    "pdf",
    "pdf",
    "PDFium (poppler where installed) renders each page; a trustworthy text layer is used "
    "as text",
)
IMAGE_READER: Final = Reader(
    "image",
    "image",
    "Pillow decodes the image under `limits.max_image_pixels`; EXIF orientation applied, "
    "transparency flattened on white",
)
OFFICE_READER: Final = Reader(
    "office",
    "pdf",
    "converted to PDF by LibreOffice (`soffice --headless --convert-to pdf`, a private copy "
    "and profile folder, 300 s deadline), then read as a PDF with its exact text layer. "
    "Without LibreOffice such a file fails as `unsupported` with the package to install; "
    "`setup.sh` does not install it for production (it is large), `setup.sh --dev` installs "
    "Writer for the tests",
)
READERS: Final = (PDF_READER, IMAGE_READER, OFFICE_READER)


class Head:
    """The first bytes of a file (and the file, for the few formats that need more)."""

    # Enough for every signature below; PDF readers look for the header this far in.
    SIZE: Final = 1024

    def __init__(self, data: bytes, path: Path | None = None) -> None:
        self.data = data
        self.path = path
        self._zip_names: frozenset[str] | None = None

    def zip_names(self) -> frozenset[str]:
        """The member names of a zip file (OOXML tells its kind by them); empty if none."""
        if self._zip_names is None:
            import zipfile  # worker side only: the daemon never sniffs

            names: frozenset[str] = frozenset()
            if self.path is not None and self.data.startswith(_ZIP):
                try:
                    with zipfile.ZipFile(self.path) as zf:
                        names = frozenset(zf.namelist())
                except (zipfile.BadZipFile, OSError, ValueError):
                    pass
            self._zip_names = names
        return self._zip_names


# A content test: does this file's start say it is this format?
Magic = Callable[[Head], bool]


@dataclass(frozen=True)
class InputFormat:
    name: str  # the format's id; for images Pillow's own format name
    label: str  # what the README calls it
    extensions: tuple[str, ...]  # lower case with the dot; the first is the usual one
    mime: str
    reader: Reader
    magic: Magic
    what: str  # the format in a sentence: "a Word document"
    note: str = ""  # for the README, after the label
    # Images: which decoder Pillow needs and how to get it, when it is not built in.
    decoder_hint: str | None = None
    # Office: the Debian package whose LibreOffice converts it.
    package: str | None = None
    # TIFF: every frame is a page. Elsewhere frames are animation and frame 1 is read.
    frames_are_pages: bool = False

    @property
    def usual_extension(self) -> str:
        return self.extensions[0]


# ---------------------------------------------------------------------------- magic bytes
# Every test below is exclusive of the others except PDF's (a header anywhere in the first
# 1024 bytes, as Acrobat, PDFium and poppler accept it), which is why PDF comes first.


def _starts(*signatures: bytes) -> Magic:
    return lambda head: head.data.startswith(signatures)


_PDF_MAGIC = b"%PDF-"


def _pdf(head: Head) -> bool:
    # Some mail gateways and old generators prepend junk before the header.
    return _PDF_MAGIC in head.data[: Head.SIZE]


def _webp(head: Head) -> bool:
    return head.data[:4] == b"RIFF" and head.data[8:12] == b"WEBP"


# ISO base media files (HEIF, AVIF) name their brand after "ftyp" at offset 4.
_HEIF_BRANDS = frozenset({b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"hevm",
                          b"hevs", b"mif1", b"msf1"})
_AVIF_BRANDS = frozenset({b"avif", b"avis"})


def _is_avif(head: Head) -> bool | None:
    """True for AVIF, False for HEIF, None for neither."""
    data = head.data
    if data[4:8] != b"ftyp":
        return None
    brand = data[8:12]
    if brand in _AVIF_BRANDS:
        return True
    if brand in _HEIF_BRANDS:
        # "mif1" is the generic HEIF brand; an AVIF file may list it first.
        compatible = {data[i : i + 4] for i in range(16, min(len(data), 64), 4)}
        return bool(compatible & _AVIF_BRANDS)
    return None


# Netpbm: "P1".."P6" then whitespace (PBM, PGM, PPM in ASCII or binary).
_PNM_MAGIC = tuple(f"P{n}".encode() for n in range(1, 7))


def _netpbm(head: Head) -> bool:
    return head.data[:2] in _PNM_MAGIC and head.data[2:3].isspace()


_ZIP = b"PK\x03\x04"


def _odf(mime: str) -> Magic:
    # ODF stores an uncompressed `mimetype` member first, readable at a fixed offset.
    tag = mime.encode()
    return lambda head: (
        head.data.startswith(_ZIP)
        and head.data[30:38] == b"mimetype"
        and head.data[38 : 38 + len(tag)] == tag
    )


def _ooxml(part: str) -> Magic:
    # Office Open XML is a zip with a content-types part and one folder per application.
    def magic(head: Head) -> bool:
        names = head.zip_names()
        return "[Content_Types].xml" in names and any(n.startswith(part) for n in names)

    return magic


# ---------------------------------------------------------------------------- the formats

_WRITER = "libreoffice-writer-nogui"
_CALC = "libreoffice-calc-nogui"
_IMPRESS = "libreoffice-impress-nogui"
_ODT = "application/vnd.oasis.opendocument.text"
_ODS = "application/vnd.oasis.opendocument.spreadsheet"
_ODP = "application/vnd.oasis.opendocument.presentation"
_OOXML_MIME = "application/vnd.openxmlformats-officedocument"

FORMATS: Final[tuple[InputFormat, ...]] = (
    InputFormat(
        name="PDF", label="PDF", extensions=(".pdf",), mime="application/pdf",
        reader=PDF_READER, magic=_pdf, what="a PDF",
        note="born-digital, scanned, encrypted with a configured password",
    ),
    InputFormat(
        name="PNG", label="PNG", extensions=(".png",), mime="image/png",
        reader=IMAGE_READER, magic=_starts(b"\x89PNG\r\n\x1a\n"), what="a PNG image",
    ),
    InputFormat(
        name="JPEG", label="JPEG", extensions=(".jpg", ".jpeg", ".jpe"), mime="image/jpeg",
        reader=IMAGE_READER, magic=_starts(b"\xff\xd8\xff"), what="a JPEG image",
    ),
    InputFormat(
        name="TIFF", label="TIFF", extensions=(".tif", ".tiff"), mime="image/tiff",
        reader=IMAGE_READER,
        magic=_starts(b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"),  # classic, BigTIFF
        what="a TIFF image", note="every frame a page", frames_are_pages=True,
    ),
    InputFormat(
        name="WEBP", label="WebP", extensions=(".webp",), mime="image/webp",
        reader=IMAGE_READER, magic=_webp, what="a WebP image", note="first frame",
    ),
    InputFormat(
        name="BMP", label="BMP", extensions=(".bmp", ".dib"), mime="image/bmp",
        reader=IMAGE_READER, magic=_starts(b"BM"), what="a BMP image",
    ),
    InputFormat(
        name="GIF", label="GIF", extensions=(".gif",), mime="image/gif",
        reader=IMAGE_READER, magic=_starts(b"GIF87a", b"GIF89a"), what="a GIF image",
        note="first frame",
    ),
    InputFormat(
        name="HEIF", label="HEIC/HEIF", extensions=(".heic", ".heif", ".hif"),
        mime="image/heic", reader=IMAGE_READER, magic=lambda head: _is_avif(head) is False,
        what="a HEIF image", note="iPhone photos; Pillow reads them through `pillow-heif`",
        decoder_hint="HEIF/HEIC images need the pillow-heif package (pip install pillow-heif)",
    ),
    InputFormat(
        name="AVIF", label="AVIF", extensions=(".avif",), mime="image/avif",
        reader=IMAGE_READER, magic=lambda head: _is_avif(head) is True, what="an AVIF image",
        note="Pillow ≥ 11.3",
        decoder_hint="AVIF images need Pillow >= 11.3 built with libavif (pip install -U pillow)",
    ),
    InputFormat(
        name="JPEG2000", label="JPEG 2000", extensions=(".jp2", ".j2k", ".j2c", ".jpf", ".jpx"),
        mime="image/jp2", reader=IMAGE_READER,
        magic=_starts(b"\x00\x00\x00\x0cjP  \r\n\x87\n", b"\xffO\xffQ"),  # JP2, bare J2K
        what="a JPEG 2000 image",
        decoder_hint="JPEG 2000 images need a Pillow built with OpenJPEG (pip install -U pillow)",
    ),
    InputFormat(
        name="PPM", label="Netpbm", extensions=(".pnm", ".pbm", ".pgm", ".ppm"),
        mime="image/x-portable-anymap", reader=IMAGE_READER, magic=_netpbm,
        what="a Netpbm image",
    ),
    InputFormat(
        name="DOCX", label="Word", extensions=(".docx",),
        mime=f"{_OOXML_MIME}.wordprocessingml.document", reader=OFFICE_READER,
        magic=_ooxml("word/"), what="a Word document", package=_WRITER,
    ),
    InputFormat(
        name="XLSX", label="Excel", extensions=(".xlsx",),
        mime=f"{_OOXML_MIME}.spreadsheetml.sheet", reader=OFFICE_READER,
        magic=_ooxml("xl/"), what="an Excel workbook", package=_CALC,
    ),
    InputFormat(
        name="PPTX", label="PowerPoint", extensions=(".pptx",),
        mime=f"{_OOXML_MIME}.presentationml.presentation", reader=OFFICE_READER,
        magic=_ooxml("ppt/"), what="a PowerPoint presentation", package=_IMPRESS,
    ),
    InputFormat(
        name="ODT", label="OpenDocument text", extensions=(".odt",), mime=_ODT,
        reader=OFFICE_READER, magic=_odf(_ODT), what="an OpenDocument text", package=_WRITER,
    ),
    InputFormat(
        name="ODS", label="OpenDocument spreadsheet", extensions=(".ods",), mime=_ODS,
        reader=OFFICE_READER, magic=_odf(_ODS), what="an OpenDocument spreadsheet",
        package=_CALC,
    ),
    InputFormat(
        name="ODP", label="OpenDocument presentation", extensions=(".odp",), mime=_ODP,
        reader=OFFICE_READER, magic=_odf(_ODP), what="an OpenDocument presentation",
        package=_IMPRESS,
    ),
    InputFormat(
        name="RTF", label="RTF", extensions=(".rtf",), mime="application/rtf",
        reader=OFFICE_READER, magic=_starts(b"{\\rtf"), what="an RTF document",
        package=_WRITER,
    ),
)

BY_NAME: Final = {fmt.name: fmt for fmt in FORMATS}
_BY_EXTENSION: Final = {ext: fmt for fmt in FORMATS for ext in fmt.extensions}

# What an inbox takes unless its `patterns` say otherwise: every extension above, so a
# format added here can never be silently dropped by the inbox's name filter.
DEFAULT_PATTERNS: Final[tuple[str, ...]] = tuple(f"*{ext}" for ext in _BY_EXTENSION)


def by_extension(suffix: str) -> InputFormat | None:
    """The format a file's extension claims (".JPG" claims JPEG), or None."""
    return _BY_EXTENSION.get(suffix.lower())


def identify(head: Head) -> InputFormat | None:
    """The format of a file from its content, or None if it is nothing docinbox reads."""
    for fmt in FORMATS:
        if fmt.magic(head):
            return fmt
    return None


# ---------------------------------------------------------------------------- README

README_BEGIN: Final = (
    "<!-- input-formats: generated from daemon/document/formats.py by scripts/readme_tables.py -->"
)
README_END: Final = "<!-- /input-formats -->"


def readme_table() -> str:
    """The README's "What docinbox reads" table and its readers, from `FORMATS`."""
    lines = ["| format | extensions | MIME type | read by |", "|---|---|---|---|"]
    for fmt in FORMATS:
        label = f"{fmt.label} ({fmt.note})" if fmt.note else fmt.label
        extensions = ", ".join(f"`{ext}`" for ext in fmt.extensions)
        reader = f"{fmt.reader.name} (`{fmt.package}`)" if fmt.package else fmt.reader.name
        lines.append(f"| {label} | {extensions} | `{fmt.mime}` | {reader} |")
    lines.append("")
    lines += [f"- **{reader.name}**: {reader.how}." for reader in READERS]
    return "\n".join(lines) + "\n"
