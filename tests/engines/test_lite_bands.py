"""Columns whose gutter is not one straight x: a skewed scan, text set around a picture.

Boxes are drawn here, in pixels of a 2,500 x 3,300 page, so the right order is known. A
two-column page with a gutter of 1 % of its width, turned 0.8 degrees, moves its columns
sideways by 46 px from top to bottom: no blank vertical strip is left, and with both
columns' baselines level every row has blank rows above and below it. Read with one
global x split (or by rows), the columns come out interleaved.
"""

from __future__ import annotations

import math

from daemon.engines.lite.reading_order import Box, read_page

WIDTH, HEIGHT = 2500, 3300
LINE, PITCH = 40, 60
LEFT_COL = (100, 1237)
RIGHT_COL = (1263, 2400)  # a 26 px gutter: 1 % of the width


def skewed(box: Box, degrees: float) -> Box:
    """The axis-aligned box of `box` turned `degrees` about the page's middle."""
    t = math.radians(degrees)
    cx, cy = WIDTH / 2, HEIGHT / 2
    corners = [(box[0], box[1]), (box[2], box[1]), (box[0], box[3]), (box[2], box[3])]
    turned = [
        (cx + (x - cx) * math.cos(t) - (y - cy) * math.sin(t),
         cy + (x - cx) * math.sin(t) + (y - cy) * math.cos(t))
        for x, y in corners
    ]
    xs = [p[0] for p in turned]
    ys = [p[1] for p in turned]
    return (min(xs), min(ys), max(xs), max(ys))


def column(name: str, x: tuple[int, int], top: int, rows: int, starts: list[int] | None = None
           ) -> list[tuple[str, Box]]:
    """`rows` lines of a column, level with the other column's; `starts` moves each
    line's left end (text set around a picture)."""
    out = []
    for k in range(rows):
        x0 = x[0] + (starts[k] if starts else 0)
        # Ragged right: the last line of every paragraph of five ends early.
        x1 = x[1] - (400 if k % 5 == 4 else 0)
        out.append((f"{name}{k}", (float(x0), float(top + k * PITCH),
                                   float(x1), float(top + k * PITCH + LINE))))
    return out


def order(items: list[tuple[str, Box]], degrees: float) -> list[str]:
    turned = [(name, skewed(box, degrees)) for name, box in items]
    return [name for name, _ in read_page(turned, lambda it: it[1]).order]


def test_a_skewed_page_with_a_narrow_gutter_is_read_column_by_column() -> None:
    left = column("L", LEFT_COL, 200, 45)
    right = column("R", RIGHT_COL, 200, 45)
    names = order(left + right, 0.8)
    assert names == [n for n, _ in left] + [n for n, _ in right]


def test_the_same_page_turned_the_other_way() -> None:
    left = column("L", LEFT_COL, 200, 45)
    right = column("R", RIGHT_COL, 200, 45)
    names = order(left + right, -0.6)
    assert names == [n for n, _ in left] + [n for n, _ in right]


def test_lines_set_around_a_picture_stay_in_their_column() -> None:
    # The right column's lower half runs around a cut-out photo at its left: its lines
    # start further right, each at another x, following the photo's outline.
    rows = 45
    contour = [0] * 25 + [int(300 * math.sin(math.pi * k / 20)) for k in range(20)]
    left = column("L", LEFT_COL, 200, rows)
    right = column("R", RIGHT_COL, 200, rows, starts=contour)
    photo = ("photo", (1263.0, 200.0 + 25 * PITCH, 1560.0, 200.0 + 44 * PITCH))
    names = order([*left, *right, photo], 0.7)
    assert [n for n in names if n != "photo"] == [n for n, _ in left] + [n for n, _ in right]
    # The photo comes back where the right column reaches it.
    assert names.index("photo") > names.index("L44")


def test_a_headline_across_a_skewed_page_cuts_it_into_bands() -> None:
    above_l = column("a", LEFT_COL, 200, 20)
    above_r = column("b", RIGHT_COL, 200, 20)
    headline = ("head", (300.0, 1450.0, 2200.0, 1560.0))
    below_l = column("c", LEFT_COL, 1650, 24)
    below_r = column("d", RIGHT_COL, 1650, 24)
    names = order([*above_l, *above_r, headline, *below_l, *below_r], 0.8)
    expected = [n for n, _ in above_l + above_r] + ["head"] + [n for n, _ in below_l + below_r]
    assert names == expected


def test_a_form_whose_gaps_jump_is_still_read_by_rows() -> None:
    # Labels and values whose gap lies at a different x on every row (a form, a list
    # of terms): no gutter runs down it, so every row reads left to right.
    items: list[tuple[str, Box]] = []
    for k in range(12):
        y = float(200 + k * PITCH)
        split = 800.0 if k % 2 else 1500.0
        items.append((f"label{k}", (100.0, y, split - 60, y + LINE)))
        items.append((f"value{k}", (split, y, 2400.0, y + LINE)))
    names = [name for name, _ in read_page(items, lambda it: it[1]).order]
    assert names == [n for k in range(12) for n in (f"label{k}", f"value{k}")]
