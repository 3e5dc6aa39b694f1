"""RapidOCR on the PP-OCR models inside its wheel: a page image's text lines, and the
recogniser's confidence for line crops (the OCR orientation vote).

Model files: the `rapidocr` wheel ships PP-OCR ONNX models in `rapidocr/models/`
(detector, text-line orientation classifier, recogniser; the recogniser carries its
character dictionary in the ONNX metadata). RapidOCR only downloads when no `model_path`
is configured and the file it expects is missing or has another checksum, so `OcrReader`
passes the bundled files explicitly: nothing is fetched at run time. This was checked by
running OCR inside a network namespace without connectivity (`unshare -n`), and the reader
raises EngineUnavailable instead of letting RapidOCR try a download when the files are
gone.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from daemon.common.errors import EngineUnavailable
from daemon.engines.lite.detection import DetectionPass, ScaledDetector
from daemon.engines.lite.dropcaps import missed_drop_caps
from daemon.engines.lite.gutters import split_at_gutters, split_at_rules, trim_to_ink
from daemon.engines.lite.lines import Box, Line
from daemon.engines.lite.rules import erase, find_rules, joined

# RapidOCR shrinks larger images before detection. 2000 (its default) loses small print on
# A4 pages rendered at 200 dpi (1654x2339); 2400 keeps it at a modest CPU cost.
_OCR_MAX_SIDE = 2400
# A line read with less confidence than this is read again turned 180 degrees: the turned
# reading is kept when the recogniser is surer of it (see `_upside_down`).
_RECHECK_BELOW = 0.9


@dataclass(frozen=True)
class OcrPage:
    """What OCR read off a page: its text lines and its column rules (boxes normalised to
    the page; rules go to reading order as gutters, see `rules`)."""

    lines: list[Line]
    rules: list[Box]
    # The detector's passes over the page: one, unless its print was too small at the
    # first side (`detection`).
    passes: list[DetectionPass] = field(default_factory=list)


class OcrReader:
    """RapidOCR loaded on the bundled models, its ONNX sessions created up front."""

    def __init__(self, threads: int) -> None:
        try:
            import rapidocr
            from rapidocr import RapidOCR
        except ImportError as exc:
            raise EngineUnavailable(
                f"the lite engine needs rapidocr and onnxruntime ({exc})",
                hint="pip install rapidocr onnxruntime",
            ) from exc
        self.models = bundled_models(Path(rapidocr.__file__).parent / "models")
        self.version = importlib.metadata.version("rapidocr")
        try:
            import cv2

            # RapidOCR pre-processes with OpenCV, which would otherwise use every core.
            cv2.setNumThreads(threads)
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
            "Det.model_path": str(self.models["det"]),
            "Cls.model_path": str(self.models["cls"]),
            "Rec.model_path": str(self.models["rec"]),
            "EngineConfig.onnxruntime.intra_op_num_threads": threads,
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
        }
        try:
            # rapidocr ships no type hints: its engine and results stay Any here.
            self._ocr: Any = RapidOCR(params=params)
            # RapidOCR creates its ONNX sessions on first use. Create them now so a broken
            # model fails here as EngineUnavailable, not on a user's first page. These are
            # private hooks: if a release renames them, loading just stays lazy.
            for hook in ("_load_det_model", "_load_cls_model", "_load_rec_model"):
                build = getattr(self._ocr, hook, None)
                if callable(build):
                    build()
            # Pages whose print is too small at the detector's side are detected again at a
            # larger one (`detection`). RapidOCR calls its detector through this attribute;
            # where a release has none, pages are detected once as before.
            detector = getattr(self._ocr, "text_det", None)
            if detector is not None:
                setattr(self._ocr, "text_det", ScaledDetector(detector))  # noqa: B010
        except Exception as exc:
            raise EngineUnavailable(
                f"RapidOCR failed to start: {exc}",
                hint="pip install --force-reinstall rapidocr onnxruntime",
            ) from exc

    def _detection_passes(self) -> list[DetectionPass]:
        """The detector's passes over the page RapidOCR last read."""
        det = getattr(self._ocr, "text_det", None)
        return list(det.passes) if isinstance(det, ScaledDetector) else []

    def lines(self, image: Image.Image) -> list[Line]:
        """The text lines RapidOCR finds on `image`, boxes normalised to it."""
        return self.read(image).lines

    def read(self, image: Image.Image) -> OcrPage:
        """The text lines RapidOCR finds on `image` and the column rules printed on it,
        boxes normalised to it."""
        image = image if image.mode == "RGB" else image.convert("RGB")
        width, height = image.size
        # RapidOCR treats arrays as OpenCV BGR. Every step is named: RapidOCR keeps the
        # last call's choices as its new defaults. No line classifier (`_upside_down`).
        bgr = np.ascontiguousarray(np.asarray(image)[:, :, ::-1])
        result = self._ocr(bgr, use_det=True, use_cls=False, use_rec=True)
        passes = self._detection_passes()
        if result is None or getattr(result, "txts", None) is None or result.boxes is None:
            return OcrPage(lines=[], rules=[], passes=passes)
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
        return replace(self._split_bridges(self._upside_down(lines, bgr), bgr), passes=passes)

    def _upside_down(self, lines: list[Line], bgr: np.ndarray) -> list[Line]:
        """`lines` with each unsure line that reads better turned 180 degrees read so.

        PP-OCR's text-line classifier (0 or 180 degrees per line) is not asked: on old
        scans it turns upright lines over. The back page's print shows through thin paper
        mirrored, and a box that takes in a little of it reads to the classifier as turned
        text: on a typewritten page 10 of 66 lines came out as letter salad ("sas t e rts
        e me"), on a handwritten diary page 19 of 54. A whole page turned is the
        orientation step's (engine); a single line upside down on an upright page is
        rare, so only the lines the recogniser is unsure of are read again turned, and
        the reading it is surer of wins.
        """
        height, width = bgr.shape[:2]
        unsure: list[int] = []
        crops: list[np.ndarray] = []
        for i, ln in enumerate(lines):
            x0, y0, x1, y1 = ln.bbox
            crop = bgr[
                int(y0 * height) : int(np.ceil(y1 * height)),
                int(x0 * width) : int(np.ceil(x1 * width)),
            ]
            if ln.confidence < _RECHECK_BELOW and min(crop.shape[:2]) >= 2:
                unsure.append(i)
                crops.append(np.ascontiguousarray(crop[::-1, ::-1]))
        if not unsure:
            return lines
        texts, scores = self._read_crops(crops)
        out = list(lines)
        for i, text, score in zip(unsure, texts, scores, strict=True):
            if text.strip() and score > lines[i].confidence:
                out[i] = Line(
                    text=text.strip(), bbox=lines[i].bbox, size=lines[i].size, confidence=score
                )
        return out

    def _split_bridges(self, lines: list[Line], bgr: np.ndarray) -> OcrPage:
        """`lines` with each box that bridges a gutter cut into its columns' lines, each
        part read again from its own crop, and every box's sides moved onto its ink
        (`gutters`); and the page's column rules (`rules`).

        RapidOCR can give word boxes (`return_word_box`), but it computes them for every
        line of every page, and at a narrow gutter the recogniser's character positions
        are a guess; recognising the two crops costs only on the rare bridged line and
        reads each column's text exactly as any other line.
        """
        page_gray = bgr.mean(axis=2)
        height, width = page_gray.shape
        rules = find_rules(page_gray)
        # Rules are ink, but not the lines' ink: box sides are trimmed onto the print,
        # gutters looked for and parts read with the rules painted out.
        gray = erase(page_gray, rules)
        if rules.mask is not None:
            bgr = bgr.copy()
            bgr[rules.mask] = 255
        splits = split_at_rules(lines, rules, gray)
        splits.update(
            (i, parts) for i, parts in split_at_gutters(lines, gray).items() if i not in splits
        )
        found = [r.normalised(width, height) for r in joined(rules.found, height)]
        if not splits:
            return OcrPage(self._with_missed_caps(trim_to_ink(lines, gray), bgr, gray), found)
        crops: list[np.ndarray] = []
        boxes: list[tuple[int, tuple[float, float, float, float]]] = []
        for i, parts in splits.items():
            y0, y1 = lines[i].bbox[1], lines[i].bbox[3]
            top, bottom = int(y0 * height), int(np.ceil(y1 * height))
            for part in parts:
                crops.append(np.ascontiguousarray(bgr[top:bottom, part.x0 : part.x1]))
                boxes.append((i, (part.x0 / width, y0, part.x1 / width, y1)))
        texts, scores = self._read_crops(crops)
        pieces: dict[int, list[Line]] = {}
        for (i, box), text, score in zip(boxes, texts, scores, strict=True):
            if text.strip():
                pieces.setdefault(i, []).append(
                    Line(text=text.strip(), bbox=box, size=lines[i].size, confidence=score)
                )
        out: list[Line] = []
        for i, ln in enumerate(lines):
            out.extend(pieces.get(i, [ln]) if i in splits else [ln])
        return OcrPage(self._with_missed_caps(trim_to_ink(out, gray), bgr, gray), found)

    def _with_missed_caps(self, lines: list[Line], bgr: np.ndarray, gray: np.ndarray) -> list[Line]:
        """`lines` and the drop caps the detector left unboxed, each read from its own crop
        (`dropcaps`); a crop that reads as no letter or two is left out."""
        caps = missed_drop_caps(lines, gray)
        if not caps:
            return lines
        height, width = gray.shape
        crops = []
        for x0, y0, x1, y1 in caps:
            # The recogniser reads lines: the glyph gets a margin of paper around it.
            pad = int(0.2 * (y1 - y0) * height)
            glyph = bgr[
                int(y0 * height) : int(np.ceil(y1 * height)),
                int(x0 * width) : int(np.ceil(x1 * width)),
            ]
            crops.append(
                np.ascontiguousarray(
                    np.pad(glyph, ((pad, pad), (pad, pad), (0, 0)), constant_values=255)
                )
            )
        texts, scores = self._read_crops(crops)
        out = list(lines)
        for box, text, score in zip(caps, texts, scores, strict=True):
            text = text.strip()
            if 1 <= len(text) <= 2 and text.isalpha():
                size = (box[3] - box[1]) * height
                out.append(Line(text=text, bbox=box, size=size, confidence=score))
        return out

    def _read_crops(self, crops: list[np.ndarray]) -> tuple[list[str], list[float]]:
        """The recogniser's text and confidence for BGR line images (RapidOCR's
        recogniser on its own: a private loader, created in __init__ already)."""
        from rapidocr.ch_ppocr_rec import TextRecInput

        rec = self._ocr._load_rec_model()
        out = rec(TextRecInput(img=crops))
        return [str(t) for t in out.txts or ()], [float(v) for v in out.scores]

    def recognize(self, crops: list[np.ndarray]) -> list[float]:
        """Recogniser confidences for BGR line images (no detection, no 0/180 classifier)."""
        if not crops:
            return []
        return self._read_crops(crops)[1]


def bundled_models(folder: Path) -> dict[str, Path]:
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
