"""`<stem>_content_list.json` (MinerU's v1, the format RAGFlow and RAG-Anything read) and
`<stem>_content_list_v2.json`, both rendered from the middle JSON as MinerU renders them.

v1 is one flat list for the document: every block with `type`, its fields, `bbox` on the
0..1000 grid and `page_idx`. v2 is one list per page with typed `content` objects and text
as spans. Furniture (header, footer, page number) is kept in both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from typing import Any

from daemon.output.formats import inline, tables
from daemon.output.formats.inline import Span

Node = dict[str, Any]

_V2_AUX = {"header": "page_header", "footer": "page_footer", "page_number": "page_number",
           "aside_text": "page_aside_text"}


def bbox_1000(bbox: Sequence[float]) -> list[int]:
    """0..1 -> MinerU's 0..1000 ints, truncated as MinerU's renderer does (clamped; a
    missing or non-finite value -> 0)."""
    out = [int(min(1.0, max(0.0, f)) * 1000) if math.isfinite(f := float(v)) else 0
           for v in list(bbox)[:4]]
    return out + [0] * (4 - len(out))


def _units(blocks: list[Node]) -> Iterator[Node]:
    """Blocks in reading order, consecutive reference entries as one reference list."""
    refs: list[Node] = []
    for block in blocks:
        if block["type"] == "ref_text":
            refs.append(block)
            continue
        if refs:
            yield _ref_group(refs)
            refs = []
        yield block
    if refs:
        yield _ref_group(refs)


def _ref_group(refs: list[Node]) -> Node:
    boxes = [r["bbox"] for r in refs]
    return {
        "type": "list",
        "sub_type": "ref_text",
        "bbox": [min(b[0] for b in boxes), min(b[1] for b in boxes),
                 max(b[2] for b in boxes), max(b[3] for b in boxes)],
        "content": [{**r, "type": "text"} for r in refs],
    }


def _body(node: Node) -> Node:
    return next(c for c in node["content"] if str(c["type"]).endswith("_body"))


def _annotations(node: Node, kind: str) -> list[Node]:
    return [c for c in node["content"] if c["type"] == kind]


def _texts(node: Node, kind: str) -> list[str]:
    return [inline.render(c["content"]) for c in _annotations(node, kind)]


def _v2_spans(node: Node, kind: str) -> list[Span]:
    return [s for c in _annotations(node, kind) for s in inline.v2_spans(c["content"])]


# ----------------------------------------------------------------------------------- v1


def _v1(node: Node) -> Node | None:
    t = node["type"]
    if t == "text":
        return {"type": "text", "text": inline.render(node["content"])}
    if t in ("doc_title", "paragraph_title"):
        return {"type": "text", "text": inline.render(node["content"]), "text_level": node["level"]}
    if t in ("page_footnote", "header", "footer", "page_number", "aside_text"):
        return {"type": t, "text": inline.render(node["content"])}
    if t == "equation":
        item: Node = {"type": "equation", "img_path": node.get("image_path", "")}
        if latex := str(node["content"]).strip():
            item["text"] = latex
            item["text_format"] = "latex"
        return item
    if t == "list":
        return {
            "type": "list",
            "sub_type": node.get("sub_type") or "text",
            "list_items": [inline.render(c["content"]) for c in node["content"] if c["content"]],
        }
    if t in ("image", "table", "chart"):
        return _v1_visual(node)
    if t == "code":
        body = _body(node)
        content = body["content"]
        return {
            "type": "code",
            "sub_type": "algorithm" if node.get("sub_type") == "algorithm" else "code",
            "code_body": content if isinstance(content, str) else inline.render(content),
            "code_caption": _texts(node, "code_caption"),
            "code_footnote": _texts(node, "code_footnote"),
        }
    return None


def _v1_visual(node: Node) -> Node:
    """Images, tables and charts: the crop, captions and footnotes folded in, the body."""
    t = node["type"]
    body = _body(node)
    content = tables.formulas_inline(str(body["content"])).strip()
    item: Node = {"type": t, "img_path": body.get("image_path", "")}
    if t == "chart":  # a chart always has its data field, even empty
        item["content"] = content
    item[f"{t}_caption"] = _texts(node, f"{t}_caption")
    item[f"{t}_footnote"] = _texts(node, f"{t}_footnote")
    if content and t != "chart":
        item["table_body" if t == "table" else "content"] = content
    if t != "table" and node.get("sub_type"):
        item["sub_type"] = node["sub_type"]
    return item


def content_list(middle: Node) -> list[Node]:
    """MinerU's content_list v1 for a middle JSON."""
    out: list[Node] = []
    for page in middle["pages"]:
        for unit in _units(page["blocks"]):
            item = _v1(unit)
            if item is None:
                continue
            item["bbox"] = bbox_1000(unit["bbox"])
            item["page_idx"] = page["page_idx"]
            out.append(item)
    return out


# ----------------------------------------------------------------------------------- v2


def _list_attribute(items: list[Node]) -> str:
    # MinerU calls a list ordered when every item starts with a number or letter marker.
    marks = [re.match(r"^\s*(\d+|[A-Za-z]|[ivxlcdm]+)[.)]\s", inline.plain(i["content"]))
             for i in items if inline.plain(i["content"]).strip()]
    return "ordered" if marks and all(marks) else "unordered"


def _v2(node: Node) -> Node | None:
    t = node["type"]
    if t == "text":
        return {"type": "paragraph",
                "content": {"paragraph_content": inline.v2_spans(node["content"])}}
    if t in ("doc_title", "paragraph_title"):
        return {"type": "title", "content": {"title_content": inline.v2_spans(node["content"]),
                                             "level": node["level"]}}
    if t == "page_footnote":
        return {"type": "page_footnote",
                "content": {"page_footnote_content": inline.v2_spans(node["content"])}}
    if t in _V2_AUX:
        kind = _V2_AUX[t]
        return {"type": kind, "content": {f"{kind}_content": inline.v2_spans(node["content"])}}
    if t == "equation":
        return {"type": "equation_interline", "content": {
            "math_content": str(node["content"]).strip(), "math_type": "latex",
            "image_source": {"path": node.get("image_path", "")}}}
    if t == "list":
        items = [c for c in node["content"] if c["content"]]
        ref = node.get("sub_type") == "ref_text"
        content: Node = {
            "list_type": "reference_list" if ref else "text_list",
            "list_items": [{"item_type": "text", "item_content": inline.v2_spans(c["content"])}
                           for c in items],
        }
        if not ref:
            content["attribute"] = _list_attribute(items)
        return {"type": "list", "content": content}
    if t == "image":
        body = _body(node)
        body_content = tables.formulas_inline(str(body["content"])).strip()
        content = {
            "image_source": {"path": body.get("image_path", "")},
            "image_caption": _v2_spans(node, "image_caption"),
            "image_footnote": _v2_spans(node, "image_footnote"),
        }
        if body_content or node.get("sub_type"):
            content["content"] = body_content
        item: Node = {"type": "image", "content": content}
        if node.get("sub_type"):
            item["sub_type"] = node["sub_type"]
        return item
    if t == "table":
        body = _body(node)
        html = tables.formulas_inline(str(body["content"])).strip()
        return {"type": "table", "content": {
            "image_source": {"path": body.get("image_path", "")},
            "table_caption": _v2_spans(node, "table_caption"),
            "table_footnote": _v2_spans(node, "table_footnote"),
            "html": html,
            "table_type": "complex_table" if tables.is_complex(html) else "simple_table",
            "table_nest_level": tables.nest_level(html)}}
    if t == "chart":
        body = _body(node)
        item = {"type": "chart", "content": {
            "image_source": {"path": body.get("image_path", "")},
            "content": tables.formulas_inline(str(body["content"])).strip(),
            "chart_caption": _v2_spans(node, "chart_caption"),
            "chart_footnote": _v2_spans(node, "chart_footnote")}}
        if node.get("sub_type"):
            item["sub_type"] = node["sub_type"]
        return item
    if t == "code":
        body = _body(node)
        captions = _v2_spans(node, "code_caption")
        footnotes = _v2_spans(node, "code_footnote")
        if node.get("sub_type") == "algorithm":
            return {"type": "algorithm", "content": {
                "algorithm_caption": captions,
                "algorithm_content": inline.v2_spans(body["content"]),
                "algorithm_footnote": footnotes}}
        code = str(body["content"])
        return {"type": "code", "content": {
            "code_caption": captions,
            "code_content": [{"type": "text", "content": code}] if code else [],
            "code_footnote": footnotes,
            "code_language": node.get("guess_lang") or "txt"}}
    return None


def content_list_v2(middle: Node) -> list[list[Node]]:
    """MinerU's content_list v2 for a middle JSON: one list of items per page."""
    out: list[list[Node]] = []
    for page in middle["pages"]:
        items: list[Node] = []
        for unit in _units(page["blocks"]):
            item = _v2(unit)
            if item is None:
                continue
            item["bbox"] = bbox_1000(unit["bbox"])
            items.append(item)
        out.append(items)
    return out
