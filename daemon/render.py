"""Input validation and page rendering. Runs inside the worker process.

`inspect()` decides, from the file's real content, whether we can read a document at all
and how many pages it has; every refusal is a `DocumentError` whose `FailureKind` and
message tell the user what to do. `render_page()` then turns one page at a time into an
RGB image for an engine, and `pdf_text_layer()` reads the text a born-digital PDF already
carries so engines can skip OCR for it.

PDFs are opened with pypdfium2 (bundled PDFium, no system packages needed). Rendering
uses poppler through pdf2image when `pdftoppm` is installed (it is a declared dependency
and many users have it) and PDFium otherwise; `RENDERER` forces one for tests.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import re
import shutil
import stat
import statistics
import unicodedata
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image, ImageOps, UnidentifiedImageError

from daemon.config import LimitsConfig
from daemon.engines.base import PageInput
from daemon.errors import DocumentError, FailureKind

log = logging.getLogger(__name__)

DocKind = Literal["pdf", "image"]
RendererName = Literal["poppler", "pdfium"]

# "auto" picks poppler when `pdftoppm` is on PATH, else PDFium. Tests set this to force one.
RENDERER: Literal["auto", "poppler", "pdfium"] = "auto"

# PDF readers (Acrobat, PDFium, poppler) accept a header anywhere in the first 1024 bytes;
# some mail gateways and old generators prepend junk, so we accept the same.
_PDF_MAGIC = b"%PDF-"
_PDF_HEADER_WINDOW = 1024

# (signature at offset 0, Pillow format name). WebP needs two checks and is handled apart.
_IMAGE_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"II+\x00", "TIFF"),  # BigTIFF
    (b"MM\x00+", "TIFF"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
)
SUPPORTED_IMAGE_FORMATS = frozenset({"PNG", "JPEG", "TIFF", "WEBP", "BMP", "GIF"})

# What a file's extension claims: the format the content must then have.
_EXTENSION_FORMAT: dict[str, str] = {
    ".pdf": "PDF",
    ".png": "PNG",
    ".jpg": "JPEG",
    ".jpeg": "JPEG",
    ".jpe": "JPEG",
    ".tif": "TIFF",
    ".tiff": "TIFF",
    ".webp": "WEBP",
    ".bmp": "BMP",
    ".dib": "BMP",
    ".gif": "GIF",
}
# The usual extension of each format, for the "rename it to" hint.
_FORMAT_EXTENSION = {"PDF": ".pdf", "PNG": ".png", "JPEG": ".jpg", "TIFF": ".tif",
                     "WEBP": ".webp", "BMP": ".bmp", "GIF": ".gif"}

# Pillow raises a mix of these for damaged image data; none of them means anything else.
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, KeyError)


@dataclass
class DocumentInfo:
    """What `inspect` learnt about a readable document."""

    kind: DocKind
    format: str  # "PDF", "PNG", "JPEG", "TIFF", "WEBP", "BMP", "GIF"
    page_count: int
    # The password that opened an encrypted PDF ("" or None when none was needed).
    # repr=False keeps it out of logs and tracebacks that print this object.
    password: str | None = field(default=None, repr=False)


# ---------------------------------------------------------------------------- sniffing


def sniff(head: bytes) -> tuple[DocKind, str] | None:
    """(kind, format) from the first bytes of a file, or None if it is nothing we read."""
    if head.startswith(_PDF_MAGIC) or _PDF_MAGIC in head[:_PDF_HEADER_WINDOW]:
        return "pdf", "PDF"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image", "WEBP"
    for signature, fmt in _IMAGE_SIGNATURES:
        if head.startswith(signature):
            return "image", fmt
    return None


def _safe_prefix(head: bytes) -> str:
    """At most 8 leading bytes as a printable Python bytes repr, safe for any log."""
    return repr(bytes(head[:8]))


def _not_readable_message(path: Path, head: bytes) -> str:
    start = f"starts with {_safe_prefix(head)}"
    suffix = path.suffix.lower()
    claimed = _EXTENSION_FORMAT.get(suffix)
    if claimed == "PDF":
        return f"named {suffix} but the content is not a PDF ({start}, not %PDF-)"
    if claimed is not None:
        return f"named {suffix} but the content is not a supported image ({start})"
    return f"content is not a PDF or a supported image ({start})"


# ---------------------------------------------------------------------------- inspect


def _regular_file(path: Path) -> os.stat_result:
    """lstat `path` and refuse anything but a regular file.

    The watcher never takes a symlink, but a queued file can be swapped for one before
    the worker opens it (a link to /etc/... or to a document of another user): PDFium
    and Pillow would follow it, and its content would land in the outbox.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError as exc:
        raise DocumentError(FailureKind.VANISHED, "the file disappeared") from exc
    if stat.S_ISLNK(st.st_mode):
        raise DocumentError(
            FailureKind.UNSUPPORTED,
            "the file was replaced by a symbolic link after it was queued; docinbox never "
            "follows links out of an inbox",
        )
    if not stat.S_ISREG(st.st_mode):
        raise DocumentError(FailureKind.UNSUPPORTED, "not a regular file")
    return st



def inspect(path: Path, *, passwords: Sequence[str], limits: LimitsConfig) -> DocumentInfo:
    """Validate `path` and count its pages, or raise `DocumentError` saying why not.

    The type comes from the content, never from the name alone. A file whose extension
    names another format than its content is refused (unsupported, saying both): a
    mislabelled file is often not what its sender meant to send (an attachment saved
    under the wrong name, a renamed download), and a silent guess would put a surprise
    into the outbox. A file with an extension we do not know (an inbox pattern like `*`)
    is judged by its content alone.
    """
    size = _regular_file(path).st_size
    if size == 0:
        raise DocumentError(FailureKind.EMPTY, "the file is empty (0 bytes)")
    if size > limits.max_file_bytes:
        raise DocumentError(
            FailureKind.TOO_LARGE,
            f"file is {size:,} bytes, over limits.max_file_size = {limits.max_file_bytes:,}",
        )
    try:
        with path.open("rb") as fh:
            head = fh.read(_PDF_HEADER_WINDOW)
    except FileNotFoundError as exc:
        raise DocumentError(FailureKind.VANISHED, "the file disappeared") from exc

    sniffed = sniff(head)
    if sniffed is None:
        raise DocumentError(FailureKind.UNSUPPORTED, _not_readable_message(path, head))
    kind, fmt = sniffed
    suffix = path.suffix.lower()
    claimed = _EXTENSION_FORMAT.get(suffix)
    if claimed is not None and claimed != fmt:
        raise DocumentError(
            FailureKind.UNSUPPORTED,
            f"named {suffix} but the content is {fmt}, not {claimed}: rename it to "
            f"{path.stem}{_FORMAT_EXTENSION[fmt]} if it is meant to be read as {fmt}",
        )

    if kind == "pdf":
        return _inspect_pdf(path, passwords, limits)
    return _inspect_image(path, fmt, limits)


def _open_pdf(path: Path, passwords: Sequence[str]) -> tuple[pdfium.PdfDocument, str | None]:
    """Open with no password first, then each configured one in order.

    Raises ENCRYPTED when none fits and CORRUPT with PDFium's reason for anything else.
    """
    candidates: list[str | None] = [None, *passwords]
    for candidate in candidates:
        try:
            return pdfium.PdfDocument(str(path), password=candidate), candidate
        except pdfium.PdfiumError as exc:
            if exc.err_code == pdfium_c.FPDF_ERR_PASSWORD:
                continue
            raise DocumentError(FailureKind.CORRUPT, _pdfium_reason(exc)) from exc
        except FileNotFoundError as exc:
            raise DocumentError(FailureKind.VANISHED, "the file disappeared") from exc
    raise DocumentError(FailureKind.ENCRYPTED, "no matching password in config")


def _pdfium_reason(exc: pdfium.PdfiumError) -> str:
    # PDFium words it as "Failed to load document (PDFium: Data format error)."
    text = str(exc).strip().rstrip(".")
    return f"the PDF cannot be read: {text}"


def _inspect_pdf(path: Path, passwords: Sequence[str], limits: LimitsConfig) -> DocumentInfo:
    doc, password = _open_pdf(path, passwords)
    try:
        pages = len(doc)
        if pages == 0:
            raise DocumentError(FailureKind.CORRUPT, "the PDF has no pages")
        if pages > limits.max_pages:
            raise DocumentError(
                FailureKind.TOO_LARGE,
                f"PDF has {pages:,} pages, over limits.max_pages = {limits.max_pages:,}",
            )
        # PDFium repairs broken cross-reference tables on open, so a damaged file can open
        # and still have no loadable page; trying the first one catches most of those.
        try:
            doc[0].close()
        except pdfium.PdfiumError as exc:
            raise DocumentError(
                FailureKind.CORRUPT, f"the PDF cannot be read: page 1 does not load ({exc})"
            ) from exc
    finally:
        doc.close()
    return DocumentInfo(kind="pdf", format="PDF", page_count=pages, password=password)


@contextlib.contextmanager
def _pillow_guard(max_image_pixels: int) -> Iterator[None]:
    """Apply our bomb limit to Pillow for the duration of one call.

    Pillow's limit is a module global; the worker handles one document at a time, so
    setting it per call is safe and lets each call carry its own configured limit. Pillow
    only warns between 1x and 2x the limit, so the warning is turned into an error here.
    """
    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max_image_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    finally:
        Image.MAX_IMAGE_PIXELS = previous


def _bomb(width: int, height: int, limit: int) -> DocumentError:
    return DocumentError(
        FailureKind.BOMB,
        f"image is {width}x{height} = {width * height:,} pixels, over "
        f"limits.max_image_pixels = {limit:,}; raise limits.max_image_pixels in the config "
        "if this image is genuine",
    )


def _header_size(path: Path) -> tuple[int, int] | None:
    """The size an image header claims, read with Pillow's bomb check off (header only)."""
    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        with warnings.catch_warnings(), Image.open(path) as im:
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return im.size
    except Exception:  # only used to word a message; the caller already has an error
        return None
    finally:
        Image.MAX_IMAGE_PIXELS = previous


@contextlib.contextmanager
def _open_image(path: Path, max_image_pixels: int) -> Iterator[Image.Image]:
    """Image.open under our bomb limit, with every failure mapped to a DocumentError."""
    try:
        with _pillow_guard(max_image_pixels), Image.open(path) as im:
            _check_pixels(im, max_image_pixels)
            yield im
    except DocumentError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        size = _header_size(path)
        if size is None:
            raise DocumentError(FailureKind.BOMB, str(exc)) from exc
        raise _bomb(size[0], size[1], max_image_pixels) from exc
    except FileNotFoundError as exc:
        raise DocumentError(FailureKind.VANISHED, "the file disappeared") from exc
    except UnidentifiedImageError as exc:
        raise DocumentError(
            FailureKind.CORRUPT, "the image cannot be read: its header is damaged"
        ) from exc
    except _DECODE_ERRORS as exc:
        raise DocumentError(
            FailureKind.CORRUPT, f"the image data is damaged or truncated ({exc})"
        ) from exc


def _check_pixels(im: Image.Image, limit: int) -> None:
    # Pillow checks only the first frame at open; TIFF frames can each have their own size.
    width, height = im.size
    if width * height > limit:
        raise _bomb(width, height, limit)


def _inspect_image(path: Path, fmt: str, limits: LimitsConfig) -> DocumentInfo:
    with _open_image(path, limits.max_image_pixels) as im:
        if im.format is not None and im.format.upper() not in SUPPORTED_IMAGE_FORMATS:
            raise DocumentError(
                FailureKind.UNSUPPORTED,
                f"content is not a PDF or a supported image (it is {im.format})",
            )
        # Only TIFF pages are pages; GIF and WebP frames are animation, so we read frame 1.
        pages = int(getattr(im, "n_frames", 1)) if fmt == "TIFF" else 1
        # Decode now so truncation is reported before any engine time is spent. Pillow's
        # LOAD_TRUNCATED_IMAGES stays off: a silently grey half-page would be worse.
        im.load()
    if pages > limits.max_pages:
        raise DocumentError(
            FailureKind.TOO_LARGE,
            f"image has {pages:,} pages, over limits.max_pages = {limits.max_pages:,}",
        )
    return DocumentInfo(kind="image", format=fmt, page_count=pages)


# ---------------------------------------------------------------------------- rendering


def choose_renderer() -> RendererName:
    """The PDF rasteriser to use: `RENDERER` if forced, else poppler when installed."""
    if RENDERER != "auto":
        return RENDERER
    return "poppler" if shutil.which("pdftoppm") else "pdfium"


def effective_dpi(
    page_size_pt: tuple[float, float], *, dpi: int, max_long_side: int, max_image_pixels: int
) -> int:
    """The whole-number DPI at most `dpi` at which the page fits both pixel limits.

    Computed up front from the page size so no oversize bitmap is ever rendered first.
    """
    width_pt, height_pt = page_size_pt
    long_pt = max(width_pt, height_pt, 1e-3)
    limit = float(dpi)
    limit = min(limit, max_long_side * 72.0 / long_pt)
    area_in2 = max(width_pt * height_pt, 1e-6) / (72.0 * 72.0)
    limit = min(limit, math.sqrt(max_image_pixels / area_in2))
    return max(1, math.floor(limit))


def render_page(
    path: Path,
    info: DocumentInfo,
    page_idx: int,
    *,
    dpi: int,
    max_long_side: int,
    max_image_pixels: int,
) -> PageInput:
    """Render page `page_idx` (0-based) as RGB. Only this page is ever decoded."""
    if not 0 <= page_idx < info.page_count:
        raise IndexError(f"page {page_idx} of a {info.page_count}-page document")
    _regular_file(path)
    if info.kind == "pdf":
        return _render_pdf_page(
            path,
            info,
            page_idx,
            dpi=dpi,
            max_long_side=max_long_side,
            max_image_pixels=max_image_pixels,
        )
    return _render_image_page(
        path, info, page_idx, max_long_side=max_long_side, max_image_pixels=max_image_pixels
    )


def _render_pdf_page(
    path: Path,
    info: DocumentInfo,
    page_idx: int,
    *,
    dpi: int,
    max_long_side: int,
    max_image_pixels: int,
) -> PageInput:
    doc = _open_known_pdf(path, info.password)
    try:
        try:
            page = doc[page_idx]
        except pdfium.PdfiumError as exc:
            raise DocumentError(
                FailureKind.CORRUPT, f"page {page_idx + 1} does not load ({exc})"
            ) from exc
        # get_size() is the displayed size: /Rotate 90 pages report width and height swapped.
        size_pt = page.get_size()
        page_dpi = effective_dpi(
            size_pt, dpi=dpi, max_long_side=max_long_side, max_image_pixels=max_image_pixels
        )
        # An encrypted PDF is never handed to pdftoppm: its password would sit on a
        # command line, readable by every user through `ps`. PDFium renders it in-process.
        if choose_renderer() == "poppler" and not info.password:
            page.close()
            image = _render_poppler(path, info.password, page_idx, page_dpi)
        else:
            image = _render_pdfium(doc, page, page_dpi)
    finally:
        doc.close()
    # Renderers round pixel sizes up; never hand an engine more than it was promised.
    image = _fit(image.convert("RGB"), max_long_side)
    return PageInput(
        image=image,
        page_idx=page_idx,
        page_count=info.page_count,
        dpi=page_dpi,
        pdf_path=path,
        pdf_password=info.password,
        page_size_pt=(float(size_pt[0]), float(size_pt[1])),
    )


def _open_known_pdf(path: Path, password: str | None) -> pdfium.PdfDocument:
    try:
        return pdfium.PdfDocument(str(path), password=password)
    except pdfium.PdfiumError as exc:
        if exc.err_code == pdfium_c.FPDF_ERR_PASSWORD:
            raise DocumentError(FailureKind.ENCRYPTED, "no matching password in config") from exc
        raise DocumentError(FailureKind.CORRUPT, _pdfium_reason(exc)) from exc
    except FileNotFoundError as exc:
        raise DocumentError(FailureKind.VANISHED, "the file disappeared") from exc


def _render_pdfium(doc: pdfium.PdfDocument, page: pdfium.PdfPage, page_dpi: int) -> Image.Image:
    try:
        # Form fields are drawn from their appearance streams only once forms are set up;
        # filled-in forms would otherwise render empty.
        with contextlib.suppress(pdfium.PdfiumError):
            doc.init_forms()
        bitmap = page.render(scale=page_dpi / 72.0, may_draw_forms=True)
        image: Image.Image = bitmap.to_pil()
        return image
    except pdfium.PdfiumError as exc:
        raise DocumentError(FailureKind.CORRUPT, f"the page cannot be rendered ({exc})") from exc


def _render_poppler(path: Path, password: str | None, page_idx: int, page_dpi: int) -> Image.Image:
    from pdf2image import convert_from_path
    from pdf2image.exceptions import PDFInfoNotInstalledError, PDFPageCountError, PDFSyntaxError

    kwargs: dict[str, Any] = {}
    if password:
        kwargs["userpw"] = password
    try:
        # first_page == last_page: pdftoppm rasterises this single page and nothing else.
        images: list[Image.Image] = convert_from_path(
            str(path),
            dpi=page_dpi,
            first_page=page_idx + 1,
            last_page=page_idx + 1,
            thread_count=1,
            **kwargs,
        )
    except PDFInfoNotInstalledError as exc:
        raise RuntimeError("poppler renderer selected but poppler is not installed") from exc
    except (PDFPageCountError, PDFSyntaxError) as exc:
        raise DocumentError(FailureKind.CORRUPT, f"the page cannot be rendered ({exc})") from exc
    if not images:
        raise DocumentError(
            FailureKind.CORRUPT, f"poppler rendered nothing for page {page_idx + 1}"
        )
    return images[0]


def _render_image_page(
    path: Path, info: DocumentInfo, page_idx: int, *, max_long_side: int, max_image_pixels: int
) -> PageInput:
    with _open_image(path, max_image_pixels) as im:
        try:
            if page_idx:
                im.seek(page_idx)
                _check_pixels(im, max_image_pixels)
            im.load()
            # Phones and scanners store pixels sideways plus an EXIF note to turn them.
            upright = ImageOps.exif_transpose(im)
            rgb = to_rgb(upright)
        except DocumentError:
            raise
        except EOFError as exc:
            raise DocumentError(
                FailureKind.CORRUPT, f"page {page_idx + 1} is missing from the image"
            ) from exc
        except _DECODE_ERRORS as exc:
            raise DocumentError(
                FailureKind.CORRUPT, f"the image data is damaged or truncated ({exc})"
            ) from exc
    return PageInput(
        image=_fit(rgb, max_long_side),
        page_idx=page_idx,
        page_count=info.page_count,
        dpi=None,
    )


def to_rgb(im: Image.Image) -> Image.Image:
    """Any Pillow mode we meet in documents -> 8-bit RGB, transparency flattened on white."""
    mode = im.mode
    if mode == "RGB":
        return im.copy()
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        return _high_depth_to_rgb(im)
    if mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        mode in ("P", "L", "RGB") and "transparency" in im.info
    ):
        rgba = im.convert("RGBA")
        # Transparent areas of scans and screenshots are paper; black would hide the text.
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if mode == "1":
        return im.convert("L").convert("RGB")
    # CMYK, YCbCr, L, P, RGBX, HSV: Pillow converts these directly. CMYK is converted
    # without colour management; text contrast is what matters here, not colour fidelity.
    try:
        return im.convert("RGB")
    except ValueError as exc:
        raise DocumentError(
            FailureKind.UNSUPPORTED, f"image colour mode {mode} is not supported"
        ) from exc


def _high_depth_to_rgb(im: Image.Image) -> Image.Image:
    import numpy as np

    arr = np.asarray(im, dtype=np.float64)
    peak = float(arr.max()) if arr.size else 0.0
    if im.mode.startswith("I;16") or 255.0 < peak <= 65535.0:
        scaled = arr / 257.0  # 16-bit range onto 8-bit
    elif peak > 65535.0:
        scaled = arr * (255.0 / peak)  # 32-bit data: stretch what is there
    else:
        scaled = arr  # already 0..255 (e.g. an 8-bit image opened as mode I)
    grey = Image.fromarray(np.clip(scaled + 0.5, 0, 255).astype(np.uint8), mode="L")
    return grey.convert("RGB")


def _fit(image: Image.Image, max_long_side: int) -> Image.Image:
    width, height = image.size
    long_side = max(width, height)
    if long_side <= max_long_side:
        return image
    scale = max_long_side / long_side
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    if max(size) > max_long_side:  # rounding up on the long side
        size = (min(size[0], max_long_side), min(size[1], max_long_side))
    return image.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)


# ---------------------------------------------------------------------------- text layer


@dataclass(frozen=True)
class TextLine:
    """One line (or one horizontally separate piece of a line) of a PDF's text layer.

    bbox is (x0, y0, x1, y1) in 0..1 of the displayed page (page rotation applied), origin
    top-left, like `Block.bbox`. font_size is the median effective size in points.
    """

    text: str
    bbox: tuple[float, float, float, float]
    font_size: float | None = None
    invisible: bool = False  # drawn with text render mode 3: an OCR layer over a scan
    unmapped: int = 0  # characters PDFium could not map to Unicode (garbled on extraction)
    bold: bool = False  # most characters are in a bold font (weight or font name says so)


# A gap wider than this many line heights (≈1.2 em each) between characters on one baseline
# starts a new TextLine: even stretched justified word spaces stay under two em, while
# table cells and row-wise written column gutters are usually wider.
_SEGMENT_GAP = 2.0
_INVISIBLE_RENDER_MODE = 3  # FPDF_TEXTRENDERMODE_INVISIBLE


@dataclass
class _Char:
    ch: str
    box: tuple[float, float, float, float]  # displayed points, top-left origin
    # The same box in the character's own reading frame: rotated by the glyph's angle
    # (in quarter turns) so its text runs left to right and "down" is the next line.
    rbox: tuple[float, float, float, float]
    quarter: int  # the glyph's angle in quarter turns; a change of direction ends a line
    size: float | None
    invisible: bool
    unmapped: bool
    bold: bool


def pdf_text_layer(path: Path, password: str | None, page_idx: int) -> list[TextLine]:
    """The text lines of one PDF page, in the order the PDF draws them.

    Reading order is the producer's content order, which for most born-digital files is
    reading order within a column; engines sort blocks themselves.
    """
    doc = _open_known_pdf(path, password)
    try:
        page = doc[page_idx]
        try:
            return page_text_lines(page)
        finally:
            page.close()
    except pdfium.PdfiumError as exc:
        raise DocumentError(
            FailureKind.CORRUPT, f"text of page {page_idx + 1} cannot be read ({exc})"
        ) from exc
    finally:
        doc.close()


def page_text_lines(page: pdfium.PdfPage) -> list[TextLine]:
    """`pdf_text_layer` for a page that is already open (for engines that keep a document)."""
    geometry = _PageGeometry.of(page)
    textpage = page.get_textpage()
    try:
        chars = list(_iter_chars(textpage, geometry))
    finally:
        textpage.close()
    return _group_lines(chars, geometry.display_size)


@dataclass(frozen=True)
class _PageGeometry:
    """Maps PDF user space to displayed points: origin top-left, /Rotate applied."""

    left: float
    bottom: float
    right: float
    top: float
    rotation: int  # clockwise degrees, as /Rotate

    @classmethod
    def of(cls, page: pdfium.PdfPage) -> _PageGeometry:
        left, bottom, right, top = page.get_bbox()  # the visible (crop) box in user space
        return cls(left, bottom, right, top, page.get_rotation() % 360)

    @property
    def display_size(self) -> tuple[float, float]:
        width = max(self.right - self.left, 1e-6)
        height = max(self.top - self.bottom, 1e-6)
        return (height, width) if self.rotation in (90, 270) else (width, height)

    def to_display(self, x: float, y: float) -> tuple[float, float]:
        width = max(self.right - self.left, 1e-6)
        height = max(self.top - self.bottom, 1e-6)
        dx, dy = x - self.left, self.top - y  # unrotated, top-left origin
        # /Rotate turns the page clockwise for display.
        if self.rotation == 90:
            return height - dy, dx
        if self.rotation == 180:
            return width - dx, height - dy
        if self.rotation == 270:
            return dy, width - dx
        return dx, dy


def _iter_chars(textpage: pdfium.PdfTextPage, geometry: _PageGeometry) -> Iterator[_Char | str]:
    """Characters with displayed boxes; yields "\\n" for line ends and " " for spaces."""
    matrix = pdfium_c.FS_MATRIX()
    # Per text object: (effective size, invisible, bold); one object holds many chars.
    object_facts: dict[int, tuple[float | None, bool, bool]] = {}
    count = textpage.count_chars()
    index = 0
    while index < count:
        code = pdfium_c.FPDFText_GetUnicode(textpage, index)
        current = index
        index += 1
        if 0xD800 <= code <= 0xDBFF and index < count:
            low = pdfium_c.FPDFText_GetUnicode(textpage, index)
            if 0xDC00 <= low <= 0xDFFF:
                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                index += 1
        ch = chr(code) if 0 <= code <= 0x10FFFF else "\ufffd"
        if code in (0x02, 0xAD):
            # PDFium marks a hyphen that breaks a word at a line end as U+0002; a soft
            # hyphen is the same thing. Both are shown as "-" so consumers can rejoin.
            ch = "-"
        if ch in "\r\n":
            yield "\n"
            continue
        if ch.isspace() or code == 0:
            yield " "
            continue
        left, bottom, right, top = textpage.get_charbox(current, loose=True)
        x0, y0 = geometry.to_display(left, top)
        x1, y1 = geometry.to_display(right, bottom)
        box = (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))
        angle = pdfium_c.FPDFText_GetCharAngle(textpage, current)
        quarter = round(angle / (math.pi / 2)) % 4 if angle >= 0 else 0
        rx0, ry0 = _to_reading_frame(left, bottom, quarter)
        rx1, ry1 = _to_reading_frame(right, top, quarter)
        rbox = (min(rx0, rx1), min(ry0, ry1), max(rx0, rx1), max(ry0, ry1))
        obj = pdfium_c.FPDFText_GetTextObject(textpage, current)
        key = ctypes.cast(obj, ctypes.c_void_p).value or 0
        facts = object_facts.get(key)
        if facts is None:
            facts = _object_facts(textpage, current, obj, matrix)
            object_facts[key] = facts
        yield _Char(
            ch=ch,
            box=box,
            rbox=rbox,
            quarter=quarter,
            size=facts[0],
            invisible=facts[1],
            bold=facts[2],
            unmapped=bool(pdfium_c.FPDFText_HasUnicodeMapError(textpage, current) == 1),
        )


def _to_reading_frame(x: float, y: float, quarter: int) -> tuple[float, float]:
    """User-space point -> frame where text at `quarter` * 90° runs along +x, lines go +y.

    Page /Rotate is deliberately not involved: generators write text in user space, and
    a landscape table on a rotated page still runs along its own baseline there.
    """
    if quarter == 1:  # text runs up the page
        return y, x
    if quarter == 2:  # upside down
        return -x, y
    if quarter == 3:  # text runs down the page
        return -y, -x
    return x, -y


def _object_facts(
    textpage: pdfium.PdfTextPage, index: int, obj: Any, matrix: Any
) -> tuple[float | None, bool, bool]:
    # FPDFText_GetFontSize is the Tf operand only; generators that write "1 Tf" and scale
    # with the text matrix are common, so multiply by the matrix's scale.
    size: float | None = float(pdfium_c.FPDFText_GetFontSize(textpage, index))
    if pdfium_c.FPDFText_GetMatrix(textpage, index, ctypes.byref(matrix)):
        scale = math.sqrt(abs(matrix.a * matrix.d - matrix.b * matrix.c))
        size = size * scale if size is not None and scale > 0 else size
    if size is not None and size <= 0:
        size = None
    invisible = bool(obj) and (
        pdfium_c.FPDFTextObj_GetTextRenderMode(obj) == _INVISIBLE_RENDER_MODE
    )
    return size, invisible, _is_bold(textpage, index)


# Bold face names: "Arial-BoldMT", "Helvetica-Black", and TeX's bold extended fonts
# (Computer Modern "CMBX10", cm-super "SFBX1000", EC "ECBX1000"), matched after the
# six-letter subset prefix ("ABCDEF+") is removed.
_BOLD_NAME = re.compile(r"bold|black|heavy|demi|^(cm|sf|ec)bx")
_FORCE_BOLD_FLAG = 1 << 18  # PDF font descriptor flag bit 19


def _is_bold(textpage: pdfium.PdfTextPage, index: int) -> bool:
    # Many fonts omit /FontWeight, so the name ("Helvetica-Bold", "ABCDEF+Arial-BoldMT")
    # and the ForceBold flag are consulted too.
    if pdfium_c.FPDFText_GetFontWeight(textpage, index) >= 600:
        return True
    flags = ctypes.c_int(0)
    length = pdfium_c.FPDFText_GetFontInfo(textpage, index, None, 0, ctypes.byref(flags))
    if length <= 0:
        return False
    buffer = ctypes.create_string_buffer(length)
    pdfium_c.FPDFText_GetFontInfo(textpage, index, buffer, length, ctypes.byref(flags))
    name = buffer.value.decode("utf-8", "replace").lower()
    name = name.split("+", 1)[1] if len(name) > 7 and name[6] == "+" else name
    return bool(flags.value & _FORCE_BOLD_FLAG) or bool(_BOLD_NAME.search(name))


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, value))


def _group_lines(stream: Sequence[_Char | str], page_size: tuple[float, float]) -> list[TextLine]:
    lines: list[TextLine] = []
    current: list[_Char] = []
    text: list[str] = []
    pending_space = False

    def flush() -> None:
        nonlocal current, text, pending_space
        if current:
            lines.append(_make_line(current, "".join(text).strip(), page_size))
        current, text, pending_space = [], [], False

    for item in stream:
        if isinstance(item, str):
            if item == "\n":
                flush()
            else:
                pending_space = bool(current)
            continue
        if current and not _continues_line(current, item):
            flush()
        if pending_space and current:
            text.append(" ")
        pending_space = False
        current.append(item)
        text.append(item.ch)
    flush()
    return [line for line in lines if line.text]


def _continues_line(current: list[_Char], char: _Char) -> bool:
    """Does `char` sit on the current line's baseline, next to what is there already?

    Compared in the glyphs' reading frame so rotated text groups like upright text, and
    against the line's whole extent rather than the previous glyph so right-to-left
    scripts (drawn leftwards) and overlapping accents stay on their line.
    """
    if char.quarter != current[0].quarter:
        return False
    x0 = min(c.rbox[0] for c in current)
    x1 = max(c.rbox[2] for c in current)
    top = min(c.rbox[1] for c in current)
    bottom = max(c.rbox[3] for c in current)
    height = max(bottom - top, 1e-6)
    c_x0, c_top, c_x1, c_bottom = char.rbox
    overlap = min(bottom, c_bottom) - max(top, c_top)
    if overlap < 0.5 * min(height, max(c_bottom - c_top, 1e-6)):
        return False
    # Distance to the line's extent along the baseline; 0 when touching or overlapping.
    gap = max(0.0, c_x0 - x1, x0 - c_x1)
    return gap <= _SEGMENT_GAP * height


def _make_line(chars: list[_Char], text: str, page_size: tuple[float, float]) -> TextLine:
    width, height = page_size
    bbox = (
        _clamp(min(c.box[0] for c in chars) / width),
        _clamp(min(c.box[1] for c in chars) / height),
        _clamp(max(c.box[2] for c in chars) / width),
        _clamp(max(c.box[3] for c in chars) / height),
    )
    sizes = [c.size for c in chars if c.size is not None]
    return TextLine(
        text=text,
        bbox=bbox,
        font_size=round(statistics.median(sizes), 2) if sizes else None,
        invisible=sum(c.invisible for c in chars) * 2 > len(chars),
        bold=sum(c.bold for c in chars) * 2 > len(chars),
        unmapped=sum(c.unmapped for c in chars),
    )


def text_layer_is_trustworthy(
    lines: Sequence[TextLine],
    *,
    min_chars: int = 16,
    max_bad_ratio: float = 0.1,
    allow_invisible: bool = False,
) -> bool:
    """Is this text layer good enough to use instead of looking at the pixels?

    Yes when the page has at least `min_chars` visible characters and at most
    `max_bad_ratio` of them are junk: U+FFFD, private-use code points, control or
    unassigned characters, or characters PDFium could not map to Unicode (broken font
    encodings extract as garbage). An invisible text layer (render mode 3) is the OCR
    result of some earlier tool laid over a scan: its quality is unknown, so by default it
    is not trusted and the page is OCR'd again; `allow_invisible=True` accepts it.
    Pages with a little real text over a large picture (a scanned page with a typed
    header) pass this check; telling those apart needs the image layer, which engines that
    care can inspect themselves.
    """
    total = 0
    bad = 0
    invisible = 0
    for line in lines:
        n = 0
        for ch in line.text:
            if ch.isspace():
                continue
            n += 1
            if _is_junk(ch):
                bad += 1
        bad += min(line.unmapped, n)
        total += n
        if line.invisible:
            invisible += n
    if total < min_chars:
        return False
    if bad > max_bad_ratio * total:
        return False
    return allow_invisible or invisible * 2 <= total


def _is_junk(ch: str) -> bool:
    if ch == "\ufffd":
        return True
    category = unicodedata.category(ch)
    # Co = private use (symbol fonts without a ToUnicode map land there), Cc/Cs/Cn = control,
    # surrogate, unassigned. Cf (format characters such as RTL marks) is legitimate.
    return category in ("Co", "Cc", "Cs", "Cn")


def text_in_bbox(
    lines: Sequence[TextLine],
    bbox: tuple[float, float, float, float],
    *,
    min_overlap: float = 0.5,
) -> str:
    """The text of the lines that lie mostly inside `bbox` (normalised), top to bottom.

    For engines that find blocks on the image and fill them from the text layer. A line
    counts when at least `min_overlap` of its area is inside the box.
    """
    x0, y0, x1, y1 = bbox
    picked: list[TextLine] = []
    for line in lines:
        lx0, ly0, lx1, ly1 = line.bbox
        area = max(lx1 - lx0, 1e-9) * max(ly1 - ly0, 1e-9)
        inter_w = min(x1, lx1) - max(x0, lx0)
        inter_h = min(y1, ly1) - max(y0, ly0)
        if inter_w > 0 and inter_h > 0 and inter_w * inter_h >= min_overlap * area:
            picked.append(line)
    picked.sort(key=lambda ln: (round(ln.bbox[1], 3), ln.bbox[0]))
    return "\n".join(line.text for line in picked)
