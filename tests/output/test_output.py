"""The output side: formats (Markdown, content_list), the atomic outbox writer (outbox,
publish.write_document), moving originals, failures and their hints."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from daemon import __version__
from daemon.common import display, errors
from daemon.common.errors import FailureKind
from daemon.config import settings as config
from daemon.config.schema import declared
from daemon.document.page import Block, Crop, EngineInfo
from daemon.document.record import PageRecord
from daemon.jobs.store import MIGRATIONS, SCHEMA_VERSION, Store
from daemon.output import durable, originals, publish
from daemon.output import outbox as outbox_writer
from daemon.output.formats import content_list, markdown
from daemon.output.formats.middle import PageData, build_middle
from daemon.output.publish import as_pages
from tests.conftest import write_config

SHA_A = "a" * 8 + "1" * 56
SHA_B = "b" * 8 + "2" * 56
BOX = (0.1, 0.2, 0.5, 0.25)

RealRename = Callable[[Any, Any], None]
REAL_RENAME: RealRename = os.rename


def b(type_: str, text: str = "", **kw: Any) -> Block:
    return Block(type=type_, bbox=kw.pop("bbox", BOX), text=text, **kw)


def every_block_type() -> list[list[Block]]:
    return [
        [
            b("header", "ACME Corp", bbox=(0.1, 0.02, 0.9, 0.05)),
            b("title", "Annual Report"),  # level 0 on a title -> top heading
            b("title", "Overview", text_level=2),
            b("text", "First paragraph.  \r\nsecond line   "),
            b("text", "Bad\x00 chars\x07 here\tand\x1b tab"),
            b("list", "- one\n- two"),
            b("code", "def f():\n    return '```'"),
            b("table", "", html="<table><tr><td>1</td></tr></table>"),
            b("table", "a | b"),
            b("equation", "", latex="E = mc^2"),
            b("image", ""),
            b("page_number", "1"),
            b("footer", "Confidential"),
        ],
        [
            b("text", "a *starred* FUNCTION_ID &amp; <b>tag</b>"),
            b("text", "Last."),
        ],
    ]


def render(pages: list[list[Block]]) -> tuple[str, list[dict[str, Any]]]:
    middle = build_middle(as_pages(pages))
    return markdown.markdown(middle), content_list.content_list(middle)


EXPECTED_MD = (
    "# Annual Report\n"
    "\n"
    "## Overview\n"
    "\n"
    "First paragraph.  \n"
    "second line   \n"
    "\n"
    "Bad chars here\tand tab\n"
    "\n"
    "- one\n"
    "- two\n"
    "\n"
    "````txt\n"
    "def f():\n"
    "    return '```'\n"
    "````\n"
    "\n"
    "| 1 |\n"  # a table without spans becomes a pipe table, as MinerU writes it
    "| --- |\n"
    "\n"
    "```\n"  # a table the model gave as text, not HTML: kept verbatim, fenced
    "a | b\n"
    "```\n"
    "\n"
    "$$\n"
    "E = mc^2\n"
    "$$\n"
    "\n"
    # MinerU's escaping: Markdown specials, entity-like text and tag-like text made inert.
    "a \\*starred\\* FUNCTION\\_ID &amp;amp; &lt;b&gt;tag&lt;/b&gt;\n"
    "\n"
    "Last.\n"
)


def test_markdown_every_block_type() -> None:
    # Header, footer and page number stay out of the Markdown (they are in content_list).
    assert render(every_block_type())[0] == EXPECTED_MD


def test_markdown_edge_cases() -> None:
    assert render([])[0] == "\n"
    # Pre-wrapped LaTeX is not wrapped twice; an empty equation/image without a crop
    # emits nothing; an engine's heading level on text is honoured (at most 4, MinerU's).
    md, _ = render(
        [[b("equation", latex="$$ x $$"), b("equation"), b("text", "t", text_level=3)]]
    )
    assert md == "$$\nx\n$$\n\n### t\n"
    assert render([[b("title", "x", text_level=9)]])[0] == "#### x\n"


def test_content_list_every_block_type() -> None:
    bbox = [100, 200, 500, 250]
    assert render(every_block_type())[1] == [
        {"type": "header", "text": "ACME Corp", "bbox": [100, 20, 900, 50], "page_idx": 0},
        {"type": "text", "text": "Annual Report", "text_level": 1, "bbox": bbox, "page_idx": 0},
        {"type": "text", "text": "Overview", "text_level": 2, "bbox": bbox, "page_idx": 0},
        {"type": "text", "text": "First paragraph.  \nsecond line   ", "bbox": bbox, "page_idx": 0},
        {"type": "text", "text": "Bad chars here\tand tab", "bbox": bbox, "page_idx": 0},
        {
            "type": "list",
            "sub_type": "text",
            "list_items": ["- one", "- two"],
            "bbox": bbox,
            "page_idx": 0,
        },
        {
            "type": "code",
            "sub_type": "code",
            "code_body": "def f():\n    return '```'",
            "code_caption": [],
            "code_footnote": [],
            "bbox": bbox,
            "page_idx": 0,
        },
        {
            "type": "table",
            "img_path": "",
            "table_caption": [],
            "table_footnote": [],
            "table_body": "<table><tr><td>1</td></tr></table>",
            "bbox": bbox,
            "page_idx": 0,
        },
        {
            "type": "table",
            "img_path": "",
            "table_caption": [],
            "table_footnote": [],
            "table_body": "a | b",
            "bbox": bbox,
            "page_idx": 0,
        },
        {
            # Bare LaTeX: MinerU's renderers add the $$ in Markdown only.
            "type": "equation",
            "img_path": "",
            "text": "E = mc^2",
            "text_format": "latex",
            "bbox": bbox,
            "page_idx": 0,
        },
        {
            "type": "image",
            "img_path": "",
            "image_caption": [],
            "image_footnote": [],
            "bbox": bbox,
            "page_idx": 0,
        },
        {"type": "page_number", "text": "1", "bbox": bbox, "page_idx": 0},
        {"type": "footer", "text": "Confidential", "bbox": bbox, "page_idx": 0},
        {
            "type": "text",
            "text": "a \\*starred\\* FUNCTION\\_ID &amp;amp; &lt;b&gt;tag&lt;/b&gt;",
            "bbox": bbox,
            "page_idx": 1,
        },
        {"type": "text", "text": "Last.", "bbox": bbox, "page_idx": 1},
    ]


def test_inline_formulas_are_spans_and_prices_stay_text() -> None:
    md, cl = render([[b("text", "costs $5 and $10 for \\(a_1^2\\) units")]])
    assert cl[0]["text"] == "costs \\$5 and \\$10 for $a_1^2$ units"
    assert md == "costs \\$5 and \\$10 for $a_1^2$ units\n"
    v2 = content_list.content_list_v2(build_middle(as_pages([[b("text", "x \\(y\\)")]])))
    assert v2[0][0]["content"]["paragraph_content"] == [
        {"type": "text", "content": "x "}, {"type": "equation_inline", "content": "y"}]


def test_formulas_wrapped_in_tables_become_dollar_math() -> None:
    table = "<table><tr><td>area</td><td><eq>a|b^{2}</eq></td></tr></table>"
    md, cl = render([[b("table", html=table)]])
    assert cl[0]["table_body"] == "<table><tr><td>area</td><td> $a|b^{2}$ </td></tr></table>"
    assert md == "| area | $a\\|b^{2}$ |\n| --- | --- |\n"


def test_content_list_bbox_is_clamped() -> None:
    [entry] = render([[b("text", "x", bbox=(-0.1, 0.0004, 1.2, float("nan")))]])[1]
    assert entry["bbox"] == [0, 0, 1000, 0]


def test_captions_lists_and_crops_are_grouped_as_mineru_does() -> None:
    chart = b("chart", "| a | b |", bbox=(0.1, 0.3, 0.9, 0.6), sub_type="bar_chart", index=4)
    caption = b("image_caption", "Figure 1: sales", bbox=(0.2, 0.61, 0.8, 0.63), index=5)
    table_caption = b("table_caption", "Table 1", bbox=(0.1, 0.66, 0.5, 0.68), index=6)
    table = b("table", html="<table><tr><td rowspan=\"2\">x</td></tr></table>",
              bbox=(0.1, 0.69, 0.9, 0.8), index=7)
    items = [
        b("list", bbox=(0.1, 0.1, 0.9, 0.2), index=1),
        b("text", "• one", bbox=(0.1, 0.1, 0.9, 0.15), index=2),
        b("text", "• two", bbox=(0.1, 0.15, 0.9, 0.2), index=3),
    ]
    page = PageData(page_idx=3, blocks=(*items, chart, caption, table_caption, table),
                    crop_names=frozenset({"page_3_chart_4.jpg", "page_3_table_7.jpg"}))
    middle = build_middle([page])
    cl = content_list.content_list(middle)
    assert [e["type"] for e in cl] == ["list", "chart", "table"]
    assert cl[0]["list_items"] == ["• one", "• two"]
    assert cl[1]["chart_caption"] == ["Figure 1: sales"]  # an image caption under a chart
    assert cl[1]["img_path"] == "images/page_3_chart_4.jpg" and cl[1]["sub_type"] == "bar_chart"
    assert cl[2]["table_caption"] == ["Table 1"]
    assert cl[2]["img_path"] == "images/page_3_table_7.jpg"
    # A container box adds nothing; a generic caption finds its figure.
    extra = PageData(page_idx=4, blocks=(
        b("image_block", bbox=(0.1, 0.1, 0.9, 0.5)),
        b("image", bbox=(0.1, 0.1, 0.9, 0.4)),
        b("caption", "Figure 2", bbox=(0.1, 0.41, 0.9, 0.45)),
    ))
    [image] = content_list.content_list(build_middle([extra]))
    assert image["type"] == "image" and image["image_caption"] == ["Figure 2"]
    md = markdown.markdown(middle)
    # Caption under the figure, over the table; a table with spans stays HTML.
    assert md.index("![](images/page_3_chart_4.jpg)") < md.index("Figure 1: sales")
    assert md.index("Table 1") < md.index("<table>")
    assert "<details>\n<summary>bar_chart</summary>" in md


# --------------------------------------------------------------------------- outbox


def tmp_area(outbox: Path) -> Path:
    return outbox / durable.TMP_DIR_NAME


def leftovers(outbox: Path) -> list[Path]:
    t = tmp_area(outbox)
    return list(t.iterdir()) if t.exists() else []


def write(
    outbox: Path,
    sha: str = SHA_A,
    stem: str = "report",
    subdir: str = "inbox1",
    pages: list[list[Block]] | None = None,
    meta: dict[str, Any] | None = None,
) -> Path:
    doc = publish.DocumentFiles(
        pages=as_pages(pages if pages is not None else every_block_type()),
        meta=meta if meta is not None else {"job_id": 7},
    )
    return publish.write_document(outbox, subdir, stem, sha, doc)


def test_write_document_layout_and_no_tmp(tmp_path: Path) -> None:
    outbox = tmp_path / "outbox"
    folder = write(outbox)
    assert folder == outbox.resolve() / "inbox1" / "report"
    assert sorted(p.name for p in folder.iterdir()) == [
        "report.md",
        "report.meta.json",
        "report_content_list.json",
        "report_content_list_v2.json",
        "report_middle.json",
        "report_model.json",
    ]
    assert (folder / "report.md").read_text(encoding="utf-8") == EXPECTED_MD
    meta = json.loads((folder / "report.meta.json").read_text(encoding="utf-8"))
    assert meta == {"job_id": 7, "sha256": SHA_A, "docinbox_version": __version__}
    cl = json.loads((folder / "report_content_list.json").read_text(encoding="utf-8"))
    assert cl == render(every_block_type())[1]
    assert not tmp_area(outbox).exists()


def test_mineru_legacy_layout_crops_and_no_extra_json(tmp_path: Path) -> None:
    page = PageData(page_idx=0, blocks=(b("image", index=2),),
                    crop_names=frozenset({"page_0_image_2.jpg"}))
    doc = publish.DocumentFiles(pages=[page], meta={"job_id": 1},
                                crops={"page_0_image_2.jpg": b"JPEG"})
    folder = publish.write_document(tmp_path, "", "scan", SHA_A, doc, layout="mineru-legacy",
                                    extra_json=False)
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    # RAGFlow's MinerU parser looks in <stem>/auto/; the meta stays where the outbox
    # writer recognises the folder as this document's.
    assert files == ["auto/images/page_0_image_2.jpg", "auto/scan.md",
                     "auto/scan_content_list.json", "scan.meta.json"]
    assert (folder / "auto/images/page_0_image_2.jpg").read_bytes() == b"JPEG"
    assert (folder / "auto/scan.md").read_text() == "![](images/page_0_image_2.jpg)\n"
    [entry] = json.loads((folder / "auto/scan_content_list.json").read_text())
    assert entry["img_path"] == "images/page_0_image_2.jpg"


# Two stored pages of a MinerU document: a text layer title, a figure with its crop, and
# the model's raw answers on the first page.
STORED = (
    PageRecord(0, (b("title", "Report", source="text_layer", index=0),
                   b("image", "a chart", index=1, sub_type="bar_chart")),
               "mineru", 2.25, info={"page_size_pt": [612.0, 792.0], "model_blocks": 1},
               model_output={"layout": {"raw_output": "<|box_start|>..."}, "blocks": []},
               crops=(Crop("page_0_image_1.jpg", b"\xff\xd8jpeg", (40, 20)),)),
    PageRecord(1, (b("text", "Done.", continues_prev=True),), "lite", 0.5,
               info={"page_size_pt": [612.0, 792.0], "orientation": {"angle": 0}}),
)


def publish_stored(root: Path, store: Store) -> dict[str, bytes]:
    cfg = config.load_config(write_config(root, after_success="keep"))
    job = store.job(1)
    assert job is not None
    engine = EngineInfo("mineru", "opendatalab/MinerU2.5-2509-1.2B", details={"runtime": "http"})
    folder = Path(publish.Publisher(cfg, store, lambda: 1.7e9).complete(job, engine, 1.0).folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_database_of_the_previous_release_still_publishes(tmp_path: Path) -> None:
    """Schema 3 kept a page's blocks as a bare JSON list, with keys an older release had
    (the engine-made Markdown "md"). Such a file opens, migrates and publishes the very
    bytes the pages stored today publish."""
    now = tmp_path / "now"
    current = Store(now / "state.sqlite3")
    arrived = current.record_arrival(path="/in/report.pdf", inbox="/in", subdir="", size=10,
                                     mtime_ns=1, sha256=SHA_A, now=100)
    assert arrived is not None
    current.start_job(arrived.job.id, 101, "mineru")
    current.set_page_count(arrived.job.id, 2)
    for page in STORED:
        current.save_page(arrived.job.id, page, 102)
    expected = publish_stored(now, current)
    current.close()

    old = tmp_path / "old"
    old.mkdir()
    db = sqlite3.connect(old / "state.sqlite3", isolation_level=None)
    for statement in (s for step in MIGRATIONS[:3] for s in step):
        db.execute(statement)
    db.execute("PRAGMA user_version=3")
    db.execute("INSERT INTO documents VALUES(1, ?, 10, 100)", (SHA_A,))
    db.execute("INSERT INTO jobs(id, document_id, source_path, inbox, state, attempts,"
               " created_at, started_at, engine, page_count, pages_done)"
               " VALUES(1, 1, '/in/report.pdf', '/in', 'running', 1, 100, 101, 'mineru', 2, 2)")
    for page in STORED:
        blocks = [{**dataclasses.asdict(x), "bbox": list(x.bbox), "md": "old"} for x in page.blocks]
        db.execute("INSERT INTO pages VALUES(1, ?, ?, ?, ?, ?, 102, ?)",
                   (page.page_idx, json.dumps(blocks), json.dumps(page.info), page.engine,
                    page.seconds, json.dumps(page.model_output) if page.model_output else None))
        for crop in page.crops:
            db.execute("INSERT INTO page_crops VALUES(1, ?, ?, ?, ?, ?)",
                       (page.page_idx, crop.name, crop.jpeg, *crop.size))
    db.close()
    migrated = Store(old / "state.sqlite3")
    assert migrated.schema_version() == SCHEMA_VERSION
    assert migrated.pages(1) == list(STORED)  # the same typed records, "md" dropped
    assert publish_stored(old, migrated) == expected
    migrated.close()
    assert "images/page_0_image_1.jpg" in expected and '"text_layer": 1' in str(
        expected["report.meta.json"], "utf-8")


def test_json_is_utf8_unescaped_and_survives_odd_meta(tmp_path: Path) -> None:
    meta = {"original_path": "/in/caf\udce9.pdf", "title": "Größe", "ratio": float("nan")}
    folder = write(tmp_path, meta=meta, pages=[[b("text", "Größe")]])
    raw = (folder / "report.meta.json").read_text(encoding="utf-8")
    assert "Größe" in raw  # ensure_ascii=False
    data = json.loads(raw)
    assert data["original_path"] == "/in/caf\\xe9.pdf"
    assert data["ratio"] is None


def test_meta_sha_mismatch_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write(tmp_path, meta={"sha256": SHA_B})


def test_crash_on_final_rename_leaves_no_visible_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox = tmp_path / "outbox"

    def crash(src: Any, dst: Any) -> None:
        raise OSError(errno.EIO, "simulated crash")

    monkeypatch.setattr(os, "rename", crash)
    # A real crash runs no cleanup at all: simulate that too.
    monkeypatch.setattr(outbox_writer, "remove_tree", lambda p: None)
    with pytest.raises(OSError):
        write(outbox)
    assert not (outbox / "inbox1" / "report").exists()
    visible = [p for p in (outbox / "inbox1").iterdir()]
    assert visible == []
    assert len(leftovers(outbox)) == 1

    monkeypatch.undo()
    assert outbox_writer.cleanup_orphans(outbox) == 1
    assert not tmp_area(outbox).exists()
    assert outbox_writer.cleanup_orphans(outbox) == 0


def test_failed_write_cleans_its_own_staging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(src: Any, dst: Any) -> None:
        raise PermissionError(errno.EACCES, "denied")

    monkeypatch.setattr(os, "rename", fail)
    with pytest.raises(PermissionError):
        write(tmp_path)
    assert not tmp_area(tmp_path).exists()


def test_disk_full_raises_and_leaves_no_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:  # the second file written
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError) as info:
        write(tmp_path)
    assert info.value.errno == errno.ENOSPC
    assert not tmp_area(tmp_path).exists()
    assert not (tmp_path / "inbox1" / "report").exists()


def test_collision_with_other_document_gets_suffix(tmp_path: Path) -> None:
    first = write(tmp_path, sha=SHA_A)
    second = write(tmp_path, sha=SHA_B)
    assert second.name == "report-" + SHA_B[:8]
    assert (second / "report.md").exists()
    assert json.loads((first / "report.meta.json").read_text())["sha256"] == SHA_A
    # Another document whose 8-hex prefix also collides: a longer prefix.
    sha_c = SHA_B[:8] + "3" * 56
    third = write(tmp_path, sha=sha_c)
    assert third.name == "report-" + sha_c[:12]
    # Reprocessing the suffixed document replaces its own folder, not someone else's.
    again = write(tmp_path, sha=SHA_B, pages=[[b("text", "v2")]])
    assert again == second
    assert (second / "report.md").read_text() == "v2\n"
    assert (first / "report.md").read_text() == EXPECTED_MD


def test_foreign_folder_is_never_overwritten(tmp_path: Path) -> None:
    foreign = tmp_path / "inbox1" / "report"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    (foreign / "x.meta.json").write_text("{not json")
    folder = write(tmp_path)
    assert folder.name == "report-" + SHA_A[:8]
    assert (foreign / "notes.txt").read_text() == "mine"


def test_same_sha_replaces(tmp_path: Path) -> None:
    write(tmp_path, pages=[[b("text", "old")]])
    folder = write(tmp_path, pages=[[b("text", "new")]])
    assert folder.name == "report"
    assert (folder / "report.md").read_text() == "new\n"
    assert sorted(p.name for p in folder.parent.iterdir()) == ["report"]
    assert not tmp_area(tmp_path).exists()


def test_replace_failure_rolls_back_to_old(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write(tmp_path, pages=[[b("text", "old")]])

    def rename(src: Any, dst: Any) -> None:
        if Path(src).name == "new":
            raise OSError(errno.EIO, "simulated")
        REAL_RENAME(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError):
        write(tmp_path, pages=[[b("text", "new")]])
    assert (folder / "report.md").read_text() == "old\n"
    assert not tmp_area(tmp_path).exists()


def test_crash_inside_replace_window_is_rolled_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write(tmp_path, pages=[[b("text", "old")]])

    class Killed(BaseException):
        pass

    def rename(src: Any, dst: Any) -> None:
        if Path(src).name == "new":
            raise Killed  # the process dies right after the old folder was moved aside
        REAL_RENAME(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(outbox_writer, "remove_tree", lambda p: None)
    # Rollback would run in a living process; a killed one runs nothing.
    monkeypatch.setattr(outbox_writer, "_replace", _replace_without_rollback)
    with pytest.raises(Killed):
        write(tmp_path, pages=[[b("text", "new")]])
    assert not folder.exists()  # the window: neither in place...
    monkeypatch.undo()
    assert outbox_writer.cleanup_orphans(tmp_path) == 1
    assert (folder / "report.md").read_text() == "new\n"  # ...until the restart
    assert not tmp_area(tmp_path).exists()


def _replace_without_rollback(staging: Path, new: Path, final: Path, outbox: Path) -> None:
    durable.write_new_file(
        staging / outbox_writer._MARKER,
        durable.json_bytes({"target": list(final.relative_to(outbox).parts)}),
    )
    os.rename(final, staging / outbox_writer._OLD)
    os.rename(new, final)


def test_cleanup_orphans_only_touches_tmp(tmp_path: Path) -> None:
    write(tmp_path)
    t = tmp_area(tmp_path)
    (t / "w-dead").mkdir(parents=True)
    (t / "w-dead" / "new").mkdir()
    (t / "stray.part").write_text("x")
    assert outbox_writer.cleanup_orphans(tmp_path) == 2
    assert (tmp_path / "inbox1" / "report" / "report.md").exists()
    assert not t.exists()


@pytest.mark.parametrize(
    ("stem", "expected"),
    [
        ("../../etc/passwd", "_._etc_passwd"),
        ("..", "document"),
        ("", "document"),
        ("   ", "document"),
        (".hidden", "hidden"),
        ("line1\nline2\r\x00x", "line1 line2 x"),
        ("Rechnung März 2024", "Rechnung März 2024"),
        ("a:b?c*", "a_b_c_"),
        ("bad\udcffbyte", "bad_byte"),
        ("rtl\u202eevil", "rtlevil"),
    ],
)
def test_sanitize_stem(stem: str, expected: str) -> None:
    assert outbox_writer.sanitize_stem(stem) == expected


def test_sanitize_stem_long_names_cut_on_char_boundary() -> None:
    s = outbox_writer.sanitize_stem("é" * 300)
    assert len(s.encode("utf-8")) <= outbox_writer.MAX_STEM_BYTES
    assert s == "é" * (outbox_writer.MAX_STEM_BYTES // 2)
    assert outbox_writer.sanitize_stem("x" * 300) == "x" * outbox_writer.MAX_STEM_BYTES


def test_hostile_stem_stays_inside_outbox(tmp_path: Path) -> None:
    outbox = tmp_path / "outbox"
    folder = write(outbox, stem="../../etc/passwd\n" + "y" * 300)
    assert folder.parent == outbox.resolve() / "inbox1"
    assert "\n" not in folder.name and "/" not in folder.name
    assert len(folder.name.encode()) <= outbox_writer.MAX_STEM_BYTES


@pytest.mark.parametrize("subdir", ["/abs", "../x", "a/../../b", "a\\..\\b", ".docinbox-tmp"])
def test_bad_subdir_rejected(tmp_path: Path, subdir: str) -> None:
    with pytest.raises(ValueError):
        write(tmp_path, subdir=subdir)
    with pytest.raises(ValueError):
        originals.move_into(tmp_path / "x", tmp_path / "archive", subdir)


def test_empty_subdir_is_root(tmp_path: Path) -> None:
    assert write(tmp_path, subdir="").parent == tmp_path.resolve()
    assert write(tmp_path, subdir="a/./b", sha=SHA_B).parent == tmp_path.resolve() / "a" / "b"


# --------------------------------------------------------------------------- moves


def test_move_into_never_overwrites(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    dests = []
    for i in range(3):
        src = tmp_path / "in" / "scan.pdf"
        src.parent.mkdir(exist_ok=True)
        src.write_text(f"v{i}")
        dests.append(originals.move_into(src, archive, "sub"))
        assert not src.exists()
    assert [d.name for d in dests] == ["scan.pdf", "scan (1).pdf", "scan (2).pdf"]
    assert [d.read_text() for d in dests] == ["v0", "v1", "v2"]
    noext = tmp_path / "README"
    noext.write_text("r")
    (archive / "README").write_text("existing")
    assert originals.move_into(noext, archive, "").name == "README (1)"


def test_move_into_cross_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "in" / "scan.pdf"
    src.parent.mkdir()
    src.write_bytes(b"%PDF-1.7 data")
    os.utime(src, (1_000_000, 1_000_000))
    archive = tmp_path / "archive"
    (archive / "s").mkdir(parents=True)
    (archive / "s" / "scan.pdf").write_text("older")

    def rename(s: Any, d: Any) -> None:
        if Path(s).parent != Path(d).parent:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        REAL_RENAME(s, d)

    monkeypatch.setattr(os, "rename", rename)
    dest = originals.move_into(src, archive, "s")
    assert dest.name == "scan (1).pdf"
    assert dest.read_bytes() == b"%PDF-1.7 data"
    assert dest.stat().st_mtime == 1_000_000
    assert not src.exists()
    assert (archive / "s" / "scan.pdf").read_text() == "older"
    assert sorted(p.name for p in (archive / "s").iterdir()) == ["scan (1).pdf", "scan.pdf"]


def test_cross_device_copy_failure_keeps_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "scan.pdf"
    src.write_bytes(b"data")

    def rename(s: Any, d: Any) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError):
        originals.move_into(src, tmp_path / "archive", "")
    assert src.read_bytes() == b"data"
    assert list((tmp_path / "archive").iterdir()) == []  # no temp copy left behind


# --------------------------------------------------------------------------- failures


def error_dict(**kw: Any) -> dict[str, Any]:
    return {
        "job_id": 12,
        "kind": "encrypted",
        "reason": "No configured password opens it.",
        "attempts": 1,
        "sha256": SHA_A,
        **kw,
    }


def test_write_failure_moves_and_writes_error(tmp_path: Path) -> None:
    src = tmp_path / "in" / "secret.pdf"
    src.parent.mkdir()
    src.write_text("x")
    failed = tmp_path / "failed"
    dest = originals.write_failure(src, failed, "box", error_dict())
    assert dest == failed / "box" / "secret.pdf"
    assert dest.read_text() == "x" and not src.exists()
    err = json.loads((failed / "box" / "secret.pdf.error.json").read_text(encoding="utf-8"))
    assert err["file"] == str(src)
    assert err["kind"] == "encrypted"
    assert err["attempts"] == 1 and err["job_id"] == 12 and err["sha256"] == SHA_A
    assert "`passwords:`" in err["hint"] and "docinbox retry 12" in err["hint"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", err["failed_at"])
    assert [p.name for p in (failed / "box").iterdir() if p.name.startswith(".")] == []


def test_write_failure_when_src_vanished(tmp_path: Path) -> None:
    src = tmp_path / "in" / "gone.pdf"
    failed = tmp_path / "failed"
    (failed / "box").mkdir(parents=True)
    (failed / "box" / "gone.pdf.error.json").write_text("earlier failure")
    path = originals.write_failure(src, failed, "box", error_dict(kind=FailureKind.VANISHED))
    assert path == failed / "box" / "gone (1).pdf"
    assert not path.exists()
    err = json.loads((failed / "box" / "gone (1).pdf.error.json").read_text())
    assert err["kind"] == "vanished" and err["moved_to"] is None
    assert err["file"] == str(src)
    assert (failed / "box" / "gone.pdf.error.json").read_text() == "earlier failure"


def test_failed_name_reserves_sidecar(tmp_path: Path) -> None:
    failed = tmp_path / "failed"
    failed.mkdir()
    (failed / "a.pdf.error.json").write_text("orphan record")
    src = tmp_path / "a.pdf"
    src.write_text("x")
    assert originals.write_failure(src, failed, "", error_dict()).name == "a (1).pdf"
    assert (failed / "a (1).pdf.error.json").exists()


def test_every_failure_kind_has_a_hint_naming_real_config_keys() -> None:
    sections = {f.name: f.type for f in dataclasses.fields(config.Config)}
    # The keys a user writes in config.yaml (limits.max_file_size), not the field names
    # they are stored under (max_file_bytes).
    yaml_keys = {
        section: {s.key_for(f.name) for f, s in declared(cls)}
        for section, cls in (
            ("limits", config.LimitsConfig),
            ("worker", config.WorkerConfig),
            ("engine", config.EngineConfig),
        )
    }
    generic = errors.hint_for("no-such-kind")
    for kind in FailureKind:
        hint = errors.hint_for(kind)
        assert hint and hint != generic, kind
        assert hint == errors.hint_for(kind.value)
        for key in re.findall(r"`([a-z_]+(?:\.[a-z_]+)?):?`", hint):
            head, _, tail = key.partition(".")
            assert head in sections, key
            if tail:
                assert tail in yaml_keys[head], key
    assert "<id>" in errors.hint_for(FailureKind.ENCRYPTED)
    assert "retry 5" in errors.hint_for("timeout", 5)


# --------------------------------------------------------------------------- logs


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("plain name.pdf", "plain name.pdf"),
        ("Größe 報告.pdf", "Größe 報告.pdf"),
        ("evil\nINFO fake line.pdf", "evil\\nINFO fake line.pdf"),
        ("x\r\x1b[31m.pdf", "x\\r\\x1b[31m.pdf"),
        ("rtl\u202etxt.exe", "rtl\\u202etxt.exe"),
        ("bad\udcffbyte", "bad\\xffbyte"),
        (b"raw\xfe\n", "raw\\xfe\\n"),
        ("back\\slash", "back\\\\slash"),
    ],
)
def test_safe_display(name: str | bytes, shown: str) -> None:
    assert display.safe_display(name) == shown
    assert "\n" not in display.safe_display(name)


def test_safe_display_path() -> None:
    assert display.safe_display(Path("/in/a\nb.pdf")) == "/in/a\\nb.pdf"


def test_write_error_file_refreshes_in_place(tmp_path: Path) -> None:
    held = tmp_path / "failed" / "a.pdf"
    held.parent.mkdir()
    held.write_text("x")
    first = originals.write_error_file(held, error_dict(attempts=1))
    second = originals.write_error_file(held, error_dict(attempts=2, kind="timeout"))
    assert first == second == held.parent / "a.pdf.error.json"
    err = json.loads(second.read_text())
    assert err["attempts"] == 2 and err["kind"] == "timeout" and err["moved_to"] == str(held)
    assert sorted(p.name for p in held.parent.iterdir()) == ["a.pdf", "a.pdf.error.json"]
