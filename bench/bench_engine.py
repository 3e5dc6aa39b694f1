"""Benchmark instrumentation of the transformers paths, and a plugin engine for document runs.

`instrument()` makes a loaded Qwen2-VL do a fixed amount of work and times it:

- every generate() call is forced to its planned token count (`min_new_tokens` = the cap, so
  random weights cannot stop early; any `max_length` is dropped). Layout: the plan's layout
  count; blocks: each block's own count, matched to its crop through the client helper's
  `prepare_for_extract` (crop object -> block box -> plan). In a batched call each row
  stops at its own count (docinbox's RowStops), the call at the largest;
- the layout step's generated text is replaced, after its generate() has run and been
  timed, by the plan's layout string (the helper's `parse_layout_output` is wrapped), so
  every path crops the same blocks;
- per call: vision-tower seconds (hooks on `model.visual`), prefill (call start -> first new
  token), decode (first -> last new token, a streamer stamps every step), rows, tokens.

`BenchMinerU` is docinbox's MinerUEngine with that instrumentation, loadable as a plugin
engine (`bench_engine:BenchMinerU`, bench/ on PYTHONPATH) so a whole document goes through
the real supervisor and worker (`daemon.cli.parse.parse_files`); it appends one JSON line per
page (parse_page start/end, its generate() calls) to `engine.options["log"]`.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemon.document.page import PageInput, PageOptions, PageResult, ProgressFn
from daemon.engines.mineru.engine import MinerUEngine


@dataclass
class Call:
    phase: str
    rows: int = 1
    prompt_tokens: int = 0  # padded, per row
    image_grid_thw: list[list[int]] = field(default_factory=list)
    started: float = 0.0  # time.monotonic()
    vision_seconds: float = 0.0
    prefill_seconds: float = 0.0  # call start -> first new token (vision + LM prefill)
    decode_steps: int = 0
    decode_seconds: float = 0.0  # first new token -> last new token
    forced_tokens: list[int] = field(default_factory=list)  # per row
    total_seconds: float = 0.0
    pages: list[int] = field(default_factory=list)  # page index of each row (documents)


class TimingStreamer:
    """generate() streamer: timestamps every new token step, forwards to an inner streamer."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.stamps: list[float] = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if self._prompt_seen:
            self.stamps.append(time.monotonic())
        self._prompt_seen = True
        if self.inner is not None:
            self.inner.put(value)

    def end(self) -> None:
        if self.inner is not None:
            self.inner.end()


@dataclass(frozen=True)
class PageWork:
    """What one page of a document is forced to (several pages may be in the engine)."""

    page_idx: int
    layout_text: str
    n_layout: int
    block_tokens: dict[tuple[int, int, int, int], int]


@dataclass
class Probe:
    layout_text: str
    n_layout: int
    m_block: int  # forced count for a block the plan does not list
    block_tokens: dict[tuple[int, int, int, int], int] = field(default_factory=dict)
    token_scale: float = 1.0  # < 1 for smoke runs only
    phase: str = "layout"
    layout_parsed_at: float = 0.0
    generated_layout_chars: int = 0
    calls: list[Call] = field(default_factory=list)
    forced: dict[int, int] = field(default_factory=dict)  # id(crop) -> tokens
    row_caps: list[int] = field(default_factory=list)
    row_pages: list[int] = field(default_factory=list)
    call_phase: str | None = None  # set per call when the rows tell (documents)
    finished: list[Call] = field(default_factory=list)  # calls done, not yet logged
    # id(image) -> page index, and which of those images are layout images (documents)
    page_of: dict[int, int] = field(default_factory=dict)
    layout_images: set[int] = field(default_factory=set)
    local: threading.local = field(default_factory=threading.local)  # .work: PageWork
    lock: threading.Lock = field(default_factory=threading.Lock)
    _vision_started: float = 0.0
    loop_call: Call | None = None  # the decode loop's call in progress (one at a time)

    def work(self) -> PageWork | None:
        """The page this thread is parsing (BenchMinerU), None outside a document."""
        return getattr(self.local, "work", None)

    def scaled(self, tokens: int) -> int:
        return max(2, round(tokens * self.token_scale))


def plan_probe(plan: dict[str, Any], m_block: int, token_scale: float) -> Probe:
    probe = Probe(plan["layout"], plan["layout_tokens"], m_block, token_scale=token_scale)
    probe.block_tokens = block_tokens(plan)
    return probe


def block_tokens(plan: dict[str, Any]) -> dict[tuple[int, int, int, int], int]:
    return {tuple(b["bbox"]): b["tokens"] for b in plan["blocks"] if b["tokens"] > 0}


def _key(bbox: Any) -> tuple[int, int, int, int]:
    x0, y0, x1, y1 = (round(float(v) * 1000) for v in bbox)
    return x0, y0, x1, y1


def instrument(
    model: Any, helper: Any, probe: Probe, *, generator: Any = None, client: Any = None
) -> None:
    """Force and time; `generator` = docinbox's BatchedGenerator, `client` = the reference
    TransformersVlmClient (one of the two knows the crops of each generate() call)."""
    original_parse = helper.parse_layout_output

    def parse_layout_output(output: str) -> Any:
        if getattr(probe.local, "partial", False):  # an early poll: its planned prefix
            return original_parse(output)
        probe.layout_parsed_at = time.monotonic()
        probe.generated_layout_chars = len(output)
        probe.phase = "block"
        work = probe.work()
        return original_parse(work.layout_text if work else probe.layout_text)

    helper.parse_layout_output = parse_layout_output

    original_layout = helper.prepare_for_layout

    def prepare_for_layout(image: Any, *args: Any, **kwargs: Any) -> Any:
        layout_image = original_layout(image, *args, **kwargs)
        work = probe.work()
        if work is not None:
            with probe.lock:
                probe.forced[id(layout_image)] = probe.scaled(work.n_layout)
                probe.page_of[id(layout_image)] = work.page_idx
                probe.layout_images.add(id(layout_image))
        return layout_image

    helper.prepare_for_layout = prepare_for_layout

    original_prepare = helper.prepare_for_extract

    def prepare_for_extract(image: Any, blocks: Any, *args: Any, **kwargs: Any) -> Any:
        images, prompts, params, indices = original_prepare(image, blocks, *args, **kwargs)
        work = probe.work()
        tokens_of = work.block_tokens if work else probe.block_tokens
        with probe.lock:
            for crop, idx in zip(images, indices, strict=True):
                tokens = tokens_of.get(_key(blocks[idx].bbox), probe.m_block)
                probe.forced[id(crop)] = probe.scaled(tokens)
                probe.layout_images.discard(id(crop))  # an id freed and reused
                if work is not None:
                    probe.page_of[id(crop)] = work.page_idx
        return images, prompts, params, indices

    helper.prepare_for_extract = prepare_for_extract

    def cap_of(image: Any) -> int:
        if id(image) in probe.forced:
            return probe.forced[id(image)]
        if probe.phase == "layout":
            return probe.scaled(probe.n_layout)
        return probe.scaled(probe.m_block)

    if generator is not None:
        original_rows = generator.generate

        def generate_rows(rows: Any, on_done: Any) -> Any:
            rows = [dataclasses.replace(r, max_new_tokens=cap_of(r.image)) for r in rows]
            probe.row_caps = [r.max_new_tokens for r in rows]
            if probe.page_of:  # a document: the rows say which step and which pages
                ids = [id(r.image) for r in rows]
                layout = all(i in probe.layout_images for i in ids)
                probe.call_phase = "layout" if layout else "block"
                probe.row_pages = [probe.page_of.get(i, -1) for i in ids]
            return original_rows(rows, on_done)

        generator.generate = generate_rows
    if client is not None:
        original_batch = client._predict_one_batch

        def predict_one_batch(image_objs: Any, chat_prompts: Any, *args: Any, **kw: Any) -> Any:
            probe.row_caps = [cap_of(img) for img in image_objs]
            return original_batch(image_objs, chat_prompts, *args, **kw)

        client._predict_one_batch = predict_one_batch

    visual = model.model.visual

    def vision_pre(_module: Any, _inputs: Any) -> None:
        probe._vision_started = time.monotonic()

    def vision_post(_module: Any, _inputs: Any, _output: Any) -> None:
        if probe.calls:
            probe.calls[-1].vision_seconds += time.monotonic() - probe._vision_started

    visual.register_forward_pre_hook(vision_pre)
    visual.register_forward_hook(vision_post)

    original_generate = model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        caps = probe.row_caps or [probe.scaled(probe.n_layout)]
        probe.row_caps = []
        n = max(caps)
        kwargs.pop("max_length", None)
        kwargs["max_new_tokens"] = n
        kwargs["min_new_tokens"] = n  # no early end-of-turn; rows stop at their own cap
        streamer = TimingStreamer(kwargs.pop("streamer", None))
        kwargs["streamer"] = streamer
        call = Call(
            phase=probe.call_phase or probe.phase,
            forced_tokens=caps,
            rows=len(caps),
            pages=probe.row_pages,
        )
        probe.call_phase, probe.row_pages = None, []
        input_ids = kwargs.get("input_ids")
        if input_ids is not None:
            call.prompt_tokens = int(input_ids.shape[-1])
        grid = kwargs.get("image_grid_thw")
        if grid is not None:
            call.image_grid_thw = [[int(v) for v in row] for row in grid.tolist()]
        probe.calls.append(call)
        start = call.started = time.monotonic()
        out = original_generate(*args, **kwargs)
        end = time.monotonic()
        call.total_seconds = end - start
        if streamer.stamps:
            call.prefill_seconds = streamer.stamps[0] - start
            call.decode_steps = len(streamer.stamps)
            call.decode_seconds = streamer.stamps[-1] - streamer.stamps[0]
        with probe.lock:
            probe.finished.append(call)
        return out

    model.generate = generate
    _PROBES.append(probe)
    loop = getattr(generator, "loop", None)
    if loop is not None:
        _instrument_loop(loop, probe)
        _instrument_early(loop, probe, cap_of)


def _instrument_early(loop: Any, probe: Probe, cap_of: Callable[[Any], int]) -> None:
    """Blocks started while the layout is written (engine's early_blocks.py), forced as
    the rest: the random model writes no layout a parse can read, so a poll after n of the
    layout's N forced tokens reads the first n/N of the planned layout text (the page's
    own plan: the EarlyBlocks remembers the page it was made for, and the poll runs on the
    model thread); a block row the layout starts is forced to its planned count, as the
    block step's rows are."""
    from daemon.engines.mineru import early_blocks

    original_request = loop.request

    def request(row: Any) -> Any:
        return original_request(dataclasses.replace(row, max_new_tokens=cap_of(row.image)))

    loop.request = request
    cls = early_blocks.EarlyBlocks
    if getattr(cls, "_bench_planned", False):
        return  # one patch per process
    original_init, original_poll = cls.__init__, cls.poll

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.bench_work = probe.work()  # the page thread's page (None: a single page)

    def poll(self: Any, text: str, tokens: int, final: bool) -> Any:
        work = self.bench_work
        planned = work.layout_text if work else probe.layout_text
        total = probe.scaled(work.n_layout if work else probe.n_layout)
        share = 1.0 if final else min(1.0, tokens / max(1, total))
        previous = getattr(probe.local, "work", None)
        probe.local.work, probe.local.partial = work, True
        try:
            return original_poll(self, planned[: round(len(planned) * share)], tokens, final)
        finally:
            probe.local.work, probe.local.partial = previous, False

    cls.__init__ = init  # type: ignore[method-assign]
    cls.poll = poll  # type: ignore[method-assign]
    cls._bench_planned = True  # type: ignore[attr-defined]


def _instrument_loop(loop: Any, probe: Probe) -> None:
    """Time the decode loop of our own as generate() calls are timed: one Call per
    `LoopGenerator.generate`, prefill = the rows' joins (each row's vision and prompt pass,
    so vision is inside it, as in a generate() call's prefill), decode = the batch's steps.
    The loop's rows overlap (a row joins while others decode), so a call's prefill and decode
    are sums of those passes, not two spans of the call."""
    from daemon.engines.mineru.runtimes import decode_loop

    original = loop.generate

    def generate(rows: Any, on_done: Any, processors: Any = None) -> Any:
        call = Call(
            phase=probe.call_phase or probe.phase,
            forced_tokens=[r.max_new_tokens for r in rows],
            rows=len(rows),
            pages=probe.row_pages,
        )
        probe.row_caps, probe.call_phase, probe.row_pages = [], None, []
        probe.calls.append(call)
        probe.loop_call = call
        start = call.started = time.monotonic()
        try:
            return original(rows, on_done, processors)
        finally:
            call.total_seconds = time.monotonic() - start
            probe.loop_call = None
            with probe.lock:
                probe.finished.append(call)

    loop.generate = generate
    batch = decode_loop.DecodeBatch
    if getattr(batch, "_bench_timed", False):
        return  # one patch per process: the class is shared by every engine loaded
    original_join, original_step = batch.join, batch.step

    def join(self: Any, index: int, request: Any) -> Any:
        started = time.monotonic()
        try:
            return original_join(self, index, request)
        finally:
            call = _PROBES[-1].loop_call if _PROBES else None
            if call is not None:
                call.prefill_seconds += time.monotonic() - started
                length = int(request.inputs["input_ids"].shape[1])
                call.prompt_tokens = max(call.prompt_tokens, length)

    def step(self: Any) -> Any:
        started = time.monotonic()
        try:
            return original_step(self)
        finally:
            call = _PROBES[-1].loop_call if _PROBES else None
            if call is not None:
                call.decode_seconds += time.monotonic() - started
                # generate()'s count is of token stamps, one more than its decode steps
                # (phases() subtracts it): a pass here is one step.
                call.decode_steps = max(call.decode_steps, 1) + 1

    batch.join, batch.step = join, step  # type: ignore[method-assign]
    batch._bench_timed = True  # type: ignore[attr-defined]


# The probes of the engines instrumented in this process, the newest last: the patched
# DecodeBatch methods time into the newest one's current loop call.
_PROBES: list[Probe] = []


class BenchMinerU(MinerUEngine):
    """MinerUEngine forced and timed per page, for whole documents through the worker.

    engine.options: `plans` (a JSON file: one page plan per page index), `log` (JSONL
    output), `token_scale` (1.0; smaller only for smoke runs).

    With engine.page_batch > 1 several pages are in the engine at once (threads) and their
    rows share generate() calls: each page's work is kept per thread, each call records the
    pages of its rows, and a page's log line carries the calls finished since the previous
    line (with page_batch 1, exactly that page's calls).
    """

    name = "mineru"

    def load(self) -> Any:
        info = super().load()
        opts = self.config.options
        # Plugin options come from YAML untyped: plans and log are paths, token_scale a number.
        self._plans = {p["page_idx"]: p for p in json.loads(Path(str(opts["plans"])).read_text())}
        self._log = Path(str(opts["log"]))
        first = next(iter(self._plans.values()))
        self._probe = plan_probe(first, 32, float(str(opts.get("token_scale", 1.0))))
        local: Any = self.runtime  # the transformers runtime: its client and generator
        client = local.client
        instrument(client.client.model, client.helper, self._probe, generator=local.generator)
        if local.loop is not None:
            # The plan's counts: rows end at their cap, never at a random end-of-turn (as
            # generate()'s min_new_tokens forces them; bench_mineru's auto-loop does the same).
            local.loop.eos_ids = set()
        if opts.get("rss_log"):
            from bench.rss_phases import install

            install(local, Path(str(opts["rss_log"])))
        return info

    def parse_page(self, page: PageInput, options: PageOptions, progress: ProgressFn) -> PageResult:
        plan = self._plans[page.page_idx]
        probe = self._probe
        probe.local.work = PageWork(
            page.page_idx, plan["layout"], plan["layout_tokens"], block_tokens(plan)
        )
        started_wall, started = time.time(), time.monotonic()
        try:
            result = super().parse_page(page, options, progress)
        finally:
            probe.local.work = None
        ended = time.monotonic()
        with probe.lock:
            calls, probe.finished = probe.finished, []
            record = {
                "page_idx": page.page_idx,
                "started_wall": started_wall,
                "started": started,
                "ended": ended,
                "calls": [vars(c) for c in calls],
            }
            with self._log.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
        return result
