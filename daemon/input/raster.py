"""Page rasterising: one page of an inspected document -> an RGB image for an engine.

Only the requested page is ever decoded. PDFs are rendered with poppler through pdf2image
when `pdftoppm` is installed (it is a declared dependency and many users have it) and with
PDFium otherwise; `RENDERER` forces one for tests. Image files are decoded with Pillow under
the bomb limit, turned upright by their EXIF note and flattened to 8-bit RGB.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from pathlib import Path
from typing import Any, Literal

import pypdfium2 as pdfium
from PIL import Image, ImageOps

from daemon.common.errors import DocumentError, FailureKind
from daemon.document.page import PageInput
from daemon.input.sniff import (
    DECODE_ERRORS,
    PDFIUM_LOCK,
    DocumentInfo,
    check_pixels,
    load_page,
    open_image,
    open_known_pdf,
    regular_file,
)

RendererName = Literal["poppler", "pdfium"]

# "auto" picks poppler when `pdftoppm` is on PATH, else PDFium. Tests set this to force one.
RENDERER: Literal["auto", "poppler", "pdfium"] = "auto"


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
    regular_file(path)
    # By the reader's `kind` (daemon/document/formats.py): an image, or a PDF (which an office
    # document was converted to).
    if info.kind != "pdf":
        return _render_image_page(
            path, info, page_idx, max_long_side=max_long_side, max_image_pixels=max_image_pixels
        )
    path = info.converted_pdf or path  # an office document is read from its PDF
    image: Image.Image | None = None
    with PDFIUM_LOCK:  # pdftoppm below runs outside it: another process
        doc = open_known_pdf(path, info.password)
        try:
            page = load_page(doc, page_idx)
            # get_size() is the displayed size: /Rotate 90 pages report width and height
            # swapped.
            size_pt = page.get_size()
            page_dpi = effective_dpi(
                size_pt, dpi=dpi, max_long_side=max_long_side, max_image_pixels=max_image_pixels
            )
            # An encrypted PDF is never handed to pdftoppm: its password would sit on a
            # command line, readable by every user through `ps`. PDFium renders it
            # in-process.
            if choose_renderer() == "poppler" and not info.password:
                page.close()
            else:
                image = _render_pdfium(doc, page, page_dpi)
        finally:
            doc.close()
    if image is None:
        image = _render_poppler(path, info.password, page_idx, page_dpi)
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
    with open_image(path, max_image_pixels) as im:
        try:
            if page_idx:
                im.seek(page_idx)
                check_pixels(im, max_image_pixels)
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
        except DECODE_ERRORS as exc:
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
