"""Reading order: XY-cut with cross-column elements masked, after XY-Cut++.

The classic XY-cut (Nagy and Seth, 1984) splits a page at the widest blank strip, top to
bottom or left to right, and recurses. Taken literally it reads a two-column page row by
row wherever the baselines of both columns line up, and it cannot split columns at all
where a title or a picture crosses the gutter. XY-Cut++ (arXiv 2504.10258, 2025) masks
such cross-column elements, cuts the rest, and puts the masked elements back by position.
Here, at every node:

1. a blank vertical strip from top to bottom separates columns: read them left to right;
2. otherwise a strip that only a few elements cross is a gutter. Each crossing element is
   either *embedded* (several lines tall with text beside it: a picture across the gutter
   with both columns flowing around it; or stacked on such a picture, like its caption),
   or *spanning* (any other, at least half the node wide: a headline, a full-width figure
   with its caption). Spanning elements cut the node into horizontal bands (the columns
   above a headline are finished before it, those below come after). Embedded ones are
   masked: the rest is cut at the gutter into columns, each column read top to bottom
   past the picture, and each masked element goes back before the first element in
   reading order that lies below it and overlaps it horizontally. One or two narrower
   crossing lines that reach into both columns' text are lines the OCR joined across
   the gutter: each is read with the column it starts in. Any other narrower crossing
   element that is no picture (the middle column of an author block) means no gutter;
3. otherwise a blank horizontal strip separates rows: read them top to bottom;
4. otherwise the elements overlap in both directions: read them by rows.

A two-page spread is two pages with a blank strip (the fold) between them: rule 1 reads
the left page, then the right one. Right-to-left pages (Arabic, Hebrew) read columns and
row neighbours right to left; the text of each line is kept as it came.

The cut also counts the columns it read the page in (`read_page`, `Reading.columns`):
the engine reports that count, so the page's columns and its order come from one place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from daemon.engines.lite.rules import across_blanks, rule_x, tall_rules

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
# A spanning element (one that cuts the columns into bands) is at least this share of the
# node's width; a narrower one crossing the gutter that is no picture means there is no
# gutter there.
_MIN_SPANNING_WIDTH = 0.5
# A crossing element this many body lines tall, with text level with it, is a picture
# the columns run around.
_PICTURE_LINES = 3.0
# At most this many narrow boxes may bridge a gutter (lines joined across it) and still
# leave it a gutter.
_MAX_BRIDGES = 2
# Gutters are looked for away from the node's edges, where indents would pass for one.
_GUTTER_ZONE = (0.2, 0.8)


@dataclass(frozen=True)
class Reading(Generic[T]):
    """A page's elements in reading order, and how many columns that order read them in."""

    order: list[T]
    # Columns side by side where most of the print is: parts of a vertical cut add up,
    # parts of a horizontal one (a headline's bands, paragraphs, a table) count as the one
    # with the most print. A part of fewer than `_MIN_PER_SIDE` elements (a date, a stamp,
    # a picture beside the text) is no column. 0 for no elements.
    columns: int


def read_page(
    items: Sequence[T],
    box_of: Callable[[T], Box],
    *,
    rtl: bool = False,
    heading: Callable[[T], bool] | None = None,
    rules: Sequence[Box] = (),
) -> Reading[T]:
    """`items` in reading order, and the columns the order found.

    `heading` tells titles and headlines: one that crosses a gutter, however narrow or
    tall, cuts the columns into bands (read before the columns below it, after those
    above), where a line of its size would go to a column or a picture be masked.
    `rules` are column rules printed on the page (`rules`): a blank strip that holds one
    parts columns however narrow it is.
    """
    boxes = [box_of(it) for it in items]
    heads = frozenset(i for i, it in enumerate(items) if heading is not None and heading(it))
    joined = across_blanks(rules, boxes, _MIN_COLUMN_GAP)
    order, columns = _cut(list(range(len(items))), boxes, rtl, heads, joined)
    return Reading(order=[items[i] for i in order], columns=columns)


def xy_cut(items: Sequence[T], box_of: Callable[[T], Box], *, rtl: bool = False) -> list[T]:
    """`items` in reading order."""
    return read_page(items, box_of, rtl=rtl).order


def read_rows(items: Sequence[T], box_of: Callable[[T], Box], *, rtl: bool = False) -> list[T]:
    """`items` read by rows, top to bottom, with no columns looked for: the lines of a
    title or caption region, which the layout model already boxed as one element."""
    boxes = [box_of(it) for it in items]
    return [items[i] for i in _by_rows(list(range(len(items))), boxes, rtl)]


def _cut(
    idx: list[int],
    boxes: Sequence[Box],
    rtl: bool,
    heads: frozenset[int] = frozenset(),
    rules: tuple[Box, ...] = (),
) -> tuple[list[int], int]:
    """The node's reading order and its column count (see `Reading.columns`)."""
    if len(idx) <= 1:
        return idx, len(idx)
    foot = _foot_headings(idx, boxes, heads)
    if foot:
        order, count = _cut([i for i in idx if i not in foot], boxes, rtl, heads, rules)
        return order + foot, count
    columns = _split_x(idx, boxes, rules)
    if columns is not None:
        if rtl:
            columns.reverse()
        return _beside(columns, boxes, rtl, heads, rules)
    # A gutter that few elements cross, else one found row by row (it drifts).
    gutter = (
        _split_at_rule(idx, boxes, rules)
        or _split_at_gutter(idx, boxes, heads, rules)
        or _split_by_row_gutters(idx, boxes, heads)
    )
    if gutter is not None:
        if not gutter.columns:
            return _stacked(gutter.parts, boxes, rtl, heads, rules)
        parts = gutter.parts[::-1] if rtl else gutter.parts
        order, count = _beside(parts, boxes, rtl, heads, rules)
        # Masked elements (pictures the columns run around) go back by position.
        return _reinsert(order, gutter.masked, boxes), count
    rows = _split_y(idx, boxes)
    if rows is not None:
        return _stacked(rows, boxes, rtl, heads, rules)
    return _by_rows(idx, boxes, rtl), 1


def _foot_headings(idx: list[int], boxes: Sequence[Box], heads: frozenset[int]) -> list[int]:
    """Headings below everything else of the node that reach under two columns, top to
    bottom: a title across the foot of a spread, a headline under the columns. Read
    after the rest: a clean cut between columns they do not reach under would read them
    between those columns."""
    mine = [i for i in idx if i in heads]
    rest = [i for i in idx if i not in heads]
    if not mine or len(rest) < 2:
        return []
    bottom = max(boxes[i][3] for i in rest)
    return sorted(
        (i for i in mine if boxes[i][1] >= bottom and _under_two(i, rest, boxes)),
        key=lambda i: boxes[i][1],
    )


def _under_two(i: int, others: Sequence[int], boxes: Sequence[Box]) -> bool:
    """Whether element `i` reaches under two columns: among the others it overlaps
    horizontally, two that do not overlap each other (a section heading at the foot of
    one column reaches under that column alone)."""
    x0, x1 = boxes[i][0], boxes[i][2]
    level = [boxes[j] for j in others if min(x1, boxes[j][2]) > max(x0, boxes[j][0])]
    return bool(level) and min(b[2] for b in level) < max(b[0] for b in level)


def _beside(
    parts: list[list[int]],
    boxes: Sequence[Box],
    rtl: bool,
    heads: frozenset[int],
    rules: tuple[Box, ...] = (),
) -> tuple[list[int], int]:
    """Parts side by side, read one after the other; their columns add up."""
    done = [_cut(part, boxes, rtl, heads, rules) for part in parts]
    count = sum(n for part, (_, n) in zip(parts, done, strict=True) if len(part) >= _MIN_PER_SIDE)
    return [i for order, _ in done for i in order], max(count, 1)


def _stacked(
    parts: list[list[int]],
    boxes: Sequence[Box],
    rtl: bool,
    heads: frozenset[int],
    rules: tuple[Box, ...] = (),
) -> tuple[list[int], int]:
    """Parts one above the other, read top to bottom; the columns of the part with the most
    print count (by the area of its boxes: a table's many small cells are less text than a
    few paragraphs' long lines)."""
    done = [_cut(part, boxes, rtl, heads, rules) for part in parts]
    largest = max(range(len(parts)), key=lambda k: _area(parts[k], boxes))
    return [i for order, _ in done for i in order], done[largest][1]


def _area(idx: Sequence[int], boxes: Sequence[Box]) -> float:
    return sum((boxes[i][2] - boxes[i][0]) * (boxes[i][3] - boxes[i][1]) for i in idx)


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


def _split_x(
    idx: list[int], boxes: Sequence[Box], rules: tuple[Box, ...] = ()
) -> list[list[int]] | None:
    cover, lo, span = _coverage(idx, boxes, 0)
    ruled = _rule_xs(idx, boxes, rules)
    cuts = [
        lo + (a + b) / 2 / _BINS * span
        for a, b in _gaps(cover == 0)
        if a > 0 and b < _BINS and _is_gutter(a, b, lo, span, ruled)
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


def _rule_xs(idx: Sequence[int], boxes: Sequence[Box], rules: tuple[Box, ...]) -> list[float]:
    """Where each rule that runs down most of the node stands, half way down the node."""
    middle = (min(boxes[i][1] for i in idx) + max(boxes[i][3] for i in idx)) / 2
    return [rule_x(r, middle) for r in tall_rules(idx, boxes, rules)]


def _is_gutter(a: int, b: int, lo: float, span: float, ruled: Sequence[float]) -> bool:
    """Whether the blank strip of bins [a, b) parts columns: wide enough, or holding a rule
    (a newspaper's gutters are narrower than `_MIN_COLUMN_GAP`, its rules say where)."""
    if (b - a) / _BINS * span >= _MIN_COLUMN_GAP:
        return True
    x0, x1 = lo + a / _BINS * span, lo + b / _BINS * span
    return any(x0 <= x <= x1 for x in ruled)


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


class _Gutter(NamedTuple):
    parts: list[list[int]]  # [left, right] columns, or bands top to bottom
    masked: list[int]  # embedded elements the columns run around
    columns: bool  # parts side by side (True) or one above the other


def _split_at_rule(
    idx: list[int], boxes: Sequence[Box], rules: tuple[Box, ...]
) -> _Gutter | None:
    """Parts of the node on either side of a column rule that runs down most of it.

    A rule is where the printer ended a column, so what crosses its x decides by where it
    stands: above or below the rule (a masthead, a headline over the columns it spans) it
    cuts the node into bands, and so does one across two rules; level with the rule and
    across it alone it can only be a line the OCR joined across the gutter (one or two:
    more means the "rule" is no column edge), read with the column it starts in. The rule
    crossed by the fewest elements is taken first.
    """
    if len(idx) < 2 * _MIN_PER_SIDE + 1:
        return None
    best: _Gutter | None = None
    fewest = len(idx)
    tall = tall_rules(idx, boxes, rules)

    def crosses(i: int, rule: Box) -> bool:
        # A box that reaches past the rule by less than a narrow gutter is a column's
        # line beside it: the fitted rule is straight, the printed one bends where the
        # paper was folded, and a bridged line reaches a whole column across.
        at = rule_x(rule, (boxes[i][1] + boxes[i][3]) / 2)
        return boxes[i][0] + _MIN_COLUMN_GAP < at < boxes[i][2] - _MIN_COLUMN_GAP

    for rule in tall:
        crossing = [i for i in idx if crosses(i, rule)]
        if len(crossing) >= fewest:
            continue
        # The OCR joins the lines of two columns, never of three: an element across two
        # rules (a running head the rules reach up to) spans the columns, like one
        # above or below the rule.
        level = [
            i
            for i in crossing
            if rule[1] <= (boxes[i][1] + boxes[i][3]) / 2 <= rule[3]
            and sum(crosses(i, r) for r in tall) == 1
        ]
        if len(level) > _MAX_BRIDGES:
            continue
        outside = [i for i in crossing if i not in level]
        if outside:
            bands = _bands(idx, outside, boxes)
            if bands is None:
                continue
            best, fewest = _Gutter(bands, [], columns=False), len(crossing)
            continue
        middle = {i: rule_x(rule, (boxes[i][1] + boxes[i][3]) / 2) for i in idx}
        left = [i for i in idx if (boxes[i][0] + boxes[i][2]) / 2 < middle[i]]
        right = [i for i in idx if (boxes[i][0] + boxes[i][2]) / 2 >= middle[i]]
        if len(left) < _MIN_PER_SIDE or len(right) < _MIN_PER_SIDE:
            continue
        best, fewest = _Gutter([left, right], [], columns=True), len(crossing)
    return best


def _split_at_gutter(
    idx: list[int],
    boxes: Sequence[Box],
    heads: frozenset[int] = frozenset(),
    rules: tuple[Box, ...] = (),
) -> _Gutter | None:
    """Parts of the node on either side of a gutter that a few elements cross.

    Bands when spanning elements cut the node into horizontal bands; [left, right]
    columns with the masked elements when the crossing elements are embedded ones, or
    with none when none cross at all (the columns' ragged edges nearly touch, leaving a
    blank strip too narrow for `_split_x`, inside a wide strip that few lines reach into);
    None without a gutter.
    """
    if len(idx) < 2 * _MIN_PER_SIDE + 1:
        return None
    cover, lo, span = _coverage(idx, boxes, 0)
    allowed = max(1, int(len(idx) * _MAX_CROSSING_SHARE))
    zone_lo, zone_hi = int(_GUTTER_ZONE[0] * _BINS), int(_GUTTER_ZONE[1] * _BINS)
    best: tuple[int, int] | None = None
    for a, b in _gaps(cover[zone_lo:zone_hi] <= allowed):
        if best is None or b - a > best[1] - best[0]:
            best = (a + zone_lo, b + zone_lo)
    if best is None or not _is_gutter(best[0], best[1], lo, span, _rule_xs(idx, boxes, rules)):
        return None
    # The gutter is where the fewest elements cross, within the strip: a ragged column
    # edge makes the strip lopsided, and its middle may cut the column's longest lines.
    strip = cover[best[0] : best[1]]
    ra, rb = max(_gaps(strip == strip.min()), key=lambda r: r[1] - r[0])
    gutter = lo + (best[0] + (ra + rb) / 2) / _BINS * span
    crossing = [i for i in idx if boxes[i][0] < gutter < boxes[i][2]]
    rest = [i for i in idx if not boxes[i][0] < gutter < boxes[i][2]]
    left = [i for i in rest if boxes[i][2] <= gutter]
    right = [i for i in rest if boxes[i][0] >= gutter]
    if len(left) < _MIN_PER_SIDE or len(right) < _MIN_PER_SIDE:
        return None
    top = max(min(boxes[i][1] for i in left), min(boxes[i][1] for i in right))
    bottom = min(max(boxes[i][3] for i in left), max(boxes[i][3] for i in right))
    if bottom <= top:  # the "columns" never stand side by side: no gutter
        return None
    # Embedded: a picture (several lines tall) with text level with it, and what is
    # stacked on one (its caption). Spanning: the other crossing elements, if wide. A
    # narrow one that is no picture (the middle column of an author block) means there
    # is no gutter here.
    line = float(np.median([boxes[i][3] - boxes[i][1] for i in idx]))
    seeds = [
        i
        for i in crossing
        if i not in heads
        and boxes[i][3] - boxes[i][1] >= _PICTURE_LINES * line
        and _has_beside(i, rest, boxes)
    ]
    embedded = [i for i in _stacked_on(seeds, crossing, boxes, line) if i not in heads]
    spanning = [i for i in crossing if i not in embedded]
    narrow = [
        i
        for i in spanning
        if i not in heads and boxes[i][2] - boxes[i][0] < _MIN_SPANNING_WIDTH * span
    ]
    if narrow:
        # One or two boxes that reach into the text of both columns are lines the OCR
        # joined across the gutter, not a reason to give the gutter up: each goes to the
        # column it starts in. Anything else narrow (an author block's middle column,
        # clear of both sides' text) means no gutter.
        if len(narrow) > _MAX_BRIDGES or not all(
            _reaches_both(i, left, right, boxes, 0.02 * span) for i in narrow
        ):
            return None
        spanning = [i for i in spanning if i not in narrow]
        for i in narrow:
            (left if (boxes[i][0] + boxes[i][2]) / 2 < gutter else right).append(i)
    if spanning:
        bands = _bands(idx, spanning, boxes)
        return _Gutter(bands, [], columns=False) if bands is not None else None
    return _Gutter([left, right], embedded, columns=True)


def _split_by_row_gutters(
    idx: list[int], boxes: Sequence[Box], heads: frozenset[int] = frozenset()
) -> _Gutter | None:
    """Two columns whose gutter moves down the page, found row by row.

    A gutter that is straight on the sheet is not on the scan: turned half a degree, a
    page's columns drift sideways by more than a 1 % gutter from top to bottom; text set
    around a cut-out picture moves a column's edge line by line. No one x then separates
    the columns, yet every row does: where two lines stand level, the blank from the end
    of one to the start of the next is the gutter there, and the blanks of successive rows
    overlap (a jump means no one gutter: a form, a grid). A row of one line takes the
    blank of the nearest row that has one. Tall elements (a picture the columns run
    around) are masked and come back by position; a wide line across the gutter cuts the
    node into bands; one or two narrow ones go to the column they start in.
    """
    if len(idx) < 2 * _MIN_PER_SIDE + 1:
        return None
    lo = min(boxes[i][0] for i in idx)
    span = max(max(boxes[i][2] for i in idx) - lo, 1e-9)
    line = float(np.median([boxes[i][3] - boxes[i][1] for i in idx]))
    masked = [
        i for i in idx if i not in heads and boxes[i][3] - boxes[i][1] >= _PICTURE_LINES * line
    ]
    rows = _level_rows([i for i in idx if i not in masked], boxes)
    found = [
        ((min(boxes[i][1] for i in row) + max(boxes[i][3] for i in row)) / 2, gap)
        for row in rows
        if (gap := _row_gutter(row, boxes, lo, span)) is not None
    ]
    if len(found) < _MIN_PER_SIDE or 2 * len(found) < len(rows):
        return None
    if any(max(a[0], b[0]) > min(a[1], b[1]) for (_, a), (_, b) in pairwise(found)):
        return None
    left: list[int] = []
    right: list[int] = []
    spanning: list[int] = []
    bridges = 0
    for row in rows:
        middle = (min(boxes[i][1] for i in row) + max(boxes[i][3] for i in row)) / 2
        g_lo, g_hi = min(found, key=lambda f: abs(f[0] - middle))[1]
        for i in row:
            x0, _, x1, _ = boxes[i]
            wide = x1 - x0 >= _MIN_SPANNING_WIDTH * span or i in heads
            if x0 < g_lo and x1 > g_hi and wide:
                spanning.append(i)
                continue
            bridges += x0 < g_lo and x1 > g_hi
            (left if x0 + x1 < g_lo + g_hi else right).append(i)
    if len(left) < _MIN_PER_SIDE or len(right) < _MIN_PER_SIDE or bridges > _MAX_BRIDGES:
        return None
    if spanning:
        bands = _bands(idx, spanning, boxes)
        return _Gutter(bands, [], columns=False) if bands is not None else None
    return _Gutter([left, right], masked, columns=True)


def _level_rows(idx: list[int], boxes: Sequence[Box]) -> list[list[int]]:
    """Elements grouped into rows: middles within half a line of the row's first."""
    rows: list[list[int]] = []
    for i in sorted(idx, key=lambda i: (boxes[i][1] + boxes[i][3]) / 2):
        if rows:
            first = boxes[rows[-1][0]]
            h = min(first[3] - first[1], boxes[i][3] - boxes[i][1])
            if abs(boxes[i][1] + boxes[i][3] - first[1] - first[3]) / 2 <= 0.5 * max(h, 1e-9):
                rows[-1].append(i)
                continue
        rows.append([i])
    return rows


def _row_gutter(
    row: list[int], boxes: Sequence[Box], lo: float, span: float
) -> tuple[float, float] | None:
    """The widest blank (from, to) between a row's lines, its middle inside the gutter
    zone and as wide as a column gap; None for a row of one line or of lines closer."""
    spans = sorted((boxes[i][0], boxes[i][2]) for i in row)
    best: tuple[float, float] | None = None
    reach = spans[0][1]
    for a, b in spans[1:]:
        inside = _GUTTER_ZONE[0] <= ((reach + a) / 2 - lo) / span <= _GUTTER_ZONE[1]
        wider = best is None or a - reach > best[1] - best[0]
        if inside and a - reach >= _MIN_COLUMN_GAP * span and wider:
            best = (reach, a)
        reach = max(reach, b)
    return best


def _stacked_on(
    seeds: list[int], crossing: list[int], boxes: Sequence[Box], line: float
) -> list[int]:
    """`seeds` and the crossing elements stacked on them, at most a `line` apart and
    overlapping horizontally: the caption under a picture that text runs around has
    nothing beside it, yet belongs with the picture."""
    embedded = list(seeds)
    grew = bool(embedded)
    while grew:
        grew = False
        for i in crossing:
            if i in embedded:
                continue
            a = boxes[i]
            for j in embedded:
                b = boxes[j]
                gap = max(a[1] - b[3], b[1] - a[3])
                if gap <= line and min(a[2], b[2]) - max(a[0], b[0]) > 0:
                    embedded.append(i)
                    grew = True
                    break
    return embedded


def _reaches_both(
    i: int, left: Sequence[int], right: Sequence[int], boxes: Sequence[Box], margin: float
) -> bool:
    """Whether element `i` reaches `margin` into the text of both columns: left of the
    left column's right edge and right of the right column's left edge."""
    x0, _, x1, _ = boxes[i]
    left_edge = max(boxes[j][2] for j in left)
    right_edge = min(boxes[j][0] for j in right)
    return x0 < left_edge - margin and x1 > right_edge + margin


def _has_beside(i: int, others: Sequence[int], boxes: Sequence[Box]) -> bool:
    """Whether text stands level with element `i`, wholly to its left or right."""
    x0, y0, x1, y1 = boxes[i]
    for j in others:
        b = boxes[j]
        overlap = min(y1, b[3]) - max(y0, b[1])
        if overlap > 0.25 * min(y1 - y0, b[3] - b[1]) and (b[2] <= x0 or b[0] >= x1):
            return True
    return False


def _bands(idx: list[int], spanning: list[int], boxes: Sequence[Box]) -> list[list[int]] | None:
    """The node cut into bands: above each spanning element, the element, below it."""
    spanning = sorted(spanning, key=lambda i: (boxes[i][1], boxes[i][0]))
    rest = [i for i in idx if i not in spanning]
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


def _reinsert(ordered: list[int], masked: list[int], boxes: Sequence[Box]) -> list[int]:
    """Masked elements back into the reading: each before the first element (in reading
    order) below it that it overlaps horizontally, else after the last one above it that
    it overlaps, else at the end. Masked elements keep their top-to-bottom order."""
    out = list(ordered)
    for m in sorted(masked, key=lambda i: (boxes[i][1], boxes[i][0])):
        x0, y0, x1, y1 = boxes[m]
        cy = (y0 + y1) / 2
        level = [
            (k, boxes[j])
            for k, j in enumerate(out)
            if j not in masked and min(x1, boxes[j][2]) - max(x0, boxes[j][0]) > 0
        ]
        below = [k for k, b in level if b[1] >= cy]
        if below:
            out.insert(below[0], m)
            continue
        above = [k for k, b in level if b[3] <= cy]
        out.insert(above[-1] + 1 if above else len(out), m)
    return out


def _by_rows(idx: list[int], boxes: Sequence[Box], rtl: bool) -> list[int]:
    """Top to bottom; elements whose middles share a row left to right (RTL: right to left).

    A row is the topmost element left and the elements level with it (middles within half
    a line) that stand beside every other element of the row. One that stands under a
    row's element (most of the narrower's width shared) is the next line of a column, not
    a row neighbour: OCR boxes of a scan are loose and tall, so a column's lines can be
    level by this measure, and read left to right a paragraph's indented first line would
    come after the line below it.
    """
    todo = sorted(idx, key=lambda i: (boxes[i][1], boxes[i][0]))
    out: list[int] = []
    while todo:
        first = boxes[todo[0]]
        row = [todo[0]]
        later: list[int] = []
        for n, i in enumerate(todo[1:], start=1):
            b = boxes[i]
            if b[1] > first[3]:  # its top below the first's foot: no middle can be level
                later.extend(todo[n:])
                break
            h = min(first[3] - first[1], b[3] - b[1])
            level = abs(b[1] + b[3] - first[1] - first[3]) / 2 <= 0.5 * max(h, 1e-9)
            if level and not any(_stacked_pair(boxes[j], b) for j in row):
                row.append(i)
            else:
                later.append(i)
        out.extend(sorted(row, key=lambda i: boxes[i][0], reverse=rtl))
        todo = later
    return out


def _stacked_pair(a: Box, b: Box) -> bool:
    """Whether two boxes share most of the narrower one's width: one above the other in a
    column, never neighbours in a row (pieces of one OCR line touch or barely overlap)."""
    shared = min(a[2], b[2]) - max(a[0], b[0])
    return shared > 0.5 * min(a[2] - a[0], b[2] - b[0])


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
