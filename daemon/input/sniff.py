"""What a file is and whether we can read it. Runs inside the worker process.

`inspect()` decides, from the file's real content, whether we can read a document at all
and how many pages it has; every refusal is a `DocumentError` whose `FailureKind` and
message tell the user what to do. The type comes from the first bytes (`sniff`, by the
magic of each format in `formats.py`), never from the name alone; each reader there has its
checks here. The helpers that open a file safely (no symlinks, Pillow's bomb limit, PDFium's
errors in words) are shared with `raster` and `textlayer`.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image, UnidentifiedImageError

from daemon.common.errors import DocumentError, FailureKind
from daemon.config.settings import LimitsConfig
from daemon.document.formats import (
    FORMATS,
    IMAGE_READER,
    OFFICE_READER,
    PDF_READER,
    DocKind,
    Head,
    InputFormat,
    by_extension,
    identify,
)
from daemon.input.office import convert_to_pdf

# The Pillow format names we read; anything else Pillow opens is refused.
SUPPORTED_IMAGE_FORMATS = frozenset(fmt.name for fmt in FORMATS if fmt.reader is IMAGE_READER)


def _register_plugins() -> None:
    """HEIF/HEIC (what iPhones save) through pillow-heif; AVIF is built into Pillow >= 11.3.

    Registered once per process that reads images (the worker); without pillow-heif such
    files fail with a reason that names the package instead of "not a supported image".
    """
    try:
        import pillow_heif
    except ImportError:
        return
    pillow_heif.register_heif_opener()


_register_plugins()

# Pillow raises a mix of these for damaged image data; none of them means anything else.
DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, KeyError)


@dataclass
class DocumentInfo:
    """What `inspect` learnt about a readable document."""

    kind: DocKind
    format: str  # "PDF", "PNG", "JPEG", "TIFF", "WEBP", "BMP", "GIF", "HEIF", "AVIF", ...
    page_count: int
    # The password that opened an encrypted PDF ("" or None when none was needed).
    # repr=False keeps it out of logs and tracebacks that print this object.
    password: str | None = field(default=None, repr=False)
    # Office documents: the PDF LibreOffice made of it, which is what gets rendered.
    converted_pdf: Path | None = None


# ---------------------------------------------------------------------------- sniffing


def sniff(path: Path | None, head: bytes) -> InputFormat | None:
    """The format of a file from its first bytes, or None if it is nothing we read.

    `path` lets a zip be opened to tell Word from Excel from PowerPoint; without it only
    the first bytes count.
    """
    return identify(Head(head, path))


def _safe_prefix(head: bytes) -> str:
    """At most 8 leading bytes as a printable Python bytes repr, safe for any log."""
    return repr(bytes(head[:8]))


def _not_readable_message(path: Path, head: bytes) -> str:
    start = f"starts with {_safe_prefix(head)}"
    suffix = path.suffix.lower()
    claimed = by_extension(suffix)
    if claimed is not None and claimed.reader is PDF_READER:
        return f"named {suffix} but the content is not a PDF ({start}, not %PDF-)"
    if claimed is not None and claimed.reader is OFFICE_READER:
        return f"named {suffix} but the content is not {claimed.what} ({start})"
    if claimed is not None:
        return f"named {suffix} but the content is not a supported image ({start})"
    return f"content is not a PDF or a supported image ({start})"


# ---------------------------------------------------------------------------- inspect


def regular_file(path: Path) -> os.stat_result:
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
    size = regular_file(path).st_size
    if size == 0:
        raise DocumentError(FailureKind.EMPTY, "the file is empty (0 bytes)")
    at_most("file is", size, "bytes", "max_file_size", limits.max_file_bytes)
    try:
        with path.open("rb") as fh:
            head = fh.read(Head.SIZE)
    except FileNotFoundError as exc:
        raise DocumentError(FailureKind.VANISHED, "the file disappeared") from exc

    found = sniff(path, head)
    if found is None:
        raise DocumentError(FailureKind.UNSUPPORTED, _not_readable_message(path, head))
    suffix = path.suffix.lower()
    claimed = by_extension(suffix)
    if claimed is not None and claimed is not found:
        fmt = found.name
        raise DocumentError(
            FailureKind.UNSUPPORTED,
            f"named {suffix} but the content is {fmt}, not {claimed.name}: rename it to "
            f"{path.stem}{found.usual_extension} if it is meant to be read as {fmt}",
        )
    return _READERS[found.reader.name](path, found, passwords, limits)


def _read_pdf(
    path: Path, fmt: InputFormat, passwords: Sequence[str], limits: LimitsConfig
) -> DocumentInfo:
    return _inspect_pdf(path, passwords, limits)


def _read_office(
    path: Path, fmt: InputFormat, passwords: Sequence[str], limits: LimitsConfig
) -> DocumentInfo:
    pdf = convert_to_pdf(path, fmt)
    info = _inspect_pdf(pdf, passwords, limits)
    return DocumentInfo(
        kind=fmt.reader.kind, format=fmt.name, page_count=info.page_count, converted_pdf=pdf
    )


def _read_image(
    path: Path, fmt: InputFormat, passwords: Sequence[str], limits: LimitsConfig
) -> DocumentInfo:
    return _inspect_image(path, fmt, limits)


# Each reader of formats.py: how a file of its formats is checked and its pages counted
# (raster.py renders them by `DocumentInfo.kind`, the reader's `kind`).
_READERS: dict[str, Callable[[Path, InputFormat, Sequence[str], LimitsConfig], DocumentInfo]] = {
    PDF_READER.name: _read_pdf,
    OFFICE_READER.name: _read_office,
    IMAGE_READER.name: _read_image,
}


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
            raise DocumentError(FailureKind.CORRUPT, pdfium_reason(exc)) from exc
        except FileNotFoundError as exc:
            raise DocumentError(FailureKind.VANISHED, "the file disappeared") from exc
    raise DocumentError(FailureKind.ENCRYPTED, "no matching password in config")


def pdfium_reason(exc: pdfium.PdfiumError) -> str:
    # PDFium words it as "Failed to load document (PDFium: Data format error)."
    text = str(exc).strip().rstrip(".")
    return f"the PDF cannot be read: {text}"


# PDFium must never be called from two threads at once, not even for different documents
# (pypdfium2's documentation: it corrupts or crashes the process). The worker renders the
# next page in a thread while the engine reads the text layer of the current one, so every
# PDFium call in docinbox holds this lock. Re-entrant: helpers call each other.
PDFIUM_LOCK = threading.RLock()


def _inspect_pdf(path: Path, passwords: Sequence[str], limits: LimitsConfig) -> DocumentInfo:
    with PDFIUM_LOCK:
        return _inspect_pdf_locked(path, passwords, limits)


def _inspect_pdf_locked(
    path: Path, passwords: Sequence[str], limits: LimitsConfig
) -> DocumentInfo:
    doc, password = _open_pdf(path, passwords)
    try:
        pages = len(doc)
        if pages == 0:
            raise DocumentError(FailureKind.CORRUPT, "the PDF has no pages")
        at_most("PDF has", pages, "pages", "max_pages", limits.max_pages)
        # PDFium repairs broken cross-reference tables on open, so a damaged file can open
        # and still have no loadable page; trying the first one catches most of those.
        load_page(doc, 0).close()
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
def open_image(path: Path, max_image_pixels: int) -> Iterator[Image.Image]:
    """Image.open under our bomb limit, with every failure mapped to a DocumentError."""
    try:
        with _pillow_guard(max_image_pixels), Image.open(path) as im:
            check_pixels(im, max_image_pixels)
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
    except DECODE_ERRORS as exc:
        raise DocumentError(
            FailureKind.CORRUPT, f"the image data is damaged or truncated ({exc})"
        ) from exc


def check_pixels(im: Image.Image, limit: int) -> None:
    # Pillow checks only the first frame at open; TIFF frames can each have their own size.
    width, height = im.size
    if width * height > limit:
        raise _bomb(width, height, limit)


def _missing_decoder(fmt: InputFormat) -> str | None:
    """What to install when this Pillow cannot decode `fmt`, or None when it can."""
    if fmt.decoder_hint is None:
        return None
    Image.init()  # Pillow registers its format plugins lazily
    return None if fmt.name in Image.OPEN else fmt.decoder_hint


def _inspect_image(path: Path, fmt: InputFormat, limits: LimitsConfig) -> DocumentInfo:
    missing = _missing_decoder(fmt)
    if missing is not None:
        raise DocumentError(FailureKind.UNSUPPORTED, missing)
    with open_image(path, limits.max_image_pixels) as im:
        if im.format is not None and im.format.upper() not in SUPPORTED_IMAGE_FORMATS:
            raise DocumentError(
                FailureKind.UNSUPPORTED,
                f"content is not a PDF or a supported image (it is {im.format})",
            )
        # Only TIFF pages are pages; GIF and WebP frames are animation, so we read frame 1.
        pages = int(getattr(im, "n_frames", 1)) if fmt.frames_are_pages else 1
        # Decode now so truncation is reported before any engine time is spent. Pillow's
        # LOAD_TRUNCATED_IMAGES stays off: a silently grey half-page would be worse.
        im.load()
    at_most("image has", pages, "pages", "max_pages", limits.max_pages)
    return DocumentInfo(kind=fmt.reader.kind, format=fmt.name, page_count=pages)


def at_most(what: str, count: int, unit: str, key: str, limit: int) -> None:
    """Refuse a document over one of the `limits` keys (too_large), naming the key to raise."""
    if count > limit:
        raise DocumentError(
            FailureKind.TOO_LARGE, f"{what} {count:,} {unit}, over limits.{key} = {limit:,}"
        )


def open_known_pdf(path: Path, password: str | None) -> pdfium.PdfDocument:
    try:
        return pdfium.PdfDocument(str(path), password=password)
    except pdfium.PdfiumError as exc:
        if exc.err_code == pdfium_c.FPDF_ERR_PASSWORD:
            raise DocumentError(FailureKind.ENCRYPTED, "no matching password in config") from exc
        raise DocumentError(FailureKind.CORRUPT, pdfium_reason(exc)) from exc
    except FileNotFoundError as exc:
        raise DocumentError(FailureKind.VANISHED, "the file disappeared") from exc


def load_page(doc: pdfium.PdfDocument, page_idx: int) -> pdfium.PdfPage:
    """Page `page_idx` of an open PDF; a page PDFium cannot load makes the PDF corrupt."""
    try:
        return doc[page_idx]
    except pdfium.PdfiumError as exc:
        raise DocumentError(
            FailureKind.CORRUPT,
            f"the PDF cannot be read: page {page_idx + 1} does not load ({exc})",
        ) from exc
