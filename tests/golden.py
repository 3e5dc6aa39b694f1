"""Replays MinerU 4.0.12's canned model answers through docinbox's `mineru` engine path.

`../shared/golden/mineru-4.0.12/` holds what MinerU itself wrote for four corpus PDFs when
its MinerU2.5 two-step path ran with the model answered from `canned_model_output.json`
(see that folder's README). This module runs the same PDF pages through docinbox: the
page rendered at 200 DPI, `run_page` with every model call answered from the same raw
strings, the worker's crop step, and the output formats, and returns the files docinbox
would write, so the golden tests can compare them field by field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemon.config.settings import LimitsConfig
from daemon.document.page import PageOptions, TextLayer, no_progress
from daemon.engines.mineru.engine import ModelFreeClient, Prediction, run_page
from daemon.engines.mineru.runtimes.base import (
    MinerUClient,
    PageStep,
    RowDone,
    SamplingParams,
    capped,
    in_turn,
)
from daemon.input import raster
from daemon.input.sniff import inspect as inspect_document
from daemon.input.textlayer import with_text_layer
from daemon.output.formats.middle import PageData
from daemon.output.publish import DocumentFiles, document_files
from daemon.worker.crops import finish_page

# ../shared relative to the repository root, as every test that uses shared material.
SHARED = Path(__file__).resolve().parents[1].parent / "shared"
GOLDEN = SHARED / "golden" / "mineru-4.0.12"
CORPUS = SHARED / "corpus" / "pdf"
FIXTURES = ("docling__2305.03393v1-pg9", "docling__code_and_formula",
            "docling__picture_classification", "docling__redp5110_sampled")
VARIANTS: dict[str, TextLayer] = {"advanced_ocr": "off", "advanced_auto": "auto"}

# MinerU 4's client flags at tier `advanced` (its `_create_model`): image analysis on,
# formula wrapping in tables on, no cross-page table merge.
MINERU_ADVANCED_FLAGS = {"image_analysis": True, "enable_table_formula_eq_wrap": True,
                         "enable_cross_page_table_merge": False}


def available() -> bool:
    return GOLDEN.is_dir() and CORPUS.is_dir()


# answer(image, prompt, params with the cap set, cap) -> Prediction
Answer = Callable[[Any, str, SamplingParams, int], Prediction]


class Canned:
    """A `Predictor` that answers each request in turn, from `answer`: the engine's page
    function runs on it as on a runtime, without a model."""

    def __init__(self, answer: Answer, client: MinerUClient | None = None) -> None:
        self.answer = answer
        self.client: MinerUClient = client or ModelFreeClient.make()

    def predict(self, step: PageStep, on_done: RowDone) -> list[Prediction]:
        return in_turn(
            lambda r: self.answer(
                r.image, r.prompt, capped(r.params, r.max_new_tokens), r.max_new_tokens
            ),
            step.requests,
            on_done,
        )


class CannedModel:
    """Answers layout and block requests from the canned raw outputs, in request order.

    A block request must match the next canned request's prompt and crop size: that our
    crop of the 200-DPI page is the one MinerU sent is part of what is being checked.
    """

    def __init__(self, page: dict[str, Any], fallback: dict[str, Any]) -> None:
        self.layout = str(page["vlm_layout_raw_output"])
        self.answers = {int(b["layout_index"]): b for b in page["vlm_blocks"]}
        # MinerU's auto mode does not ask for text it takes from the PDF; docinbox may
        # (a block its text layer left empty): the OCR run has every block's answer.
        self.fallback = {int(b["layout_index"]): b for b in fallback["vlm_blocks"]}
        self.asked: list[tuple[int, tuple[int, int], tuple[int, int]]] = []
        self.queue = sorted({**self.fallback, **self.answers}.items())

    def predict(self, image: Any, prompt: str, params: Any, max_new_tokens: int) -> Prediction:
        if "Layout" in prompt:
            return Prediction(self.layout, 1)
        for i, (index, answer) in enumerate(self.queue):
            if answer["prompt"] == prompt and tuple(answer["crop_size"]) == tuple(image.size):
                del self.queue[i]
                self.asked.append((index, tuple(answer["crop_size"]), tuple(image.size)))
                return Prediction(str(answer["raw_output"]), 1)
        raise AssertionError(f"no canned answer for a {image.size} crop asked with {prompt!r}")


@dataclass
class Replay:
    files: dict[str, bytes]
    name: str
    golden: Path  # MinerU's parse_result folder

    def json(self, suffix: str) -> Any:
        return json.loads(self.files[f"{self.name}{suffix}"])


def replay(stem: str, variant: str) -> Replay:
    canned = json.loads((GOLDEN / stem / variant / "canned_model_output.json").read_text())
    ocr = json.loads((GOLDEN / stem / "advanced_ocr" / "canned_model_output.json").read_text())
    pdf = CORPUS / f"{stem}.pdf"
    info = inspect_document(pdf, passwords=(), limits=LimitsConfig())
    client = ModelFreeClient.make(**MINERU_ADVANCED_FLAGS)
    options = PageOptions(text_layer=VARIANTS[variant], dpi=200)
    pages: list[PageData] = []
    crops: dict[str, bytes] = {}
    model: list[dict[str, Any]] = []
    previous = raster.RENDERER
    raster.RENDERER = "pdfium"  # MinerU renders with PDFium (pypdfium2)
    try:
        for page_json, ocr_json in zip(canned["pages"], ocr["pages"], strict=True):
            page = raster.render_page(pdf, info, int(page_json["page_idx"]), dpi=200,
                                      max_long_side=100_000, max_image_pixels=10**9)
            canned_model = CannedModel(page_json, ocr_json)
            runtime = Canned(canned_model.predict, client)
            result = run_page(with_text_layer(page, options), options, no_progress, runtime)
            result = finish_page(page, result)
            pages.append(PageData(page_idx=page.page_idx, blocks=tuple(result.blocks),
                                  crop_names=frozenset(c.name for c in result.crops),
                                  size_pt=page.page_size_pt))
            crops.update({c.name: c.jpeg for c in result.crops})
            model.append({"page_idx": page.page_idx, "engine": "mineru",
                          **(result.model_output or {})})
    finally:
        raster.RENDERER = previous
    doc = DocumentFiles(pages=pages, meta={"sha256": canned["pdf_sha256"]}, crops=crops,
                        model=model, page_count=info.page_count, file_suffix="pdf",
                        engine="mineru")
    return Replay(document_files(stem, doc), stem, GOLDEN / stem / variant / "parse_result")
