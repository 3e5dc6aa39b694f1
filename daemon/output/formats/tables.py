"""HTML tables in Markdown as MinerU writes them: a pipe table when the table has no
spans and nothing a pipe table cannot hold, the HTML itself otherwise.

Parsed with the standard library's HTMLParser: model tables are small, flat HTML
(`<table><tr><td>`), and a full HTML library would add a dependency for nothing.
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

# Tags a pipe-table cell may contain; anything else (lists, nested tables, images...)
# keeps the table in HTML, as MinerU's renderer decides.
_INLINE_TAGS = frozenset({"a", "b", "br", "code", "em", "eq", "i", "p", "s", "span", "strong",
                          "sub", "sup", "u"})
_STYLE = {"b": "**", "strong": "**", "em": "*", "i": "*", "s": "~~"}


class _Table(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables = 0
        self.complex = False
        self.thead_rows = 0
        self.in_thead = False
        self.rows: list[list[str]] = []
        self.header_flags: list[list[bool]] = []
        self.cell: list[str] | None = None
        self.styles: list[str] = []
        self.in_formula = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {name for name, _ in attrs}
        if tag == "table":
            self.tables += 1
            self.complex |= self.tables > 1
        elif tag == "thead":
            self.in_thead = True
        elif tag == "tr":
            self.rows.append([])
            self.header_flags.append([])
            self.thead_rows += int(self.in_thead)
        elif tag in ("td", "th"):
            self.complex |= bool(names & {"rowspan", "colspan"})
            if not self.rows:
                self.rows.append([])
                self.header_flags.append([])
            self.cell = []
            self.header_flags[-1].append(tag == "th")
        elif self.cell is not None:
            if tag not in _INLINE_TAGS or (tag == "span" and attrs):
                self.complex = True
            elif tag == "br":
                self.cell.append("<br>")
            elif tag == "eq":  # a formula the model wrapped inside the table
                self.cell.append("$")
                self.in_formula = True
            elif tag in _STYLE:
                self.cell.append(_STYLE[tag])
                self.styles.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == "thead":
            self.in_thead = False
        elif tag in ("td", "th") and self.cell is not None and self.rows:
            self.rows[-1].append(_normalise("".join(self.cell)))
            self.cell = None
        elif self.cell is not None and tag == "eq":
            self.cell.append("$")
            self.in_formula = False
        elif self.cell is not None and tag in _STYLE:
            self.cell.append(_STYLE[tag])

    def handle_data(self, data: str) -> None:
        if self.cell is not None and self.in_formula:
            self.cell.append(data.strip().replace("|", r"\|"))
        elif self.cell is not None:
            self.cell.append(_escape_cell(data))


_FORMULA_RE = re.compile(r"<eq>(?P<latex>.*?)</eq>", re.IGNORECASE | re.DOTALL)


def formulas_inline(markup: str) -> str:
    """`<eq>latex</eq>` (mineru-vl-utils' formula wrapping in tables) -> ` $latex$ `, as
    MinerU writes embedded HTML into content_list and Markdown."""
    return _FORMULA_RE.sub(lambda m: f" ${html.unescape(m.group('latex')).strip()}$ ", markup)


def _escape_cell(text: str) -> str:
    escaped = text.replace("&", "&amp;").replace("<", "&lt;")
    return escaped.replace("\\", "\\\\").replace("|", r"\|")


def _normalise(text: str) -> str:
    text = re.sub(r"[ \t\r\f\v]+", " ", text)
    text = re.sub(r" *\n+ *", " ", text)
    text = re.sub(r" *<br> *", "<br>", text)
    return text.strip()


def _row(cells: list[str]) -> str:
    return f"| {' | '.join(cells)} |"


def table_markdown(table_html: str) -> str:
    """A table body in Markdown: GFM pipes when lossless, else the HTML unchanged."""
    parser = _Table()
    try:
        parser.feed(table_html)
        parser.close()
    except Exception:  # HTMLParser is lenient; whatever it still rejects stays HTML
        return formulas_inline(table_html).strip()
    rows = [r for r in parser.rows if r]
    if parser.tables != 1 or parser.complex or parser.thead_rows > 1 or not rows:
        return formulas_inline(table_html).strip()
    width = max(len(r) for r in rows)
    for r in rows:
        r.extend([""] * (width - len(r)))
    header_at = 0
    if not parser.thead_rows:
        header_at = next(
            (i for i, flags in enumerate(parser.header_flags) if flags and all(flags)), 0
        )
    header, body = rows[header_at], rows[:header_at] + rows[header_at + 1 :]
    return "\n".join([_row(header), _row(["---"] * width), *(_row(r) for r in body)])


def is_complex(table_html: str) -> bool:
    """content_list v2's table_type: spans or nesting make a table complex."""
    return len(re.findall(r"<table\b", table_html, re.IGNORECASE)) > 1 or bool(
        re.search(r"\b(?:rowspan|colspan)\b", table_html, re.IGNORECASE)
    )


def nest_level(table_html: str) -> int:
    return 2 if len(re.findall(r"<table\b", table_html, re.IGNORECASE)) > 1 else 1

