"""A drop cap the text detector missed, found by the hole it leaves at a paragraph's start.

The detector boxes lines of text; a letter three lines tall with no line of its own size
beside it is often not boxed at all, and the first word loses its first letter. What
stays is the shape the cap gives the paragraph: its first two or three lines start right
of the lines below them, all by the same amount, and the blank left of them holds one
glyph as tall as those lines together. `missed_drop_caps` returns that glyph's box, for
the recogniser to read; `paragraphs.join_drop_caps` then joins it to its word like a cap
the detector did box.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from daemon.engines.lite.lines import Box, Line

# The lines beside a cap start this many line heights right of the lines below them (a
# paragraph indent of one em is narrower than a cap two or three lines tall).
_MIN_HOLE_LINES = 1.2
# Lines beside one cap start within this many line heights of each other.
_SAME_START = 0.4
# A cap stands beside this many lines (a four-line cap may indent a fifth line too: the
# "W" of a 1931 magazine page does).
_BESIDE = (2, 5)
# Its ink is at least this many line heights tall (as `paragraphs._DROP_CAP_LINES`).
_CAP_LINES = 1.8


def missed_drop_caps(lines: Sequence[Line], gray: np.ndarray) -> list[Box]:
    """Boxes (normalised, tight on the ink) of big glyphs in the holes that drop caps
    nobody boxed leave at paragraph starts. `gray` is the page the lines were read on."""
    if len(lines) < 3:
        return []
    height, width = gray.shape[:2]
    px = [
        (ln.bbox[0] * width, ln.bbox[1] * height, ln.bbox[2] * width, ln.bbox[3] * height)
        for ln in lines
    ]
    typical = float(np.median([b[3] - b[1] for b in px]))
    order = sorted(range(len(lines)), key=lambda i: px[i][1])
    found: list[Box] = []
    seen: set[int] = set()  # lines beside a cap already found: none starts another
    for k, first in enumerate(order):
        if first in seen:
            continue
        beside, below = _beside_and_below(first, order[k + 1 :], px, typical)
        if below is None or not _BESIDE[0] <= len(beside) <= _BESIDE[1]:
            continue
        seen.update(beside)
        # The hole ends where the line below starts: loose boxes of one column overlap
        # by a few pixels, and the line below is no cap.
        bottom = min(px[beside[-1]][3], px[below][1])
        hole = (px[below][0], px[first][1], px[first][0], bottom)
        if hole[2] - hole[0] < _MIN_HOLE_LINES * typical or _occupied(hole, px):
            continue
        ink = _ink_box(gray, hole)
        if ink is not None and ink[3] - ink[1] >= _CAP_LINES * typical:
            found.append((ink[0] / width, ink[1] / height, ink[2] / width, ink[3] / height))
    return found


def _beside_and_below(
    first: int, later: Sequence[int], px: Sequence[Box], typical: float
) -> tuple[list[int], int | None]:
    """The lines of `first`'s column that start where it starts, one under the other, and
    the next line of the column, which starts further left (None when none does)."""
    x0, _, x1, _ = px[first]
    beside = [first]
    for j in later:
        b = px[j]
        if min(x1, b[2]) - max(x0, b[0]) <= 0.5 * min(x1 - x0, b[2] - b[0]):
            continue  # another column
        if b[1] - px[beside[-1]][3] > typical:
            return beside, None  # a blank: the paragraph ended
        if abs(b[0] - x0) <= _SAME_START * typical:
            beside.append(j)
            continue
        return beside, (j if b[0] < x0 - _MIN_HOLE_LINES * typical else None)
    return beside, None


def _occupied(hole: Box, px: Sequence[Box]) -> bool:
    """Whether a line already lies in `hole` (a cap the detector did box)."""
    return any(
        min(hole[2], b[2]) - max(hole[0], b[0]) > 0 and min(hole[3], b[3]) - max(hole[1], b[1]) > 0
        for b in px
    )


def _ink_box(gray: np.ndarray, hole: Box) -> Box | None:
    """The box (pixels) of the dark pixels inside `hole`, or None for a blank hole."""
    x0, y0 = max(int(hole[0]), 0), max(int(hole[1]), 0)
    x1, y1 = int(np.ceil(hole[2])), int(np.ceil(hole[3]))
    crop = gray[y0:y1, x0:x1]
    if crop.size == 0:
        return None
    # Dark against the page: the page's paper is its brightest tenth.
    paper = float(np.percentile(gray, 90))
    dark = crop < paper * 0.5
    if dark.sum() < 0.02 * crop.size:
        return None
    ys = np.flatnonzero(dark.any(axis=1))
    xs = np.flatnonzero(dark.any(axis=0))
    return (x0 + float(xs[0]), y0 + float(ys[0]), x0 + float(xs[-1] + 1), y0 + float(ys[-1] + 1))
