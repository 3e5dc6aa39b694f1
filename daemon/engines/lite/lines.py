"""A page's text lines as every step of the lite engine sees them, and the box arithmetic
they share.

OCR and a PDF's text layer both become `Line`s in one frame: boxes normalised to the page
(0..1, origin top-left), so the composition rules never ask where a line came from.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Box = tuple[float, float, float, float]  # x0, y0, x1, y1, normalised 0..1, origin top-left

# A line (or a piece of a figure) belongs to a region when this much of it lies inside.
INSIDE = 0.6


@dataclass
class Line:
    text: str
    bbox: Box
    size: float  # font size (pt) or OCR box height (px): only compared within a page
    bold: bool = False  # text layer only; OCR cannot tell
    confidence: float = 1.0  # the recogniser's; text-layer lines are certain

    @property
    def height(self) -> float:
        return max(self.bbox[3] - self.bbox[1], 1e-6)

    @property
    def cy(self) -> float:
        return (self.bbox[1] + self.bbox[3]) / 2


def body_size(lines: Sequence[Line]) -> float:
    """The page's body text size: the median size weighted by characters."""
    sizes: list[float] = []
    for ln in lines:
        sizes.extend([ln.size] * max(1, len(ln.text)))
    return statistics.median(sizes) if sizes else 0.0


def union(boxes: Iterable[Box]) -> Box:
    bs = list(boxes)
    return (
        min(b[0] for b in bs),
        min(b[1] for b in bs),
        max(b[2] for b in bs),
        max(b[3] for b in bs),
    )
