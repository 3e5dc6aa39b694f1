"""Detected lines that bridge a narrow gutter, cut back into one line per column.

PP-OCR's detector runs on the page shrunk to 960 px: a gutter of 1-1.5 % of the width is
then a few pixels, no wider than a word space, and the detector returns the first line of
column 1 and the first line of column 2 as one box across it. Reading order cannot undo
that (the box belongs to both columns), so the box is cut here, on the full-resolution
page, before anything else sees it.

A cut is a vertical white run through the line's core (its middle rows: neighbours'
descenders and accents stay out) that is
- wider than the line's own word spaces (the median of its inner white runs, measured on
  the page, so a headline's wide spaces are judged against its own type) and than a share
  of the line height, yet no wider than a detector bridges (a few line heights: a wider
  gap between a table row's cells is left to the table);
- white in other lines above and below as well: a column gutter runs down the page, word
  spaces of neighbouring lines do not line up (a justified paragraph's "river" lines up
  for a line or two, so two neighbours are asked for);
- between two parts that are each a column's line long (a label and its value stay one
  line).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from daemon.engines.lite.lines import Line
from daemon.engines.lite.rules import Rule, Rules

# The rows of a line box whose ink decides: the middle, clear of neighbours' ascenders.
_CORE = (0.2, 0.8)
# A gutter is wider than this many of the line's median word spaces...
_WORD_SPACES = 1.8
# ... and than this share of the line height (a word space is about a quarter of it)...
_MIN_GAP_HEIGHTS = 0.35
# ... and narrower than this many line heights (the detector does not bridge wider gaps).
_MAX_GAP_HEIGHTS = 4.0
# Each part of a bridged line is at least this many line heights wide: a column's line
# (a magazine column is 15-20 line heights wide), not a few words that a wider space
# happens to set apart in lines of the same text.
_MIN_PART_HEIGHTS = 8.0
# Beside a column rule a bridged line is blank for this many line heights on each side.
_RULE_MARGIN_HEIGHTS = 0.08
# Lines this many line heights above or below are asked whether the gutter runs on.
_NEIGHBOURHOOD = 6.0
_MIN_CONFIRMING = 2
# A line worth a look is this many times as wide as it is tall.
_MIN_ASPECT = 2 * _MIN_PART_HEIGHTS + _MIN_GAP_HEIGHTS


@dataclass(frozen=True)
class Part:
    """One column's piece of a bridged line, in page pixels."""

    x0: int
    x1: int


def split_at_gutters(lines: Sequence[Line], gray: np.ndarray) -> dict[int, list[Part]]:
    """For each line that bridges a gutter (by index), its parts left to right.

    `gray` is the page the line boxes are normalised to, 8-bit greyscale.
    """
    height, width = gray.shape[:2]
    px = [_pixels(ln, width, height) for ln in lines]
    profiles = [_profile(gray, box) for box in px]
    found: dict[int, list[Part]] = {}
    for i, (box, prof) in enumerate(zip(px, profiles, strict=True)):
        h = box[3] - box[1]
        if prof is None or box[2] - box[0] < _MIN_ASPECT * h:
            continue
        low, runs = _gutter_candidates(prof, h)
        cuts = [run for run in runs if _confirmed(run, i, px, profiles, h, 0.75 * low)]
        parts = _parts(box, cuts, h)
        if len(parts) > 1:
            found[i] = parts
    return found


def split_at_rules(lines: Sequence[Line], rules: Rules, gray: np.ndarray) -> dict[int, list[Part]]:
    """For each line whose box runs across a column rule (`rules`), its parts left to right.

    `gray` is the page with its rules painted out. A rule is the printer's own column
    edge, so the white run at it needs no confirming by the lines around, only to be a
    gutter's: blank for a share of the line height on both sides of the rule. A title
    set across a paste-up's edge (which reads as a rule too) has its letters up to the
    edge. "Print on both sides" is a line height of box beyond the rule each way: the
    detector's padding alone reaches over a rule by less. A rule on a turned scan leans,
    so where it stands is read level with each line, from its pixels.
    """
    height, width = gray.shape[:2]
    found: dict[int, list[Part]] = {}
    for i, ln in enumerate(lines):
        box = _pixels(ln, width, height)
        h = box[3] - box[1]
        across = [
            at
            for r in rules.found
            if min(box[3], r.y1) - max(box[1], r.y0) >= 0.5 * h
            and (at := _rule_at(rules, r, box[1], box[3])) is not None
            and box[0] + h <= at[0]
            and at[1] <= box[2] - h
        ]
        prof = _profile(gray, box) if across else None
        if prof is None:
            continue
        cuts = [
            run
            for x0, x1 in across
            if (run := _blank_around(prof, x0, x1)) is not None
            and run[1] - run[0] >= _MIN_GAP_HEIGHTS * h
            # Paper on both sides of the rule itself: a letter that touches the rule (a
            # title typed across a paste-up's edge) leaves none on its side.
            and min(x0 - run[0], run[1] - x1) >= _RULE_MARGIN_HEIGHTS * h
        ]
        parts = _parts(box, cuts, h, min_part=1.0)
        if len(parts) > 1:
            found[i] = parts
    return found


def _rule_at(rules: Rules, rule: Rule, top: int, bottom: int) -> tuple[int, int] | None:
    """The pixel columns rule `rule` takes between rows top and bottom."""
    if rules.mask is None:
        return rule.x0, rule.x1
    sub = rules.mask[max(top, rule.y0) : min(bottom, rule.y1), rule.x0 : rule.x1]
    cols = np.flatnonzero(sub.any(axis=0))
    if cols.size == 0:
        return None
    return rule.x0 + int(cols[0]), rule.x0 + int(cols[-1]) + 1


def _blank_around(prof: _Profile, x0: int, x1: int) -> tuple[int, int] | None:
    """The white run of the line's core that holds pixel columns x0..x1, in page pixels."""
    a, b = x0 - prof.x0, x1 - prof.x0
    if a < 0 or b > prof.ink.size or (prof.ink[a:b] > 0).any():
        return None
    while a > 0 and prof.ink[a - 1] == 0:
        a -= 1
    while b < prof.ink.size and prof.ink[b] == 0:
        b += 1
    return prof.x0 + a, prof.x0 + b


def _pixels(line: Line, width: int, height: int) -> tuple[int, int, int, int]:
    x0, y0, x1, y1 = line.bbox
    return (
        int(x0 * width),
        int(y0 * height),
        int(np.ceil(x1 * width)),
        int(np.ceil(y1 * height)),
    )


@dataclass(frozen=True)
class _Profile:
    x0: int  # page pixel of ink[0]
    ink: np.ndarray  # dark pixels per pixel column of the line's core


def _profile(gray: np.ndarray, box: tuple[int, int, int, int]) -> _Profile | None:
    """Ink per pixel column of the line's core, or None for a box too small or too flat
    in contrast to tell ink from paper."""
    x0, y0, x1, y1 = box
    h = y1 - y0
    top, bottom = y0 + int(h * _CORE[0]), y0 + int(np.ceil(h * _CORE[1]))
    crop = gray[top:bottom, x0:x1]
    if crop.size == 0 or crop.shape[0] < 2 or crop.shape[1] < 2:
        return None
    lo, hi = np.percentile(crop, (2, 98))
    if hi - lo < 40:
        return None
    ink = (crop < (lo + hi) / 2).sum(axis=0)
    return _Profile(x0=x0, ink=ink)


def _white_runs(ink: np.ndarray) -> list[tuple[int, int]]:
    """Inner runs of pixel columns without ink, as (start, end) offsets."""
    dark = np.flatnonzero(ink > 0)
    if dark.size < 2:
        return []
    steps = np.diff(dark)
    at = np.flatnonzero(steps > 1)
    return [(int(dark[k]) + 1, int(dark[k + 1])) for k in at]


def _gutter_candidates(prof: _Profile, h: int) -> tuple[float, list[tuple[int, int]]]:
    """The narrowest gutter for this line's type, and its inner white runs at least that
    wide, in page pixels."""
    runs = _white_runs(prof.ink)
    if len(runs) < 2:
        return 0.0, []
    # Letter spacing gives 1-2 px runs; word spaces are the runs of a third of the
    # height's order. The median of the runs above the letter spacing is the word space.
    spaces = [b - a for a, b in runs if b - a > 0.08 * h]
    if not spaces:
        return 0.0, []
    space = float(np.median(spaces))
    low = max(_WORD_SPACES * space, _MIN_GAP_HEIGHTS * h)
    return low, [(prof.x0 + a, prof.x0 + b) for a, b in runs if low < b - a <= _MAX_GAP_HEIGHTS * h]


def _confirmed(
    run: tuple[int, int],
    i: int,
    boxes: Sequence[tuple[int, int, int, int]],
    profiles: Sequence[_Profile | None],
    h: int,
    width: float,
) -> bool:
    """Whether lines of the same type above and below line `i` are blank for `width`
    pixels somewhere within the run too (beyond a line's ends counts as blank: a column's
    ragged edge). Lines that stop well short of the run say nothing about it."""
    a, b = run
    cy = (boxes[i][1] + boxes[i][3]) / 2
    confirming = contradicting = 0
    for j, (box, prof) in enumerate(zip(boxes, profiles, strict=True)):
        if j == i or abs((box[1] + box[3]) / 2 - cy) > _NEIGHBOURHOOD * h:
            continue
        if not 0.7 * h <= box[3] - box[1] <= 1.4 * h:
            continue  # a headline or a caption in other type: not this text's lines
        if box[2] <= a - 2 * h or box[0] >= b + 2 * h or prof is None:
            continue
        blank = np.ones(b - a, dtype=bool)
        lo, hi = max(prof.x0, a), min(prof.x0 + prof.ink.size, b)
        if hi > lo:
            blank[lo - a : hi - a] = prof.ink[lo - prof.x0 : hi - prof.x0] == 0
        if _longest(blank) >= width:
            confirming += 1
        else:
            contradicting += 1  # ink across the run: its blank is a word space here
    # A river of word spaces lines up over a line or two of a paragraph; a gutter runs
    # through (or between) nearly every line beside it.
    return confirming >= _MIN_CONFIRMING and 3 * contradicting <= confirming


def _longest(blank: np.ndarray) -> int:
    best = run = 0
    for free in blank.tolist():
        run = run + 1 if free else 0
        best = max(best, run)
    return best


def _parts(
    box: tuple[int, int, int, int],
    cuts: list[tuple[int, int]],
    h: int,
    min_part: float = _MIN_PART_HEIGHTS,
) -> list[Part]:
    """The line's pieces between the cuts, each at least `min_part` line heights wide (by
    default a column's line)."""
    parts: list[Part] = []
    start = box[0]
    for a, b in sorted(cuts):
        if a - start >= min_part * h and box[2] - b >= min_part * h:
            parts.append(Part(start, a))
            start = b
    parts.append(Part(start, box[2]))
    return parts


def trim_to_ink(lines: Sequence[Line], gray: np.ndarray) -> list[Line]:
    """`lines` with each box's left and right edges moved onto its ink.

    The detector pads its boxes by a fraction of the line height on every side; at a
    gutter of 1 % of the page the padded boxes of both columns touch, and the blank
    strip between the columns, which reading order looks for, is gone. Only x moves:
    the height stays the detector's (the text size).
    """
    height, width = gray.shape[:2]
    out: list[Line] = []
    for ln in lines:
        box = _pixels(ln, width, height)
        prof = _profile(gray, box)
        dark = np.flatnonzero(prof.ink > 0) if prof is not None else np.zeros(0)
        if prof is None or dark.size == 0:
            out.append(ln)
            continue
        x0 = (prof.x0 + int(dark[0])) / width
        x1 = (prof.x0 + int(dark[-1]) + 1) / width
        out.append(replace(ln, bbox=(x0, ln.bbox[1], x1, ln.bbox[3])))
    return out
