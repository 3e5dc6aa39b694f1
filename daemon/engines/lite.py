"""The lite engine: a PDF's own text layer where it is trustworthy, RapidOCR elsewhere.

No torch, no hub: it runs wherever onnxruntime runs, loads in about a second and needs a
few hundred MB, so it is the fallback when MinerU's weights are missing. It finds text
lines and groups them into paragraphs and headings; it does not recognise tables or
formulas (they come out as text).

Model files: the `rapidocr` wheel ships PP-OCR ONNX models in `rapidocr/models/`
(detector, text-line orientation classifier, recogniser; the recogniser carries its
character dictionary in the ONNX metadata). RapidOCR only downloads when no `model_path`
is configured and the file it expects is missing or has another checksum, so `load()`
passes the bundled files explicitly: nothing is fetched at run time. This was checked by
running OCR inside a network namespace without connectivity (`unshare -n`), and
`load()` raises EngineUnavailable instead of letting RapidOCR try a download when the
files are gone.
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from daemon.config import EngineConfig
from daemon.cpus import resolve_threads
from daemon.errors import EngineUnavailable
from daemon.page import (
    PAGE_NUMBER,
    SOURCE_OCR,
    SOURCE_TEXT_LAYER,
    TEXT,
    TITLE,
    Block,
    EngineInfo,
    PageInput,
    PageOptions,
    PageResult,
    ProgressFn,
)

log = logging.getLogger(__name__)

# RapidOCR shrinks larger images before detection. 2000 (its default) loses small print on
# A4 pages rendered at 200 dpi (1654x2339); 2400 keeps it at a modest CPU cost.
_OCR_MAX_SIDE = 2400

# A line at least this many times the body size is a heading; this much more is level 1.
_HEADING_RATIO = 1.3
_TOP_HEADING_RATIO = 1.7
_HEADING_MAX_CHARS = 200
_HEADING_MAX_LINES = 3
_BOLD_HEADING_MAX_CHARS = 120

# A vertical gap between two lines larger than this many line heights starts a paragraph.
_PARAGRAPH_GAP = 0.7

# "7", "- 7 -", "Page 7", "7 / 12", "7 of 12", and roman front-matter numbers ("iii").
_PAGE_NUMBER_RE = re.compile(
    r"^\W*(page\s*)?(\d{1,4}|[ivxlc]{1,7})(\s*(/|of)\s*\d{1,4})?\W*$", re.IGNORECASE
)
_PAGE_MARGIN = 0.08  # top/bottom share of the page where page numbers live


@dataclass
class _Line:
    text: str
    bbox: tuple[float, float, float, float]  # normalised 0..1, origin top-left
    size: float  # font size (pt) or OCR box height (px): only compared within a page
    bold: bool = False  # text layer only; OCR cannot tell

    @property
    def height(self) -> float:
        return max(self.bbox[3] - self.bbox[1], 1e-6)

    @property
    def cy(self) -> float:
        return (self.bbox[1] + self.bbox[3]) / 2


class LiteEngine:
    name = "lite"

    def __init__(self, config: EngineConfig) -> None:
        self._config = config
        self._ocr: Any = None
        self._threads = resolve_threads(config.threads)

    # ------------------------------------------------------------------ lifecycle

    def load(self) -> EngineInfo:
        try:
            import rapidocr
            from rapidocr import RapidOCR
        except ImportError as exc:
            raise EngineUnavailable(
                f"the lite engine needs rapidocr and onnxruntime ({exc})",
                hint="pip install rapidocr onnxruntime",
            ) from exc
        models = _bundled_models(Path(rapidocr.__file__).parent / "models")
        try:
            import cv2

            # RapidOCR pre-processes with OpenCV, which would otherwise use every core.
            cv2.setNumThreads(self._threads)
        except ImportError:
            pass
        params: dict[str, Any] = {
            "Global.log_level": "warning",
            "Global.max_side_len": _OCR_MAX_SIDE,
            # Detection runs on the page scaled to a 960 px long side, PP-OCR's classic
            # setting. RapidOCR's default ("min" side 736) leaves a 200-DPI page at full
            # size, where the small det model finds NOTHING on sparse pages (a 12 pt line
            # on an otherwise empty US Letter page: empty at >= 1280 px, found at 960).
            # Recognition still reads the boxes from the full-resolution page.
            "Det.limit_type": "max",
            "Det.limit_side_len": 960,
            "Det.model_path": str(models["det"]),
            "Cls.model_path": str(models["cls"]),
            "Rec.model_path": str(models["rec"]),
            "EngineConfig.onnxruntime.intra_op_num_threads": self._threads,
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
        }
        try:
            self._ocr = RapidOCR(params=params)
            # RapidOCR creates its ONNX sessions on first use. Create them now so a broken
            # model fails here as EngineUnavailable, not on a user's first page. These are
            # private hooks: if a release renames them, loading just stays lazy.
            for hook in ("_load_det_model", "_load_cls_model", "_load_rec_model"):
                build = getattr(self._ocr, hook, None)
                if callable(build):
                    build()
        except Exception as exc:
            raise EngineUnavailable(
                f"RapidOCR failed to start: {exc}",
                hint="pip install --force-reinstall rapidocr onnxruntime",
            ) from exc
        version = importlib.metadata.version("rapidocr")
        return EngineInfo(
            name=self.name,
            model_id=f"rapidocr {version} PP-OCR",
            revision=None,
            precision="fp32",
            details={
                "det_model": models["det"].name,
                "cls_model": models["cls"].name,
                "rec_model": models["rec"].name,
                "threads": self._threads,
                "onnxruntime": importlib.metadata.version("onnxruntime"),
            },
        )

    def close(self) -> None:
        self._ocr = None

    # ------------------------------------------------------------------ parsing

    def parse_page(self, page: PageInput, options: PageOptions, progress: ProgressFn) -> PageResult:
        info: dict[str, Any] = {}
        lines: list[_Line] | None = None
        if page.pdf_path is not None and options.text_layer == "auto":
            from daemon.textlayer import pdf_text_layer, text_layer_is_trustworthy

            layer = pdf_text_layer(page.pdf_path, page.pdf_password, page.page_idx)
            if text_layer_is_trustworthy(layer):
                page_h = page.page_size_pt[1] if page.page_size_pt else 792.0
                lines = [
                    _Line(
                        text=ln.text,
                        bbox=ln.bbox,
                        size=ln.font_size or (ln.bbox[3] - ln.bbox[1]) * page_h,
                        bold=ln.bold,
                    )
                    for ln in layer
                ]
                source = SOURCE_TEXT_LAYER
            else:
                info["text_layer"] = "untrusted" if layer else "absent"
        if lines is None:
            lines = self._ocr_lines(page)
            source = SOURCE_OCR
        info["source"] = source
        info["lines"] = len(lines)
        blocks, columns = layout_blocks(lines, source=source, progress=progress)
        info["columns"] = columns
        info[f"{source}_blocks"] = len(blocks)
        return PageResult(blocks=blocks, info=info)

    def _ocr_lines(self, page: PageInput) -> list[_Line]:
        if self._ocr is None:
            raise RuntimeError("LiteEngine.parse_page called before load()")
        image = page.image if page.image.mode == "RGB" else page.image.convert("RGB")
        width, height = image.size
        # RapidOCR treats arrays as OpenCV BGR.
        bgr = np.ascontiguousarray(np.asarray(image)[:, :, ::-1])
        result = self._ocr(bgr)
        if result is None or getattr(result, "txts", None) is None or result.boxes is None:
            return []
        lines: list[_Line] = []
        for box, text in zip(result.boxes, result.txts, strict=False):
            text = str(text).strip()
            if not text:
                continue
            pts = np.asarray(box, dtype=np.float64).reshape(-1, 2)
            x0, y0 = pts.min(axis=0)
            x1, y1 = pts.max(axis=0)
            lines.append(
                _Line(
                    text=text,
                    bbox=(
                        _clamp(x0 / width),
                        _clamp(y0 / height),
                        _clamp(x1 / width),
                        _clamp(y1 / height),
                    ),
                    # The quad's left edge is the text height even for slightly skewed lines.
                    size=float(np.linalg.norm(pts[3] - pts[0])) if len(pts) == 4 else y1 - y0,
                )
            )
        return lines


def _bundled_models(folder: Path) -> dict[str, Path]:
    """The detector, classifier and recogniser ONNX files shipped inside the wheel."""
    found: dict[str, Path] = {}
    for role in ("det", "cls", "rec"):
        candidates = sorted(folder.glob(f"*{role}*.onnx"))
        if not candidates:
            raise EngineUnavailable(
                f"rapidocr's bundled {role} model is missing from {folder}",
                hint="pip install --force-reinstall rapidocr",
            )
        found[role] = candidates[-1]  # newest PP-OCR version sorts last
    return found


def _clamp(value: float) -> float:
    return float(min(1.0, max(0.0, value)))


# ---------------------------------------------------------------------------- layout


def find_gutter(lines: Sequence[_Line], *, min_gap: float = 0.008) -> float | None:
    """x of the gap between two text columns, or None for a single-column page.

    Counts, for each x in the middle half of the page, how many lines cross it, and takes
    the widest strip crossed by at most a tenth of the lines (centred titles, author
    lines, a page number, a wide caption may cross a gutter). `min_gap` is the narrowest
    gutter accepted: 0.008 of the width is 5 pt on US Letter; LaTeX's two-column default
    is 10 pt. It is a gutter when at least three lines sit wholly on each side at
    overlapping heights. A page of labels and values can pass as two columns; reading it
    column by column is still sensible.
    """
    if len(lines) < 6:
        return None
    bins = 1000
    crossings = np.zeros(bins, dtype=np.int64)
    for ln in lines:
        crossings[int(ln.bbox[0] * bins) : int(np.ceil(ln.bbox[2] * bins))] += 1
    lo, hi = int(0.25 * bins), int(0.75 * bins)
    allowed = len(lines) // 10
    best: tuple[int, int] | None = None
    start: int | None = None
    for i in range(lo, hi + 1):
        free = i < hi and crossings[i] <= allowed
        if free and start is None:
            start = i
        elif not free and start is not None:
            if best is None or i - start > best[1] - best[0]:
                best = (start, i)
            start = None
    if best is None or (best[1] - best[0]) / bins < min_gap:
        return None
    gutter = (best[0] + best[1]) / 2 / bins
    left = [ln for ln in lines if ln.bbox[2] <= gutter]
    right = [ln for ln in lines if ln.bbox[0] >= gutter]
    if len(left) < 3 or len(right) < 3:
        return None
    top = max(min(ln.bbox[1] for ln in left), min(ln.bbox[1] for ln in right))
    bottom = min(max(ln.bbox[3] for ln in left), max(ln.bbox[3] for ln in right))
    return gutter if bottom > top else None


def reading_order(lines: Sequence[_Line], gutter: float | None) -> list[list[_Line]]:
    """Lines as flows (runs read top to bottom), in reading order.

    With a gutter: lines crossing it (titles, wide figures' captions) cut the page into
    bands, and each band is read left column first, then right column.
    """
    ordered = _rows(sorted(lines, key=lambda ln: (ln.bbox[1], ln.bbox[0])))
    if gutter is None:
        return [ordered] if ordered else []
    flows: list[list[_Line]] = []
    left: list[_Line] = []
    right: list[_Line] = []

    def close_band() -> None:
        nonlocal left, right
        flows.extend(flow for flow in (left, right) if flow)
        left, right = [], []

    for ln in ordered:
        if ln.bbox[0] < gutter < ln.bbox[2]:
            close_band()
            flows.append([ln])
        elif ln.bbox[2] <= gutter:
            left.append(ln)
        else:
            right.append(ln)
    close_band()
    # Consecutive single spanning lines belong to one flow (e.g. a two-line title).
    merged: list[list[_Line]] = []
    for flow in flows:
        if (
            merged
            and len(flow) == 1
            and gutter is not None
            and flow[0].bbox[0] < gutter < flow[0].bbox[2]
            and merged[-1][-1].bbox[0] < gutter < merged[-1][-1].bbox[2]
        ):
            merged[-1].append(flow[0])
        else:
            merged.append(flow)
    return merged


def _rows(lines: list[_Line]) -> list[_Line]:
    """Lines sorted top to bottom, and left to right among those on one row."""
    out: list[_Line] = []
    row: list[_Line] = []
    for ln in lines:
        if row and abs(ln.cy - row[0].cy) > 0.5 * min(ln.height, row[0].height):
            out.extend(sorted(row, key=lambda r: r.bbox[0]))
            row = []
        row.append(ln)
    out.extend(sorted(row, key=lambda r: r.bbox[0]))
    return out


def body_size(lines: Sequence[_Line]) -> float:
    """The page's body text size: the median size weighted by characters."""
    sizes: list[float] = []
    for ln in lines:
        sizes.extend([ln.size] * max(1, len(ln.text)))
    return statistics.median(sizes) if sizes else 0.0


def layout_blocks(
    lines: Sequence[_Line], *, source: str, progress: ProgressFn
) -> tuple[list[Block], int]:
    """Paragraph and heading blocks in reading order, and the number of columns found."""
    if not lines:
        return [], 0
    gutter = find_gutter(lines)
    flows = reading_order(lines, gutter)
    body = body_size(lines)
    # Bold only marks headings where most text is not bold.
    chars = sum(len(ln.text) for ln in lines)
    bold_marks = sum(len(ln.text) for ln in lines if ln.bold) * 2 < chars
    total = len(lines)
    done = 0
    blocks: list[Block] = []
    for flow in flows:
        para: list[_Line] = []
        for ln in flow:
            if para and _starts_paragraph(para, ln, body):
                blocks.append(_make_block(para, body, source, bold_marks))
                para = []
            para.append(ln)
            done += 1
            if done % 25 == 0:
                progress(done, total, "line")
        if para:
            blocks.append(_make_block(para, body, source, bold_marks))
    progress(total, total, "line")
    return blocks, 2 if gutter is not None else 1


def _heading_level(size: float, body: float) -> int:
    if body <= 0 or size < _HEADING_RATIO * body:
        return 0
    return 1 if size >= _TOP_HEADING_RATIO * body else 2


def _starts_paragraph(para: list[_Line], ln: _Line, body: float) -> bool:
    prev = para[-1]
    height = min(prev.height, ln.height)
    if ln.bbox[1] - prev.bbox[3] > _PARAGRAPH_GAP * height:
        return True
    if ln.bbox[1] < prev.bbox[1] - 0.5 * height:  # moved up: not a continuation
        return True
    if _heading_level(ln.size, body) != _heading_level(prev.size, body):
        return True
    if ln.bold != prev.bold:  # a bold run-in heading line, or bold emphasis paragraph
        return True
    # Book style (LaTeX, most typeset prose): no space between paragraphs, but the last
    # line stops short and the next one is indented.
    left = min(p.bbox[0] for p in para)
    right = max(p.bbox[2] for p in para)
    width = max(right - left, 1e-6)
    stops_short = prev.bbox[2] < right - 0.1 * width
    indented = 0.01 < ln.bbox[0] - left < 0.15 * width
    if len(para) > 1 and stops_short and indented:
        return True
    return not 0.8 <= ln.size / max(prev.size, 1e-6) <= 1.25


def _join(lines: Sequence[_Line]) -> str:
    text = ""
    for ln in lines:
        piece = ln.text.strip()
        if not text:
            text = piece
        elif text.endswith("-") and len(text) >= 2 and text[-2].isalpha() and piece[:1].islower():
            # A word hyphenated at the line end: rejoin it ("infor-" + "mation").
            text = text[:-1] + piece
        else:
            text = f"{text} {piece}"
    return text


def _mostly_letters(text: str) -> bool:
    # Bold numbers are table cells or totals, not headings.
    visible = [ch for ch in text if not ch.isspace()]
    return sum(ch.isalpha() for ch in visible) * 2 >= len(visible) > 0


def _make_block(para: list[_Line], body: float, source: str, bold_marks: bool) -> Block:
    bbox = (
        min(ln.bbox[0] for ln in para),
        min(ln.bbox[1] for ln in para),
        max(ln.bbox[2] for ln in para),
        max(ln.bbox[3] for ln in para),
    )
    text = _join(para)
    level = _heading_level(statistics.median(ln.size for ln in para), body)
    block_type = TEXT
    in_margin = bbox[3] <= _PAGE_MARGIN or bbox[1] >= 1 - _PAGE_MARGIN
    if len(para) == 1 and in_margin and _PAGE_NUMBER_RE.match(text):
        return Block(type=PAGE_NUMBER, bbox=bbox, text=text, source=source)
    if level and len(para) <= _HEADING_MAX_LINES and len(text) <= _HEADING_MAX_CHARS:
        block_type = TITLE
    elif (
        bold_marks
        and all(ln.bold for ln in para)
        and len(para) <= 2
        and len(text) <= _BOLD_HEADING_MAX_CHARS
        and not text.endswith((".", ",", ";", ":"))
        and _mostly_letters(text)
    ):
        # A short bold line at body size on a page that is mostly not bold: a sub-heading
        # ("5.1 Hyper Parameter Optimization"). Sentences in bold end with punctuation.
        block_type, level = TITLE, 2
    else:
        level = 0
    return Block(type=block_type, bbox=bbox, text=text, text_level=level, source=source)
