"""Magazine layouts read in column order: a picture across the gutter, a headline over the
columns, two stories on a page, a two-page spread; and tables as HTML grids.

Each page is typeset here (tests/magazine.py) from real prose, the Declaration of
Independence (public domain), so the right reading order is known line by line. The lines
go to the layout code with the boxes the typesetter drew them in, the picture as the
layout model reports one (a figure region), as OCR would hand them over.
"""

from __future__ import annotations

import pytest

from daemon.document.page import IMAGE, TABLE, TITLE, no_progress
from daemon.engines.lite.compose import PageLayout, compose_page
from daemon.engines.lite.lines import Line
from daemon.engines.lite.regions import Region
from daemon.engines.lite.tables import Cell, grid_html
from tests.magazine import Article, Picture, SetPage, spread, typeset

DECLARATION = [
    "When in the Course of human events, it becomes necessary for one people to dissolve "
    "the political bands which have connected them with another, and to assume among the "
    "powers of the earth, the separate and equal station to which the Laws of Nature and of "
    "Nature's God entitle them, a decent respect to the opinions of mankind requires that "
    "they should declare the causes which impel them to the separation.",
    "We hold these truths to be self-evident, that all men are created equal, that they are "
    "endowed by their Creator with certain unalienable Rights, that among these are Life, "
    "Liberty and the pursuit of Happiness.",
    "That to secure these rights, Governments are instituted among Men, deriving their just "
    "powers from the consent of the governed. That whenever any Form of Government becomes "
    "destructive of these ends, it is the Right of the People to alter or to abolish it, "
    "and to institute new Government, laying its foundation on such principles and "
    "organizing its powers in such form, as to them shall seem most likely to effect their "
    "Safety and Happiness.",
    "Prudence, indeed, will dictate that Governments long established should not be changed "
    "for light and transient causes; and accordingly all experience hath shewn, that "
    "mankind are more disposed to suffer, while evils are sufferable, than to right "
    "themselves by abolishing the forms to which they are accustomed.",
    "But when a long train of abuses and usurpations, pursuing invariably the same Object "
    "evinces a design to reduce them under absolute Despotism, it is their right, it is "
    "their duty, to throw off such Government, and to provide new Guards for their future "
    "security.",
    "Such has been the patient sufferance of these Colonies; and such is now the necessity "
    "which constrains them to alter their former Systems of Government. The history of the "
    "present King of Great Britain is a history of repeated injuries and usurpations, all "
    "having in direct object the establishment of an absolute Tyranny over these States.",
    "He has refused his Assent to Laws, the most wholesome and necessary for the public "
    "good. He has forbidden his Governors to pass Laws of immediate and pressing "
    "importance, unless suspended in their operation till his Assent should be obtained; "
    "and when so suspended, he has utterly neglected to attend to them.",
    "He has refused to pass other Laws for the accommodation of large districts of people, "
    "unless those people would relinquish the right of Representation in the Legislature, "
    "a right inestimable to them and formidable to tyrants only.",
]

SIZE = (1240, 1754)  # A4 at 150 dpi
FONT_PX = 21


def lay_out(page: SetPage) -> PageLayout:
    """The typeset lines and pictures through the lite engine's layout step."""
    w, h = page.image.size
    lines = [
        Line(text=ln.text, bbox=(ln.box[0] / w, ln.box[1] / h, ln.box[2] / w, ln.box[3] / h),
             size=ln.size)
        for ln in page.lines
    ]
    figures = [
        Region(kind="figure", bbox=(b[0] / w, b[1] / h, b[2] / w, b[3] / h), score=0.9)
        for b in page.pictures
    ]
    # Handed over in no particular order, as a detector's boxes come.
    return compose_page(lines[::-1], figures, source="ocr", progress=no_progress,
                        page_aspect=h / w)


def read(laid: PageLayout) -> str:
    return " ".join(" ".join(b.text for b in laid.blocks).split())


def assert_paragraphs_in_order(text: str, paragraphs: list[str], page: SetPage) -> None:
    """Each paragraph's opening words are found, in the order the paragraphs were set
    (captions, which a reader meets where the picture is, left out)."""
    for ln in page.lines:
        if ln.role == "caption":
            text = text.replace(ln.text, "")
    text = " ".join(text.split())
    found = [text.find(" ".join(p.split()[:8])) for p in paragraphs]
    assert -1 not in found, [p[:40] for p, at in zip(paragraphs, found, strict=True) if at < 0]
    assert found == sorted(found)


def one_article(headline: str, columns: int, picture: Picture | None = None, *,
                drop_cap: bool = True) -> SetPage:
    """The declaration set on one page under `headline`."""
    return typeset([Article(headline, DECLARATION, columns, 1.0, picture, drop_cap=drop_cap)],
                   size=SIZE, font_px=FONT_PX)


def test_columns_run_around_a_picture_across_the_gutter() -> None:
    picture = Picture(0, 1, 0.25, 0.3, "A picture set across the gutter, text on both sides.")
    page = one_article("Declaration of Independence", 2, picture)
    laid = lay_out(page)
    text = read(laid)
    set_paragraphs = [p for p in DECLARATION if p.split()[0] in text]
    assert len(set_paragraphs) >= 5  # the page holds most of the text
    assert_paragraphs_in_order(text, set_paragraphs, page)
    # The whole page reads as a person reads it, the drop cap back on its word ("When").
    assert text == page.text
    assert [b.type for b in laid.blocks][:2] == [TITLE, "text"]
    assert laid.blocks[1].text.startswith("When in the Course")
    assert [b.type for b in laid.blocks].count(IMAGE) == 1
    assert laid.columns == 2


def test_a_headline_across_the_columns_separates_two_stories() -> None:
    first, second = DECLARATION[:3], DECLARATION[3:]
    page = typeset(
        [
            Article("The first story", first, 2, 0.45),
            Article("A second story under a headline across both columns", second, 2, 0.55,
                    Picture(0, 1, 0.3, 0.3, "The second story's picture.")),
        ],
        size=SIZE, font_px=FONT_PX,
    )
    laid = lay_out(page)
    text = read(laid)
    assert text == page.text
    headline = text.index("A second story under a headline")
    # Both columns of the first story come before the headline, the second story after.
    assert all(text.find(" ".join(p.split()[:8])) < headline for p in first)
    assert_paragraphs_in_order(text[headline:], [p for p in second if p.split()[0] in text], page)
    titles = [b.text for b in laid.blocks if b.type == TITLE]
    assert titles == ["The first story", "A second story under a headline across both columns"]
    assert laid.columns == 2  # two stories of two columns each, one above the other


def test_a_spread_is_read_left_page_then_right_page() -> None:
    left = typeset(
        [Article("The left page", DECLARATION[:4], 2, 1.0,
                 Picture(0, 1, 0.5, 0.25, "On the left page."))],
        size=SIZE, font_px=FONT_PX + 4,
    )
    right = typeset(
        [Article("The right page", DECLARATION[4:], 2, 1.0,
                 Picture(0, 1, 0.1, 0.25, "On the right page."))],
        size=SIZE, font_px=FONT_PX + 4,
    )
    page = spread(left, right)
    laid = lay_out(page)
    text = read(laid)
    assert text == page.text
    assert text.index("The left page") < text.index(left.text[-40:]) < text.index("The right page")
    assert_paragraphs_in_order(text, [p for p in DECLARATION if p.split()[0] in text], page)
    assert laid.columns == 4  # two pages of two columns side by side


def test_the_columns_reported_are_the_ones_the_page_is_read_in() -> None:
    picture = Picture(1, 2, 0.1, 0.3, "A picture across the second gutter.")
    page = one_article("Three columns", 3, picture)
    laid = lay_out(page)
    assert read(laid) == page.text
    assert laid.columns == 3


def test_line_end_hyphens_are_joined_and_real_hyphens_kept() -> None:
    page = typeset([Article("Narrow columns", DECLARATION[:7], 3, 1.0)], size=SIZE,
                   font_px=FONT_PX)
    drawn = [ln.text for ln in page.lines]
    assert any(t.endswith("-") for t in drawn)  # the typesetter did break words
    text = read(lay_out(page))
    assert text == page.text
    assert "self-evident" in text


def test_a_table_region_becomes_an_html_table_in_markdown_and_content_list() -> None:
    from daemon.output.formats.content_list import content_list
    from daemon.output.formats.markdown import pages_to_markdown
    from daemon.output.formats.middle import PageData, build_middle

    def cell(text: str, x0: float, x1: float, row: int) -> Line:
        y = 0.40 + 0.03 * row
        return Line(text=text, bbox=(x0, y, x1, y + 0.015), size=15.0)

    cells = [
        cell("Opening hours", 0.35, 0.75, 0),  # a heading over two columns
        cell("Library", 0.10, 0.22, 1), cell("Weekdays", 0.35, 0.48, 1),
        cell("Weekends", 0.60, 0.75, 1),
        cell("Main hall", 0.10, 0.24, 2), cell("9 to 18", 0.35, 0.45, 2),
        cell("10 to 14", 0.60, 0.71, 2),
        cell("Reading room", 0.10, 0.28, 3), cell("8 to 20", 0.35, 0.45, 3),
        cell("closed", 0.60, 0.70, 3),
    ]
    body = [Line(text="The hours changed in May, as the table shows.",
                 bbox=(0.1, 0.3, 0.9, 0.315), size=15.0)]
    table = Region(kind="table", bbox=(0.08, 0.38, 0.8, 0.52), score=0.9)
    laid = compose_page(body + cells[::-1], [table], source="ocr", progress=no_progress)
    assert [b.type for b in laid.blocks] == ["text", TABLE]
    html = laid.blocks[1].html
    assert html == (
        "<table>"
        '<tr><td></td><td colspan="2">Opening hours</td></tr>'
        "<tr><td>Library</td><td>Weekdays</td><td>Weekends</td></tr>"
        "<tr><td>Main hall</td><td>9 to 18</td><td>10 to 14</td></tr>"
        "<tr><td>Reading room</td><td>8 to 20</td><td>closed</td></tr>"
        "</table>"
    )
    page = PageData(page_idx=0, blocks=tuple(laid.blocks), crop_names=frozenset())
    entries = content_list(build_middle([page]))
    tables = [e for e in entries if e["type"] == "table"]
    assert len(tables) == 1 and tables[0]["table_body"] == html
    markdown = pages_to_markdown([laid.blocks])
    assert "<td>Reading room</td>" in markdown  # a colspan keeps the HTML in Markdown


def test_cells_that_are_no_grid_stay_text() -> None:
    one_column = [Cell(text=f"line {i}", bbox=(0.1, 0.1 + 0.03 * i, 0.5, 0.115 + 0.03 * i))
                  for i in range(5)]
    assert grid_html(one_column) is None
    assert grid_html(one_column[:2]) is None


@pytest.mark.parametrize("columns", [2, 3])
def test_plain_columns_without_pictures_still_read_down(columns: int) -> None:
    page = one_article("Columns", columns, drop_cap=False)
    text = read(lay_out(page))
    assert text == page.text
