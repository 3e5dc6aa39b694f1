"""Columns of running text that the layout model boxes as one table are read as text.

A magazine page set in three columns reads to rapid-layout as a table whose every row
holds one line of each column; built as a grid, the columns come out read across. The
lines here stand in for OCR's boxes of such a page: justified lines as wide as their
column, words broken at line ends with hyphens, a paragraph's last line short.
"""

from __future__ import annotations

from daemon.document.page import TABLE, no_progress
from daemon.engines.lite.compose import compose_page
from daemon.engines.lite.lines import Line
from daemon.engines.lite.regions import Region
from daemon.engines.lite.tables import Cell, reads_as_prose

STORY = (
    "The committee of the association gathered at the town hall on a rainy afternoon "
    "to consider the question of the new reading room. Several members remembered "
    "that the old room had been promised to the schoolchildren, and nobody wished to "
    "break that promise. After a long and courteous discussion the treasurer proposed "
    "that the association rent the empty shop beside the bakery, which had a large "
    "window facing the square and a stove that still worked. The proposal was carried "
    "unanimously, and the secretary was instructed to write to the landlord before the "
    "end of the month. Volunteers offered to paint the walls, to mend the shelves and "
    "to carry the books across the square on the following Saturday morning, weather "
    "permitting. The meeting closed with thanks to the hostess and a cup of tea."
)
LINE_CHARS = 28
PITCH = 0.018
HEIGHT = 0.016


def set_column(words: list[str]) -> list[str]:
    """The words set in lines of about LINE_CHARS characters, a long word that does not
    fit broken with a hyphen, as a compositor justifies a narrow column."""
    lines: list[str] = []
    line = ""
    for word in words:
        room = LINE_CHARS - len(line) - (1 if line else 0)
        if len(word) <= room:
            line = f"{line} {word}" if line else word
            continue
        if room >= 4 and len(word) >= 6:
            cut = min(room - 1, len(word) - 3)
            lines.append(f"{line} {word[:cut]}-")
            line = word[cut:]
        else:
            lines.append(line)
            line = word
    lines.append(line)
    return lines


def columns_of_story(columns: int = 3) -> tuple[list[Line], list[list[str]]]:
    """The story set in `columns` columns side by side, lines level across columns."""
    words = STORY.split()
    per = -(-len(words) // columns)
    out: list[Line] = []
    texts: list[list[str]] = []
    width = 0.8 / columns - 0.02
    for k in range(columns):
        column = set_column(words[k * per : (k + 1) * per])
        texts.append(column)
        x0 = 0.1 + k * 0.8 / columns
        for i, text in enumerate(column):
            # Justified: every line fills the column but the paragraph's last one.
            right = x0 + (width if i < len(column) - 1 else width * len(text) / LINE_CHARS)
            y0 = 0.3 + PITCH * i
            out.append(Line(text=text, bbox=(x0, y0, right, y0 + HEIGHT), size=HEIGHT * 1000))
    return out, texts


def cells_of(lines: list[Line]) -> list[Cell]:
    return [Cell(text=ln.text, bbox=ln.bbox) for ln in lines]


def test_columns_of_running_text_read_as_prose() -> None:
    lines, texts = columns_of_story()
    assert all(len(column) >= 6 for column in texts)
    assert sum(t.endswith("-") for column in texts for t in column) >= 3
    assert reads_as_prose(cells_of(lines))


def test_a_table_boxed_over_three_columns_is_read_down_each_column() -> None:
    lines, _ = columns_of_story()
    table = Region(kind="table", bbox=(0.08, 0.28, 0.92, 0.6), score=0.7)
    laid = compose_page(lines, [table], source="ocr", progress=no_progress)
    assert TABLE not in [b.type for b in laid.blocks]
    # Down the first column, then the second, then the third, and every word broken at a
    # line end whole again: the story as it was written. (Read as a grid, its first row
    # held the first line of each column.)
    assert " ".join(b.text for b in laid.blocks) == STORY


def test_tables_of_words_and_of_figures_stay_tables() -> None:
    # A timetable: three columns of many rows, cells of one width, but figures.
    timetable = [
        Cell(text, (x0, 0.1 + 0.03 * i, x0 + 0.2, 0.12 + 0.03 * i))
        for i in range(8)
        for x0, text in (
            (0.1, f"Departure from platform {i + 1}"),
            (0.4, f"Arrival at {9 + i}.15 in the city"),
            (0.7, f"Connection to line {20 + i} south"),
        )
    ]
    assert not reads_as_prose(timetable)
    # A glossary: words only, long cells, but no word broken at a line end and cells as
    # wide as their text.
    terms = ["Abbey", "Buttress", "Cloister", "Dormitory", "Refectory", "Transept", "Vault"]
    glossary = [
        cell
        for i, term in enumerate(terms)
        for cell in (
            Cell(term, (0.1, 0.1 + 0.03 * i, 0.1 + 0.015 * len(term), 0.12 + 0.03 * i)),
            Cell(
                f"a word for the {term.lower()} and the rooms around it",
                (0.35, 0.1 + 0.03 * i, 0.35 + 0.01 * (30 + 3 * i), 0.12 + 0.03 * i),
            ),
        )
    ]
    assert not reads_as_prose(glossary)
    # The three columns of prose with a column of prices beside them: not all prose.
    lines, _ = columns_of_story()
    prices = [
        Cell(f"{i}.40", (0.95, 0.3 + PITCH * i, 0.99, 0.3 + PITCH * i + HEIGHT)) for i in range(10)
    ]
    assert not reads_as_prose([*cells_of(lines), *prices])
