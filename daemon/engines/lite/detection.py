"""The text detector run at the scale the page's print needs.

RapidOCR's detector (PP-OCR's DB model) sees the page shrunk to a fixed long side (960 px,
see `ocr.py` for why not more). On a broadsheet newspaper scanned whole (5,203 px wide) that
shrinks body type to about 4 px, and the detector returns the headlines only: the body text
lights up its probability map, but as a grey wash the box finder cannot cut into lines, so
every such pixel is dropped. Detecting every page at a larger size is no cure: on sparse
pages the small model then finds nothing at all, and it costs 3-8 s a page.

So the page is first detected as before, and the probability map says whether that scale
was enough: the share of "text" pixels (probability above the box finder's own threshold)
that fall in no returned box. Measured over the corpus and the real scans (docs/quality.md):
0.98 and 0.55 on the two newspaper pages, at most 0.01 on every other page. Only above
`UNBOXED_LIMIT` is the page detected again at twice the side, and again while the map still
says so and the image has pixels to give. A box of an earlier pass that no box of the final
pass covers (a big initial letter, a headline the finer pass cut) is kept beside them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rapidocr.ch_ppocr_det.main import TextDetector
    from rapidocr.ch_ppocr_det.utils import TextDetOutput

# Share of the map's text pixels outside every box above which the page is detected again
# at a larger side. Pages read well sit at <= 0.01, the newspaper pages at 0.55 and 0.98.
UNBOXED_LIMIT = 0.2
# A later pass covers an earlier box when its boxes hold this share of the box's area.
_COVERED = 0.5
# The largest side the detector is run at: 4x its base side. Body type of a whole
# broadsheet at the recogniser's 2,400 px is found at 1,920 (docs/quality.md).
_MAX_FACTOR = 4


@dataclass(frozen=True)
class DetectionPass:
    """One run of the detector: its side limit and what its map left unboxed."""

    side: int
    boxes: int
    unboxed: float


class ScaledDetector:
    """Stands in for RapidOCR's `TextDetector` (same call, same output) and detects again at
    a larger side when the first pass's map shows text it could not box.

    Wraps the detector object RapidOCR built (its private `text_det`), reusing its
    pre-processing, ONNX session, box finder and box order, so a page that needs one pass
    gets exactly the boxes it got before.
    """

    def __init__(self, detector: TextDetector) -> None:
        self._det = detector
        if detector.limit_side_len is None:  # ocr.py always sets it (Det.limit_side_len)
            raise ValueError("RapidOCR's text detector has no side limit")
        self.base_side = int(detector.limit_side_len)
        self.passes: list[DetectionPass] = []  # the last call's passes, for the page's info

    def __call__(self, img: np.ndarray) -> TextDetOutput:
        from rapidocr.ch_ppocr_det.utils import TextDetOutput

        start = time.perf_counter()
        self.passes = []
        longest = max(img.shape[:2])
        side = self.base_side
        kept: list[np.ndarray] = []
        kept_scores: list[float] = []
        while True:
            boxes, scores, unboxed = self._detect(img, side)
            self.passes.append(DetectionPass(side=side, boxes=len(boxes), unboxed=unboxed))
            kept, kept_scores = _merge(kept, kept_scores, list(boxes), list(scores))
            bigger = min(2 * side, _MAX_FACTOR * self.base_side, longest)
            # Growing the side past the image's own would only upsample: nothing to find.
            if unboxed <= UNBOXED_LIMIT or bigger <= side * 1.25:
                break
            side = bigger
        if not kept:
            return TextDetOutput()
        ordered = self._det.sorted_boxes(np.asarray(kept))
        if len(self.passes) == 1:
            # As RapidOCR's own detector returns them (its scores are not re-sorted).
            scores = kept_scores
        else:
            by_box = {_key(b): s for b, s in zip(kept, kept_scores, strict=True)}
            scores = [by_box.get(_key(b), 1.0) for b in ordered]
        return TextDetOutput(img, ordered, scores, elapse=time.perf_counter() - start)

    def _detect(self, img: np.ndarray, side: int) -> tuple[np.ndarray, list[float], float]:
        """Boxes and scores of one pass at `side`, and the share of its map's text pixels
        outside every box."""
        det = self._det
        det.limit_side_len = side
        try:
            prepared = det.get_preprocess()(img)
        finally:
            det.limit_side_len = self.base_side
        if prepared is None:
            return np.zeros((0, 4, 2), dtype=np.float32), [], 0.0
        preds = det.session(prepared)
        boxes, scores = det.postprocess_op(preds, img.shape[:2])
        return np.asarray(boxes), list(scores), _unboxed(preds[0, 0], boxes, img.shape[:2], det)


def _unboxed(
    prob: np.ndarray, boxes: np.ndarray, shape: tuple[int, ...], det: TextDetector
) -> float:
    """Share of the map's text pixels that no box takes in, boxes scaled to the map."""
    text = prob > float(getattr(det.postprocess_op, "thresh", 0.3))
    total = int(text.sum())
    if total == 0:
        return 0.0
    map_h, map_w = prob.shape
    sy, sx = map_h / shape[0], map_w / shape[1]
    covered = np.zeros_like(text)
    for box in boxes:
        pts = np.asarray(box, dtype=np.float64)
        x0, y0 = np.floor(pts.min(axis=0) * (sx, sy)).astype(int)
        x1, y1 = np.ceil(pts.max(axis=0) * (sx, sy)).astype(int)
        covered[max(y0, 0) : y1 + 1, max(x0, 0) : x1 + 1] = True
    return float((text & ~covered).sum()) / total


def _merge(
    old: list[np.ndarray], old_scores: list[float], new: list[np.ndarray], new_scores: list[float]
) -> tuple[list[np.ndarray], list[float]]:
    """The new pass's boxes, and those of earlier passes that they leave uncovered."""
    if not old:
        return new, new_scores
    rects = [_rect(b) for b in new]
    boxes, scores = list(new), list(new_scores)
    for box, score in zip(old, old_scores, strict=True):
        x0, y0, x1, y1 = _rect(box)
        area = max((x1 - x0) * (y1 - y0), 1e-9)
        inside = sum(
            max(0.0, min(x1, r[2]) - max(x0, r[0])) * max(0.0, min(y1, r[3]) - max(y0, r[1]))
            for r in rects
        )
        if inside / area < _COVERED:
            boxes.append(box)
            scores.append(score)
    return boxes, scores


def _rect(box: np.ndarray) -> tuple[float, float, float, float]:
    pts = np.asarray(box, dtype=np.float64)
    x0, y0 = pts.min(axis=0)
    x1, y1 = pts.max(axis=0)
    return float(x0), float(y0), float(x1), float(y1)


def _key(box: np.ndarray) -> bytes:
    return np.asarray(box, dtype=np.float32).tobytes()
