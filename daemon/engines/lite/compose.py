"""A page's blocks from its lines: what each line is, and in which order a person reads them.

`compose_page` takes the lines of one page (OCR or text layer, `lines.Line`) and, for a
scan, the layout model's regions (`regions`). Noise lines go first (`junk`); a drop cap
joins its word; lines inside a figure are the figure's, lines inside a table, title or
running head/foot become that block, a line standing on its end in the margin is aside
text; the rest is ordered by columns (`reading_order`) and grouped into paragraphs and
headings. A born-digital page has no layout model's regions: its figures come from its own
image and path objects (`figures`).
"""

from __future__ import annotations

import statistics
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

import daemon.engines.lite.regions as rg
from daemon.document.page import (
    ASIDE_TEXT,
    FOOTER,
    HEADER,
    IMAGE,
    IMAGE_CAPTION,
    PAGE_NUMBER,
    SOURCE_OCR,
    TABLE,
    TABLE_CAPTION,
    TITLE,
    Block,
    ProgressFn,
)
from daemon.engines.lite.junk import is_noise
from daemon.engines.lite.lines import INSIDE, Box, Line, body_size, union
from daemon.engines.lite.paragraphs import (
    HEADING_RATIO,
    TOP_HEADING_RATIO,
    is_page_number,
    join_drop_caps,
    join_text,
    mend_split_words,
    paragraph_block,
    starts_paragraph,
)
from daemon.engines.lite.reading_order import is_rtl, read_page, read_rows
from daemon.engines.lite.tables import Cell, grid_html, reads_as_prose

# Left/right share of the page where sideways margin notes (arXiv's stamp) stand.
_SIDE_MARGIN = 0.12


@dataclass(frozen=True)
class PageLayout:
    blocks: list[Block]
    columns: int  # side by side where most of the page is, as `reading_order` read them
    dropped: dict[str, int]  # lines left out, by reason: "noise", "figure"


@dataclass
class _Group:
    """Lines that a layout region holds together (a table, a title, a running head)."""

    kind: str  # IMAGE, TABLE, TITLE, HEADER, FOOTER
    bbox: tuple[float, float, float, float]
    lines: list[Line]


# Which region claims a line when regions overlap: the more specific first.
_CLAIM_ORDER = (
    rg.FIGURE,
    rg.TABLE,
    rg.HEADER,
    rg.FOOTER,
    rg.FIGURE_CAPTION,
    rg.TABLE_CAPTION,
    rg.TITLE,
)
# Captions get MinerU's caption types: the output folds each into the nearest figure or
# table (image_caption / table_caption lists), or keeps it as a paragraph when none is near.
_REGION_BLOCK = {
    rg.FIGURE: IMAGE,
    rg.TABLE: TABLE,
    rg.HEADER: HEADER,
    rg.FOOTER: FOOTER,
    rg.FIGURE_CAPTION: IMAGE_CAPTION,
    rg.TABLE_CAPTION: TABLE_CAPTION,
    rg.TITLE: TITLE,
}
# A "figure" holding this many body-size lines that cover this share of it is text.
_STRIP_MIN_LINES = 4
_STRIP_MIN_COVER = 0.3


def layout_blocks(
    lines: Sequence[Line], *, source: str, progress: ProgressFn
) -> tuple[list[Block], int]:
    """Paragraph and heading blocks in reading order, and the number of columns found."""
    laid = compose_page(lines, (), source=source, progress=progress)
    return laid.blocks, laid.columns


def compose_page(
    lines: Sequence[Line],
    regions: Sequence[rg.Region],
    *,
    source: str,
    progress: ProgressFn,
    page_aspect: float = 1.0,
    rules: Sequence[Box] = (),
) -> PageLayout:
    """Blocks in reading order from a page's lines and (for scans) its layout regions.

    Noise lines are dropped first. Lines inside a figure are the figure's, not body text;
    lines inside a table, title or running head/foot become that block; the rest are
    grouped into paragraphs. Everything is ordered by `reading_order`, which also counts
    the columns it read the page in.
    """
    dropped: Counter[str] = Counter()
    kept = _without_noise(lines, source, dropped)
    if not kept and not any(r.kind in (rg.FIGURE, rg.TABLE) for r in regions):
        progress(0, 0, "line")
        return PageLayout(blocks=[], columns=0, dropped=dict(dropped))
    capped = join_drop_caps(kept)
    kept = capped.lines
    body = body_size(kept)
    groups, free = _claim(kept, _trusted_regions(regions, kept, capped.caps), dropped)
    # A line standing on its end on an upright page is marginal text (arXiv's stamp, a
    # binding note): MinerU's aside_text, not a giant heading.
    aside = [ln for ln in free if _vertical(ln, page_aspect)]
    if aside:
        free = [ln for ln in free if not _vertical(ln, page_aspect)]
        groups += [_Group(kind=ASIDE_TEXT, bbox=ln.bbox, lines=[ln]) for ln in aside]
    items: list[Line | _Group] = [*free, *groups]
    rtl = is_rtl([ln.text for ln in kept])
    reading = read_page(items, lambda it: it.bbox, rtl=rtl, heading=_is_title, rules=rules)
    ordered = reading.order
    # Running heads first and feet (and margin notes) last, where a reader skips them.
    tail = (FOOTER, ASIDE_TEXT)
    ordered = (
        [it for it in ordered if isinstance(it, _Group) and it.kind == HEADER]
        + [it for it in ordered if not (isinstance(it, _Group) and it.kind in (HEADER, *tail))]
        + [it for it in ordered if isinstance(it, _Group) and it.kind in tail]
    )
    chars = sum(len(ln.text) for ln in kept)
    # Bold only marks headings where most text is not bold.
    bold_marks = sum(len(ln.text) for ln in kept if ln.bold) * 2 < chars
    blocks = _blocks(ordered, body, source, bold_marks, progress, total=len(kept))
    blocks = mend_split_words(blocks)
    blocks = [b for b in blocks if b.text.strip() or b.type in (IMAGE, TABLE)]
    # Counted by the cut that ordered the page, so the count and the order never disagree.
    columns = reading.columns if blocks else 0
    return PageLayout(blocks=blocks, columns=columns, dropped=dict(dropped))


def _is_title(item: Line | _Group) -> bool:
    # Titles and headlines go by their place in the article's flow, never into a column.
    return isinstance(item, _Group) and item.kind == TITLE


def _without_noise(lines: Sequence[Line], source: str, dropped: Counter[str]) -> list[Line]:
    """The lines that are text, control characters removed; noise counted in `dropped`."""
    kept: list[Line] = []
    for ln in lines:
        text = _printable(ln.text)
        if is_noise(text, ln.confidence, recognised=source == SOURCE_OCR):
            dropped["noise"] += 1
        else:
            kept.append(replace(ln, text=text) if text != ln.text else ln)
    return kept


def _blocks(
    ordered: Sequence[Line | _Group],
    body: float,
    source: str,
    bold_marks: bool,
    progress: ProgressFn,
    *,
    total: int,
) -> list[Block]:
    """Blocks in reading order: each group its block, runs of free lines paragraphs."""
    done = 0
    blocks: list[Block] = []
    para: list[Line] = []
    for item in ordered:
        if isinstance(item, _Group):
            if para:
                blocks.append(paragraph_block(para, body, source, bold_marks))
                para = []
            block = _group_block(item, body, source)
            if block is not None:
                blocks.append(block)
            done += len(item.lines)
            continue
        if para and starts_paragraph(para, item, body):
            blocks.append(paragraph_block(para, body, source, bold_marks))
            para = []
        para.append(item)
        done += 1
        if done % 25 == 0:
            progress(done, total, "line")
    if para:
        blocks.append(paragraph_block(para, body, source, bold_marks))
    progress(total, total, "line")
    return blocks


def _vertical(ln: Line, page_aspect: float) -> bool:
    """Taller than wide by far, in page units (`page_aspect` = height / width)."""
    width = ln.bbox[2] - ln.bbox[0]
    height = (ln.bbox[3] - ln.bbox[1]) * page_aspect
    in_margin = ln.bbox[2] <= _SIDE_MARGIN or ln.bbox[0] >= 1 - _SIDE_MARGIN
    return in_margin and len(ln.text) >= 4 and height > 3 * max(width, 1e-9)


def _printable(text: str) -> str:
    # Control characters from PDF fonts (an end-of-proof box mapped to U+0004) are not text.
    return "".join(ch for ch in text if unicodedata.category(ch)[0] != "C" or ch == "\t").strip()


def _trusted_regions(
    regions: Sequence[rg.Region], lines: Sequence[Line], caps: Sequence[Box] = ()
) -> list[rg.Region]:
    """The regions worth acting on; a "figure" full of body-size print is the page itself,
    and so is a "header" with no text below it; a "table" of running prose is text.

    An old newspaper page reads to the detector as one big picture; dropping its text as
    figure text would empty the page. A real figure's own labels are small or sparse. A
    "figure" that is only a drop cap (joined to its word already) is no picture either:
    kept, it would cut the first paragraph after its first line.
    """
    body = body_size(lines)
    out: list[rg.Region] = []
    for region in regions:
        if region.kind == rg.FIGURE and any(_just_the_cap(region.bbox, c) for c in caps):
            continue
        if region.kind == rg.FIGURE:
            inside = [ln for ln in lines if rg.overlap_share(ln.bbox, region.bbox) >= INSIDE]
            if len(inside) >= 8 and len(inside) * 2 >= len(lines):
                outside = [ln for ln in lines if rg.overlap_share(ln.bbox, region.bbox) < INSIDE]
                ref = body_size(outside) if len(outside) >= 5 else body
                if body_size(inside) >= 0.8 * ref:
                    continue
            if _prose_strip(region, inside, body):
                continue
        if region.kind == rg.TABLE:
            inside = [ln for ln in lines if rg.overlap_share(ln.bbox, region.bbox) >= INSIDE]
            if reads_as_prose([Cell(text=ln.text, bbox=ln.bbox) for ln in inside]):
                continue
        if region.kind == rg.HEADER:
            inside = [ln for ln in lines if rg.overlap_share(ln.bbox, region.bbox) >= INSIDE]
            if not any(ln.bbox[1] >= region.bbox[3] for ln in lines):
                # A running head stands above the page's text. With nothing below it, the
                # "header" is the page's text (a page of one line), which must not vanish.
                # (A line below the region shares none of it, so it is never inside.)
                continue
            if inside and statistics.median(ln.size for ln in inside) >= HEADING_RATIO * body:
                # Running heads are small print; a headline at the top of a page is not one.
                region = replace(region, kind=rg.TITLE)
        out.append(region)
    return out


def _just_the_cap(region: Box, cap: Box) -> bool:
    """Whether `region` holds `cap` and little more (at most three times its area)."""
    area = (region[2] - region[0]) * (region[3] - region[1])
    cap_area = max((cap[2] - cap[0]) * (cap[3] - cap[1]), 1e-12)
    return rg.overlap_share(cap, region) >= INSIDE and area <= 3 * cap_area


def _prose_strip(region: rg.Region, inside: Sequence[Line], body: float) -> bool:
    """A "figure" that is a strip of body text: the column beside a picture, set narrow
    to run around it, reads to the detector as part of the picture. A chart's labels are
    small or sparse; these lines are body size and cover much of the box."""
    if len(inside) < _STRIP_MIN_LINES or body_size(inside) < 0.8 * body:
        return False
    x0, y0, x1, y1 = region.bbox
    area = max((x1 - x0) * (y1 - y0), 1e-12)
    covered = sum((ln.bbox[2] - ln.bbox[0]) * ln.height for ln in inside)
    return covered >= _STRIP_MIN_COVER * area


def _claim(
    lines: Sequence[Line], regions: Sequence[rg.Region], dropped: Counter[str]
) -> tuple[list[_Group], list[Line]]:
    """Region groups, and the lines no region claimed (body text)."""
    groups: list[_Group] = []
    claimed: set[int] = set()
    for kind in _CLAIM_ORDER:
        for region in (r for r in regions if r.kind == kind):
            mine = [
                i
                for i, ln in enumerate(lines)
                if i not in claimed and rg.overlap_share(ln.bbox, region.bbox) >= INSIDE
            ]
            claimed.update(mine)
            if kind == rg.FIGURE:
                # Labels, axis ticks and photo texture read as text: none of it is prose.
                if mine:
                    dropped["figure"] += len(mine)
                groups.append(_Group(kind=IMAGE, bbox=region.bbox, lines=[]))
                continue
            if not mine and kind != rg.TABLE:
                continue
            own = [lines[i] for i in mine]
            # Text regions shrink to their lines: the detector's box is loose.
            bbox = region.bbox if kind == rg.TABLE or not own else union(ln.bbox for ln in own)
            groups.append(_Group(kind=_REGION_BLOCK[kind], bbox=bbox, lines=own))
    free = [ln for i, ln in enumerate(lines) if i not in claimed]
    return groups, free


def _group_block(group: _Group, body: float, source: str) -> Block | None:
    if group.kind == IMAGE:
        return Block(type=IMAGE, bbox=group.bbox, source=source)
    if group.kind == TABLE:
        # The grid comes from the OCR boxes (`tables`); the text keeps one row per line,
        # cells split by " | ", for search and for a region that is no grid.
        rows = _rows(sorted(group.lines, key=lambda ln: (ln.bbox[1], ln.bbox[0])))
        text = "\n".join(" | ".join(ln.text for ln in row) for row in _row_groups(rows))
        table = grid_html([Cell(text=ln.text, bbox=ln.bbox) for ln in group.lines])
        return Block(type=TABLE, bbox=group.bbox, text=text, html=table, source=source)
    # A title's or caption's lines one under the other, even where a scan's loose boxes
    # make a centred or indented line look level with the next (`read_rows`).
    rows = read_rows(group.lines, lambda ln: ln.bbox)
    text = join_text(rows)
    if not text:
        return None
    if group.kind in (HEADER, FOOTER):
        kind = PAGE_NUMBER if is_page_number(text) else group.kind
        return Block(type=kind, bbox=group.bbox, text=text, source=source)
    if group.kind in (ASIDE_TEXT, IMAGE_CAPTION, TABLE_CAPTION):
        return Block(type=group.kind, bbox=group.bbox, text=text, source=source)
    size = statistics.median(ln.size for ln in rows)
    level = 1 if body > 0 and size >= TOP_HEADING_RATIO * body else 2
    return Block(type=TITLE, bbox=group.bbox, text=text, text_level=level, source=source)


def _row_groups(lines: list[Line]) -> list[list[Line]]:
    rows: list[list[Line]] = []
    for ln in lines:
        if rows and abs(ln.cy - rows[-1][0].cy) <= 0.5 * min(ln.height, rows[-1][0].height):
            rows[-1].append(ln)
        else:
            rows.append([ln])
    return rows


def _rows(lines: list[Line]) -> list[Line]:
    """Lines sorted top to bottom, and left to right among those on one row."""
    out: list[Line] = []
    row: list[Line] = []
    for ln in lines:
        if row and abs(ln.cy - row[0].cy) > 0.5 * min(ln.height, row[0].height):
            out.extend(sorted(row, key=lambda r: r.bbox[0]))
            row = []
        row.append(ln)
    out.extend(sorted(row, key=lambda r: r.bbox[0]))
    return out
