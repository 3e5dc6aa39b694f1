"""Column rules: the thin printed lines that part a newspaper's columns.

A broadsheet sets seven or eight columns with gutters of a few points and a hairline rule
in each. The detector's padded boxes reach onto the rule from both sides, trimming a box
to its ink stops at the rule (it is ink), and the blank strip left between two columns is
narrower than reading order accepts as a gutter (`reading_order._MIN_COLUMN_GAP`): the page
would be read row by row across all its columns. A rule is the printer saying where a
column ends, so it is found and used as such:

- `find_rules`: long thin vertical runs of ink on the page. A letter's stem is at most a
  line tall; a rule runs for many lines. Scans are turned a little, so the ink is widened
  sideways before the vertical runs are measured, and a run may lean. A photo's dark
  areas give wide runs and are not rules; neither is a run shorter than `_MIN_LENGTH`.
- `erase`: the page with its rules painted white, for the steps that look at a line's ink
  (trimming box sides, finding bridged gutters).
- the rules themselves go to reading order, where a blank strip holding a rule is a
  gutter however narrow. There a rule is a line on the page, normalised as (x at its
  top, top, x at its bottom, bottom): `rule_x` (where it stands at a height),
  `tall_rules` (those that run down most of a node), `across_blanks` (pieces joined
  across a stretch where only the gutter runs on, which needs the page's elements:
  `joined` below joins pieces by their pixels alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from daemon.engines.lite.lines import Box

# A rule is at least this share of the page's height long...
_MIN_LENGTH = 0.15
# ... and at most this share of its width wide (after the sideways widening).
_MAX_WIDTH = 0.006
# A rule's pixels are darker than the paper by this share of the paper-to-print range on
# at least `_UNBROKEN` of the rows it spans.
_RULE_DARKNESS = 0.12
_UNBROKEN = 0.85
# The strips this wide just beside a rule's footprint are paper (a gutter's own width is
# a few points, so they are narrow).
_SIDE = 2
# A rule's valley is this share of the paper-to-print range deeper than both its sides,
# measured `_REACH` pixels away after averaging over `_SMOOTH` pixels down the page.
_VALLEY = 0.05
_REACH = 5
_SMOOTH = 41
# The sideways drift per pixel down of a rule on a scan turned by up to half a degree.
_LEAN_SLOPE = 0.009
# Pieces of a rule this share of the page's height apart or closer are one rule.
_JOIN_GAP = 0.01
# A rule parts the columns of a node (reading order) it runs down this share of.
_RULE_SHARE = 0.6
# Rules are looked for on every this many rows of the page.
_ROW_STEP = 4
# The strips beside a rule hold at most this share of ink.
_SIDE_INK = 0.08
# Sideways widening, in pixels of the grey image, that keeps a rule on a scan turned by
# up to ~0.5 degrees in one piece over `_MIN_LENGTH` of a 3,000 px page.
_LEAN = 3


@dataclass(frozen=True)
class Rule:
    """A vertical rule, in page pixels: its box (x0, y0, x1, y1: x1 and y1 exclusive) and
    where its middle stands at the top and at the bottom (a rule on a turned scan leans:
    its box is wider than the rule by the lean)."""

    x0: int
    y0: int
    x1: int
    y1: int
    top_x: float
    bottom_x: float

    def normalised(self, width: int, height: int) -> tuple[float, float, float, float]:
        """The rule as reading order takes it: (x at the top, top, x at the bottom,
        bottom), normalised to the page."""
        return (self.top_x / width, self.y0 / height, self.bottom_x / width, self.y1 / height)


@dataclass(frozen=True)
class Rules:
    """A page's rules and the pixels they are made of (None when there are none)."""

    found: list[Rule]
    mask: np.ndarray | None


def find_rules(gray: np.ndarray) -> Rules:
    """The vertical rules on a grey page image (0 black, 255 white)."""
    import cv2

    height, width = gray.shape[:2]
    length = int(_MIN_LENGTH * height)
    if length < 20 or width < 20:
        return Rules(found=[], mask=None)
    page = np.asarray(gray, dtype=np.float32)
    # Old newsprint is grey on grey and its hairlines print faint, some barely darker than
    # the paper. A rule is a valley across the page: averaged down the page (so the grain,
    # the JPEG and breaks in the print even out, and a letter's stem, a line tall, fades)
    # it is darker than the paper a few pixels to its left AND to its right. A column's
    # edge of print is dark on one side only; text is dark all over.
    # Paper and print levels from every third pixel each way: as good, ten times cheaper.
    sample = page[::3, ::3]
    paper = float(np.median(sample))
    dark = float(np.percentile(sample, 1))
    if paper - dark < 40:  # a blank or flat page: no print to tell a rule from
        return Rules(found=[], mask=None)
    avg = cv2.blur(page, (1, _SMOOTH))
    left = np.empty_like(avg)
    right = np.empty_like(avg)
    left[:, _REACH:] = avg[:, :-_REACH]
    left[:, :_REACH] = avg[:, :1]
    right[:, :-_REACH] = avg[:, _REACH:]
    right[:, -_REACH:] = avg[:, -1:]
    valley = np.minimum(left, right) - avg
    ink = (valley > _VALLEY * (paper - dark)).astype(np.uint8)
    # Widened sideways so a leaning rule stays one run, then opened with a tall, thin
    # kernel: only vertical runs of at least `length` survive. Rules are vertical, so
    # every `_ROW_STEP`th row tells as much as all of them at a quarter of the cost.
    widened = cv2.dilate(ink[::_ROW_STEP], np.ones((1, 2 * _LEAN + 1), np.uint8))
    tall = cv2.morphologyEx(
        widened, cv2.MORPH_OPEN, np.ones((max(length // _ROW_STEP, 1), 1), np.uint8)
    )
    count, labels, stats, _ = cv2.connectedComponentsWithStats(tall, connectivity=8)
    found: list[Rule] = []
    widest = max(int(_MAX_WIDTH * width), 2 * _LEAN + 3)
    for k in range(1, count):
        x, y, w, h = (int(v) for v in stats[k, :4])
        # A rule on a turned scan leans: its box is wider by the lean over its height.
        if h * _ROW_STEP < length or w > widest + int(_LEAN_SLOPE * h * _ROW_STEP):
            continue
        rows, cols = np.nonzero(labels[y : y + h, x : x + w] == k)
        # The rule's middle line, fitted to its pixels (sampled rows, so back to the page).
        slope, at0 = np.polyfit((rows + y) * _ROW_STEP, cols + x, 1)
        top, bottom = y * _ROW_STEP, min((y + h) * _ROW_STEP, height)
        rule = Rule(
            x0=x,
            y0=top,
            x1=x + w,
            y1=bottom,
            top_x=float(at0 + slope * top),
            bottom_x=float(at0 + slope * bottom),
        )
        # Print, pixel by pixel: darker than halfway from the paper to the darkest print.
        if _in_paper(page, (paper + dark) / 2, rule) and _unbroken(page, paper, dark, rule):
            found.append(rule)
    if not found:
        return Rules(found=[], mask=None)
    return Rules(found=found, mask=_pixels_of(found, ink, height, width))


def _pixels_of(rules: list[Rule], ink: np.ndarray, height: int, width: int) -> np.ndarray:
    """The pixels the rules are printed in: the valley's pixels near each rule's middle
    line, row by row (the box of a leaning rule also holds the gutter beside it), and
    one more pixel each side for the rule's soft edges."""
    import cv2

    mask = np.zeros((height, width), dtype=np.uint8)
    reach = _LEAN + 2
    for r in rules:
        x0, x1 = max(r.x0 - reach, 0), min(r.x1 + reach, width)
        ys = np.arange(r.y0, r.y1)
        centre = r.top_x + (r.bottom_x - r.top_x) * (ys - r.y0) / max(r.y1 - r.y0, 1)
        near = np.abs(np.arange(x0, x1)[None, :] - centre[:, None]) <= reach
        mask[r.y0 : r.y1, x0:x1] |= (near & (ink[r.y0 : r.y1, x0:x1] > 0)).astype(np.uint8)
    return cv2.dilate(mask, np.ones((1, 3), np.uint8)) > 0


def _unbroken(page: np.ndarray, paper: float, dark: float, rule: Rule) -> bool:
    """Whether the rule is printed on nearly every row it spans. The left edge of flush-left
    print is a valley too, averaged down the page (the stems of every line's first letter
    line up), but it breaks between the lines, where a rule runs on."""
    darkest = page[rule.y0 : rule.y1, rule.x0 : rule.x1].min(axis=1)
    return float((paper - darkest > _RULE_DARKNESS * (paper - dark)).mean()) >= _UNBROKEN


def _in_paper(page: np.ndarray, print_below: float, rule: Rule) -> bool:
    """Whether the strips just left and right of `rule` are paper: a column rule stands in
    a gutter, clear of the print on either side. A dark stroke in a photograph or a
    drawing has more of its kind beside it; a fold or a shadow down the middle of a
    typescript has the lines it crosses."""
    width = page.shape[1]
    side = _SIDE
    strips = [
        page[rule.y0 : rule.y1, max(rule.x0 - side, 0) : rule.x0],
        page[rule.y0 : rule.y1, rule.x1 : min(rule.x1 + side, width)],
    ]
    return all(s.size == 0 or float((s < print_below).mean()) <= _SIDE_INK for s in strips)


def joined(rules: list[Rule], height: int) -> list[Rule]:
    """`rules` with the pieces of one rule made one: a rule that fades for a few lines or
    breaks where the scan's paper was creased is found as pieces one above the other, and
    reading order asks whether a rule runs down most of a column band. Pieces join when
    their x ranges touch (a leaning rule shifts a little) and the gap between them is
    under `_JOIN_GAP` of the page; a headline across the columns leaves a wider one.
    """
    out: list[Rule] = []
    for r in sorted(rules, key=lambda r: r.y0):
        for k, o in enumerate(out):
            # A rule on a scan turned half a degree drifts ~1 px sideways per 110 down.
            drift = _LEAN + int(_LEAN_SLOPE * (r.y1 - o.y0))
            touching = r.x0 <= o.x1 + drift and o.x0 <= r.x1 + drift
            if touching and r.y0 - o.y1 <= _JOIN_GAP * height:
                upper, lower = (o, r) if o.y0 <= r.y0 else (r, o)
                out[k] = Rule(
                    x0=min(o.x0, r.x0),
                    y0=upper.y0,
                    x1=max(o.x1, r.x1),
                    y1=max(o.y1, r.y1),
                    top_x=upper.top_x,
                    bottom_x=lower.bottom_x if lower.y1 >= upper.y1 else upper.bottom_x,
                )
                break
        else:
            out.append(r)
    return out


def erase(gray: np.ndarray, rules: Rules) -> np.ndarray:
    """`gray` with the rules' pixels painted white (a copy; the input is left as it is)."""
    if rules.mask is None:
        return gray
    out = gray.copy()
    out[rules.mask] = 255
    return out


# ---- rules as reading order takes them: lines on the page, normalised -----------------


def rule_x(rule: Box, y: float) -> float:
    """Where a rule, given as (x at its top, top, x at its bottom, bottom), stands at y
    (a rule on a turned scan leans)."""
    share = (min(max(y, rule[1]), rule[3]) - rule[1]) / max(rule[3] - rule[1], 1e-9)
    return rule[0] + (rule[2] - rule[0]) * share


def tall_rules(idx: Sequence[int], boxes: Sequence[Box], rules: tuple[Box, ...]) -> list[Box]:
    """The rules that run down most of the node made of elements `idx` (a short rule
    beside one story says nothing about the node's other rows)."""
    if not rules:
        return []
    top = min(boxes[i][1] for i in idx)
    bottom = max(boxes[i][3] for i in idx)
    tall = _RULE_SHARE * (bottom - top)
    return [r for r in rules if min(bottom, r[3]) - max(top, r[1]) >= tall]


def across_blanks(rules: Sequence[Box], boxes: Sequence[Box], gap: float) -> tuple[Box, ...]:
    """`rules` with pieces of one column rule joined across a stretch where it is not
    printed but its gutter runs on: a rule fades, or a fold or a tear hides it, for a
    few inches, and the column beside it is no less parted there. Two pieces one above
    the other are one rule when the lower starts within two narrow gutters (`gap`, the
    page's narrowest column gap; a column is ten times as wide) of where the upper ends,
    text stands on both sides of the stretch between them, and no element crosses it (a
    headline or a picture across the columns ends the rule above it).
    """
    out = sorted(rules, key=lambda r: r[1])
    joined = True
    while joined:
        joined = False
        for a, b in ((a, b) for a in out for b in out if b[1] >= a[3]):
            if abs(b[0] - a[2]) > 2 * gap or not _blank_between(a, b, boxes, gap):
                continue
            out.remove(a)
            out.remove(b)
            out.append((a[0], a[1], b[2], b[3]))
            out.sort(key=lambda r: r[1])
            joined = True
            break
    return tuple(out)


def _blank_between(upper: Box, lower: Box, boxes: Sequence[Box], gap: float) -> bool:
    """Whether the straight line from the foot of `upper` to the head of `lower` runs
    through a gutter: elements level with it on both sides and none across it (a box
    that reaches over it by less than a narrow gutter, `gap`, is a column's line beside
    it)."""
    top, bottom = upper[3], lower[1]
    stretch: Box = (upper[2], top, lower[0], bottom)
    left = right = False
    for b in boxes:
        middle = (b[1] + b[3]) / 2
        if b[3] <= top or b[1] >= bottom:
            continue
        x = rule_x(stretch, middle)
        if b[0] + gap < x < b[2] - gap:
            return False
        if top <= middle <= bottom:
            left = left or b[2] <= x + gap
            right = right or b[0] >= x - gap
    return left and right
