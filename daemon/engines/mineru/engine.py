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

Model loading and precision live in `mineru_model.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
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
from daemon.engines.mineru.runtimes.base import (
    GenRequest,
    Prediction,
    PredictManyFn,
    RowDone,
    Runtime,
    capped,
)
from daemon.engines.mineru.runtimes.transformers_generate import (
    BLOCK,
    LAYOUT,
    BatchedGenerator,
    PageBatcher,
)

if TYPE_CHECKING:
    from daemon.config.settings import EngineConfig
    from daemon.document.page import TextLine
    from daemon.engines.mineru.runtimes.transformers_model import LoadedModel

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


# predict(image, prompt, sampling_params, max_new_tokens) -> Prediction
PredictFn = Callable[[Any, str, Any, int], Prediction]


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
    extra: dict[str, Any] = field(default_factory=dict)

    def as_info(self) -> dict[str, Any]:
        info = dataclasses.asdict(self)
        info.update(info.pop("extra"))
        for key in ("layout_seconds", "recognition_seconds", "text_layer_seconds"):
            info[key] = round(info[key], 3)
        return info


def client_defaults() -> dict[str, Any]:
    """MinerUClient's own defaults for its helper (prompts, sizes, post-processing flags).

    Read from the signature instead of copied, so the helper we build for tests (without a
    model) and the one the engine gets from a real client stay identical across versions.
    """
    from mineru_vl_utils import MinerUClient

    params = inspect.signature(MinerUClient.__init__).parameters
    return {name: p.default for name, p in params.items() if p.default is not p.empty}


def make_helper() -> Any:
    """A `MinerUClientHelper` configured exactly as `MinerUClient(backend="transformers")`."""
    from mineru_vl_utils.mineru_client import MinerUClientHelper

    d = client_defaults()
    names = inspect.signature(MinerUClientHelper.__init__).parameters
    kwargs = {k: v for k, v in d.items() if k in names}
    return MinerUClientHelper(backend="transformers", **kwargs)


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


def fill_from_text_layer(blocks: Sequence[Any], lines: Sequence[TextLine]) -> dict[int, str]:
    """Fill text-like blocks from the text-layer lines inside their box.

    Returns {id(block): text} for the blocks that were filled (the caller skips the model
    for those). Blocks whose box holds no text-layer text are left to the model.
    """
    from daemon.input.textlayer import text_in_bbox

    filled: dict[int, str] = {}
    for block in blocks:
        if block.type not in TEXT_LIKE_TYPES:
            continue
        text = join_text_lines(text_in_bbox(lines, tuple(block.bbox)))
        if text:
            block.content = text
            filled[id(block)] = text
    return filled


def run_page(
    page: PageInput,
    options: PageOptions,
    progress: ProgressFn,
    *,
    helper: Any,
    prompts: dict[str, str],
    sampling_params: dict[str, Any],
    predict: PredictFn,
    predict_many: PredictManyFn | None = None,
) -> PageResult:
    """One page through MinerU's two steps. Model-free apart from `predict`/`predict_many`.

    Separated from the engine class so tests can drive the parsing, text-layer fill,
    post-processing and mapping with canned model outputs. `predict_many` recognises all
    blocks of the page in one call (batched, or concurrently, as the runtime sees fit) and
    reports each finished block; without it the blocks go through `predict` one by one.
    """
    stats = PageStats()
    image = page.image

    # --- step 1: layout on the page resized to MinerU's fixed 1036x1036.
    progress(0, 1, "layout")
    t0 = time.monotonic()
    layout_image = helper.prepare_for_layout(image)
    layout_prompt = prompts.get("[layout]") or prompts["[default]"]
    layout_params = sampling_params.get("[layout]") or sampling_params.get("[default]")
    out = predict(
        layout_image,
        layout_prompt,
        capped(layout_params, options.max_new_tokens_layout),
        options.max_new_tokens_layout,
    )
    blocks = helper.parse_layout_output(out.text)
    layout_index = {id(b): i for i, b in enumerate(blocks)}
    stats.layout_seconds = time.monotonic() - t0
    stats.layout_decode_tokens = out.tokens
    stats.decode_tokens += out.tokens
    stats.layout_truncated = out.tokens >= options.max_new_tokens_layout
    stats.extra["layout_blocks"] = len(blocks)
    progress(1, 1, "layout")

    # --- text-layer fill for born-digital PDFs.
    filled: dict[int, str] = {}
    if page.text_layer is not None:
        t1 = time.monotonic()
        if page.text_layer.error is not None:
            # A broken text layer on a page that rendered fine: the pixels still work.
            stats.text_layer = "error"
        else:
            from daemon.input.textlayer import text_layer_is_trustworthy

            lines = page.text_layer.lines
            if text_layer_is_trustworthy(lines):
                filled = fill_from_text_layer(blocks, lines)
                stats.text_layer = "used"
            else:
                stats.text_layer = "untrustworthy"
        stats.text_layer_seconds = time.monotonic() - t1
    elif options.text_layer == "auto" and page.pdf_path is None:
        stats.text_layer = "no_pdf"  # nothing to read: an image

    # --- step 2: recognition of each remaining block, cropped from the full-resolution page.
    t2 = time.monotonic()
    block_images, block_prompts, block_params, indices = helper.prepare_for_extract(image, blocks)
    # prepare_for_extract drops captions that sit inside an image (MinerU reads those with
    # the image); forget any we filled so the counts stay true.
    alive = {id(b) for b in blocks}
    filled = {key: text for key, text in filled.items() if key in alive}
    jobs = [
        (img, prompt, params, idx)
        for img, prompt, params, idx in zip(
            block_images, block_prompts, block_params, indices, strict=True
        )
        if id(blocks[idx]) not in filled
    ]
    total = len(jobs)
    cap = options.max_new_tokens_block
    requests = [GenRequest(img, prompt, params, cap) for img, prompt, params, _ in jobs]
    done = 0

    def block_done(_row: int) -> None:
        # Rows of a batch finish at different steps: count them as they finish, so
        # `docinbox status` moves block by block even while a batch is decoding.
        nonlocal done
        done += 1
        progress(done, total, "block")

    progress(0, total, "block")
    results = (predict_many or _one_by_one(predict))(requests, block_done)
    answers: list[Json] = []
    for (_img, prompt, _params, idx), result in zip(jobs, results, strict=True):
        blocks[idx].content = result.text
        answers.append({"index": layout_index[id(blocks[idx])], "type": blocks[idx].type,
                        "prompt": prompt, "raw_output": result.text})
        stats.decode_tokens += result.tokens
        stats.truncated_blocks += int(result.tokens >= cap)
    stats.recognition_seconds = time.monotonic() - t2
    stats.model_blocks = total
    stats.text_layer_blocks = len(filled)

    # --- MinerU's post-processing, then our Blocks.
    processed = helper.post_process(blocks)
    for block in processed:
        # MinerU's text fixers target model LaTeX/Markdown; text-layer text stays verbatim.
        if id(block) in filled:
            block.content = filled[id(block)]
    model_output: dict[str, Json] = {
        "page_size": list(image.size),
        "layout": {"prompt": layout_prompt, "raw_output": out.text},
        "blocks": answers,
        "text_layer_blocks": [
            {"index": layout_index[key], "text": text} for key, text in filled.items()
        ],
    }
    return PageResult(
        blocks=to_blocks(processed, set(filled), layout_index),
        info=stats.as_info(),
        model_output=model_output,
    )


def _one_by_one(predict: PredictFn) -> PredictManyFn:
    """`predict_many` for a runtime that only predicts one request at a time."""

    def predict_many(requests: Sequence[GenRequest], on_done: RowDone) -> list[Prediction]:
        results = []
        for row, request in enumerate(requests):
            cap = request.max_new_tokens
            results.append(predict(request.image, request.prompt, capped(request.params, cap), cap))
            on_done(row)
        return results

    return predict_many


def to_blocks(
    content_blocks: Sequence[Any],
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

    def sink(message: Any) -> None:
        record = message.record
        # loguru's level numbers match stdlib's for DEBUG/INFO/WARNING/ERROR/CRITICAL.
        std.log(record["level"].no, "%s", record["message"])

    loguru_logger.remove()
    loguru_logger.add(sink, level="DEBUG", format="{message}")


class MinerUEngine:
    """Engine `mineru`. Constructed with the engine config; `load()` once per worker.

    `engine.runtime` decides where generation runs (see `runtime.py`); everything else,
    from the layout step to the block mapping, is this module's and the same for all.
    """

    name = "mineru"

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._loaded: LoadedModel | None = None
        self._client: Any = None
        self._generator: BatchedGenerator | None = None
        self._batcher: PageBatcher | None = None
        self._remote: Runtime | None = None
        self._pool: ThreadPoolExecutor | None = None
        # Pages the worker may run through parse_page at once, each in its own thread: a
        # server batches concurrent requests (its own bound); the in-process runtimes take
        # engine.page_batch pages, whose model steps then share batches (transformers) or
        # slots (llama-cpp).
        self.max_pages_in_flight = max(1, config.page_batch)

    def load(self) -> EngineInfo:
        route_loguru_to_logging()
        runtime = self.config.runtime
        if runtime == "transformers":
            return self._load_transformers()
        remote: Runtime
        if runtime == "http":
            from daemon.engines.mineru.runtimes.http import HttpRuntime

            remote = HttpRuntime(self.config.http, client_options())
        elif runtime == "llama-cpp":
            from daemon.common.cpus import resolve_threads
            from daemon.engines.mineru.runtimes.llama_cpp import LlamaCppRuntime

            threads = resolve_threads(self.config.llama_cpp.threads or self.config.threads)
            remote = LlamaCppRuntime(
                self.config.model, self.config.llama_cpp, threads, client_options()
            )
        else:
            raise ValueError(f"unknown engine.runtime {runtime!r}")
        self._remote = remote
        self._client = remote.client
        if runtime == "http":
            self.max_pages_in_flight = remote.max_pages_in_flight
        if remote.max_blocks_in_flight > 1:
            self._pool = ThreadPoolExecutor(
                max_workers=remote.max_blocks_in_flight, thread_name_prefix="mineru-block"
            )
        info = remote.info
        return EngineInfo(
            name=self.name,
            model_id=info.model,
            revision=None,
            precision=None,
            details={
                "runtime": info.runtime,
                "server": info.server,
                "model": info.model,
                **info.details,
            },
        )

    def _load_transformers(self) -> EngineInfo:
        from transformers.utils import logging as hf_logging

        from daemon.engines.mineru.runtimes.transformers_model import load_model

        # Worker logs go to journald/files: progress bars there are noise.
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        loaded = load_model(
            self.config.model, self.config.revision, self.config.precision, self.config.threads
        )
        from mineru_vl_utils import MinerUClient

        self._client = MinerUClient(
            backend="transformers",
            model=loaded.model,
            processor=loaded.processor,
            use_tqdm=False,
            **client_options(),
        )
        self._loaded = loaded
        self._generator = BatchedGenerator(
            loaded.model, loaded.processor, self._client.client, self.batch_size
        )
        self._batcher = PageBatcher(self._generator, self.config.page_batch)
        return EngineInfo(
            name=self.name,
            model_id=self.config.model,
            revision=loaded.weights.commit or self.config.revision,
            precision=loaded.precision,
            details={
                "runtime": "transformers",
                "server": None,
                "model": self.config.model,
                "threads": loaded.threads,
                "batch_size": self.batch_size,
                "page_batch": self.config.page_batch,
                "dtype_vision": loaded.dtype_vision,
                "dtype_decoder": loaded.dtype_decoder,
                "requested_precision": self.config.precision,
                "weights_path": str(loaded.weights.path),
                "load_seconds": round(loaded.load_seconds, 2),
            },
        )

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    def coming_page(self) -> AbstractContextManager[None]:
        """Around bringing one page to `parse_page` (the worker renders it inside): the
        layout step of the pages in the engine waits for it to join their batch."""
        return self._batcher.coming() if self._batcher is not None else nullcontext()

    def _local_steps(self, page_idx: int) -> tuple[PredictFn, PredictManyFn]:
        """The page's layout step and block step, as rows of the batches all pages share:
        the same generate() path for both, so layout and blocks share MinerU's sampling
        rules and our per-row stopping."""
        batcher = self._batcher
        assert batcher is not None

        def predict(image: Any, prompt: str, params: Any, max_new_tokens: int) -> Prediction:
            request = GenRequest(image, prompt, params, max_new_tokens)
            return batcher.run(page_idx, LAYOUT, [request], lambda _row: None)[0]

        def predict_many(requests: Sequence[GenRequest], on_done: RowDone) -> list[Prediction]:
            return batcher.run(page_idx, BLOCK, requests, on_done)

        return predict, predict_many

    def _concurrent_many(
        self, requests: Sequence[GenRequest], on_done: RowDone
    ) -> list[Prediction]:
        """The blocks of a page as concurrent requests (server or llama.cpp slots, which
        batch them themselves); each lands in its own row whatever the finishing order."""
        assert self._pool is not None and self._remote is not None
        predict = self._remote.predict
        futures = {
            self._pool.submit(
                predict, r.image, r.prompt, capped(r.params, r.max_new_tokens), r.max_new_tokens
            ): row
            for row, r in enumerate(requests)
        }
        results: dict[int, Prediction] = {}
        try:
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                on_done(futures[future])
        finally:
            for future in futures:  # one block failed: do not leave the others queued
                future.cancel()
        return [results[row] for row in range(len(requests))]

    def parse_page(self, page: PageInput, options: PageOptions, progress: ProgressFn) -> PageResult:
        """One page. Thread-safe for every runtime: the helper keeps no per-page state, the
        remote runtimes' predict() may be called from several threads, and the local
        model's generate() calls are made by the shared `PageBatcher`, one at a time."""
        if self._client is None:
            raise RuntimeError("MinerUEngine.parse_page() before load()")
        step = functools.partial(
            run_page,
            page,
            options,
            progress,
            helper=self._client.helper,
            prompts=self._client.prompts,
            sampling_params=self._client.sampling_params,
        )
        if self._remote is not None:
            return step(
                predict=self._remote.predict,
                predict_many=self._concurrent_many if self._pool is not None else None,
            )
        import torch

        # The local model: no autograd bookkeeping (per thread: whichever page thread runs
        # a batch runs it in this mode), and the batches every page in the engine shares.
        assert self._batcher is not None
        predict, predict_many = self._local_steps(page.page_idx)
        with torch.inference_mode(), self._batcher.page():
            return step(predict=predict, predict_many=predict_many)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._remote is not None:
            self._remote.close()
            self._remote = None
        # Dropping the references is enough: the worker process exits or recycles soon.
        self._client = None
        self._generator = None
        self._batcher = None
        self._loaded = None


def client_options() -> dict[str, Any]:
    """MinerUClient flags, the same for every runtime so every runtime gives the same output.

    mineru-vl-utils' defaults: no image analysis, no formula wrapping in tables. MinerU 4
    itself turns both on for MinerU2.5-Pro (see docs/scale-out.md, "Which model"); the
    output side follows MinerU's renderers for the blocks the defaults produce.
    """
    return {}
