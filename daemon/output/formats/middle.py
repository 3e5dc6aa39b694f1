"""`<stem>_middle.json`: the document's blocks grouped as MinerU 4 groups them.

Engines hand over each page's blocks flat, in MinerU's vocabulary. This module builds the
structure MinerU 4 (DocVortex's "middle JSON", schema 2.0) keeps between analysis and
rendering, and every other format (content_list v1 and v2, Markdown) renders from it, as
MinerU's renderers do:

- captions and footnotes go into the nearest figure, table, chart or code block of their
  kind on the page (an image caption under a chart becomes a chart caption);
- text blocks lying inside a `list` box (≥ 80 % of their area) become its items;
- a title is the document title (level 1) when it opens the document's first page, else
  a section title (level 2), unless the engine gave a level. MinerU 4 asks a second
  layout model for this; docinbox has one model, so it uses the position instead;
- image, table, chart and equation blocks point at their crop
  `images/page_<page_idx>_<type>_<index>.jpg` when the worker cut one.

Bounding boxes stay 0..1 of the page; the page sizes in PDF points are in
`extensions.docvortex_layout.pages`, so a box maps back onto the PDF.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from daemon import __version__
from daemon.document.page import Block, crop_name
from daemon.output.formats.inline import spans
from daemon.output.formats.text import clean_text

MIDDLE_SCHEMA = "docvortex.middle"
MIDDLE_SCHEMA_VERSION = "2.0"

AUXILIARY_TYPES = frozenset({"header", "footer", "page_number", "aside_text"})
_TITLE_TYPES = frozenset({"title", "doc_title", "paragraph_title"})
_LIST_ITEM_TYPES = frozenset({"text", "list_item", "ref_text"})
# Caption/footnote type -> {parent type: the annotation's type inside that parent}.
_ANNOTATION_PARENTS: dict[str, dict[str, str]] = {
    "image_caption": {"image": "image_caption", "chart": "chart_caption"},
    "image_footnote": {"image": "image_footnote", "chart": "chart_footnote"},
    "chart_caption": {"chart": "chart_caption", "image": "image_caption"},
    "chart_footnote": {"chart": "chart_footnote", "image": "image_footnote"},
    "table_caption": {"table": "table_caption"},
    "table_footnote": {"table": "table_footnote"},
    "code_caption": {"code": "code_caption", "algorithm": "code_caption"},
    "code_footnote": {"code": "code_footnote", "algorithm": "code_footnote"},
    # The model's generic caption/footnote goes to the nearest figure of any kind.
    "caption": {"image": "image_caption", "chart": "chart_caption", "table": "table_caption",
                "code": "code_caption", "algorithm": "code_caption"},
    "footnote": {"image": "image_footnote", "chart": "chart_footnote",
                 "table": "table_footnote", "code": "code_footnote",
                 "algorithm": "code_footnote"},
}
# Layout containers: their members are blocks of their own, the box adds nothing to write.
_CONTAINER_TYPES = frozenset({"image_block", "equation_block", "unknown"})
_BODY_TYPE = {"image": "image_body", "chart": "chart_body", "table": "table_body"}
_LIST_OVERLAP = 0.8  # share of an item's area inside the list box (MinerU's threshold)


@dataclass(frozen=True)
class PageData:
    """One stored page, as the formats need it."""

    page_idx: int
    blocks: tuple[Block, ...]
    crop_names: frozenset[str] = frozenset()
    size_pt: tuple[float, float] | None = None  # PDF page size in points


def _index(block: Block, position: int) -> int:
    return block.index if block.index is not None else position


def _bbox(block: Block) -> list[float]:
    return [round(float(v), 6) for v in block.bbox]


def _overlap_of(inner: Block, outer: Block) -> float:
    x0, y0, x1, y1 = inner.bbox
    ox0, oy0, ox1, oy1 = outer.bbox
    w = min(x1, ox1) - max(x0, ox0)
    h = min(y1, oy1) - max(y0, oy0)
    area = max(x1 - x0, 1e-9) * max(y1 - y0, 1e-9)
    return w * h / area if w > 0 and h > 0 else 0.0


def _gap(a: Block, b: Block) -> float:
    """Edge distance between two boxes (0 when they touch or overlap)."""
    dx = max(0.0, a.bbox[0] - b.bbox[2], b.bbox[0] - a.bbox[2])
    dy = max(0.0, a.bbox[1] - b.bbox[3], b.bbox[1] - a.bbox[3])
    return dx + dy


def _unwrap_latex(latex: str) -> str:
    """Display-math delimiters an engine left around a formula go: renderers add their own."""
    s = latex.strip()
    for left, right in (("$$", "$$"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            return s[len(left) : len(s) - len(right)].strip()
    return s


class _PageBuilder:
    def __init__(self, page: PageData, first_title_done: bool) -> None:
        self.page = page
        self.blocks = list(page.blocks)
        self.title_done = first_title_done
        self.items: dict[int, list[int]] = {}  # list position -> item positions
        self.annotations: dict[int, list[tuple[int, str]]] = {}  # parent -> (pos, type)
        self.taken: set[int] = set()

    def build(self) -> list[dict[str, Any]]:
        self._group_lists()
        self._group_annotations()
        out: list[dict[str, Any]] = []
        body_seen = False
        for pos, block in enumerate(self.blocks):
            if pos in self.taken:
                continue
            node = self._node(pos, block, body_seen)
            if node is None:
                continue
            if block.type not in AUXILIARY_TYPES:
                body_seen = True
            out.append(node)
        return out

    def _group_lists(self) -> None:
        # mineru-vl-utils hands a list over as the `list` box followed by its items.
        for pos, block in enumerate(self.blocks):
            if block.type != "list":
                continue
            members: list[int] = []
            for i in range(pos + 1, len(self.blocks)):
                item = self.blocks[i]
                if item.type not in _LIST_ITEM_TYPES or _overlap_of(item, block) < _LIST_OVERLAP:
                    break
                members.append(i)
            self.items[pos] = members
            self.taken.update(members)

    def _group_annotations(self) -> None:
        for pos, block in enumerate(self.blocks):
            parents = _ANNOTATION_PARENTS.get(block.type)
            if parents is None or pos in self.taken:
                continue
            candidates = [
                (_gap(block, b), i)
                for i, b in enumerate(self.blocks)
                if b.type in parents and i not in self.taken
            ]
            if not candidates:
                continue  # no figure of its kind on the page: stays a paragraph
            _, parent = min(candidates)
            self.annotations.setdefault(parent, []).append(
                (pos, parents[self.blocks[parent].type])
            )
            self.taken.add(pos)

    def _crop(self, block: Block, index: int) -> str | None:
        name = crop_name(self.page.page_idx, block.type, index)
        return f"images/{name}" if name in self.page.crop_names else None

    def _leaf(self, pos: int, block_type: str) -> dict[str, Any]:
        block = self.blocks[pos]
        return {
            "type": block_type,
            "index": _index(block, pos),
            "bbox": _bbox(block),
            "content": spans(clean_text(block.text)),
        }

    def _title_level(self, block: Block, body_seen: bool) -> int:
        if block.text_level > 0:
            return min(block.text_level, 4)
        if block.type == "doc_title":
            return 1
        first = self.page.page_idx == 0 and not self.title_done and not body_seen
        if block.type == "title" and first:
            return 1
        return 2

    def _node(self, pos: int, block: Block, body_seen: bool) -> dict[str, Any] | None:
        index = _index(block, pos)
        t = block.type
        if t in _CONTAINER_TYPES:
            return None
        if t in _TITLE_TYPES:
            level = self._title_level(block, body_seen)
            self.title_done = self.title_done or level == 1
            node = self._leaf(pos, "doc_title" if level == 1 else "paragraph_title")
            node["level"] = level
            return node
        if t == "text" and block.text_level > 0:  # engines that mark headings on text
            node = self._leaf(pos, "doc_title" if block.text_level == 1 else "paragraph_title")
            node["level"] = min(block.text_level, 4)
            return node
        if t in AUXILIARY_TYPES or t in ("page_footnote", "ref_text", "phonetic"):
            return self._leaf(pos, t if t != "phonetic" else "text")
        if t == "equation":
            raw = block.latex if block.latex is not None else block.text
            latex = _unwrap_latex(clean_text(raw))
            node = {"type": "equation", "index": index, "bbox": _bbox(block)}
            if path := self._crop(block, index):
                node["image_path"] = path
            node["content"] = latex
            return node
        if t == "list":
            return self._list(pos, block)
        if t in ("image", "chart", "table"):
            return self._visual(pos, block)
        if t in ("code", "algorithm"):
            return self._code(pos, block)
        node = self._leaf(pos, "text")
        if block.continues_prev:
            node["continues_prev"] = True
        return node

    def _annotation_nodes(self, pos: int) -> list[dict[str, Any]]:
        return [self._leaf(p, kind) for p, kind in self.annotations.get(pos, [])]

    def _ordered(self, children: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # Captions above a table come before it, notes under a figure after: layout order.
        return sorted(children, key=lambda c: int(c["index"]))

    def _list(self, pos: int, block: Block) -> dict[str, Any]:
        members = self.items.get(pos, [])
        if members:
            children = [self._leaf(i, "text") for i in members]
            kinds = {self.blocks[i].type for i in members}
            sub_type = "ref_text" if kinds == {"ref_text"} else "text"
        else:
            # An engine that writes a list as one block, one item per line.
            lines = [ln.strip() for ln in clean_text(block.text).split("\n") if ln.strip()]
            children = [
                {"type": "text", "index": _index(block, pos), "bbox": _bbox(block),
                 "content": spans(line)}
                for line in lines
            ]
            sub_type = "text"
        return {
            "type": "list",
            "index": _index(block, pos),
            "bbox": _bbox(block),
            "content": children,
            "sub_type": sub_type,
        }

    def _visual(self, pos: int, block: Block) -> dict[str, Any]:
        index = _index(block, pos)
        if block.type == "table":
            body_content = clean_text(block.html) if block.html else clean_text(block.text)
        else:
            body_content = clean_text(block.text).strip()
        body: dict[str, Any] = {"type": _BODY_TYPE[block.type], "index": index,
                                "bbox": _bbox(block)}
        if path := self._crop(block, index):
            body["image_path"] = path
        body["content"] = body_content
        node: dict[str, Any] = {
            "type": block.type,
            "index": index,
            "bbox": _bbox(block),
            "content": self._ordered([body, *self._annotation_nodes(pos)]),
        }
        if block.sub_type:
            node["sub_type"] = block.sub_type
        return node

    def _code(self, pos: int, block: Block) -> dict[str, Any]:
        index = _index(block, pos)
        algorithm = block.type == "algorithm"
        body: dict[str, Any] = {
            "type": "algorithm_body" if algorithm else "code_body",
            "index": index,
            "bbox": _bbox(block),
            "content": spans(clean_text(block.text)) if algorithm else clean_text(block.text),
        }
        return {
            "type": "code",
            "index": index,
            "bbox": _bbox(block),
            "content": self._ordered([*self._annotation_nodes(pos), body]),
            "sub_type": "algorithm" if algorithm else "code",
            # MinerU guesses the language with Magika; docinbox does not (see
            # docs/output-format.md), so renderers fall back to "txt" as MinerU does.
            "guess_lang": None,
        }


def build_middle(
    pages: Sequence[PageData],
    *,
    page_count: int | None = None,
    file_suffix: str = "",
    engine: str | None = None,
) -> dict[str, Any]:
    """The middle JSON of a document from its stored pages (in page order)."""
    out_pages: list[dict[str, Any]] = []
    title_done = False
    for page in pages:
        builder = _PageBuilder(page, title_done)
        out_pages.append({"page_idx": page.page_idx, "blocks": builder.build()})
        title_done = builder.title_done
    return {
        "schema": MIDDLE_SCHEMA,
        "schema_version": MIDDLE_SCHEMA_VERSION,
        "is_full_document": page_count is None or page_count == len(pages),
        "metadata": {
            "file_suffix": file_suffix,
            "producer": {"name": "docinbox", "version": __version__},
            "document": {"page_count": page_count if page_count is not None else len(pages)},
        },
        "extensions": {
            "docinbox": {"engine": engine},
            "docvortex_layout": {
                "version": 1,
                "pages": [
                    {
                        "page_idx": p.page_idx,
                        "width_pt": p.size_pt[0] if p.size_pt else None,
                        "height_pt": p.size_pt[1] if p.size_pt else None,
                    }
                    for p in pages
                ],
            },
        },
        "pages": out_pages,
    }
