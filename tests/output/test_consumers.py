"""Our outbox read the way MinerU's two best-known consumers read MinerU output.

Neither is vendored; the reads below restate what their source does (RAGFlow
`deepdoc/parser/mineru_parser.py`: `_read_output` and `_transfer_to_sections`;
RAG-Anything `raganything/parser.py`: `MineruParser._read_output_files`, then its
processors' field reads):

- RAGFlow looks for `<out>/<stem>/{vlm,<method>,auto}/<stem>_content_list.json`, resolves
  `img_path` against that folder, and turns each entry into text by type: text/equation
  -> `text`, table -> `table_body` + captions + footnotes, image -> captions + footnotes,
  code -> `code_body` + captions, list -> `list_items`. Its type switch has no default:
  a type it does not know (chart, header, footer, page_number...) reuses the previous
  entry's text; MinerU's own output has those types too.
- RAG-Anything reads `<out>/<stem>/<method>/<stem>_content_list.json` when `<out>/<stem>`
  exists, else `<out>/<stem>_content_list.json`, and the `.md` beside it, resolving
  `img_path` against that folder; its processors read `text`/`text_level`/`page_idx`,
  `img_path` + `image_caption`/`image_footnote`, `table_body` + `table_caption`/
  `table_footnote`, and `text` + `text_format` for equations.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from daemon.document.page import Block
from daemon.output import publish
from daemon.output.formats.middle import PageData

SHA = "c" * 64
RAGFLOW_KNOWN = {"text", "table", "image", "equation", "code", "list", "discarded"}


def jpeg(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, "white").save(buffer, "JPEG")
    return buffer.getvalue()


def document(root: Path, layout: str) -> Path:
    blocks = (
        Block("header", (0.1, 0.02, 0.9, 0.04), text="Annual report", index=0),
        Block("title", (0.1, 0.05, 0.9, 0.08), text="Results", index=1),
        Block("text", (0.1, 0.09, 0.9, 0.15), text="Sales grew by 4 %.", index=2),
        Block("table_caption", (0.1, 0.16, 0.9, 0.18), text="Table 1: sales", index=3),
        Block("table", (0.1, 0.19, 0.9, 0.3), index=4,
              html="<table><tr><td>Q1</td><td>4</td></tr></table>"),
        Block("image", (0.1, 0.31, 0.5, 0.5), text="A bar chart of sales.", index=5,
              sub_type="natural_image"),
        Block("image_caption", (0.1, 0.51, 0.5, 0.53), text="Figure 1: sales", index=6),
        Block("equation", (0.3, 0.55, 0.7, 0.6), latex="a^{2}+b^{2}=c^{2}", index=7),
        Block("list", (0.1, 0.61, 0.9, 0.7), index=8),
        Block("text", (0.1, 0.61, 0.9, 0.65), text="• first", index=9),
        Block("text", (0.1, 0.65, 0.9, 0.7), text="• second", index=10),
        Block("code", (0.1, 0.71, 0.9, 0.8), text="print(1)", index=11),
        Block("page_number", (0.45, 0.95, 0.55, 0.97), text="1", index=12),
    )
    crops = {"page_0_table_4.jpg": jpeg((80, 11)), "page_0_image_5.jpg": jpeg((40, 19)),
             "page_0_equation_7.jpg": jpeg((40, 5))}
    page = PageData(page_idx=0, blocks=blocks, crop_names=frozenset(crops),
                    size_pt=(612.0, 792.0))
    doc = publish.DocumentFiles(pages=[page], meta={"job_id": 1}, crops=crops, page_count=1,
                                file_suffix="pdf", engine="mineru")
    return publish.write_document(root, "", "report", SHA, doc, layout=layout)


def ragflow_read(out: Path, stem: str, method: str = "auto") -> list[dict[str, Any]] | None:
    for sub in (out / stem / "vlm", out / stem / method, out / stem / "auto"):
        found = sub / f"{stem}_content_list.json"
        if found.exists():
            data: list[dict[str, Any]] = json.loads(found.read_text(encoding="utf-8"))
            for item in data:
                for key in ("img_path", "table_img_path", "equation_img_path"):
                    if item.get(key):
                        item[key] = str((sub / item[key]).resolve())
            return data
    return None


def ragflow_sections(items: list[dict[str, Any]]) -> list[str]:
    sections: list[str] = []
    section = ""
    for item in items:
        kind = item["type"]
        if kind in ("text", "equation"):
            section = item["text"]
        elif kind == "table":
            section = (item.get("table_body", "") + "\n".join(item.get("table_caption", []))
                       + "\n".join(item.get("table_footnote", [])))
        elif kind == "image":
            section = ("".join(item.get("image_caption", [])) + "\n"
                       + "".join(item.get("image_footnote", [])))
        elif kind == "code":
            section = item["code_body"] + "\n".join(item.get("code_caption", []))
        elif kind == "list":
            section = "\n".join(item.get("list_items", []))
        sections.append(section)  # no default branch: an unknown type repeats the last
    return sections


def raganything_read(out: Path, stem: str, method: str = "auto") -> tuple[list[Any], str]:
    md_file, json_file, base = out / f"{stem}.md", out / f"{stem}_content_list.json", out
    if (out / stem).exists():
        base = out / stem / method
        md_file, json_file = base / f"{stem}.md", base / f"{stem}_content_list.json"
    items: list[dict[str, Any]] = (
        json.loads(json_file.read_text(encoding="utf-8")) if json_file.exists() else []
    )
    for item in items:
        for key in ("img_path", "table_img_path", "equation_img_path"):
            if item.get(key):
                item[key] = str((base / item[key]).resolve())
    return items, md_file.read_text(encoding="utf-8") if md_file.exists() else ""


def check_items(items: list[dict[str, Any]]) -> None:
    by_type = {i["type"]: i for i in items}
    assert by_type["table"]["table_caption"] == ["Table 1: sales"]
    assert by_type["image"]["image_caption"] == ["Figure 1: sales"]
    assert by_type["equation"]["text"] == "a^{2}+b^{2}=c^{2}"
    assert by_type["equation"]["text_format"] == "latex"
    assert by_type["list"]["list_items"] == ["• first", "• second"]
    assert all(isinstance(i["page_idx"], int) and len(i["bbox"]) == 4 for i in items)
    for item in items:
        if item.get("img_path"):
            with Image.open(item["img_path"]) as im:  # an absolute path to a real JPEG
                assert im.format == "JPEG"
    titles = [i for i in items if i.get("text_level")]
    assert [(t["text"], t["text_level"]) for t in titles] == [("Results", 1)]


def test_ragflow_reads_the_mineru_legacy_layout(tmp_path: Path) -> None:
    document(tmp_path, "mineru-legacy")
    items = ragflow_read(tmp_path, "report")
    assert items is not None
    check_items(items)
    sections = dict(zip((i["type"] for i in items), ragflow_sections(items), strict=True))
    assert sections["table"].startswith("<table>") and "Table 1: sales" in sections["table"]
    assert sections["image"].startswith("Figure 1: sales")
    assert sections["list"] == "• first\n• second"
    assert sections["code"] == "print(1)"
    # Furniture types are MinerU's own; RAGFlow's switch does not know them.
    assert {i["type"] for i in items} - RAGFLOW_KNOWN == {"header", "page_number"}


def test_ragflow_does_not_find_the_default_layout(tmp_path: Path) -> None:
    document(tmp_path, "default")
    assert ragflow_read(tmp_path, "report") is None  # documented: use mineru-legacy


@pytest.mark.parametrize("layout", ["default", "mineru-legacy"])
def test_raganything_reads_both_layouts(tmp_path: Path, layout: str) -> None:
    folder = document(tmp_path, layout)
    # default: its output_dir is the document's folder; legacy: the folder holding <stem>/.
    items, md = raganything_read(folder if layout == "default" else folder.parent, "report")
    check_items(items)
    assert "![](images/page_0_image_5.jpg)" in md and "$$\na^{2}+b^{2}=c^{2}\n$$" in md
