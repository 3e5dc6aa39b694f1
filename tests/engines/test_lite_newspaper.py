"""A whole newspaper page: body type too small for one detection pass, and columns parted
by hairline rules in gutters narrower than reading order's blank-strip gutter.

The pages are typeset by tests/magazine.py (six columns, a headline across them) and get
their rules drawn here, faint grey as old newsprint prints them. The unit tests hand the
steps (`find_rules`, `split_at_rules`, `read_page`) such pages and boxes directly; the last
tests run the real RapidOCR detector on a page as large as a broadsheet scan.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from PIL import Image, ImageDraw

from daemon.engines.lite.gutters import split_at_rules
from daemon.engines.lite.lines import Line, union
from daemon.engines.lite.ocr import OcrReader
from daemon.engines.lite.reading_order import read_page
from daemon.engines.lite.rules import Rule, Rules, erase, find_rules
from tests.engines.test_lite_magazine import DECLARATION
from tests.magazine import Article, SetPage, typeset

SIZE = (2400, 1660)  # a broadsheet's proportions, at the width the OCR reads pages at
FONT_PX = 18
COLUMNS = 6
GUTTER = 0.005  # 12 px: narrower than reading order's blank-strip gutter (0.008)


def newspaper(
    rule_grey: int | None = 190, size: tuple[int, int] = SIZE, font_px: int = FONT_PX
) -> SetPage:
    """Six columns of body type under a headline, with a rule down each gutter."""
    page = typeset(
        [Article("The Register and Leader", DECLARATION * 8, COLUMNS, 1.0, None, drop_cap=False)],
        size=size,
        font_px=font_px,
        margin=0.04,
        gutter=GUTTER,
    )
    if rule_grey is not None:
        draw = ImageDraw.Draw(page.image)
        top = min(ln.box[3] for ln in page.lines if ln.role == "headline") + 10
        bottom = max(ln.box[3] for ln in page.lines)
        for x in gutter_xs(page):
            draw.line([(x, top), (x, bottom)], fill=(rule_grey,) * 3, width=2)
    return page


def column_spans(page: SetPage) -> list[tuple[int, int]]:
    """Each column's x extent, from the body lines set in it."""
    spans: list[tuple[int, int]] = []
    for ln in sorted((ln for ln in page.lines if ln.role == "body"), key=lambda ln: ln.box[0]):
        x0, x1 = int(ln.box[0]), int(ln.box[2])
        if spans and x0 < spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], x1))
        else:
            spans.append((x0, x1))
    return spans


def gutter_xs(page: SetPage) -> list[int]:
    spans = column_spans(page)
    return [(a[1] + b[0]) // 2 for a, b in pairwise(spans)]


def as_lines(page: SetPage) -> list[Line]:
    w, h = page.image.size
    return [
        Line(ln.text, (ln.box[0] / w, ln.box[1] / h, ln.box[2] / w, ln.box[3] / h), ln.size)
        for ln in page.lines
    ]


def gray_of(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("L"), dtype=np.float64)


def test_a_rule_is_found_in_every_gutter_and_nowhere_else() -> None:
    page = newspaper()
    assert len(column_spans(page)) == COLUMNS
    rules = find_rules(gray_of(page.image)).found
    centres = sorted((r.x0 + r.x1) / 2 for r in rules)
    assert len(centres) == COLUMNS - 1, rules
    for found, drawn in zip(centres, gutter_xs(page), strict=True):
        assert abs(found - drawn) <= 3


def test_text_alone_has_no_rules() -> None:
    # Columns of print without rules, and one wide column: the aligned edges of justified
    # columns and the stems of letters are no rules.
    assert find_rules(gray_of(newspaper(rule_grey=None).image)).found == []
    one = typeset(
        [Article("Declaration of Independence", DECLARATION, 1, 1.0, None, drop_cap=False)]
    )
    assert find_rules(gray_of(one.image)).found == []


def test_erasing_rules_leaves_the_print() -> None:
    page = newspaper()
    gray = gray_of(page.image)
    rules = find_rules(gray)
    clean = erase(gray, rules)
    for x in gutter_xs(page):
        assert clean[:, x - 1 : x + 2].min() == 255  # the rule is gone
    # Every dark pixel of the text is still there.
    assert ((gray < 100) & (clean == 255)).sum() == 0


def test_newspaper_columns_are_read_one_after_the_other_at_their_rules() -> None:
    page = newspaper()
    lines = as_lines(page)
    w, h = page.image.size
    rules = [r.normalised(w, h) for r in find_rules(gray_of(page.image)).found]
    body = [ln for ln in lines if ln.size == FONT_PX]

    def reading_index(order: list[Line]) -> list[int]:
        # The column each body line was set in, in the order read.
        return [sum(ln.bbox[0] * w > x for x in gutter_xs(page)) for ln in order if ln in body]

    without = read_page(lines, lambda ln: ln.bbox).order
    assert reading_index(without) != sorted(reading_index(without))  # read across rows
    reading = read_page(lines, lambda ln: ln.bbox, rules=rules)
    assert reading.order[0].size > FONT_PX  # the headline over the columns first
    assert reading_index(reading.order) == sorted(reading_index(reading.order))
    assert reading.columns == COLUMNS
    # Within each column, top to bottom.
    for col in range(COLUMNS):
        mine = [ln for ln in reading.order if ln in body and reading_index([ln]) == [col]]
        assert [ln.bbox[1] for ln in mine] == sorted(ln.bbox[1] for ln in mine)


def test_a_line_bridging_a_rule_is_cut_there() -> None:
    page = newspaper()
    gray = gray_of(page.image)
    rules = find_rules(gray)
    clean = erase(gray, rules)
    lines = as_lines(page)
    w, _ = page.image.size
    x = gutter_xs(page)[2]
    body = [ln for ln in lines if ln.size == FONT_PX]
    a = next(ln for ln in body if ln.bbox[2] * w < x and ln.bbox[2] * w > x - 40)
    b = min(
        (ln for ln in body if ln.bbox[0] * w > x and ln.bbox[0] * w < x + 40),
        key=lambda ln: abs(ln.cy - a.cy),
    )
    merged = Line(f"{a.text} {b.text}", union([a.bbox, b.bbox]), FONT_PX)
    found = split_at_rules([merged, a, b], rules, clean)
    assert list(found) == [0]
    left, right = found[0]
    assert left.x1 <= x <= right.x0
    assert abs(left.x1 - a.bbox[2] * w) <= 3 and abs(right.x0 - b.bbox[0] * w) <= 3


def test_print_touching_a_rule_is_not_cut() -> None:
    # A title typed across the edge of a pasted-up strip: the edge reads as a rule, but
    # letters run up to it, which a gutter never has.
    image = Image.new("L", (1200, 900), 255)
    draw = ImageDraw.Draw(image)
    draw.line([(600, 20), (600, 880)], fill=150, width=2)
    draw.rectangle((300, 100, 598, 130), fill=0)  # ink up to the rule on the left...
    draw.rectangle((606, 100, 900, 130), fill=0)  # ...and close on the right
    gray = gray_of(image)
    rules = find_rules(gray)
    assert len(rules.found) == 1
    title = Line("PARALLELISME", (290 / 1200, 95 / 900, 910 / 1200, 135 / 900), 30.0)
    assert split_at_rules([title], rules, erase(gray, rules)) == {}


def test_a_rule_beside_short_print_only_is_not_cut_into() -> None:
    # The detector pads its box a little over a rule beside the line's end: no print lies
    # beyond it, so there is nothing to cut off.
    rule = Rule(x0=500, y0=0, x1=502, y1=900, top_x=501.0, bottom_x=501.0)
    gray = np.full((900, 1200), 255.0)
    gray[100:130, 200:490] = 0
    line = Line("short", (190 / 1200, 95 / 900, 510 / 1200, 135 / 900), 30.0)
    assert split_at_rules([line], Rules(found=[rule], mask=None), gray) == {}


@pytest.fixture(scope="module")
def reader() -> OcrReader:
    return OcrReader(threads=2)


def test_a_broadsheet_is_detected_again_at_a_larger_side(reader: OcrReader) -> None:
    """Body type that the 960 px pass sees as a grey wash is found by the second pass."""
    # A strip of a broadsheet 4,800 px wide: its 18 px body type is 3.6 px high where the
    # detector first sees the page at 960 px (a real page's 5,203 px: ~4 px).
    page = newspaper(size=(4800, 1400), font_px=18)
    read = reader.read(page.image)
    passes = read.passes
    assert [p.side for p in passes][:2] == [960, 1920], passes
    assert passes[0].unboxed > 0.2 and passes[-1].unboxed <= 0.2
    body = [ln for ln in page.lines if ln.role == "body"]
    assert len(read.lines) >= 0.8 * len(body), (len(read.lines), len(body))
    # The rules come back with the lines, one per gutter.
    assert len(read.rules) == COLUMNS - 1


def test_a_page_of_ordinary_print_is_detected_once(reader: OcrReader) -> None:
    page = typeset(
        [Article("Declaration of Independence", DECLARATION, 2, 1.0, None, drop_cap=False)]
    )
    read = reader.read(page.image)
    assert [p.side for p in read.passes] == [960]
    assert read.lines and read.rules == []


def _two_ruled_columns(
    rows: int, gutter: tuple[float, float], skip: tuple[float, float] = (1.0, 1.0)
) -> list[Line]:
    """Two columns of body lines either side of a gutter narrower than a blank-strip
    gutter, `rows` lines each, none whose middle falls in `skip` (a stretch of y)."""
    lines: list[Line] = []
    for k in range(rows):
        y0 = 0.05 + 0.9 * k / rows
        y1 = y0 + 0.6 * 0.9 / rows
        if skip[0] <= (y0 + y1) / 2 <= skip[1]:
            continue
        lines.append(Line(f"left {k}", (0.1, y0, gutter[0], y1), 20.0))
        lines.append(Line(f"right {k}", (gutter[1], y0, 0.86, y1), 20.0))
    return lines


def _read_in_columns(order: list[Line]) -> bool:
    sides = [ln.text.split()[0] for ln in order if ln.text.split()[0] in ("left", "right")]
    return sides == sorted(sides)  # every "left" line before every "right" one


def test_a_rule_bent_at_a_fold_still_parts_its_columns() -> None:
    # Joined pieces of a rule are fitted with one straight line; where the paper was
    # folded the printed rule stands a few pixels off it, inside the right column's
    # lines' boxes. Reaching past the rule by so little is no bridged line.
    lines = _two_ruled_columns(30, (0.478, 0.482))
    rule = (0.480, 0.05, 0.488, 0.95)  # at the foot 0.006 inside the right column
    assert _read_in_columns(read_page(lines, lambda ln: ln.bbox, rules=[rule]).order)


def test_a_rule_hidden_for_a_stretch_is_one_rule_where_its_gutter_runs_on() -> None:
    # A fold hides the rule over the middle of the page: two pieces, neither running
    # down most of the columns, yet the gutter between them is blank.
    lines = _two_ruled_columns(30, (0.478, 0.482))
    pieces = [(0.480, 0.05, 0.480, 0.4), (0.481, 0.6, 0.481, 0.95)]
    assert _read_in_columns(read_page(lines, lambda ln: ln.bbox, rules=pieces).order)


def test_a_headline_across_a_rules_break_keeps_the_pieces_apart() -> None:
    # Two stories: a headline across both columns where the rule breaks. The columns
    # above it are read before it, those below after it.
    lines = _two_ruled_columns(30, (0.478, 0.482), skip=(0.45, 0.55))
    headline = Line("HEADLINE", (0.15, 0.47, 0.8, 0.53), 40.0)
    pieces = [(0.480, 0.05, 0.480, 0.45), (0.480, 0.55, 0.480, 0.95)]
    order = read_page([*lines, headline], lambda ln: ln.bbox, rules=pieces).order
    at = order.index(headline)
    assert all(ln.cy < headline.cy for ln in order[:at])
    assert all(ln.cy > headline.cy for ln in order[at + 1 :])
    assert _read_in_columns(order[:at]) and _read_in_columns(order[at + 1 :])


def test_a_running_head_the_rules_reach_up_to_is_read_before_the_columns() -> None:
    # The rules' valleys, averaged down the page, reach a little way up into the running
    # head over the columns: level with two rules it is no line the OCR joined across
    # one gutter, and it heads all three columns.
    lines: list[Line] = []
    for k in range(20):
        y0 = 0.15 + 0.04 * k
        for c, (x0, x1) in enumerate(((0.05, 0.328), (0.332, 0.658), (0.662, 0.95))):
            lines.append(Line(f"col{c} {k}", (x0, y0, x1, y0 + 0.025), 20.0))
    head = Line("THE REGISTER AND LEADER", (0.2, 0.08, 0.8, 0.12), 24.0)
    rules = [(0.33, 0.095, 0.33, 0.97), (0.66, 0.095, 0.66, 0.97)]
    order = read_page([*lines, head], lambda ln: ln.bbox, rules=rules).order
    assert order[0] is head
    columns = [ln.text.split()[0] for ln in order[1:]]
    assert columns == sorted(columns)
