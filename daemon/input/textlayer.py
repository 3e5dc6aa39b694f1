"""The text a born-digital PDF already carries, as lines with boxes on the displayed page.

The worker's page pipeline reads it once per page (`with_text_layer`, the one place that
decides whether a page's text layer is used) and hands it to the engine on `PageInput`;
engines use it to skip OCR for text the producer wrote (`text_layer_is_trustworthy`, then
`text_in_bbox`). The text layer needs PDFium only, not a rendered image.
"""

from __future__ import annotations

import ctypes
import math
import re
import statistics
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from daemon.common.errors import DocumentError, FailureKind
from daemon.document.page import PageInput, PageOptions, PageText, TextLine
from daemon.input.sniff import PDFIUM_LOCK, load_page, open_known_pdf

Box = tuple[float, float, float, float]  # normalised 0..1, origin top-left


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


def with_text_layer(page: PageInput, options: PageOptions) -> PageInput:
    """`page` with its PDF text layer (`page.text_layer`) when `engine.text_layer` is auto
    and the page is a PDF's; `page` as it is otherwise.

    The one place that decides whether engines see a text layer. A layer that cannot be
    read is handed on as its error: the engine decides between the pixels and failing.
    """
    if options.text_layer != "auto" or page.pdf_path is None:
        return page
    try:
        lines = pdf_text_layer(page.pdf_path, page.pdf_password, page.page_idx)
    except DocumentError as exc:
        return replace(page, text_layer=PageText(error=exc))
    return replace(page, text_layer=PageText(tuple(lines)))


def pdf_text_layer(path: Path, password: str | None, page_idx: int) -> list[TextLine]:
    """The text lines of one PDF page, in the order the PDF draws them.

    Reading order is the producer's content order, which for most born-digital files is
    reading order within a column; engines sort blocks themselves.
    """
    with PDFIUM_LOCK:
        doc = open_known_pdf(path, password)
        try:
            page = load_page(doc, page_idx)
            try:
                return page_text_lines(page)
            except pdfium.PdfiumError as exc:
                raise DocumentError(
                    FailureKind.CORRUPT, f"text of page {page_idx + 1} cannot be read ({exc})"
                ) from exc
            finally:
                page.close()
        finally:
            doc.close()


def pdf_image_boxes(path: Path, password: str | None, page_idx: int) -> list[Box]:
    """Boxes of a born-digital page's image objects, normalised to the displayed page
    (origin top-left, /Rotate applied). Clipping paths are not applied: an image cropped
    by one counts with its full extent."""
    return _object_boxes(path, password, page_idx, pdfium_c.FPDF_PAGEOBJ_IMAGE)


def pdf_path_boxes(path: Path, password: str | None, page_idx: int) -> list[Box]:
    """Boxes of a born-digital page's path objects (lines, curves, filled shapes: what a
    chart or diagram drawn without an image is made of), normalised like
    `pdf_image_boxes`."""
    return _object_boxes(path, password, page_idx, pdfium_c.FPDF_PAGEOBJ_PATH)


def _object_boxes(path: Path, password: str | None, page_idx: int, kind: int) -> list[Box]:
    with PDFIUM_LOCK:
        doc = open_known_pdf(path, password)
        try:
            page = load_page(doc, page_idx)
            try:
                geometry = _PageGeometry.of(page)
                width, height = geometry.display_size
                boxes: list[Box] = []
                for obj in page.get_objects(filter=[kind], max_depth=4):
                    left, bottom, right, top = obj.get_bounds()
                    ax, ay = geometry.to_display(left, bottom)
                    bx, by = geometry.to_display(right, top)
                    box = (
                        _clamp(min(ax, bx) / width),
                        _clamp(min(ay, by) / height),
                        _clamp(max(ax, bx) / width),
                        _clamp(max(ay, by) / height),
                    )
                    wide, high = box[2] > box[0], box[3] > box[1]
                    # A path may be a rule: no height (or no width) at all.
                    if (wide and high) or (kind == pdfium_c.FPDF_PAGEOBJ_PATH and (wide or high)):
                        boxes.append(box)
                return boxes
            except pdfium.PdfiumError:
                return []  # pictures are extra; the page's text still stands
            finally:
                page.close()
        finally:
            doc.close()


def page_text_lines(page: pdfium.PdfPage) -> list[TextLine]:
    """`pdf_text_layer` for a page that is already open (for engines that keep a document;
    the caller holds `sniff.PDFIUM_LOCK`)."""
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
            lines.append(_make_line(current, "".join(text).strip(), page_size, text))
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


def _words(
    chars: list[_Char], pieces: list[str], width: float
) -> tuple[tuple[str, float, float], ...]:
    """Words of an upright line with their x extent; `pieces` is the line's text as
    appended: one entry per char in `chars`, plus " " entries where a space was inserted."""
    if any(c.quarter != 0 for c in chars):
        return ()
    words: list[tuple[str, float, float]] = []
    word: list[_Char] = []
    it = iter(chars)

    def close() -> None:
        if word:
            text = "".join(c.ch for c in word)
            if text.strip():
                x0 = min(c.box[0] for c in word) / width
                x1 = max(c.box[2] for c in word) / width
                words.append((text.strip(), _clamp(x0), _clamp(x1)))
        word.clear()

    for piece in pieces:
        if piece == " ":
            close()
            continue
        char = next(it)
        if char.ch.isspace():
            close()
        else:
            word.append(char)
    close()
    return tuple(words)


def _make_line(
    chars: list[_Char], text: str, page_size: tuple[float, float], pieces: list[str] | None = None
) -> TextLine:
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
        words=_words(chars, pieces, width) if pieces is not None else (),
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
    """The text inside `bbox` (normalised), top to bottom.

    For engines that find blocks on the image and fill them from the text layer. A line
    counts when at least `min_overlap` of its area is inside the box. A line that also
    runs outside the box sideways gives only its words whose middle is inside, and a line
    mostly outside still gives those words: one baseline can hold two layout blocks (a
    page number, then the footer text), and each must get its own words.
    """
    x0, y0, x1, y1 = bbox
    picked: list[tuple[TextLine, str]] = []
    for line in lines:
        lx0, ly0, lx1, ly1 = line.bbox
        area = max(lx1 - lx0, 1e-9) * max(ly1 - ly0, 1e-9)
        inter_w = min(x1, lx1) - max(x0, lx0)
        inter_h = min(y1, ly1) - max(y0, ly0)
        if inter_w <= 0 or inter_h <= 0:
            continue
        sideways = lx0 < x0 - 1e-3 or lx1 > x1 + 1e-3
        if line.words and sideways and inter_h >= min_overlap * (ly1 - ly0):
            inside = [w for w, wx0, wx1 in line.words if x0 <= (wx0 + wx1) / 2 <= x1]
            if inside:
                picked.append((line, " ".join(inside)))
        elif inter_w * inter_h >= min_overlap * area:
            picked.append((line, line.text))
    picked.sort(key=lambda item: (round(item[0].bbox[1], 3), item[0].bbox[0]))
    return "\n".join(text for _, text in picked)
