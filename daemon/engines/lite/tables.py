"""A table's cell grid from the OCR boxes inside it, as MinerU's HTML table body.

No table-structure model runs offline here: rapid-table resolves its ONNX models by
downloading them, and the lite engine never downloads. What OCR gives is enough for the
tables that reach a scanner most (statements, price lists, timetables): one box per cell,
cells of a row level with each other, columns lined up. So:

- rows are boxes whose vertical middles lie within half a line of each other;
- columns are the x-ranges of the boxes in the fullest rows (those have a box in every
  column), merged where they overlap; a box in another row that covers several columns
  (a heading over two) gets a colspan;
- two boxes of one row in one column are one cell (OCR split a cell at a wide space).

A region that does not come out as at least two rows and two columns is not a grid: the
engine keeps its text as lines. A region that holds running prose is no table at all
(`reads_as_prose`: a column of dialogue, or a magazine's columns of justified text side by
side): its lines go back to the page's text, which `reading_order` reads column by column.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Cell:
    text: str
    bbox: Box  # normalised 0..1, origin top-left


def grid_rows(cells: Sequence[Cell]) -> list[list[Cell]]:
    """Cells grouped into rows, top to bottom, each row left to right."""
    rows: list[list[Cell]] = []
    for cell in sorted(cells, key=lambda c: ((c.bbox[1] + c.bbox[3]) / 2, c.bbox[0])):
        cy = (cell.bbox[1] + cell.bbox[3]) / 2
        height = cell.bbox[3] - cell.bbox[1]
        if rows:
            first = rows[-1][0].bbox
            if abs(cy - (first[1] + first[3]) / 2) <= 0.5 * min(height, first[3] - first[1]):
                rows[-1].append(cell)
                continue
        rows.append([cell])
    return [sorted(row, key=lambda c: c.bbox[0]) for row in rows]


# A "table" is prose when at most this share of its rows hold cells side by side...
_PROSE_MAX_SIDE_BY_SIDE = 0.25
# ... and this share of its printed characters are letters (figures and signs are tabular).
_PROSE_MIN_LETTERS = 0.75
# ... and this share of its characters stand in lines of at least `_PROSE_WORDS` words.
_PROSE_MIN_SENTENCE_SHARE = 0.6
_PROSE_WORDS = 4


def reads_as_prose(cells: Sequence[Cell]) -> bool:
    """Whether a region the layout model calls a table holds running text instead.

    On a typewritten or multi-column scan, a column of dialogue (a speaker's name centred
    over each reply) or text with ruled lines reads to the detector as a table; built as
    a grid it comes out as rows of mostly empty cells. A table has cells side by side in
    most rows, figures, or short labels; prose has one line per row, words, and most of
    its text in lines of several words. The body of a magazine page set in columns reads
    to the detector as a table too, with every row three cells wide: that is prose when
    each column is a stack of lines of the column's width, broken with hyphens
    (`_columns_of_prose`).
    """
    cells = [c for c in cells if c.text.strip()]
    if len(cells) < 4 or not _words(cells):
        return False
    rows = grid_rows(cells)
    side_by_side = sum(1 for row in rows if len(row) > 1)
    return side_by_side <= _PROSE_MAX_SIDE_BY_SIDE * len(rows) or _columns_of_prose(cells)


def _words(cells: Sequence[Cell]) -> bool:
    """Mostly letters, and most of it in lines of several words."""
    printed = "".join("".join(c.text.split()) for c in cells)
    letters = sum(ch.isalpha() for ch in printed)
    if letters < _PROSE_MIN_LETTERS * len(printed):
        return False
    in_sentences = sum(len(c.text) for c in cells if len(c.text.split()) >= _PROSE_WORDS)
    return in_sentences >= _PROSE_MIN_SENTENCE_SHARE * sum(len(c.text) for c in cells)


# Columns of prose: each column holds at least this many lines...
_COLUMN_MIN_LINES = 6
# ... this share of them as wide as the column (justified lines; a paragraph's last line,
# an indented first line and the lines beside a drop cap are the rest) ...
_COLUMN_MIN_FULL = 0.6
_FULL_WIDTH = 0.9
# ... at least this share of all lines end in a word broken with a hyphen ("poli-") ...
_COLUMN_MIN_HYPHENATED = 0.05
# ... and at most this share of the printed characters are figures (a table's are many).
_COLUMN_MAX_DIGITS = 0.02
_HYPHENATED = re.compile(r"[^\W\d_]-$")


def _columns_of_prose(cells: Sequence[Cell]) -> bool:
    """Whether the cells are columns of running text set side by side.

    Justified lines all fill their column, so in each column most boxes share the
    column's width; a table's cells are as wide as their text. Running text breaks words
    at line ends and carries almost no figures; a table of words (a glossary, a list of
    names) breaks none.
    """
    printed = "".join("".join(c.text.split()) for c in cells)
    if sum(ch.isdigit() for ch in printed) > _COLUMN_MAX_DIGITS * len(printed):
        return False
    hyphenated = sum(1 for c in cells if _HYPHENATED.search(c.text.strip()))
    if hyphenated < _COLUMN_MIN_HYPHENATED * len(cells):
        return False
    stacks = _stacks(cells)
    if len(stacks) < 2:
        return False
    for stack in stacks:
        if len(stack) < _COLUMN_MIN_LINES:
            return False
        width = max(c.bbox[2] for c in stack) - min(c.bbox[0] for c in stack)
        full = sum(1 for c in stack if c.bbox[2] - c.bbox[0] >= _FULL_WIDTH * width)
        if full < _COLUMN_MIN_FULL * len(stack):
            return False
    return True


def _stacks(cells: Sequence[Cell]) -> list[list[Cell]]:
    """The cells grouped by the x-range they share (boxes that overlap horizontally are
    one stack), left to right."""
    stacks: list[tuple[float, float, list[Cell]]] = []
    for cell in sorted(cells, key=lambda c: c.bbox[0]):
        if stacks and cell.bbox[0] < stacks[-1][1]:
            x0, x1, members = stacks[-1]
            stacks[-1] = (x0, max(x1, cell.bbox[2]), [*members, cell])
        else:
            stacks.append((cell.bbox[0], cell.bbox[2], [cell]))
    return [members for _, _, members in stacks]


def _columns(rows: Sequence[Sequence[Cell]]) -> list[tuple[float, float]]:
    fullest = max(len(r) for r in rows)
    spans = sorted(
        (c.bbox[0], c.bbox[2]) for r in rows if len(r) == fullest for c in r
    )
    merged: list[tuple[float, float]] = []
    for a, b in spans:
        if merged and a < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _band_of(x: float, columns: Sequence[tuple[float, float]]) -> int:
    """The column whose range holds x, or the nearest one."""
    best, distance = 0, float("inf")
    for k, (a, b) in enumerate(columns):
        d = 0.0 if a <= x <= b else min(abs(x - a), abs(x - b))
        if d < distance:
            best, distance = k, d
    return best


def grid_html(cells: Sequence[Cell]) -> str | None:
    """`<table>` HTML for the cells, or None when they do not form a grid."""
    cells = [c for c in cells if c.text.strip()]
    if len(cells) < 4:
        return None
    rows = grid_rows(cells)
    if len(rows) < 2:
        return None
    columns = _columns(rows)
    if len(columns) < 2:
        return None
    out = ["<table>"]
    for row in rows:
        slots: list[tuple[int, int, list[str]]] = []  # first column, last column, texts
        for cell in row:
            # A cell's own column range: the columns its box overlaps most of, at least one.
            first = _band_of(cell.bbox[0] + 1e-9, columns)
            last = max(first, _band_of(cell.bbox[2] - 1e-9, columns))
            if slots and first <= slots[-1][1]:
                start, end, texts = slots[-1]
                slots[-1] = (start, max(end, last), [*texts, cell.text.strip()])
            else:
                slots.append((first, last, [cell.text.strip()]))
        out.append("<tr>")
        col = 0
        for start, end, texts in slots:
            out.extend("<td></td>" for _ in range(col, start))
            span = f' colspan="{end - start + 1}"' if end > start else ""
            out.append(f"<td{span}>{html.escape(' '.join(texts), quote=False)}</td>")
            col = end + 1
        out.extend("<td></td>" for _ in range(col, len(columns)))
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)
