"""Magazine-style pages typeset from real text, with the right reading order known.

The typesetter flows paragraphs down columns the way a layout program does: a headline
spanning the columns, a drop cap on the first paragraph, words wrapped (and hyphenated at
the line end) to the column width, and a picture that sits across a gutter with the text
of both columns running around it and its caption beneath. Every line's box is recorded,
so a test can hand the lines straight to the layout code, and the bench can render the
page, add scanner noise and skew, and OCR it.

`SetPage.reading` is the page read as a person reads it: headline, then each column top
to bottom, left to right; the caption is read where the first column under the picture
meets it (before that column's first line below the caption); a spread is its left page,
then its right page. Hyphenated words are whole in it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from PIL import Image, ImageDraw, ImageFilter, ImageFont

from tests.docgen import draw_figure, font

Box = tuple[int, int, int, int]

_SERIF = "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf"
_SERIF_BOLD = "/usr/share/fonts/truetype/dejavu/DejaVuSerif-Bold.ttf"


@lru_cache(maxsize=32)
def _face(size: int, bold: bool = False) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    path = _SERIF_BOLD if bold else _SERIF
    if Path(path).is_file():
        return ImageFont.truetype(path, size)
    return font(size)


@dataclass(frozen=True)
class Picture:
    """A picture across the gutter(s) between columns `first` and `last` of its article."""

    first: int
    last: int
    top: float  # share of the article's column height above the picture
    height: float  # share of the column height
    caption: str
    inset: float = 0.45  # share of the outer columns' width the picture leaves to text


@dataclass(frozen=True)
class Article:
    headline: str
    paragraphs: Sequence[str]
    columns: int
    height: float  # share of the page's text height the article takes, headline included
    picture: Picture | None = None
    drop_cap: bool = True


@dataclass(frozen=True)
class SetLine:
    text: str
    box: Box  # pixels
    size: float  # font pixels
    role: str  # body | headline | caption | dropcap


@dataclass
class SetPage:
    image: Image.Image
    lines: list[SetLine] = field(default_factory=list)
    reading: list[str] = field(default_factory=list)  # pieces in reading order
    pictures: list[Box] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.reading).split())


def _line_box(
    draw: ImageDraw.ImageDraw,
    xy: tuple[int, int],
    text: str,
    face: ImageFont.FreeTypeFont | ImageFont.ImageFont,
) -> Box:
    """The ink's width and the font's full line height, as a text detector boxes a line."""
    ink = draw.textbbox(xy, text, font=face)
    if isinstance(face, ImageFont.FreeTypeFont):
        ascent, descent = face.getmetrics()
        return (int(ink[0]), xy[1], int(ink[2]), xy[1] + ascent + descent)
    return (int(ink[0]), int(ink[1]), int(ink[2]), int(ink[3]))


def _width(text: str, face: ImageFont.FreeTypeFont | ImageFont.ImageFont) -> float:
    return float(face.getlength(text))


class _Flow:
    """The words of an article's paragraphs, handed out line by line."""

    def __init__(self, paragraphs: Sequence[str], drop_cap: bool) -> None:
        self.paras = [p.split() for p in paragraphs if p.split()]
        self.p = 0
        self.w = 0
        self.carry: str | None = None  # the tail of a word hyphenated on the last line
        self.drop_cap = drop_cap
        self.capped = False  # the first word's letter is drawn as a drop cap

    @property
    def done(self) -> bool:
        return self.p >= len(self.paras)

    @property
    def at_paragraph_start(self) -> bool:
        return self.w == 0 and self.carry is None

    def line(
        self, room: float, face: ImageFont.FreeTypeFont | ImageFont.ImageFont
    ) -> tuple[str, list[str], bool]:
        """Text to draw, the whole words it finishes (for the reading), paragraph ended."""
        words = self.paras[self.p]
        drawn: list[str] = []
        whole: list[str] = []
        if self.carry is not None:
            # The word was read whole where its head was drawn (a reader reads on over
            # the line break, not first the caption that the next line may come after).
            drawn.append(self.carry)
            self.carry = None
            self.w += 1
        while self.w < len(words):
            word = words[self.w]
            if self.capped and self.p == 0 and self.w == 0:
                # The drop cap is drawn apart; the line sets the rest of the word.
                drawn.append(word[1:])
                whole.append(word)
                self.w += 1
                continue
            candidate = " ".join([*drawn, word])
            if _width(candidate, face) <= room:
                drawn.append(word)
                whole.append(word)
                self.w += 1
                continue
            head = _hyphenate(word, drawn, room, face)
            if head is not None:
                drawn.append(head + "-")
                whole.append(word)
                self.carry = word[len(head) :]
            elif not drawn:  # a word wider than the line: set it anyway
                drawn.append(word)
                whole.append(word)
                self.w += 1
            break
        ended = self.w >= len(words) and self.carry is None
        if ended:
            self.p += 1
            self.w = 0
        return " ".join(drawn), whole, ended


def _hyphenate(
    word: str, drawn: list[str], room: float, face: ImageFont.FreeTypeFont | ImageFont.ImageFont
) -> str | None:
    """The longest head of `word` that fits with a hyphen, keeping 3 letters each side."""
    if len(word) < 7 or not word.isalpha():
        return None
    for cut in range(len(word) - 3, 2, -1):
        if _width(" ".join([*drawn, word[:cut] + "-"]), face) <= room:
            return word[:cut]
    return None


def typeset(
    articles: Sequence[Article],
    *,
    size: tuple[int, int] = (1654, 2339),
    font_px: int = 28,
    margin: float = 0.07,
    gutter: float = 0.025,
) -> SetPage:
    """One page of `articles` stacked top to bottom, each with its spanning headline."""
    width, height = size
    page = SetPage(image=Image.new("RGB", size, "white"))
    draw = ImageDraw.Draw(page.image)
    body = _face(font_px)
    lead = int(font_px * 1.45)
    left, right = int(width * margin), int(width * (1 - margin))
    y = int(height * margin)
    text_height = height - 2 * y
    for art in articles:
        bottom = min(int(y + art.height * text_height), height - int(height * margin))
        # The headline spans all columns.
        head_px = int(font_px * 2.1)
        head_face = _face(head_px, bold=True)
        draw.text((left, y), art.headline, fill="black", font=head_face)
        hb = _line_box(draw, (left, y), art.headline, head_face)
        page.lines.append(SetLine(art.headline, hb, head_px, "headline"))
        page.reading.append(art.headline)
        top = int(hb[3] + font_px * 1.3)
        gut = int(width * gutter)
        col_w = (right - left - gut * (art.columns - 1)) / art.columns
        cols = [
            (int(left + c * (col_w + gut)), int(left + c * (col_w + gut) + col_w))
            for c in range(art.columns)
        ]
        pic_box: Box | None = None
        py1 = cy = 0
        cap_lines: list[SetLine] = []
        if art.picture is not None:
            pic = art.picture
            c0, c1 = cols[pic.first], cols[pic.last]
            px0 = int(c0[1] - (c0[1] - c0[0]) * (1 - pic.inset))
            px1 = int(c1[0] + (c1[1] - c1[0]) * (1 - pic.inset))
            py0 = int(top + (bottom - top) * pic.top)
            py1 = int(py0 + (bottom - top) * pic.height)
            draw_figure(page.image, (px0, py0, px1, py1))
            page.pictures.append((px0, py0, px1, py1))
            cap_px = int(font_px * 0.8)
            cap_face = _face(cap_px)
            cy = py1 + int(cap_px * 0.6)
            words = pic.caption.split()
            while words:
                n = len(words)
                while n > 1 and _width(" ".join(words[:n]), cap_face) > px1 - px0:
                    n -= 1
                text = " ".join(words[:n])
                draw.text((px0, cy), text, fill="black", font=cap_face)
                cap_lines.append(
                    SetLine(text, _line_box(draw, (px0, cy), text, cap_face), cap_px, "caption")
                )
                words = words[n:]
                cy += int(cap_px * 1.35)
            pic_box = (px0 - gut, py0 - gut, px1 + gut, cy + gut)
            page.lines.extend(cap_lines)
        flow = _Flow(art.paragraphs, art.drop_cap)
        caption_read = art.picture is None
        pieces: list[str] = []
        for c, (cx0, cx1) in enumerate(cols):
            ly = top
            cap_box: Box | None = None
            cap_left = 0
            while ly + lead <= bottom and not flow.done:
                x0, x1 = cx0, cx1
                if (
                    pic_box is not None
                    and ly + lead > pic_box[1]
                    and ly < pic_box[3]
                    and cx0 < pic_box[2]
                    and cx1 > pic_box[0]
                ):
                    # No text level with the caption: where to read a caption with text
                    # beside it would be anyone's guess.
                    beside_caption = ly + lead > pic_box[3] - (cy - py1) - gut
                    if (pic_box[0] <= cx0 and pic_box[2] >= cx1) or beside_caption:
                        ly = pic_box[3]
                        continue
                    if pic_box[0] > cx0 and pic_box[0] < cx1:
                        x1 = pic_box[0]
                    elif pic_box[2] > cx0 and pic_box[2] < cx1:
                        x0 = pic_box[2]
                    if x1 - x0 < 0.3 * (cx1 - cx0):
                        ly = pic_box[3]
                        continue
                if (
                    not caption_read
                    and pic_box is not None
                    and cx0 < pic_box[2]
                    and cx1 > pic_box[0]
                    and ly >= pic_box[3]
                ):
                    pieces.extend(ln.text for ln in cap_lines)
                    caption_read = True
                indent = 0
                if flow.at_paragraph_start:
                    first_para = flow.p == 0
                    if first_para and flow.drop_cap and cap_box is None:
                        cap_box, cap_left = _drop_cap(draw, page, flow, x0, ly, lead, font_px)
                    elif not first_para:
                        indent = int(font_px * 1.5)
                        if ly > top:
                            ly += int(lead * 0.35)
                            if ly + lead > bottom:
                                break
                if cap_box is not None and ly < cap_box[3]:
                    indent = cap_left
                face = body
                text, whole, _ = flow.line(x1 - x0 - indent, face)
                draw.text((x0 + indent, ly), text, fill="black", font=face)
                box = _line_box(draw, (x0 + indent, ly), text, face)
                page.lines.append(SetLine(text, box, font_px, "body"))
                pieces.extend(whole)
                ly += lead
            if not caption_read and pic_box is not None and c == art.picture.first:  # type: ignore[union-attr]
                pieces.extend(ln.text for ln in cap_lines)  # the picture ends the column
                caption_read = True
        if not caption_read:
            pieces.extend(ln.text for ln in cap_lines)
        if flow.carry is not None:  # the page ends inside a hyphenated word
            pieces[-1] = pieces[-1][: -len(flow.carry)] + "-"
        page.reading.extend(pieces)
        y = bottom + int(font_px * 1.2)
    return page


def _drop_cap(
    draw: ImageDraw.ImageDraw, page: SetPage, flow: _Flow, x: int, y: int, lead: int, font_px: int
) -> tuple[Box, int]:
    """Draw the first paragraph's first letter three lines tall; the word loses it."""
    letter = flow.paras[flow.p][0][0]
    cap_px = int(lead * 2.6)
    face = _face(cap_px, bold=True)
    draw.text((x, y), letter, fill="black", font=face)
    ink = draw.textbbox((x, y), letter, font=face)
    box = (int(ink[0]), int(ink[1]), int(ink[2]), int(ink[3]))
    page.lines.append(SetLine(letter, box, cap_px, "dropcap"))
    flow.capped = True
    return (box[0], box[1], box[2], y + 3 * lead), box[2] - x + int(font_px * 0.3)


def spread(left: SetPage, right: SetPage, *, spine: int = 60) -> SetPage:
    """Two pages side by side as one scan: the left page is read first."""
    w = left.image.width + spine + right.image.width
    h = max(left.image.height, right.image.height)
    img = Image.new("RGB", (w, h), "white")
    img.paste(left.image, (0, 0))
    img.paste(right.image, (left.image.width + spine, 0))
    draw = ImageDraw.Draw(img)
    mid = left.image.width + spine // 2
    for k in range(spine // 2):  # the binding's shadow darkens toward the fold
        shade = 255 - int(70 * (1 - k / (spine / 2)) ** 2)
        draw.line([(mid - k, 0), (mid - k, h)], fill=(shade, shade, shade))
        draw.line([(mid + k, 0), (mid + k, h)], fill=(shade, shade, shade))
    dx = left.image.width + spine
    moved = [
        SetLine(ln.text, (ln.box[0] + dx, ln.box[1], ln.box[2] + dx, ln.box[3]), ln.size, ln.role)
        for ln in right.lines
    ]
    pics = [(b[0] + dx, b[1], b[2] + dx, b[3]) for b in right.pictures]
    return SetPage(
        image=img,
        lines=[*left.lines, *moved],
        reading=[*left.reading, *right.reading],
        pictures=[*left.pictures, *pics],
    )


def scanned(image: Image.Image, *, skew: float, noise: float, seed: int) -> Image.Image:
    """The page as a scanner returns it: turned a little, soft, grainy, JPEG-compressed."""
    import io

    import numpy as np

    out = image.rotate(skew, resample=Image.Resampling.BICUBIC, fillcolor="white")
    out = out.filter(ImageFilter.GaussianBlur(0.6))
    rng = np.random.default_rng(seed)
    arr = np.asarray(out, dtype=np.float64) + rng.normal(0.0, noise, out.size[::-1])[:, :, None]
    out = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    buf = io.BytesIO()
    out.save(buf, format="JPEG", quality=75)
    buf.seek(0)
    return Image.open(buf).convert("RGB")




def shuffle_free(seed: int, items: Sequence[str]) -> list[str]:
    """A fixed permutation, for tests that hand lines to the layout code in any order."""
    out = list(items)
    random.Random(seed).shuffle(out)
    return out
