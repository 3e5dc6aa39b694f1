"""The `mineru` engine: loading through the production path, every precision, the page
pipeline with canned model outputs, the PDF text-layer fill, and missing weights.

Real MinerU2.5 weights are not available offline; `tests/tinymodel.py` builds a tiny
Qwen2-VL checkpoint in the same file layout whose greedy output is one valid layout line,
so every stage runs on a real (tiny) model.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from daemon.common.errors import EngineUnavailable
from daemon.config.settings import LOSSY_PRECISIONS, EngineConfig, LimitsConfig, Precision
from daemon.document.page import (
    SOURCE_MODEL,
    SOURCE_TEXT_LAYER,
    Block,
    PageInput,
    PageOptions,
    PageText,
    TextLine,
)
from daemon.engines.mineru.engine import Prediction, join_text_lines, run_page
from daemon.engines.mineru.runtimes.transformers_model import auto_precision, resolve_weights
from daemon.engines.registry import create_engine
from daemon.output.formats import content_list, markdown
from daemon.output.formats.middle import PageData, build_middle
from tests.golden import Canned
from tests.tinymodel import TINY_LAYOUT

LAYOUT_PROMPT = "\nLayout Detection:"
TEXT_PROMPT = "\nText Recognition:"
TABLE_PROMPT = "\nTable Recognition:"
FORMULA_PROMPT = "\nFormula Recognition:"


class Progress:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int, str]] = []

    def __call__(self, done: int, total: int, what: str) -> None:
        self.calls.append((done, total, what))


def box(x0: int, y0: int, x1: int, y1: int, kind: str, tail: str = "") -> str:
    """One line of MinerU2.5's layout output (coordinates in 0..1000)."""
    return (
        f"<|box_start|>{x0:03d} {y0:03d} {x1:03d} {y1:03d}<|box_end|>"
        f"<|ref_start|>{kind}<|ref_end|><|rotate_up|>{tail}\n"
    )


class FakeModel:
    """Canned outputs per prompt, in call order; records what the pipeline asked for."""

    def __init__(self, layout: str, outputs: dict[str, list[str]]) -> None:
        self.layout = layout
        self.outputs = {k: list(v) for k, v in outputs.items()}
        self.calls: list[tuple[str, tuple[int, int], int]] = []

    def __call__(self, image: Any, prompt: str, params: Any, cap: int) -> Prediction:
        assert params.max_new_tokens == cap  # every step is capped explicitly
        self.calls.append((prompt, image.size, cap))
        if prompt == LAYOUT_PROMPT:
            return Prediction(self.layout, 40)
        return Prediction(self.outputs[prompt].pop(0), 7)


def run(
    fake: FakeModel,
    *,
    page: PageInput | None = None,
    options: PageOptions | None = None,
    lines: list[TextLine] | None = None,
    progress: Progress | None = None,
) -> Any:
    page = page or PageInput(Image.new("RGB", (2000, 3000), "white"), 0, 1, 200)
    options = options or PageOptions(max_new_tokens_layout=300, max_new_tokens_block=50)
    if lines is not None and options.text_layer == "auto":  # as with_text_layer decides
        page = dataclasses.replace(page, text_layer=PageText(tuple(lines)))
    return run_page(page, options, progress or Progress(), Canned(fake))


PAGE_LAYOUT = (
    box(100, 50, 900, 100, "title")
    + box(100, 120, 900, 300, "text")
    + box(100, 320, 900, 600, "table")
    + box(100, 620, 900, 700, "text", "<|txt_contd_tgt|>")
    + box(300, 720, 700, 780, "equation")
    + box(100, 800, 500, 950, "image")
)
PAGE_OUTPUTS = {
    TEXT_PROMPT: ["Results", "The first part of a para-", "graph continues here."],
    TABLE_PROMPT: ["<fcel>A<fcel>B<nl><fcel>1<fcel>2<nl>"],
    FORMULA_PROMPT: ["E = m c^2"],
}
TABLE_HTML = "<table><tr><td>A</td><td>B</td></tr><tr><td>1</td><td>2</td></tr></table>"


def test_layout_parsing_recognition_and_markdown_are_exact() -> None:
    fake = FakeModel(PAGE_LAYOUT, PAGE_OUTPUTS)
    progress = Progress()
    result = run(fake, progress=progress)

    assert result.blocks == [
        # A title without "#" marks gets its level in the output (document or section).
        Block("title", (0.1, 0.05, 0.9, 0.1), text="Results", angle=0, index=0),
        Block("text", (0.1, 0.12, 0.9, 0.3), text="The first part of a para-", angle=0,
              index=1),
        Block("table", (0.1, 0.32, 0.9, 0.6), html=TABLE_HTML, angle=0, index=2),
        # merge_prev: a paragraph continued after a break
        Block("text", (0.1, 0.62, 0.9, 0.7), text="graph continues here.", angle=0, index=3,
              continues_prev=True),
        Block("equation", (0.3, 0.72, 0.7, 0.78), latex="E = m c^2", angle=0, index=4),
        Block("image", (0.1, 0.8, 0.5, 0.95), angle=0, index=5),
    ]  # fmt: skip
    # The raw answers, for <stem>_model.json: the layout string and every block's answer.
    assert result.model_output is not None
    assert result.model_output["layout"]["raw_output"] == PAGE_LAYOUT
    assert [(b["index"], b["raw_output"]) for b in result.model_output["blocks"]] == [
        (0, "Results"), (1, "The first part of a para-"),
        (2, "<fcel>A<fcel>B<nl><fcel>1<fcel>2<nl>"), (3, "graph continues here."),
        (4, "E = m c^2"),
    ]  # fmt: skip
    # What the outbox gets, through the shipped writers: <stem>.md ...
    middle = build_middle([PageData(page_idx=0, blocks=tuple(result.blocks))])
    assert markdown.markdown(middle) == (
        "# Results\n\nThe first part of a paragraph continues here.\n\n"
        "| A | B |\n| --- | --- |\n| 1 | 2 |\n\n$$\nE = m c^2\n$$\n"
    )
    # ... and <stem>_content_list.json, entry for entry as MinerU writes it
    assert content_list.content_list(middle) == [
        {"type": "text", "text": "Results", "text_level": 1, "bbox": [100, 50, 900, 100],
         "page_idx": 0},
        {"type": "text", "text": "The first part of a para-", "bbox": [100, 120, 900, 300],
         "page_idx": 0},
        {"type": "table", "img_path": "", "table_caption": [], "table_footnote": [],
         "table_body": TABLE_HTML, "bbox": [100, 320, 900, 600], "page_idx": 0},
        {"type": "text", "text": "graph continues here.", "bbox": [100, 620, 900, 700],
         "page_idx": 0},
        {"type": "equation", "img_path": "", "text": "E = m c^2", "text_format": "latex",
         "bbox": [300, 720, 700, 780], "page_idx": 0},
        {"type": "image", "img_path": "", "image_caption": [], "image_footnote": [],
         "bbox": [100, 800, 500, 950], "page_idx": 0},
    ]  # fmt: skip
    # Layout on MinerU's fixed 1036x1036 image; blocks cropped from the full 2000x3000 page.
    assert fake.calls[0] == (LAYOUT_PROMPT, (1036, 1036), 300)
    assert fake.calls[1:] == [
        (TEXT_PROMPT, (1600, 150), 50),
        (TEXT_PROMPT, (1600, 540), 50),
        (TABLE_PROMPT, (1600, 840), 50),
        (TEXT_PROMPT, (1600, 240), 50),
        (FORMULA_PROMPT, (800, 180), 50),
    ]
    assert progress.calls == [
        (0, 1, "layout"),
        (1, 1, "layout"),
        *[(k, 5, "block") for k in range(6)],
    ]
    info = result.info
    assert info["model_blocks"] == 5 and info["text_layer_blocks"] == 0
    assert info["decode_tokens"] == 40 + 5 * 7 and info["layout_decode_tokens"] == 40
    assert info["text_layer"] == "no_pdf" and info["layout_blocks"] == 6
    assert info["truncated_blocks"] == 0 and info["layout_truncated"] is False
    assert all(b.source == SOURCE_MODEL for b in result.blocks)


def test_hitting_the_token_cap_is_reported() -> None:
    fake = FakeModel(box(100, 100, 900, 200, "text"), {TEXT_PROMPT: ["x"]})
    result = run(fake, options=PageOptions(max_new_tokens_layout=40, max_new_tokens_block=7))
    assert result.info["layout_truncated"] is True
    assert result.info["truncated_blocks"] == 1


def test_garbage_layout_output_gives_an_empty_page() -> None:
    result = run(FakeModel("no layout here", {}))
    assert result.blocks == [] and result.info["model_blocks"] == 0


def line(text: str, x0: float, y0: float, x1: float, y1: float) -> TextLine:
    return TextLine(text=text, bbox=(x0, y0, x1, y1), font_size=10.0)


FILL_LAYOUT = (
    box(100, 50, 900, 100, "title")
    + box(100, 120, 900, 300, "text")
    + box(100, 320, 900, 600, "table")
    + box(100, 650, 900, 700, "text")  # no text-layer lines inside: the model reads it
)
FILL_LINES = [
    line("Quarterly report", 0.12, 0.06, 0.5, 0.09),
    line("Revenue grew in every recog-", 0.11, 0.13, 0.89, 0.15),
    line("nition of the market and the", 0.11, 0.16, 0.89, 0.18),
    line("costs fell.", 0.11, 0.19, 0.4, 0.21),
    line("A 1 B 2", 0.2, 0.4, 0.8, 0.42),  # inside the table: never used for the table
]


def pdf_page() -> PageInput:
    return PageInput(
        Image.new("RGB", (1000, 1400), "white"), 0, 1, 100, pdf_path=Path("/nonexistent.pdf")
    )


def test_text_layer_fills_text_blocks_and_sends_the_table_to_the_model() -> None:
    fake = FakeModel(
        FILL_LAYOUT,
        {TABLE_PROMPT: ["<fcel>A<fcel>B<nl><fcel>1<fcel>2<nl>"], TEXT_PROMPT: ["from model"]},
    )
    progress = Progress()
    result = run(fake, page=pdf_page(), lines=FILL_LINES, progress=progress)

    title, text, table, text2 = result.blocks
    assert (title.text, title.source) == ("Quarterly report", SOURCE_TEXT_LAYER)
    assert text.text == "Revenue grew in every recognition of the market and the costs fell."
    assert text.source == SOURCE_TEXT_LAYER
    assert (table.html, table.source) == (TABLE_HTML, SOURCE_MODEL)
    assert (text2.text, text2.source) == ("from model", SOURCE_MODEL)
    assert [c[0] for c in fake.calls] == [LAYOUT_PROMPT, TABLE_PROMPT, TEXT_PROMPT]
    assert result.info["text_layer"] == "used"
    assert result.info["text_layer_blocks"] == 2 and result.info["model_blocks"] == 2
    assert progress.calls[-1] == (2, 2, "block")


def test_untrustworthy_or_disabled_text_layer_sends_everything_to_the_model() -> None:
    outputs = {TABLE_PROMPT: ["<fcel>A<nl>"], TEXT_PROMPT: ["t1", "t2", "t3"]}
    junk = [line("\ufffd" * 40, 0.11, 0.13, 0.89, 0.15)]
    result = run(FakeModel(FILL_LAYOUT, outputs), page=pdf_page(), lines=junk)
    assert result.info["text_layer"] == "untrustworthy"
    assert result.info["model_blocks"] == 4 and result.info["text_layer_blocks"] == 0

    off = PageOptions(text_layer="off")
    result = run(FakeModel(FILL_LAYOUT, outputs), page=pdf_page(), lines=FILL_LINES, options=off)
    assert result.info["text_layer"] == "off" and result.info["model_blocks"] == 4


def test_join_text_lines() -> None:
    assert join_text_lines("a line\nanother") == "a line another"
    assert join_text_lines("hyphen-\nated") == "hyphenated"
    assert join_text_lines("Covid-\n19") == "Covid- 19"  # not a broken word
    assert join_text_lines("") == ""


@pytest.mark.parametrize(
    "precision",
    ["fp32", "bf16", "mixed", "int8", "bf16-int8", "int8-dynamic", "bf16-int8-dynamic", "auto"],
)
def test_tiny_model_runs_every_stage_in_each_precision(
    tiny_model: Path, precision: Precision, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the int8 decoder cache
    engine = create_engine("mineru", EngineConfig(model=str(tiny_model), precision=precision))
    info = engine.load()
    try:
        expected = auto_precision() if precision == "auto" else precision
        assert (info.name, info.model_id, info.precision) == ("mineru", str(tiny_model), expected)
        threads = info.details["threads"]
        assert isinstance(threads, int) and threads >= 1
        bf16_vision = expected in ("bf16", "bf16-int8", "bf16-int8-dynamic")
        assert info.details["dtype_vision"] == ("bfloat16" if bf16_vision else "float32")
        assert info.details["vision_attention"] in ("sdpa", "chunked")
        assert info.details["decoder_attention"] == "grouped"  # load_model routes it
        assert info.details["dtype_decoder"] == {
            "fp32": "float32", "bf16": "bfloat16", "mixed": "bfloat16",
            "int8": "int8-weight-only", "bf16-int8": "int8-weight-only",
            "int8-dynamic": "qint8-dynamic", "bf16-int8-dynamic": "qint8-dynamic",
        }[expected]  # fmt: skip

        progress = Progress()
        page = PageInput(Image.new("RGB", (850, 1100), "white"), 0, 1, 100)
        result = engine.parse_page(page, PageOptions(max_new_tokens_layout=64), progress)
        # The tiny model writes one text block; recognition "reads" the same line back.
        [block] = result.blocks
        assert (block.type, block.bbox, block.angle) == ("text", (0.1, 0.1, 0.9, 0.5), 0)
        assert block.text == TINY_LAYOUT
        assert progress.calls == [(0, 1, "layout"), (1, 1, "layout"), (0, 1, "block"),
                                  (1, 1, "block")]  # fmt: skip
        assert result.info["model_blocks"] == 1
        assert result.info["decode_tokens"] == 2 * 8  # 7 layout tokens + end-of-turn, twice
        seconds = [result.info["layout_seconds"], result.info["recognition_seconds"]]
        assert all(isinstance(s, float) and s > 0 for s in seconds), seconds
    finally:
        engine.close()


def test_tiny_model_with_a_born_digital_pdf_uses_its_text_layer(
    tiny_model: Path, tmp_path: Path
) -> None:
    from daemon.input.raster import render_page
    from daemon.input.sniff import inspect
    from daemon.input.textlayer import with_text_layer
    from tests.docgen import make_text_pdf

    body = [f"Line number {i} of the report body text." for i in range(40)]
    pdf = make_text_pdf(tmp_path / "a.pdf", [body])
    engine = create_engine("mineru", EngineConfig(model=str(tiny_model), precision="fp32"))
    engine.load()
    limits = LimitsConfig()
    doc = inspect(pdf, passwords=(), limits=limits)
    page = render_page(
        pdf, doc, 0, dpi=72, max_long_side=2000, max_image_pixels=limits.max_image_pixels
    )
    assert page.pdf_path == pdf
    page = with_text_layer(page, PageOptions())  # as the worker's pipeline hands it on
    result = engine.parse_page(page, PageOptions(), Progress())
    [block] = result.blocks
    assert block.source == SOURCE_TEXT_LAYER
    assert block.text.startswith("Line number") and "of the report body text." in block.text
    assert result.info["text_layer_blocks"] == 1 and result.info["model_blocks"] == 0


def test_hub_id_loads_from_the_hf_cache(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    from daemon.cli.model import info

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--opendatalab--Tiny-MinerU"
    shutil.copytree(tiny_model, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    weights = resolve_weights("opendatalab/Tiny-MinerU", None)
    assert weights.commit == commit and not weights.local_folder
    facts = info("opendatalab/Tiny-MinerU", None, try_load=True)
    assert facts["available"] and facts["loads"] and facts["commit"] == commit
    assert facts["size_bytes"] > 100_000
    assert facts["image_processor"] == "Qwen2VLImageProcessorPil"


def test_missing_weights_offline_fail_fast_with_the_pull_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    engine = create_engine("mineru", EngineConfig(model="opendatalab/MinerU2.5-2509-1.2B"))
    started = time.monotonic()
    with pytest.raises(EngineUnavailable) as caught:
        engine.load()
    assert time.monotonic() - started < 5
    assert caught.value.hint == "docinbox model pull"
    assert "not in the Hugging Face cache" in caught.value.message

    with pytest.raises(EngineUnavailable) as caught:
        create_engine("mineru", EngineConfig(model=str(tmp_path / "no-such-folder"))).load()
    assert "does not exist" in caught.value.message


def test_top_level_tie_word_embeddings_wins(tiny_model: Path, tmp_path: Path) -> None:
    """mineru-vl-utils' loader fix: the raw config.json flag is copied to the text config."""
    import json

    from daemon.engines.mineru.runtimes.transformers_model import _tied_config

    folder = tmp_path / "tied"
    shutil.copytree(tiny_model, folder)
    raw = json.loads((folder / "config.json").read_text())
    raw["tie_word_embeddings"] = True
    raw["text_config"]["tie_word_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(raw))
    config = _tied_config(folder)
    assert config.tie_word_embeddings is True
    assert config.get_text_config(decoder=True).tie_word_embeddings is True


def tied_checkpoint(tiny_model: Path, folder: Path) -> dict[str, Any]:
    """A copy of the tiny checkpoint stored as MinerU2.5's is: tie_word_embeddings at the top
    level only, and no lm_head tensor. Returns the tensors the copy holds."""
    import json

    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_model, folder)
    raw = json.loads((folder / "config.json").read_text())
    raw["tie_word_embeddings"] = True  # top level only, as in MinerU2.5's config.json
    raw["text_config"].pop("tie_word_embeddings", None)
    (folder / "config.json").write_text(json.dumps(raw))
    (weights_file,) = folder.glob("*.safetensors")
    tensors = load_file(str(weights_file))
    head = [k for k in tensors if k.endswith("lm_head.weight")]
    assert head, "the tiny checkpoint stores an lm_head to drop"
    for k in head:
        del tensors[k]
    save_file(tensors, str(weights_file), metadata={"format": "pt"})
    return tensors


def bf16_checkpoint(tiny_model: Path, folder: Path) -> Any:
    """A copy of the tiny checkpoint stored in bf16, as MinerU2.5 ships; returns the bf16
    model it was saved from."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    shutil.copytree(tiny_model, folder)
    ref = Qwen2VLForConditionalGeneration.from_pretrained(str(folder), dtype=torch.bfloat16)
    ref.save_pretrained(str(folder))
    return ref


def vision_features(visual: Any, pixels: Any, grid: Any) -> Any:
    """The vision tower's output tensor (transformers returns it bare or in a ModelOutput)."""
    import torch

    with torch.inference_mode():
        out = visual(pixels, grid_thw=grid)
    return out if torch.is_tensor(out) else out.pooler_output


def test_a_tied_checkpoint_without_lm_head_loads_with_the_embeddings_as_head(
    tiny_model: Path, tmp_path: Path
) -> None:
    """MinerU2.5 stores no lm_head: it is the input embedding. mineru-vl-utils ships its
    tie fix because transformers 5.x releases have treated such a head as missing and
    initialised it randomly (noise out); whatever transformers is installed, the
    production load must end with the head tied to the stored embeddings."""
    import torch

    from daemon.engines.mineru.runtimes.transformers_model import load_model

    folder = tmp_path / "tied"
    tensors = tied_checkpoint(tiny_model, folder)
    embed_key = next(k for k in tensors if k.endswith("embed_tokens.weight"))

    loaded = load_model(str(folder), None, precision="fp32")
    qwen = loaded.model
    assert qwen.lm_head.weight is qwen.model.language_model.embed_tokens.weight
    assert torch.equal(qwen.lm_head.weight, tensors[embed_key].float())


@pytest.mark.parametrize(
    ("precision", "vision", "decoder"),
    [("fp32", "float32", "float32"), ("mixed", "float32", "bfloat16"),
     ("int8", "float32", "int8-weight-only"), ("bf16", "bfloat16", "bfloat16"),
     ("bf16-int8", "bfloat16", "int8-weight-only"), ("int8-dynamic", "float32", "qint8-dynamic"),
     ("bf16-int8-dynamic", "bfloat16", "qint8-dynamic")],
)
def test_bf16_checkpoint_is_loaded_as_bf16_then_upcast_exactly(
    tiny_model: Path, tmp_path: Path, precision: str, vision: str, decoder: str
) -> None:
    """MinerU2.5 ships bf16 weights: loading them as bf16 and up-casting only what runs in
    fp32 must give exactly the stored values (bf16 -> fp32 is exact), at a lower peak."""
    import torch

    from daemon.engines.mineru.runtimes.transformers_model import load_model, stored_dtype

    folder = tmp_path / "bf16"
    ref = bf16_checkpoint(tiny_model, folder)
    assert stored_dtype(folder) == "bfloat16"
    loaded = load_model(str(folder), None, precision=precision, decoder_cache=tmp_path / "c")
    assert (loaded.dtype_vision, loaded.dtype_decoder) == (vision, decoder)
    got = next(loaded.model.model.visual.parameters())
    assert got.dtype == (torch.bfloat16 if vision == "bfloat16" else torch.float32)
    # Every tensor, not just one: the block-by-block cast releases the checkpoint's file
    # pages as it goes (cast_in_chunks), and no value may change on the way.
    want = ref.state_dict()
    compared = 0
    # Weights packed for oneDNN (packed_linear.py, native bf16 only) are no state: unpacked.
    packed = {
        f"{name}.weight": module.packed.to_dense()
        for name, module in loaded.model.named_modules()
        if isinstance(getattr(module, "packed", None), torch.Tensor)
    }
    for name, tensor in {**loaded.model.state_dict(), **packed}.items():
        if not torch.is_tensor(tensor) or not tensor.is_floating_point() or name not in want:
            continue  # int8's packed weights and scales have no bf16 counterpart
        assert torch.equal(tensor.float(), want[name].float()), name
        compared += 1
    assert compared >= len([n for n in want if n.startswith("model.visual.")])


def test_int8_decoder_is_cached_on_disk_keyed_and_verified(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Quantising happens once per checkpoint revision, torch version and recipe: later
    starts read the prepared layers, after checking them against their manifest."""
    import hashlib
    import json

    import torch
    from safetensors.torch import load_file, save_file

    from daemon.engines.mineru.runtimes.decoder_precision import (
        INT8_HEAD_DTYPE,
        DecoderCache,
        _get,
    )
    from daemon.engines.mineru.runtimes.transformers_model import (
        checkpoint_fingerprint,
        load_model,
        resolve_weights,
    )

    cache = tmp_path / "decoders"
    first = load_model(str(tiny_model), None, precision="int8", decoder_cache=cache)
    [tensors] = cache.glob("*.safetensors")
    [manifest] = cache.glob("*.json")
    name = "model.language_model.layers.0.mlp.down_proj"
    fresh = _get(first.model, name).scales.clone()

    # A second start reads the file: a scale changed in it (and in the manifest that vouches
    # for it) shows up in the loaded model, which re-quantising could not produce.
    flat = load_file(str(tensors))
    flat[f"{name}.s"] = flat[f"{name}.s"] * 2
    save_file(flat, str(tensors))
    facts = json.loads(manifest.read_text())
    facts["size"] = tensors.stat().st_size
    facts["sha256"] = hashlib.sha256(tensors.read_bytes()).hexdigest()
    manifest.write_text(json.dumps(facts))
    second = load_model(str(tiny_model), None, precision="bf16-int8", decoder_cache=cache)
    assert torch.equal(_get(second.model, name).scales, fresh * 2)

    # Damaged bytes (the manifest not updated) are never loaded: quantised again, rewritten.
    data = bytearray(tensors.read_bytes())
    data[-16:] = bytes(16)
    tensors.write_bytes(bytes(data))
    with caplog.at_level("WARNING"):
        third = load_model(str(tiny_model), None, precision="int8", decoder_cache=cache)
    assert "damaged" in caplog.text
    assert torch.equal(_get(third.model, name).scales, fresh)
    facts = json.loads(manifest.read_text())
    assert facts["sha256"] == hashlib.sha256(tensors.read_bytes()).hexdigest()

    # Another checkpoint revision (here: a weight file rewritten) gets its own entry.
    weights = resolve_weights(str(tiny_model), None)
    fingerprint = checkpoint_fingerprint(weights)
    key = DecoderCache.for_checkpoint(cache, fingerprint, "int8", "bfloat16", INT8_HEAD_DTYPE)
    assert key.tensors == tensors
    other = DecoderCache.for_checkpoint(cache, fingerprint + "x", "int8", "bfloat16",
                                        INT8_HEAD_DTYPE)  # fmt: skip
    assert other.key != key.key
    # So does another head recipe (the layers saved differ: the head is one of them or not).
    head = DecoderCache.for_checkpoint(cache, fingerprint, "int8", "bfloat16", None)
    assert head.key != key.key


def test_int8_keeps_a_tied_head_in_bf16_shared_with_the_embeddings(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The int8 recipe quantises the decoder's layers only: the output head stays the
    checkpoint's bf16 matrix, and a tied model's embeddings read that same matrix (one copy,
    not an fp32 one beside it), widened to fp32 as they are looked up."""
    import torch

    from daemon.engines.mineru.runtimes.int8_linear import (
        Int8WeightOnlyLinear,
        KeptEmbedding,
        KeptHead,
    )
    from daemon.engines.mineru.runtimes.transformers_model import load_model

    folder = tmp_path / "tied"
    tied_checkpoint(tiny_model, folder)
    reference = load_model(str(folder), None, precision="fp32").model
    want = reference.lm_head.weight.detach().clone()

    qwen = load_model(str(folder), None, precision="int8", decoder_cache=tmp_path / "c").model
    head, embed = qwen.lm_head, qwen.model.language_model.embed_tokens
    assert isinstance(head, KeptHead) and isinstance(embed, KeptEmbedding)
    assert head.weight.dtype == torch.bfloat16
    assert head.weight.data_ptr() == embed.weight.data_ptr()
    assert torch.equal(head.weight.float(), want.to(torch.bfloat16).float())
    ids = torch.tensor([[1, 2, 3]])
    looked_up = embed(ids)
    assert looked_up.dtype == torch.float32
    assert torch.equal(looked_up, want.to(torch.bfloat16).float()[ids])
    layers = [m for m in qwen.model.language_model.modules() if isinstance(m, torch.nn.Linear)]
    assert not layers, "every decoder layer is int8"
    assert any(isinstance(m, Int8WeightOnlyLinear) for m in qwen.modules())
    # Where bf16 is emulated, several rows go through the widened path (next test).
    from daemon.common.cpus import native_bf16

    assert head.widen_rows == (not native_bf16())


def test_the_bf16_head_widened_for_several_rows_keeps_the_one_row_numerics() -> None:
    """Where bf16 is emulated the head widens its weight slice by slice for calls of several
    rows: the logits are still those of a bf16 GEMM (bf16 inputs, fp32 sums, bf16 logits),
    so a row's logits do not depend on how many rows share the step."""
    import torch

    from daemon.engines.mineru.runtimes.int8_linear import HEAD_SLICE, KeptHead

    generator = torch.Generator().manual_seed(0)
    vocab = 2 * HEAD_SLICE + 77  # two full slices and a partial one
    weight = torch.randn(vocab, 64, generator=generator).to(torch.bfloat16)
    bias = torch.randn(vocab, generator=generator).to(torch.bfloat16)
    x = torch.randn(2, 3, 64, generator=generator)
    head = KeptHead(weight, bias, widen_rows=True)

    several = head(x)
    assert several.shape == (2, 3, vocab) and several.dtype == torch.float32
    one_by_one = torch.stack([torch.cat([head(row[None]) for row in rows]) for rows in x])
    exact = x.to(torch.bfloat16).double() @ weight.double().T + bias.double()
    # Each is the exact value rounded to bf16 (8 significant bits), fp32 sums aside.
    bound = exact.abs() * 2**-7 + 1e-4
    assert ((several.double() - exact).abs() <= bound).all()
    assert ((one_by_one.double() - exact).abs() <= bound).all()
    assert (several == one_by_one).double().mean() > 0.99
    # Without widening (native bf16) the several rows take the bf16 GEMM itself.
    assert torch.equal(KeptHead(weight, bias)(x), torch.nn.functional.linear(
        x.to(torch.bfloat16), weight, bias).float())  # fmt: skip


def test_a_lossy_precision_is_loaded_with_a_warning_and_auto_never_is_one(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from daemon.engines.mineru.runtimes.transformers_model import load_model

    with caplog.at_level("WARNING"):
        load_model(str(tiny_model), None, precision="int8-dynamic")
    assert "engine.precision int8-dynamic is lossy" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        loaded = load_model(str(tiny_model), None, precision="auto", decoder_cache=tmp_path)
    assert loaded.precision not in LOSSY_PRECISIONS and "lossy" not in caplog.text


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_vision_tower_with_inplace_quick_gelu_gives_the_same_bits(
    tiny_model: Path, precision: str
) -> None:
    """The loader swaps the vision MLPs' QuickGELU for an in-place one (a lower peak on
    batches of crops): the tower's output must be bit for bit what transformers computes."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration
    from transformers.activations import QuickGELUActivation

    from daemon.engines.mineru.runtimes.transformers_model import load_model

    loaded = load_model(str(tiny_model), None, precision=precision)
    visual = loaded.model.model.visual
    acts = [type(block.mlp.act).__name__ for block in visual.blocks]
    assert acts and all(name == "InPlaceQuickGELU" for name in acts), acts
    reference = Qwen2VLForConditionalGeneration.from_pretrained(
        str(tiny_model), dtype=visual.dtype, attn_implementation="sdpa"
    ).model.visual
    # The same attention kernel as the loaded tower (load_model picks the faster one here).
    reference.config._attn_implementation = visual.config._attn_implementation
    assert all(type(block.mlp.act) is QuickGELUActivation for block in reference.blocks)
    torch.manual_seed(0)
    grid = torch.tensor([[1, 8, 12], [1, 4, 4]])
    patches = int(sum(int(t * h * w) for t, h, w in grid))
    pixels = torch.randn(patches, 3 * 2 * 14 * 14).to(visual.dtype)
    got = vision_features(visual, pixels, grid)
    assert torch.equal(got, vision_features(reference, pixels, grid))


def test_an_fp32_vision_tower_from_a_bf16_checkpoint_keeps_bf16_weights_same_bits(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Where the vision tower computes in fp32 (int8, mixed, fp32 precisions) from a bf16
    checkpoint, its linear weights stay in bf16 and are widened per call: half the
    memory, and the tower's output is bit for bit that of an fp32 copy."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    from daemon.engines.mineru.runtimes.int8_linear import Bf16StoredLinear
    from daemon.engines.mineru.runtimes.transformers_model import load_model

    folder = tmp_path / "bf16"
    bf16_checkpoint(tiny_model, folder)
    loaded = load_model(str(folder), None, precision="int8", decoder_cache=tmp_path / "c")
    visual = loaded.model.model.visual
    stored = [m for m in visual.modules() if isinstance(m, Bf16StoredLinear)]
    assert stored and not [m for m in visual.modules() if type(m) is torch.nn.Linear]
    assert all(m.weight.dtype == torch.bfloat16 for m in stored)
    assert loaded.dtype_vision == "float32"
    fp32 = Qwen2VLForConditionalGeneration.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="sdpa"
    ).model.visual
    fp32.config._attn_implementation = visual.config._attn_implementation  # the same kernel
    torch.manual_seed(1)
    grid = torch.tensor([[1, 8, 8]])
    pixels = torch.randn(64, 3 * 2 * 14 * 14)
    got = vision_features(visual, pixels, grid)
    assert got.dtype == torch.float32
    assert torch.equal(got, vision_features(fp32, pixels, grid))
