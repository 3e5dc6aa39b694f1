"""`<stem>.md`: the document as Markdown, rendered from the middle JSON as MinerU does.

Headings `#`/`##`, paragraphs (a paragraph continued after a page or column break joined
to its start), lists one item per line, `$$` display equations, tables as pipe tables when
they have no spans and as HTML otherwise, figures as `![](images/...)` with the model's
description in a `<details>` block, captions where the layout put them (under a figure,
over a table or listing), code fenced. Page furniture (header, footer, page number, side
notes) is left out: it is in content_list.json.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

from daemon.document.page import Block
from daemon.output.formats import inline
from daemon.output.formats.middle import AUXILIARY_TYPES, PageData, build_middle
from daemon.output.formats.tables import formulas_inline, table_markdown

Node = dict[str, Any]


def _fence(content: str, language: str = "") -> str:
    longest = max((len(m) for m in re.findall(r"`+", content)), default=0)
    fence = "`" * max(3, longest + 1)
    end = "" if content.endswith("\n") else "\n"
    return f"{fence}{language}\n{content}{end}{fence}"


def _details(content: str, summary: str) -> str:
    safe = html.escape(summary, quote=False)
    return f"<details>\n<summary>{safe}</summary>\n\n{content.strip()}\n</details>"


def _image(path: str | None) -> str:
    return f"![]({path})" if path else ""


def _annotation(node: Node) -> str:
    return inline.escape_marker_rule(inline.render(node["content"]))


def _table_body(body: Node) -> str:
    content = str(body["content"])
    if not content.strip():
        return _image(body.get("image_path"))
    if re.search(r"<table\b", content, re.IGNORECASE):
        return table_markdown(content)
    return _fence(content)


def _chart_body(node: Node, body: Node) -> str:
    content = str(body["content"]).strip()
    if not content:
        return _image(body.get("image_path"))
    rendered = (table_markdown(content) if re.search(r"<table\b", content, re.I)
                else formulas_inline(content))
    if not body.get("image_path"):
        return rendered
    details = _details(rendered, node.get("sub_type") or "chart content")
    return f"{_image(body.get('image_path'))}\n\n{details}"


def _image_body(node: Node, body: Node) -> str:
    parts = [_image(body.get("image_path"))]
    if content := formulas_inline(str(body["content"])).strip():
        parts.append(_details(content, node.get("sub_type") or "image content"))
    return "\n\n".join(p for p in parts if p)


def _code_body(node: Node, body: Node) -> str:
    if node.get("sub_type") == "algorithm":
        return _fence(inline.render(body["content"]))
    return _fence(str(body["content"]), node.get("guess_lang") or "txt")


def _visual(node: Node) -> str:
    parts = []
    for child in node["content"]:
        t = child["type"]
        if t == "table_body":
            parts.append(_table_body(child))
        elif t == "chart_body":
            parts.append(_chart_body(node, child))
        elif t == "image_body":
            parts.append(_image_body(node, child))
        elif t in ("code_body", "algorithm_body"):
            parts.append(_code_body(node, child))
        else:
            parts.append(_annotation(child))
    return "\n\n".join(p.strip("\n") for p in parts if p and p.strip())


def _block(node: Node, text: list[inline.Span] | None = None) -> str:
    t = node["type"]
    if t == "text":
        rendered = inline.render(text or node["content"])
        return inline.escape_marker_rule(inline.escape_block_prefix(rendered))
    if t == "ref_text":
        return inline.escape_marker_rule(inline.render(node["content"]))
    if t in ("doc_title", "paragraph_title"):
        level = min(max(int(node["level"]), 1), 6)
        return f"{'#' * level} {inline.render(node['content'])}"
    if t == "page_footnote":
        body = inline.escape_marker_rule(inline.escape_block_prefix(inline.render(node["content"])))
        if not body.strip():
            return ""
        body = body.replace("\n", "<br>")
        return ('<small><span class="docvortex-page-footnote" data-block-type="page_footnote" '
                f'style="color:#6b7280">{body}</span></small>')
    if t == "equation":
        latex = str(node["content"]).strip()
        return f"$$\n{latex}\n$$" if latex else _image(node.get("image_path"))
    if t == "list":
        lines = []
        for item in node["content"]:
            rendered = inline.render(item["content"])
            if rendered:
                lines.extend(inline.escape_marker_rule(rendered).splitlines())
        return "\n".join(lines)
    if t in ("image", "chart", "table", "code"):
        return _visual(node)
    return ""


def _joined(first: list[inline.Span], more: list[inline.Span]) -> list[inline.Span]:
    """A paragraph continued after a break: rejoin a hyphenated word, else one space."""
    head = inline.plain(first)
    tail = inline.plain(more)
    if re.search(r"[^\W\d_]-$", head) and tail[:1].islower():
        trimmed = [*first[:-1], {**first[-1], "content": first[-1]["content"][:-1]}]
        return [*trimmed, *more]
    return [*first, {"type": "text", "content": " "}, *more]


def markdown(middle: Node) -> str:
    """The document's Markdown, ending with one newline."""
    parts: list[str] = []
    last_text: tuple[int, list[inline.Span], Node] | None = None
    for page in middle["pages"]:
        for node in page["blocks"]:
            if node["type"] in AUXILIARY_TYPES:
                continue
            if node["type"] == "text" and node.get("continues_prev") and last_text is not None:
                at, joined, head = last_text
                joined = _joined(joined, node["content"])
                last_text = (at, joined, head)
                parts[at] = _block(head, joined)
                continue
            rendered = _block(node).strip("\n")
            if not rendered.strip():
                continue
            parts.append(rendered)
            # As MinerU: a continuation joins the last paragraph even across a figure or
            # table in between (the layout put the rest of the sentence after it).
            if node["type"] == "text":
                last_text = (len(parts) - 1, node["content"], node)
    return "\n\n".join(parts) + "\n"


def pages_to_markdown(pages: Sequence[Sequence[Block]]) -> str:
    """The Markdown of bare per-page block lists (pages numbered from 0), for tools and
    benchmarks that hold an engine's blocks rather than a stored document."""
    return markdown(build_middle([PageData(i, tuple(p)) for i, p in enumerate(pages)]))
