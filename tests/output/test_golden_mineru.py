"""docinbox's `mineru` path gives MinerU 4.0.12's own output for the same model answers.

Every fixture of `../shared/golden/mineru-4.0.12/` in both variants (`advanced_ocr` =
`text_layer: off`, `advanced_auto` = `text_layer: auto`) is replayed through the engine's
page function, the worker's crop step and the output formats (tests/golden.py). The
remaining, documented differences (docs/output-format.md) are undone here explicitly and
only here: MinerU's bold runs from the PDF in auto mode, and its Magika code language.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from PIL import Image

from tests import golden

pytestmark = pytest.mark.skipif(not golden.available(), reason="shared golden fixtures absent")

CASES = [(stem, variant) for stem in golden.FIXTURES for variant in golden.VARIANTS]


@pytest.fixture(scope="module")
def replays() -> dict[tuple[str, str], golden.Replay]:
    return {case: golden.replay(*case) for case in CASES}


def _no_bold(value: Any) -> Any:
    """MinerU's auto mode adds the PDF's bold runs as **...** (not done by docinbox)."""
    if isinstance(value, str):
        return value.replace("**", "")
    if isinstance(value, list):
        return [_no_bold(v) for v in value]
    if isinstance(value, dict):
        return {k: _no_bold(v) for k, v in value.items()}
    return value


def _v2_no_style(items: Any) -> Any:
    """v2 spans: MinerU splits bold runs into their own styled spans; join them back."""
    if isinstance(items, list) and items and all(
        isinstance(s, dict) and s.get("type") == "text" and set(s) <= {"type", "content", "style"}
        for s in items
    ):
        return [{"type": "text", "content": "".join(s["content"] for s in items)}]
    if isinstance(items, list):
        return [_v2_no_style(v) for v in items]
    if isinstance(items, dict):
        return {k: _v2_no_style(v) for k, v in items.items()}
    return items


def _mineru(replay: golden.Replay, name: str) -> Any:
    return json.loads((replay.golden / name).read_text(encoding="utf-8"))


def _same_block(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert ours.keys() == theirs.keys(), (ours, theirs)
    for key in ours:
        if key == "bbox":
            assert all(abs(a - b) <= 2 for a, b in zip(ours[key], theirs[key], strict=True)), (
                ours, theirs)
        else:
            assert ours[key] == theirs[key], (key, ours[key], theirs[key])


@pytest.mark.parametrize(("stem", "variant"), CASES)
def test_content_list_v1_equals_mineru(
    replays: dict[tuple[str, str], golden.Replay], stem: str, variant: str
) -> None:
    replay = replays[(stem, variant)]
    ours = replay.json("_content_list.json")
    theirs = _no_bold(_mineru(replay, f"{stem}_content_list.json"))
    assert [b["type"] for b in ours] == [b["type"] for b in theirs]
    for mine, reference in zip(ours, theirs, strict=True):
        _same_block(mine, reference)


@pytest.mark.parametrize(("stem", "variant"), CASES)
def test_content_list_v2_equals_mineru(
    replays: dict[tuple[str, str], golden.Replay], stem: str, variant: str
) -> None:
    replay = replays[(stem, variant)]
    ours = replay.json("_content_list_v2.json")
    theirs = _v2_no_style(_mineru(replay, f"{stem}_content_list_v2.json"))
    assert len(ours) == len(theirs)
    for our_page, their_page in zip(ours, theirs, strict=True):
        assert [i["type"] for i in our_page] == [i["type"] for i in their_page]
        for mine, reference in zip(our_page, their_page, strict=True):
            if mine["type"] == "code":  # MinerU guesses the language with Magika
                reference = {**reference, "content": {**reference["content"],
                                                      "code_language": "txt"}}
            _same_block(mine, reference)


def _normalised_markdown(text: str) -> str:
    text = re.sub(r"^```[A-Za-z0-9_.+#-]+$", "```txt", text, flags=re.MULTILINE)
    return re.sub(r"\s+", " ", text).strip()


@pytest.mark.parametrize(("stem", "variant"), CASES)
def test_markdown_equals_mineru(
    replays: dict[tuple[str, str], golden.Replay], stem: str, variant: str
) -> None:
    replay = replays[(stem, variant)]
    ours = replay.files[f"{stem}.md"].decode("utf-8")
    theirs = _no_bold((replay.golden / "markdown.md").read_text(encoding="utf-8"))
    assert _normalised_markdown(ours) == _normalised_markdown(theirs)


@pytest.mark.parametrize(("stem", "variant"), CASES)
def test_crops_are_mineru_s_files(
    replays: dict[tuple[str, str], golden.Replay], stem: str, variant: str
) -> None:
    replay = replays[(stem, variant)]
    ours = {
        k.removeprefix("images/"): v for k, v in replay.files.items() if k.startswith("images/")
    }
    theirs = {p.name: p for p in (replay.golden / "images").iterdir()}
    assert sorted(ours) == sorted(theirs)
    for name, jpeg in ours.items():
        with Image.open(io.BytesIO(jpeg)) as mine, Image.open(theirs[name]) as reference:
            assert mine.format == "JPEG"
            assert abs(mine.width - reference.width) <= 3, name
            assert abs(mine.height - reference.height) <= 3, name


@pytest.mark.parametrize(("stem", "variant"), CASES)
def test_middle_json_maps_boxes_back_to_the_pdf(
    replays: dict[tuple[str, str], golden.Replay], stem: str, variant: str
) -> None:
    replay = replays[(stem, variant)]
    ours = replay.json("_middle.json")
    theirs = _mineru(replay, "middle_json.json")
    assert ours["schema"] == theirs["schema"] and ours["schema_version"] == theirs["schema_version"]
    mine = ours["extensions"]["docvortex_layout"]["pages"]
    reference = theirs["extensions"]["docvortex_layout"]["pages"]
    assert [p["page_idx"] for p in mine] == [p["page_idx"] for p in reference]
    for a, b in zip(mine, reference, strict=True):
        assert abs(a["width_pt"] - b["width_pt"]) < 0.01
        assert abs(a["height_pt"] - b["height_pt"]) < 0.01
    # Same top-level blocks, types and layout indices, page by page.
    for a, b in zip(ours["pages"], theirs["pages"], strict=True):
        assert [(x["type"], x["index"]) for x in a["blocks"]] == [
            (x["type"], x["index"]) for x in b["blocks"]
        ]


@pytest.mark.parametrize(("stem", "variant"), CASES)
def test_model_json_holds_the_raw_answers(
    replays: dict[tuple[str, str], golden.Replay], stem: str, variant: str
) -> None:
    replay = replays[(stem, variant)]
    ours = replay.json("_model.json")
    canned = json.loads((golden.GOLDEN / stem / variant / "canned_model_output.json").read_text())
    assert [p["page_idx"] for p in ours] == [p["page_idx"] for p in canned["pages"]]
    for mine, page in zip(ours, canned["pages"], strict=True):
        assert mine["layout"]["raw_output"] == page["vlm_layout_raw_output"]
        answered = {b["index"]: b["raw_output"] for b in mine["blocks"]}
        for block in page["vlm_blocks"]:
            if block["layout_index"] in answered:
                assert answered[block["layout_index"]] == block["raw_output"]
