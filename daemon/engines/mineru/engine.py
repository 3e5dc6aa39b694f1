"""The `mineru` engine: MinerU2.5 (Qwen2-VL, 1.2B) with transformers + torch on the CPU.

mineru-vl-utils does MinerU's document logic: prompts, parsing the layout step's output,
cropping block images from the full-resolution page, post-processing (OTSL tables -> HTML,
equation fixes, list/caption handling) and Markdown assembly. This module wraps it and
drives its two steps itself instead of calling `MinerUClient.two_step_extract`, because the
client's transformers backend

- leaves `max_new_tokens` unset (up to 32768 tokens: a degenerate repetition on the CPU
  would run for an hour); we cap the layout step and each block separately, and
- recognises all blocks in one call, so `docinbox status` could not show "block k/K".

Driving the steps also lets born-digital PDFs skip the model for text blocks: after the
layout step, text-like blocks are filled from the PDF's own text layer when it is
trustworthy (see `fill_from_text_layer`), and only tables, equations, images and untrusted
text go to the model.

Where generate() runs is the runtime's business (`runtimes/`: transformers here, a server,
llama.cpp): the engine holds one `Runtime` and asks it for each step of a page as a batch.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from daemon.document.page import (
    EQUATION,
    SOURCE_MODEL,
    SOURCE_TEXT_LAYER,
    TABLE,
    Block,
    EngineInfo,
    Json,
    PageInput,
    PageOptions,
    PageResult,
    ProgressFn,
)
from daemon.engines.mineru.early_blocks import BlockKey, EarlyBlocks, block_key
from daemon.engines.mineru.runtimes.base import (
    BLOCK,
    LAYOUT,
    ClientOptions,
    GenRequest,
    Helper,
    LayoutBlock,
    PageStep,
    Prediction,
    Predictor,
    RowDone,
    Runtime,
    SamplingParams,
    StepKind,
)

if TYPE_CHECKING:
    from daemon.common.estimate import PassTimings
    from daemon.config.settings import EngineConfig
    from daemon.document.page import TextLine

__all__ = ["MinerUEngine", "Prediction", "run_page"]

# Block types a trustworthy PDF text layer fills instead of the model: the ones MinerU 4
# itself takes from the PDF in its `txt` mode (its NOT_EXTRACT_TYPES). List items, side
# notes and index entries still go to the model, as in MinerU: their markers (bullets
# from symbol fonts) come out of text layers wrong. Code is not here (indentation is lost
# in text layers), nor are tables/equations/images (structure, LaTeX and pixels).
TEXT_LIKE_TYPES = frozenset(
    {
        "text",
        "title",
        "doc_title",
        "paragraph_title",
        "ref_text",
        "header",
        "footer",
        "page_number",
        "page_footnote",
        "caption",
        "table_caption",
        "image_caption",
        "code_caption",
        "footnote",
        "table_footnote",
        "image_footnote",
        "phonetic",
    }
)

# Heading depth per title type. MinerU2.5-2509 mostly emits plain `title`.
TITLE_LEVELS = {"doc_title": 1, "title": 1, "paragraph_title": 2}
# Types without text of their own: the output writer renders them (e.g. an image link).
NO_MARKDOWN_TYPES = frozenset({"image", "chart"})

_HEADING_RE = re.compile(r"^(#{1,6})\s+")
_EQ_WRAP_RE = re.compile(r"^\s*\\\[\s*(.*?)\s*\\\]\s*$", re.DOTALL)


@dataclass
class PageStats:
    layout_seconds: float = 0.0
    recognition_seconds: float = 0.0
    text_layer_seconds: float = 0.0
    decode_tokens: int = 0
    layout_decode_tokens: int = 0
    layout_truncated: bool = False
    truncated_blocks: int = 0
    text_layer_blocks: int = 0
    model_blocks: int = 0
    text_layer: str = "off"  # off | no_pdf | used | untrustworthy | error
    # The transformers runtime's decode loop: forward passes of the page's rows (prefills
    # included) and draft tokens scored / confirmed by the model (0 for other runtimes).
    decode_passes: int = 0
    draft_proposed: int = 0
    draft_accepted: int = 0
    extra: dict[str, Json] = field(default_factory=dict)

    def count(self, prediction: Prediction) -> None:
        """One row's tokens and how the decode loop got them."""
        self.decode_tokens += prediction.tokens
        self.decode_passes += prediction.passes
        self.draft_proposed += prediction.drafted
        self.draft_accepted += prediction.accepted

    def as_info(self) -> dict[str, Json]:
        info: dict[str, Json] = dataclasses.asdict(self)
        extra = info.pop("extra")
        assert isinstance(extra, dict)
        info.update(extra)
        for key in ("layout_seconds", "recognition_seconds", "text_layer_seconds"):
            value = info[key]
            assert isinstance(value, float)
            info[key] = round(value, 3)
        return info


def client_defaults() -> dict[str, object]:
    """MinerUClient's own defaults for its helper (prompts, sizes, post-processing flags).

    Read from the signature instead of copied, so the helper we build for tests (without a
    model) and the one the engine gets from a real client stay identical across versions.
    """
    from mineru_vl_utils import MinerUClient as Client

    params = inspect.signature(Client.__init__).parameters
    return {name: p.default for name, p in params.items() if p.default is not p.empty}


def make_helper(**flags: bool) -> Helper:
    """A `MinerUClientHelper` configured exactly as `MinerUClient(backend="transformers")`,
    with `flags` (client options such as `image_analysis`) laid over its defaults."""
    from mineru_vl_utils.mineru_client import MinerUClientHelper

    d = client_defaults()
    names = inspect.signature(MinerUClientHelper.__init__).parameters
    kwargs = {k: v for k, v in d.items() if k in names}
    helper: Helper = MinerUClientHelper(backend="transformers", **{**kwargs, **flags})
    return helper


@dataclass
class ModelFreeClient:
    """MinerUClient's helper, prompts and sampling params without a model: for replaying a
    model's answers through `run_page` (tests, the golden replay, benches)."""

    helper: Helper
    prompts: dict[str, str]
    sampling_params: dict[str, SamplingParams | None]

    @classmethod
    def make(cls, **flags: bool) -> ModelFreeClient:
        d = client_defaults()
        prompts, params = d["prompts"], d["sampling_params"]
        assert isinstance(prompts, dict) and isinstance(params, dict)
        return cls(make_helper(**flags), prompts, params)


def join_text_lines(text: str) -> str:
    """Text-layer lines of one block -> one paragraph, like the model writes it.

    Lines are joined with a space; a word hyphenated at a line end ("recog-" + "nition")
    is rejoined when the next line starts in lower case.
    """
    out = ""
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if not out:
            out = line
        elif re.search(r"[^\W\d_]-$", out) and line[:1].islower():
            out = out[:-1] + line
        else:
            out = f"{out} {line}"
    return out


def fill_from_text_layer(
    blocks: Sequence[LayoutBlock], lines: Sequence[TextLine]
) -> dict[int, str]:
    """Fill text-like blocks from the text-layer lines inside their box.

    Returns {id(block): text} for the blocks that were filled (the caller skips the model
    for those). Blocks whose box holds no text-layer text are left to the model.
    """
    from daemon.input.textlayer import text_in_bbox

    filled: dict[int, str] = {}
    for block in blocks:
        if block.type not in TEXT_LIKE_TYPES:
            continue
        x0, y0, x1, y1 = block.bbox
        text = join_text_lines(text_in_bbox(lines, (x0, y0, x1, y1)))
        if text:
            block.content = text
            filled[id(block)] = text
    return filled


@dataclass
class PageRun:
    """One page on its way through MinerU's two steps: what each step reads and counts."""

    page: PageInput
    options: PageOptions
    progress: ProgressFn
    runtime: Predictor
    stats: PageStats = field(default_factory=PageStats)

    def ask(self, kind: StepKind, requests: list[GenRequest], on_done: RowDone) -> list[Prediction]:
        return self.runtime.predict(PageStep(self.page.page_idx, kind, requests), on_done)


@dataclass(frozen=True)
class Layout:
    """The layout step's answer: the page's blocks, and where each stood in the answer."""

    blocks: list[LayoutBlock]
    index: dict[int, int]  # id(block) -> its line in the layout answer (MinerU names crops so)
    prompt: str
    raw: str
    early: EarlyBlocks  # blocks the runtime recognised while the layout was being written


def run_page(
    page: PageInput, options: PageOptions, progress: ProgressFn, runtime: Predictor
) -> PageResult:
    """One page through MinerU's two steps. Model-free apart from `runtime.predict`.

    Separated from the engine class so tests can drive the parsing, text-layer fill,
    post-processing and mapping with canned model outputs: `runtime` is any `Predictor`.
    """
    run = PageRun(page, options, progress, runtime)
    layout = layout_step(run)
    filled = text_layer_step(run, layout.blocks)
    answers, filled = block_step(run, layout, filled)
    # MinerU's post-processing, then our Blocks.
    processed = runtime.client.helper.post_process(layout.blocks)
    for block in processed:
        # MinerU's text fixers target model LaTeX/Markdown; text-layer text stays verbatim.
        if id(block) in filled:
            block.content = filled[id(block)]
    model_output: dict[str, Json] = {
        "page_size": list(page.image.size),
        "layout": {"prompt": layout.prompt, "raw_output": layout.raw},
        "blocks": answers,
        "text_layer_blocks": [
            {"index": layout.index[key], "text": text} for key, text in filled.items()
        ],
    }
    return PageResult(
        blocks=to_blocks(processed, set(filled), layout.index),
        info=run.stats.as_info(),
        model_output=model_output,
    )


def layout_step(run: PageRun) -> Layout:
    """Step 1: the layout, on the page resized to MinerU's fixed 1036x1036."""
    client, stats, cap = run.runtime.client, run.stats, run.options.max_new_tokens_layout
    run.progress(0, 1, "layout")
    t0 = time.monotonic()
    prompt = client.prompts.get("[layout]") or client.prompts["[default]"]
    params = client.sampling_params.get("[layout]") or client.sampling_params.get("[default]")
    early = EarlyBlocks(lambda text: early_jobs(run, text))
    layout_image = client.helper.prepare_for_layout(run.page.image)
    request = GenRequest(layout_image, prompt, params, cap, early=early)
    (out,) = run.ask(LAYOUT, [request], lambda _row: None)
    blocks = client.helper.parse_layout_output(out.text)
    stats.layout_seconds = time.monotonic() - t0
    stats.layout_decode_tokens = out.tokens
    stats.count(out)
    stats.layout_truncated = out.tokens >= cap
    stats.extra["layout_blocks"] = len(blocks)
    run.progress(1, 1, "layout")
    return Layout(blocks, {id(b): i for i, b in enumerate(blocks)}, prompt, out.text, early)


def early_jobs(run: PageRun, text: str) -> list[tuple[GenRequest, BlockKey]]:
    """The block step's requests for a layout text so far (early_blocks.py): its blocks,
    filled from the text layer as the text-layer step would, cropped as the block step
    does. Runs on the runtime's model thread, between decode passes."""
    blocks = run.runtime.client.helper.parse_layout_output(text)
    filled = text_layer_fill(run.page, blocks)[0] if blocks else {}
    return [(request, block_key(blocks[idx])) for request, idx in block_jobs(run, blocks, filled)]


def text_layer_step(run: PageRun, blocks: list[LayoutBlock]) -> dict[int, str]:
    """Born-digital PDFs: text-like blocks filled from the page's own text layer."""
    stats = run.stats
    if run.page.text_layer is None:
        if run.options.text_layer == "auto" and run.page.pdf_path is None:
            stats.text_layer = "no_pdf"  # nothing to read: an image
        return {}
    t1 = time.monotonic()
    filled, stats.text_layer = text_layer_fill(run.page, blocks)
    stats.text_layer_seconds = time.monotonic() - t1
    return filled


def text_layer_fill(page: PageInput, blocks: list[LayoutBlock]) -> tuple[dict[int, str], str]:
    """The text-layer step's fill of `blocks` ({id(block): text}) and how the layer was
    taken (used | untrustworthy | error; off without one)."""
    text_layer = page.text_layer
    if text_layer is None:
        return {}, "off"
    if text_layer.error is not None:
        # A broken text layer on a page that rendered fine: the pixels still work.
        return {}, "error"
    from daemon.input.textlayer import text_layer_is_trustworthy

    if text_layer_is_trustworthy(text_layer.lines):
        return fill_from_text_layer(blocks, text_layer.lines), "used"
    return {}, "untrustworthy"


def block_step(
    run: PageRun, layout: Layout, filled: dict[int, str]
) -> tuple[list[Json], dict[int, str]]:
    """Step 2: each block the text layer did not fill, cropped from the full-resolution
    page and recognised; the model's answers, and the filled blocks that are still there."""
    stats, cap = run.stats, run.options.max_new_tokens_block
    blocks = layout.blocks
    t2 = time.monotonic()
    jobs = block_jobs(run, blocks, filled)
    # prepare_for_extract drops captions that sit inside an image (MinerU reads those with
    # the image); forget any we filled so the counts stay true.
    alive = {id(b) for b in blocks}
    filled = {key: text for key, text in filled.items() if key in alive}
    total, done = len(jobs), 0

    def block_done(_row: int) -> None:
        # Rows of a batch finish at different steps: count them as they finish, so
        # `docinbox status` moves block by block even while a batch is decoding.
        nonlocal done
        done += 1
        run.progress(done, total, "block")

    run.progress(0, total, "block")
    # Blocks recognised while the layout was written, where the request is the same.
    early = [layout.early.take(request, block_key(blocks[idx])) for request, idx in jobs]
    for _prediction in filter(None, early):
        block_done(-1)
    late = [request for (request, _idx), got in zip(jobs, early, strict=True) if got is None]
    asked = iter(run.ask(BLOCK, late, block_done))
    results = [got if got is not None else next(asked) for got in early]
    stats.extra["early_blocks"] = total - len(late)
    answers: list[Json] = []
    for (request, idx), result in zip(jobs, results, strict=True):
        block = blocks[idx]
        block.content = result.text
        answers.append({"index": layout.index[id(block)], "type": block.type,
                        "prompt": request.prompt, "raw_output": result.text})
        stats.count(result)
        stats.truncated_blocks += int(result.tokens >= cap)
    stats.recognition_seconds = time.monotonic() - t2
    stats.model_blocks = total
    stats.text_layer_blocks = len(filled)
    return answers, filled


def block_jobs(
    run: PageRun, blocks: list[LayoutBlock], filled: dict[int, str]
) -> list[tuple[GenRequest, int]]:
    """The block step's requests: each block the text layer did not fill, cropped from the
    full-resolution page by MinerU's helper (which may drop blocks from `blocks`), with its
    index in `blocks`."""
    helper, cap = run.runtime.client.helper, run.options.max_new_tokens_block
    images, prompts, params, indices = helper.prepare_for_extract(run.page.image, blocks)
    return [
        (GenRequest(image, prompt, param, cap, draft_text(run.page, blocks[idx])), idx)
        for image, prompt, param, idx in zip(images, prompts, params, indices, strict=True)
        if id(blocks[idx]) not in filled
    ]


# Blocks whose answer is not the text inside them: a table's OTSL, a formula's LaTeX, an
# image's description. The text layer's words would be a draft the model keeps rejecting.
NO_DRAFT_TYPES = frozenset({TABLE, EQUATION, *NO_MARKDOWN_TYPES})


def draft_text(page: PageInput, block: LayoutBlock) -> str | None:
    """The page's text layer inside a block left to the model (one `text_layer_step` could
    not fill: an untrustworthy layer, or a type it does not fill alone, such as list items
    and code), as the text-layer fill reads it: a draft the decode loop lets the model
    confirm (lossless: a wrong draft costs positions, never text). None: nothing to offer."""
    layer = page.text_layer
    if layer is None or layer.error is not None or not layer.lines:
        return None
    if block.type in NO_DRAFT_TYPES:
        return None
    from daemon.input.textlayer import text_in_bbox

    x0, y0, x1, y1 = block.bbox
    return join_text_lines(text_in_bbox(layer.lines, (x0, y0, x1, y1))) or None


def to_blocks(
    content_blocks: Sequence[LayoutBlock],
    text_layer_ids: set[int],
    layout_index: dict[int, int] | None = None,
) -> list[Block]:
    """Map post-processed ContentBlocks to our Blocks, one for one, in reading order.

    The flat MinerU vocabulary is kept (captions, list items as text inside a list box,
    furniture); the output formats group it as MinerU's renderers do. Equations lose the
    `\\[ \\]` post-processing added, tables keep their HTML, images and charts keep the
    model's description or data as text with its class as `sub_type`. `layout_index` maps
    id(block) to its line in the layout answer, which MinerU names crops after.
    """
    blocks: list[Block] = []
    for position, cb in enumerate(content_blocks):
        content: str = cb.content or ""
        x0, y0, x1, y1 = (float(v) for v in cb.bbox)
        text, text_level = content, 0
        html: str | None = None
        latex: str | None = None
        if cb.type == TABLE:
            is_html = content.lstrip().lower().startswith("<table")
            html = content if is_html else None
            text = "" if is_html else content
        elif cb.type == EQUATION:
            match = _EQ_WRAP_RE.match(content)
            latex = match.group(1) if match else content.strip()
            text = ""
        elif cb.type in TITLE_LEVELS:
            # A level only when the model wrote one ("## ..."); otherwise the output
            # decides between document title and section title as MinerU does.
            heading = _HEADING_RE.match(content)
            text_level = len(heading.group(1)) if heading else 0
            text = content[heading.end() :] if heading else content
        sub_type = cb.get("sub_type")
        blocks.append(
            Block(
                type=cb.type,
                bbox=(x0, y0, x1, y1),
                text=text,
                text_level=text_level,
                html=html,
                latex=latex,
                angle=cb.angle,
                source=SOURCE_TEXT_LAYER if id(cb) in text_layer_ids else SOURCE_MODEL,
                sub_type=str(sub_type) if sub_type else None,
                index=(layout_index or {}).get(id(cb), position),
                continues_prev=bool(cb.get("merge_prev", False)),
            )
        )
    return blocks


def route_loguru_to_logging() -> None:
    """Send mineru-vl-utils' loguru messages to stdlib logging (logger "mineru_vl_utils").

    loguru's default sink prints everything from DEBUG up to stderr, including the raw
    layout output of every page; the worker's logging config should decide instead.
    Only this worker process uses loguru, so replacing its sinks has no other effect.
    """
    from loguru import logger as loguru_logger

    std = logging.getLogger("mineru_vl_utils")

    def sink(message: Any) -> None:  # Any: loguru's Message, untyped here
        record = message.record
        # loguru's level numbers match stdlib's for DEBUG/INFO/WARNING/ERROR/CRITICAL.
        std.log(record["level"].no, "%s", record["message"])

    loguru_logger.remove()
    loguru_logger.add(sink, level="DEBUG", format="{message}")


class MinerUEngine:
    """Engine `mineru`. Constructed with the engine config; `load()` once per worker.

    `engine.runtime` decides where generation runs (`open_runtime`); everything else, from
    the layout step to the block mapping, is this module's and the same for all.
    """

    name = "mineru"

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._runtime: Runtime | None = None
        # Pages the worker may run through parse_page at once, each in its own thread: a
        # server batches concurrent requests (its own bound); the in-process runtimes take
        # engine.page_batch pages, whose model steps then share batches (transformers) or
        # slots (llama-cpp). The loaded runtime says which.
        self.max_pages_in_flight = max(1, config.page_batch)

    @property
    def runtime(self) -> Runtime:
        """The loaded runtime (for tests and benches that look inside it)."""
        if self._runtime is None:
            raise RuntimeError("MinerUEngine.runtime before load()")
        return self._runtime

    def load(self) -> EngineInfo:
        route_loguru_to_logging()
        runtime = open_runtime(self.config)
        self._runtime = runtime
        self.max_pages_in_flight = runtime.max_pages_in_flight
        info = runtime.info
        return EngineInfo(
            name=self.name,
            model_id=info.model,
            revision=info.revision,
            precision=info.precision,
            details={
                "runtime": info.runtime,
                "server": info.server,
                "model": info.model,
                **info.details,
            },
        )

    def coming_page(self) -> AbstractContextManager[None]:
        """Around bringing one page to `parse_page` (the worker renders it inside): a runtime
        that batches pages (transformers) waits for it before its next layout batch."""
        return self._runtime.coming_page() if self._runtime is not None else nullcontext()

    def parse_page(self, page: PageInput, options: PageOptions, progress: ProgressFn) -> PageResult:
        """One page. Thread-safe for every runtime: the helper keeps no per-page state and
        every runtime's predict() may be called from several page threads."""
        runtime = self._runtime
        if runtime is None:
            raise RuntimeError("MinerUEngine.parse_page() before load()")
        with runtime.page():
            return run_page(page, options, progress, runtime)

    def time_passes(self) -> PassTimings | None:
        """The page estimate's passes, timed on the loaded model; None where the model is
        not here to time (a server, llama.cpp)."""
        from daemon.common.estimate import PassTimings

        timer = getattr(self._runtime, "time_passes", None)
        timings = timer() if callable(timer) else None
        return timings if isinstance(timings, PassTimings) else None

    def close(self) -> None:
        if self._runtime is not None:
            self._runtime.close()
            # Dropping the reference is enough: the worker process exits or recycles soon.
            self._runtime = None


def open_runtime(config: EngineConfig) -> Runtime:
    """The runtime `engine.runtime` names, loaded: the model, the server, or the GGUF pair."""
    if config.runtime == "transformers":
        from daemon.engines.mineru.runtimes.transformers import TransformersRuntime

        return TransformersRuntime(config, client_options())
    if config.runtime == "http":
        from daemon.engines.mineru.runtimes.http import HttpRuntime

        return HttpRuntime(config.http, client_options())
    if config.runtime == "llama-cpp":
        from daemon.common.cpus import resolve_threads
        from daemon.engines.mineru.runtimes.llama_cpp import LlamaCppRuntime

        threads = resolve_threads(config.llama_cpp.threads or config.threads)
        return LlamaCppRuntime(
            config.model, config.llama_cpp, threads, client_options(), page_batch=config.page_batch
        )
    raise ValueError(f"unknown engine.runtime {config.runtime!r}")


def client_options() -> ClientOptions:
    """MinerUClient flags, the same for every runtime so every runtime gives the same output.

    mineru-vl-utils' defaults: no image analysis, no formula wrapping in tables. MinerU 4
    itself turns both on for MinerU2.5-Pro (see docs/scale-out.md, "Which model"); the
    output side follows MinerU's renderers for the blocks the defaults produce.
    """
    return {}
