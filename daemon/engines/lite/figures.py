"""Figures on a born-digital page, from the PDF's own objects: no layout model needed.

A picture placed in the PDF is an image object (`figure_boxes` merges the pieces of one
figure); a chart or diagram drawn with path operators has none (`drawing_boxes` clusters
the paths that draw something, apart from the rules of a table or a tinted panel behind
text). Both work on boxes normalised to the page, given the page's text-line boxes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from daemon.engines.lite.lines import INSIDE, Box, union
from daemon.engines.lite.regions import overlap_share


def figure_boxes(pictures: Sequence[Box], text: Sequence[Box]) -> list[Box]:
    """Figures from a born-digital page's image objects.

    A figure is often several images side by side; two pieces are one figure when they
    touch or overlap and the box around both covers no text the pieces do not (so two
    figures in two columns, or a picture beside a paragraph, stay apart). Tiny images
    (rules, bullets, small logos: under 1 % of the page) are not figures, and neither is a
    page-sized one (the scan under an OCR text layer, a background).
    """
    gap = 0.01
    boxes = list(pictures)
    merged = True
    while merged:
        merged = False
        for i, a in enumerate(boxes):
            for j in range(i + 1, len(boxes)):
                b = boxes[j]
                near = (
                    a[0] - gap <= b[2]
                    and b[0] - gap <= a[2]
                    and a[1] - gap <= b[3]
                    and b[1] - gap <= a[3]
                )
                if not near:
                    continue
                both = union((a, b))
                # A piece lying inside a figure belongs to it whatever text is near.
                nested = overlap_share(a, b) >= INSIDE or overlap_share(b, a) >= INSIDE
                covers_text = not nested and any(
                    overlap_share(t, both) >= INSIDE
                    and overlap_share(t, a) < INSIDE
                    and overlap_share(t, b) < INSIDE
                    for t in text
                )
                if not covers_text:
                    boxes[i] = both
                    del boxes[j]
                    merged = True
                    break
            if merged:
                break
    return [b for b in boxes if 0.01 <= (b[2] - b[0]) * (b[3] - b[1]) <= 0.85]


# A drawing is a figure when text covers at most this share of it: a chart's labels are
# sparse, a ruled table or a tinted box behind a paragraph is full of text.
_DRAWING_MAX_TEXT = 0.15
# Paths thinner than this (share of the page) in either direction are rules: table lines,
# underlines, frames. A drawing has at least one path that is not a rule.
_RULE = 0.004
_LABEL_WIDTH = 0.1  # a label next to a drawing is narrower than this share of the page
_MAX_PATHS = 4000  # beyond this many, the largest ones stand for the drawing


def drawing_boxes(paths: Sequence[Box], text: Sequence[Box]) -> list[Box]:
    """Vector figures on a born-digital page: clusters of path objects that draw something.

    Paths that touch (within 1 % of the page) form a cluster. A cluster is a figure when
    it is at least 1 % of the page, is more than rules (a ruled table is only rules), and
    has little text on it (a chart's labels, not a table's cells or a paragraph on a
    tinted panel). A page-sized path (a background) is never part of one.
    """
    pieces = [b for b in paths if (b[2] - b[0]) * (b[3] - b[1]) < 0.85]
    if len(pieces) > _MAX_PATHS:
        pieces = sorted(pieces, key=lambda b: (b[2] - b[0]) * (b[3] - b[1]))[-_MAX_PATHS:]
    if not pieces:
        return []
    arr = np.asarray(pieces, dtype=np.float64)
    gap = 0.01

    def near(i: int) -> list[int]:
        # One row at a time: a full matrix of 4000 paths would be 16 M cells per test.
        a = arr[i]
        hit = (
            (arr[:, 0] - gap <= a[2])
            & (a[0] - gap <= arr[:, 2])
            & (arr[:, 1] - gap <= a[3])
            & (a[1] - gap <= arr[:, 3])
        )
        return [int(j) for j in np.flatnonzero(hit)]

    label = [-1] * len(pieces)
    clusters: list[list[int]] = []
    for start in range(len(pieces)):
        if label[start] >= 0:
            continue
        label[start] = len(clusters)
        members = [start]
        stack = [start]
        while stack:
            i = stack.pop()
            for j in near(i):
                if label[j] < 0:
                    label[j] = label[start]
                    members.append(j)
                    stack.append(j)
        clusters.append(members)
    out: list[Box] = []
    for members in clusters:
        box = union(pieces[i] for i in members)
        area = (box[2] - box[0]) * (box[3] - box[1])
        if area < 0.01:
            continue
        if not any(
            pieces[i][2] - pieces[i][0] > _RULE and pieces[i][3] - pieces[i][1] > _RULE
            for i in members
        ):
            continue
        covered = sum(
            (t[2] - t[0]) * (t[3] - t[1]) for t in text if overlap_share(t, box) >= INSIDE
        )
        if covered <= _DRAWING_MAX_TEXT * area:
            out.append(_with_labels(box, text))
    return out


def _with_labels(box: Box, text: Sequence[Box]) -> Box:
    """The drawing's box grown over the short labels just outside it (axis ticks, a unit)."""
    gap = 0.015
    labels = [
        t
        for t in text
        if t[2] - t[0] <= _LABEL_WIDTH
        and box[0] - gap <= t[2]
        and t[0] <= box[2] + gap
        and box[1] - gap <= t[3]
        and t[1] <= box[3] + gap
    ]
    return union([box, *labels])
