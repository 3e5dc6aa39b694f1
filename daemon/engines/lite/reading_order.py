"""Reading order by recursive XY-cut, with full-width elements breaking the columns.

The classic XY-cut (Nagy and Seth, 1984) splits a page at the widest blank strip, top to
bottom or left to right, and recurses. Taken literally it reads a two-column page row by
row wherever the baselines of both columns line up, and it cannot split columns at all
under a title that spans them. So at every node:

1. a blank vertical strip from top to bottom separates columns: read them left to right;
2. otherwise a strip that only a few wide elements cross (a title, a figure, a caption
   spanning both columns) is a gutter: those elements cut the node into horizontal bands
   (above, the element, below), each band is ordered on its own, so the columns above a
   spanning figure are finished before the figure and the columns below it;
3. otherwise a blank horizontal strip separates rows: read them top to bottom;
4. otherwise the elements overlap in both directions: read them by rows.

Right-to-left pages (Arabic, Hebrew) read columns and row neighbours right to left; the
text of each line is kept as it came.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")
Box = tuple[float, float, float, float]

# Narrowest blank strip that separates columns: 0.008 of the width is 5 pt on US Letter
# (LaTeX's two-column default is 10 pt). Word gaps inside one OCR line are narrower
# relative to a whole column of lines, which never all gap at the same x.
_MIN_COLUMN_GAP = 0.008
_BINS = 1000
# A gutter may be crossed by at most this share of a node's elements (spanning titles,
# figures, captions) and needs this many elements wholly on each side.
_MAX_CROSSING_SHARE = 0.1
_MIN_PER_SIDE = 3
# A row gap this many median line heights tall separates blocks, not lines.
_WIDE_GAP_LINES = 1.0
# A spanning element is at least this share of the node's width; a narrower one crossing
# the gutter (the middle column of an author block) means there is no gutter there.
_MIN_SPANNING_WIDTH = 0.5
# Gutters are looked for away from the node's edges, where indents would pass for one.
_GUTTER_ZONE = (0.2, 0.8)


def xy_cut(items: Sequence[T], box_of: Callable[[T], Box], *, rtl: bool = False) -> list[T]:
    """`items` in reading order."""
    boxes = [box_of(it) for it in items]
    order = _cut(list(range(len(items))), boxes, rtl)
    return [items[i] for i in order]


def _cut(idx: list[int], boxes: Sequence[Box], rtl: bool) -> list[int]:
    if len(idx) <= 1:
        return idx
    columns = _split_x(idx, boxes)
    if columns is not None:
        if rtl:
            columns.reverse()
        return [i for part in columns for i in _cut(part, boxes, rtl)]
    bands = _split_at_spanning(idx, boxes)
    if bands is not None:
        return [i for part in bands for i in _cut(part, boxes, rtl)]
    rows = _split_y(idx, boxes)
    if rows is not None:
        return [i for part in rows for i in _cut(part, boxes, rtl)]
    return _by_rows(idx, boxes, rtl)


def _coverage(
    idx: Sequence[int], boxes: Sequence[Box], axis: int
) -> tuple[np.ndarray, float, float]:
    """How many elements cover each bin along x (axis 0) or y (axis 1) of the node."""
    lo = min(boxes[i][axis] for i in idx)
    hi = max(boxes[i][axis + 2] for i in idx)
    span = max(hi - lo, 1e-9)
    cover = np.zeros(_BINS, dtype=np.int64)
    for i in idx:
        a = int((boxes[i][axis] - lo) / span * _BINS)
        b = int(np.ceil((boxes[i][axis + 2] - lo) / span * _BINS))
        cover[max(0, a) : max(a + 1, min(_BINS, b))] += 1
    return cover, lo, span


def _gaps(free: np.ndarray) -> list[tuple[int, int]]:
    """Runs of True bins as (start, end) pairs."""
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for i, f in enumerate(free.tolist()):
        if f and start is None:
            start = i
        elif not f and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(free)))
    return runs


def _split_x(idx: list[int], boxes: Sequence[Box]) -> list[list[int]] | None:
    cover, lo, span = _coverage(idx, boxes, 0)
    cuts = [
        lo + (a + b) / 2 / _BINS * span
        for a, b in _gaps(cover == 0)
        if a > 0 and b < _BINS and (b - a) / _BINS * span >= _MIN_COLUMN_GAP
    ]
    if not cuts:
        return None
    parts = _partition(idx, [(boxes[i][0] + boxes[i][2]) / 2 for i in idx], cuts)
    if parts is None:
        return None
    # A column is several elements or one tall one (a figure beside text). A lone short
    # element off to the side (a date, a stamp) is not: the rows decide where it goes.
    top = min(boxes[i][1] for i in idx)
    height = max(max(boxes[i][3] for i in idx) - top, 1e-9)
    for part in parts:
        extent = max(boxes[i][3] for i in part) - min(boxes[i][1] for i in part)
        if len(part) < 2 and extent < 0.5 * height:
            return None
    return parts


def _split_y(idx: list[int], boxes: Sequence[Box]) -> list[list[int]] | None:
    """Rows at blank horizontal strips: the wide ones (more than a line apart) first.

    Cutting only at wide gaps keeps a grid (an author block: names, affiliations, e-mails
    in three columns) together as one band, which the next level then reads column by
    column; the narrow gaps between lines come next, within a column.
    """
    cover, lo, span = _coverage(idx, boxes, 1)
    gaps = [(a, b) for a, b in _gaps(cover == 0) if a > 0 and b < _BINS]
    if not gaps:
        return None
    line = float(np.median([boxes[i][3] - boxes[i][1] for i in idx]))
    wide = [(a, b) for a, b in gaps if (b - a) / _BINS * span > _WIDE_GAP_LINES * line]
    chosen = wide if wide and len(wide) < len(gaps) else gaps
    cuts = [lo + (a + b) / 2 / _BINS * span for a, b in chosen]
    return _partition(idx, [(boxes[i][1] + boxes[i][3]) / 2 for i in idx], cuts)


def _partition(idx: list[int], centres: list[float], cuts: list[float]) -> list[list[int]] | None:
    parts: list[list[int]] = [[] for _ in range(len(cuts) + 1)]
    for i, c in zip(idx, centres, strict=True):
        parts[sum(c > cut for cut in cuts)].append(i)
    parts = [p for p in parts if p]
    return parts if len(parts) > 1 else None


def _split_at_spanning(idx: list[int], boxes: Sequence[Box]) -> list[list[int]] | None:
    """Bands cut by the few elements crossing the node's gutter, or None without one."""
    if len(idx) < 2 * _MIN_PER_SIDE + 1:
        return None
    cover, lo, span = _coverage(idx, boxes, 0)
    allowed = max(1, int(len(idx) * _MAX_CROSSING_SHARE))
    zone_lo, zone_hi = int(_GUTTER_ZONE[0] * _BINS), int(_GUTTER_ZONE[1] * _BINS)
    best: tuple[int, int] | None = None
    for a, b in _gaps(cover[zone_lo:zone_hi] <= allowed):
        if best is None or b - a > best[1] - best[0]:
            best = (a + zone_lo, b + zone_lo)
    if best is None or (best[1] - best[0]) / _BINS * span < _MIN_COLUMN_GAP:
        return None
    gutter = lo + (best[0] + best[1]) / 2 / _BINS * span
    spanning = [i for i in idx if boxes[i][0] < gutter < boxes[i][2]]
    if any(boxes[i][2] - boxes[i][0] < _MIN_SPANNING_WIDTH * span for i in spanning):
        return None
    rest = [i for i in idx if not boxes[i][0] < gutter < boxes[i][2]]
    left = [i for i in rest if boxes[i][2] <= gutter]
    right = [i for i in rest if boxes[i][0] >= gutter]
    if not spanning or len(left) < _MIN_PER_SIDE or len(right) < _MIN_PER_SIDE:
        return None
    top = max(min(boxes[i][1] for i in left), min(boxes[i][1] for i in right))
    bottom = min(max(boxes[i][3] for i in left), max(boxes[i][3] for i in right))
    if bottom <= top:  # the "columns" never stand side by side: no gutter
        return None
    spanning.sort(key=lambda i: (boxes[i][1], boxes[i][0]))
    bands: list[list[int]] = [[]]
    for s in spanning:
        bands.append([s])
        bands.append([])
    edges = [(boxes[s][1] + boxes[s][3]) / 2 for s in spanning]
    for i in rest:
        cy = (boxes[i][1] + boxes[i][3]) / 2
        k = sum(cy > e for e in edges)
        bands[2 * k].append(i)
    parts = [b for b in bands if b]
    return parts if len(parts) > 1 else None


def _by_rows(idx: list[int], boxes: Sequence[Box], rtl: bool) -> list[int]:
    """Top to bottom; elements whose middles share a row left to right (RTL: right to left)."""
    ordered = sorted(idx, key=lambda i: (boxes[i][1], boxes[i][0]))
    out: list[int] = []
    row: list[int] = []

    def flush() -> None:
        out.extend(sorted(row, key=lambda i: boxes[i][0], reverse=rtl))
        row.clear()

    for i in ordered:
        if row:
            first = boxes[row[0]]
            h = min(first[3] - first[1], boxes[i][3] - boxes[i][1])
            cy_first = (first[1] + first[3]) / 2
            cy = (boxes[i][1] + boxes[i][3]) / 2
            if abs(cy - cy_first) > 0.5 * max(h, 1e-9):
                flush()
        row.append(i)
    flush()
    return out


def is_rtl(texts: Sequence[str]) -> bool:
    """True when most letters on the page belong to right-to-left scripts."""
    rtl = letters = 0
    for text in texts:
        for ch in text:
            if ch.isalpha():
                letters += 1
                code = ord(ch)
                # Hebrew, Arabic, Syriac, Thaana, NKo, Samaritan... and the presentation forms.
                if 0x0590 <= code <= 0x08FF or 0xFB1D <= code <= 0xFDFF or 0xFE70 <= code <= 0xFEFF:
                    rtl += 1
    return letters > 0 and rtl * 2 > letters
