"""Inline text as MinerU's middle JSON holds it (spans) and as its renderers write it.

Engines hand over plain strings; inline formulas in them (`\\(...\\)`, as mineru-vl-utils
leaves them) become `equation_inline` spans so their `_` and `^` are not escaped. A bare
`$...$` is left as text: in documents it is far more often two prices than a formula.
Plain text is escaped the way MinerU's Markdown writer (DocVortex) does it, so
`FUNCTION_USAGE` reads `FUNCTION\\_USAGE` in content_list and Markdown alike.
"""

from __future__ import annotations

import html
import re
from typing import Any

Span = dict[str, Any]  # {"type": "text" | "equation_inline", "content": str}

_INLINE_MATH_RE = re.compile(r"\\\((.+?)\\\)", re.DOTALL)
# Characters with inline Markdown meaning; MinerU escapes exactly these in plain text.
_MARKDOWN_SPECIALS = frozenset("*_`~$")
_HTML_LIKE_RE = re.compile(r"</?[A-Za-z][^<>\n]*>|<!--.*?-->|<![A-Za-z][^<>\n]*>|<\?[^<>\n]*\?>")
_ENTITY_LIKE_RE = re.compile(r"&(?:#[xX][0-9A-Fa-f]+|#[0-9]+|[A-Za-z][A-Za-z0-9]+);?")
_BLOCK_PREFIX_RE = re.compile(r"^(?P<indent>[ \t]{0,3})(?P<marker>#{1,6}|[+-])(?=[ \t])")


def spans(text: str) -> list[Span]:
    """A block's text as middle-JSON spans: text, with inline formulas split out."""
    out: list[Span] = []
    cursor = 0
    for match in _INLINE_MATH_RE.finditer(text):
        if match.start() > cursor:
            out.append({"type": "text", "content": text[cursor : match.start()]})
        out.append({"type": "equation_inline", "content": match.group(1).strip()})
        cursor = match.end()
    if cursor < len(text) or not out:
        out.append({"type": "text", "content": text[cursor:]})
    return [s for s in out if s["content"]]


def plain(content: list[Span]) -> str:
    """The spans' text without any Markdown (for v2's structured fields and for sorting)."""
    return "".join(s["content"] for s in content)


def _escape_specials(text: str) -> str:
    out: list[str] = []
    backslashes = 0
    for ch in text:
        if ch == "\\":
            out.append(ch)
            backslashes += 1
            continue
        if ch in _MARKDOWN_SPECIALS and backslashes % 2 == 0:
            out.append("\\")
        out.append(ch)
        backslashes = 0
    return "".join(out)


def _escape_entities(text: str) -> str:
    def guard(match: re.Match[str]) -> str:
        candidate = match.group(0)
        return f"&amp;{candidate[1:]}" if html.unescape(candidate) != candidate else candidate

    return _ENTITY_LIKE_RE.sub(guard, text)


def escape_text(text: str) -> str:
    """Plain text for Markdown: specials escaped, tag-like text made inert."""
    parts: list[str] = []
    cursor = 0
    for match in _HTML_LIKE_RE.finditer(text):
        parts.append(_escape_entities(_escape_specials(text[cursor : match.start()])))
        parts.append(html.escape(match.group(0), quote=False))
        cursor = match.end()
    parts.append(_escape_entities(_escape_specials(text[cursor:])))
    return "".join(parts)


def render(content: list[Span]) -> str:
    """Spans as Markdown: escaped text, `$...$` formulas."""
    return "".join(
        f"${s['content']}$" if s["type"] == "equation_inline" else escape_text(s["content"])
        for s in content
    )


def escape_block_prefix(text: str) -> str:
    """A paragraph starting with `# ` or `- ` would become a heading or a list item."""
    match = _BLOCK_PREFIX_RE.match(text)
    if not match:
        return text
    at = match.start("marker")
    return f"{text[:at]}\\{text[at:]}"


def escape_marker_rule(text: str) -> str:
    """A paragraph of only `_` or `-` would become a horizontal rule."""
    if text and (set(text) == {"_"} or set(text) == {"-"}):
        return f"\\{text}"
    return text


def v2_spans(content: list[Span]) -> list[Span]:
    """Spans as content_list v2 writes them (inline formulas trimmed)."""
    return [
        {"type": s["type"], "content": s["content"].strip()}
        if s["type"] == "equation_inline"
        else {"type": "text", "content": s["content"]}
        for s in content
    ]
