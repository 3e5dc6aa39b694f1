"""Generate small, real test documents with KNOWN text, offline.

Every function writes one file to `path` and returns `path`, so tests can write
`pdf = make_text_pdf(tmp_path / "a.pdf", [["Hello"]])`. Nothing here needs poppler,
network access or fonts beyond what the venv and the OS ship; `make_encrypted_pdf` needs
the test-only dependency `pypdf` (pypdfium2 cannot write encrypted files).

Conventions shared by the generators:
- Text PDFs use the standard Helvetica fonts (no embedding), WinAnsi encoding, so only
  Latin-1 text is supported. A line that starts with "# " is drawn as a heading in
  Helvetica-Bold at twice the body size; "## " draws a bold line at body size (a
  sub-heading only its weight tells apart). The markers themselves are not drawn.
- Image generators draw black text on white with a TrueType font (DejaVu Sans when the
  OS has it, else Pillow's bundled default font) at sizes OCR reads reliably.
"""

from __future__ import annotations

import io
import math
import shutil
import struct
import subprocess
import zlib
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

__all__ = [
    "HEADING_PREFIX",
    "SUBHEADING_PREFIX",
    "font",
    "make_16bit_png",
    "make_bomb_png",
    "make_cmyk_jpeg",
    "make_encrypted_pdf",
    "make_exif_rotated_jpeg",
    "make_multipage_tiff",
    "make_scanned_pdf",
    "make_text_image",
    "make_text_pdf",
    "make_truncated",
    "pdf_stream",
    "render_text",
    "write_pdf",
]

HEADING_PREFIX = "# "
SUBHEADING_PREFIX = "## "

# US Letter in points; the generators' default page.
LETTER = (612.0, 792.0)


# ---------------------------------------------------------------------------- fonts


@lru_cache(maxsize=1)
def _font_file() -> str | None:
    """A TrueType sans font on this machine, or None (then Pillow's bundled font is used)."""
    candidates = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/Library/Fonts/Arial.ttf",
        "C:/Windows/Fonts/arial.ttf",
    ]
    for c in candidates:
        if Path(c).is_file():
            return c
    if shutil.which("fc-match"):
        try:
            out = subprocess.run(
                ["fc-match", "-f", "%{file}", "sans:style=Regular"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out.endswith((".ttf", ".otf")) and Path(out).is_file():
            return out
    return None


def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """A scalable font at `size` pixels: DejaVu Sans if present, else Pillow's default."""
    f = _font_file()
    if f is not None:
        return ImageFont.truetype(f, size)
    # Pillow >= 10.1 bundles a scalable default font when built with FreeType.
    return ImageFont.load_default(size=size)


def render_text(
    lines: Sequence[str],
    *,
    size: tuple[int, int] = (1600, 1000),
    font_px: int = 48,
    margin: int = 60,
    line_gap: float = 1.6,
) -> Image.Image:
    """An RGB image with `lines` drawn top to bottom; "# " lines are drawn 1.6x larger.

    "## " lines are drawn at body size (images have no reliable bold face to use).
    """
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    y = float(margin)
    for line in lines:
        px = font_px
        text = line
        if line.startswith(SUBHEADING_PREFIX):  # no bold face guaranteed: drawn plain
            text = line[len(SUBHEADING_PREFIX) :]
        elif line.startswith(HEADING_PREFIX):
            px = int(font_px * 1.6)
            text = line[len(HEADING_PREFIX) :]
        draw.text((margin, y), text, fill="black", font=font(px))
        y += px * line_gap
    return img


# ---------------------------------------------------------------------------- PDFs


def _pdf_string(text: str) -> bytes:
    """A PDF literal string; WinAnsi covers Latin-1 for the characters tests use."""
    raw = text.encode("cp1252", errors="replace")
    raw = raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")
    return b"(" + raw + b")"


def write_pdf(path: Path, objects: Sequence[bytes]) -> Path:
    """Write a PDF from raw object bodies, numbered 1.. in order, with a correct xref table.

    Object 1 must be the catalog. For hand-made edge cases (odd fonts, rotation, render
    modes) that `make_text_pdf` does not cover.
    """
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets: list[int] = []
    for num, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(f"{num} 0 obj\n".encode() + body + b"\nendobj\n")
    xref_at = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n".encode())
    # Each xref entry is exactly 20 bytes, including the two-byte end of line.
    out.write(b"0000000000 65535 f \n")
    for off in offsets:
        out.write(f"{off:010d} 00000 n \n".encode())
    trailer = f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\n"
    out.write(f"{trailer}startxref\n{xref_at}\n%%EOF\n".encode())
    path.write_bytes(out.getvalue())
    return path


def pdf_stream(data: bytes, extra: str = "") -> bytes:
    """A stream object body for `write_pdf` (uncompressed; `extra` adds dictionary keys)."""
    return f"<< /Length {len(data)} {extra}>>\nstream\n".encode() + data + b"\nendstream"


def _page_content(
    lines: Sequence[str],
    *,
    font_size: float,
    page_size: tuple[float, float],
    columns: int,
    margin: float = 72.0,
    gutter: float = 36.0,
) -> bytes:
    """Content stream drawing `lines` top-down; with columns=2 the second half goes right."""
    width, height = page_size
    per_col = math.ceil(len(lines) / columns) if lines else 0
    col_width = (width - 2 * margin - gutter * (columns - 1)) / columns
    ops: list[bytes] = []
    for col in range(columns):
        x = margin + col * (col_width + gutter)
        y = height - margin
        for line in lines[col * per_col : (col + 1) * per_col]:
            size, text, font_name = font_size, line, b"/F1"
            if line.startswith(SUBHEADING_PREFIX):
                text, font_name = line[len(SUBHEADING_PREFIX) :], b"/F2"
            elif line.startswith(HEADING_PREFIX):
                size, text, font_name = font_size * 2, line[len(HEADING_PREFIX) :], b"/F2"
            y -= size * 1.2
            ops.append(
                b"BT %s %.2f Tf 1 0 0 1 %.2f %.2f Tm " % (font_name, size, x, y)
                + _pdf_string(text)
                + b" Tj ET"
            )
            y -= size * 0.4
    return b"\n".join(ops)


def make_text_pdf(
    path: Path,
    pages: Sequence[Sequence[str]],
    *,
    font_size: float = 12.0,
    page_size: tuple[float, float] = LETTER,
    columns: int = 1,
    drawings: Sequence[bytes] = (),
) -> Path:
    """A born-digital PDF: one page per item of `pages`, each a list of text lines.

    `drawings[i]`, when given, is raw content-stream operators (paths: "re", "m", "l",
    "c", "f", "S") drawn on page i after its text: a vector figure, a ruled table.

    The text is real (a Helvetica text layer that pdftotext and PDFium extract). Lines
    starting with "# " become bold headings at twice `font_size`, "## " bold lines at
    `font_size`. With `columns=2` each page's
    lines are split in half: the first half fills the left column, the rest the right.
    """
    n = len(pages)
    # Objects: 1 catalog, 2 pages, 3 regular font, 4 bold font, then (page, content) pairs.
    page_ids = [5 + 2 * i for i in range(n)]
    objects: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids ["
        + b" ".join(b"%d 0 R" % p for p in page_ids)
        + b"] /Count %d >>" % n,
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica-Bold /Encoding /WinAnsiEncoding >>",
    ]
    for i, lines in enumerate(pages):
        content = _page_content(lines, font_size=font_size, page_size=page_size, columns=columns)
        if i < len(drawings):
            content += b"\n" + drawings[i]
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %.2f %.2f] "
            b"/Resources << /Font << /F1 3 0 R /F2 4 0 R >> >> /Contents %d 0 R >>"
            % (page_size[0], page_size[1], page_ids[i] + 1)
        )
        objects.append(pdf_stream(content))
    return write_pdf(path, objects)


def make_scanned_pdf(
    path: Path,
    pages: Sequence[Sequence[str]],
    *,
    size: tuple[int, int] = (1700, 2200),
    font_px: int = 56,
    dpi: float = 200.0,
) -> Path:
    """An image-only PDF (no text layer): each page is a picture of its lines.

    At the default 1700x2200 px and 200 dpi a page is 8.5x11 in (US Letter).
    """
    images = [render_text(lines, size=size, font_px=font_px, margin=120) for lines in pages]
    images[0].save(path, "PDF", resolution=dpi, save_all=True, append_images=images[1:])
    return path


def make_encrypted_pdf(
    path: Path,
    password: str,
    *,
    pages: Sequence[Sequence[str]] = (("Secret document",),),
    owner_password: str | None = None,
) -> Path:
    """A text PDF protected with user password `password` (RC4-128, standard handler).

    RC4 is chosen because pypdf implements it without the optional `cryptography` package.
    Needs `pypdf` (a test-only dependency).
    """
    from pypdf import PdfReader, PdfWriter

    plain = make_text_pdf(path.with_suffix(".plain.pdf"), pages)
    writer = PdfWriter(clone_from=PdfReader(plain))
    writer.encrypt(
        user_password=password,
        owner_password=owner_password or password + "-owner",
        algorithm="RC4-128",
    )
    with path.open("wb") as fh:
        writer.write(fh)
    plain.unlink()
    return path


# ---------------------------------------------------------------------------- images


def make_text_image(
    path: Path,
    lines: Sequence[str],
    fmt: str = "PNG",
    size: tuple[int, int] = (1600, 1000),
    *,
    font_px: int = 48,
) -> Path:
    """A picture of `lines` (black on white) saved as `fmt` (PNG, JPEG, TIFF, WEBP, ...)."""
    img = render_text(lines, size=size, font_px=font_px)
    kwargs: dict[str, object] = {}
    if fmt.upper() in ("JPEG", "WEBP"):
        kwargs["quality"] = 95
    img.save(path, fmt, **kwargs)
    return path


def make_multipage_tiff(path: Path, pages: Sequence[Sequence[str]]) -> Path:
    """A multi-frame TIFF, one frame per item of `pages`."""
    images = [render_text(lines, size=(1200, 600)) for lines in pages]
    images[0].save(path, "TIFF", save_all=True, append_images=images[1:])
    return path


def make_cmyk_jpeg(path: Path, lines: Sequence[str] = ("CMYK picture",)) -> Path:
    """A CMYK JPEG (as print workflows produce) of `lines`."""
    render_text(lines, size=(1200, 400)).convert("CMYK").save(path, "JPEG", quality=95)
    return path


def make_16bit_png(path: Path, size: tuple[int, int] = (400, 300)) -> Path:
    """A 16-bit greyscale PNG (mode I;16) with a left-to-right gradient 0..65535."""
    w, h = size
    row = b"".join(struct.pack("<H", (x * 65535) // max(1, w - 1)) for x in range(w))
    Image.frombytes("I;16", size, row * h).save(path, "PNG")
    return path


def make_exif_rotated_jpeg(
    path: Path, lines: Sequence[str] = ("Rotated text",), orientation: int = 6
) -> Path:
    """A JPEG whose pixels are stored sideways plus an EXIF Orientation tag to fix them.

    The upright picture is `render_text(lines, size=(1200, 400))` (landscape). The stored
    pixels are rotated so that applying `orientation` (6 = rotate 90° clockwise to view,
    8 = 90° counter-clockwise, 3 = 180°) gives back the upright landscape picture.
    """
    upright = render_text(lines, size=(1200, 400))
    # Store the inverse of the transform a viewer applies for this orientation.
    inverse = {
        3: Image.Transpose.ROTATE_180,
        6: Image.Transpose.ROTATE_90,  # viewer rotates 90° clockwise = PIL ROTATE_270
        8: Image.Transpose.ROTATE_270,
    }[orientation]
    stored = upright.transpose(inverse)
    exif = Image.Exif()
    exif[0x0112] = orientation
    stored.save(path, "JPEG", quality=95, exif=exif.tobytes())
    return path


def make_bomb_png(path: Path, pixels: int) -> Path:
    """A tiny PNG whose header claims a square of at least `pixels` pixels.

    Only the header is truthful; the pixel data is a single compressed row, so opening it
    is cheap but decoding would fail or need gigabytes. Pillow's bomb check reads the
    header only, which is exactly what a decompression-bomb test needs.
    """
    side = math.isqrt(max(pixels, 1) - 1) + 1

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)  # 1-bit greyscale
    row = b"\x00" + b"\x00" * ((side + 7) // 8)
    data = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(row, 9))
        + chunk(b"IEND", b"")
    )
    path.write_bytes(data)
    return path


def make_truncated(path: Path, src: Path, keep: float = 0.5) -> Path:
    """A copy of `src` cut to the first `keep` fraction of its bytes (at least 16 bytes)."""
    data = src.read_bytes()
    path.write_bytes(data[: max(16, int(len(data) * keep))])
    return path


# ---------------------------------------------------------------------------- page layouts


def draw_figure(img: Image.Image, box: tuple[int, int, int, int]) -> None:
    """A picture inside `box`: a shaded sky, hills, a sun and a bar chart, no text."""
    x0, y0, x1, y1 = box
    draw = ImageDraw.Draw(img)
    h = y1 - y0
    for i in range(h):
        shade = int(90 + 120 * i / max(h, 1))
        draw.line([(x0, y0 + i), (x1, y0 + i)], fill=(shade // 2, shade // 2 + 40, shade))
    w = x1 - x0
    draw.ellipse([x0 + w * 0.7, y0 + h * 0.1, x0 + w * 0.85, y0 + h * 0.35], fill=(250, 210, 60))
    draw.polygon(
        [(x0, y1), (x0 + w * 0.3, y0 + h * 0.45), (x0 + w * 0.6, y1)], fill=(40, 120, 50)
    )
    draw.polygon(
        [(x0 + w * 0.4, y1), (x0 + w * 0.7, y0 + h * 0.55), (x1, y1)], fill=(30, 90, 40)
    )
    for k, bar in enumerate((0.3, 0.55, 0.8, 0.45)):
        bx = x0 + w * (0.05 + 0.06 * k)
        draw.rectangle([bx, y1 - h * bar * 0.5, bx + w * 0.04, y1], fill=(200, 60, 60))
    draw.rectangle([x0, y0, x1, y1], outline="black", width=3)


def render_two_columns(
    left: Sequence[str],
    right: Sequence[str],
    *,
    title: str | None = None,
    header: str | None = None,
    figure: bool = False,
    size: tuple[int, int] = (1700, 2200),
    font_px: int = 34,
) -> Image.Image:
    """A scanned-looking page: optional running head, a title spanning both columns, two
    text columns, and optionally a figure spanning the width under them."""
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    width, height = size
    margin = int(width * 0.07)
    if header:
        draw.text((margin, int(height * 0.025)), header, fill="black", font=font(font_px - 8))
    y = height * 0.08
    if title:
        draw.text((margin, y), title, fill="black", font=font(int(font_px * 1.7)))
        y += font_px * 3.2
    gutter = int(width * 0.05)
    col_w = (width - 2 * margin - gutter) // 2
    bottom = y
    for col, lines in enumerate((left, right)):
        cy = y
        x = margin + col * (col_w + gutter)
        for line in lines:
            draw.text((x, cy), line, fill="black", font=font(font_px))
            cy += font_px * 1.5
        bottom = max(bottom, cy)
    if figure:
        top = int(bottom + font_px * 2)
        draw_figure(img, (margin, top, width - margin, min(height - margin, top + height // 3)))
    return img


# ---------------------------------------------------------------------------- office


def make_docx(path: Path, paragraphs: Sequence[str], *, heading: str | None = None) -> Path:
    """A minimal Word document (OOXML), written part by part as the standard lays it out."""
    import zipfile
    from xml.sax.saxutils import escape

    body = ""
    if heading:
        body += (
            '<w:p><w:pPr><w:pStyle w:val="Title"/></w:pPr><w:r><w:rPr><w:b/><w:sz w:val="48"/>'
            f"</w:rPr><w:t>{escape(heading)}</w:t></w:r></w:p>"
        )
    body += "".join(f"<w:p><w:r><w:t>{escape(p)}</w:t></w:r></w:p>" for p in paragraphs)
    w = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
    parts = {
        "[Content_Types].xml": (
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            '<Default Extension="rels" '
            'ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/>'
            '<Override PartName="/word/document.xml" ContentType="application/'
            'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/>'
            "</Types>"
        ),
        "_rels/.rels": (
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/'
            '2006/relationships/officeDocument" Target="word/document.xml"/>'
            "</Relationships>"
        ),
        "word/document.xml": (
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            f'<w:document xmlns:w="{w}"><w:body>{body}</w:body></w:document>'
        ),
    }
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in parts.items():
            zf.writestr(name, data)
    return path
