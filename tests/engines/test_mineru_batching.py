"""Batched block recognition: a batch must give every block exactly what it gets alone.

Runs on the tiny Qwen2-VL of `tests/tinymodel.py`, loaded through the production loader in
fp32, with its scripted decoder replaced in memory by random weights (fixed seed): the
scripted model writes the same line for every input, which would hide a row reading
another row's image, a padding offset or a row stopped at the wrong step.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from daemon.config.settings import Config, EngineConfig
from daemon.document.page import PageInput, PageOptions, PageResult, PageText, no_progress
from daemon.document.protocol import ParsePage
from daemon.engines.mineru.engine import MinerUEngine, ModelFreeClient, run_page
from daemon.engines.mineru.runtimes.base import (
    BLOCK,
    LAYOUT,
    GenRequest,
    MinerUClient,
    PageStep,
    Prediction,
    RowDone,
    capped,
)
from daemon.engines.mineru.runtimes.transformers import TransformersRuntime
from daemon.engines.mineru.runtimes.transformers_generate import (
    estimate_prompt_tokens,
    plan_batches,
)
from daemon.worker.pipeline import PagePipeline
from tests.tinymodel import make_random_reader, randomize_language_model, tiny_model_once


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinerUEngine]:
    import torch

    folder = tiny_model_once(tmp_path_factory.mktemp("tiny-mineru-batching"))
    engine = MinerUEngine(EngineConfig(model=str(folder), precision="fp32"))
    engine.load()
    mineru: Any = local(engine).client  # the MinerUClient, untyped
    client = mineru.client  # its TransformersVlmClient
    model = client.model
    # Random decoder with the usual 1/sqrt(fan_in) scale: outputs depend on image and prompt,
    # and now and then the end-of-turn token wins, so rows end at different steps.
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        randomize_language_model(model, generator)
        head = model.lm_head.weight
        head.copy_(torch.randn(head.shape, generator=generator) * 0.125)
        # A random head almost never picks end-of-turn: make it win wherever one token that
        # some rows write would have won, so some rows end early and others at their cap.
        request = requests()[1]
        processor = client.processor
        text = processor.apply_chat_template(
            client.build_messages(request.prompt),
            tokenize=False,
            add_generation_prompt=True,
        )
        inputs = processor(text=[text], images=[request.image], return_tensors="pt")
        ids = model.generate(**inputs, max_new_tokens=4, do_sample=False)
        eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
        head[eos] = head[int(ids[0, -1])] * 1.5
    yield engine
    engine.close()


def local(engine: MinerUEngine) -> TransformersRuntime:
    """The engine's transformers runtime, whose generator and batcher the tests look at."""
    runtime = engine.runtime
    assert isinstance(runtime, TransformersRuntime)
    return runtime


def block_image(width: int, height: int, seed: int) -> Image.Image:
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.text((5, 5), f"block {seed} " * 5, fill="black")
    draw.rectangle((seed * 37 % width, 2, width - 1, height // 2), outline="red")
    return image


def requests() -> list[GenRequest]:
    client = ModelFreeClient.make()
    prompts, params = client.prompts, client.sampling_params
    shapes = [
        (300, 40, "[default]", 20),
        (500, 300, "table", 30),
        (120, 60, "equation", 12),
        (600, 200, "[default]", 25),
        (80, 30, "[default]", 30),
        (700, 500, "table", 16),
    ]
    return [
        GenRequest(block_image(w, h, i), prompts[kind], params[kind], cap)
        for i, (w, h, kind, cap) in enumerate(shapes)
    ]


def test_batched_output_equals_sequential_block_by_block(engine: MinerUEngine) -> None:
    generator = local(engine).generator
    reqs = requests()
    # Sequential: mineru-vl-utils' own transformers client, one block per generate() call.
    mineru: Any = local(engine).client  # the MinerUClient, untyped
    client = mineru.client  # its TransformersVlmClient
    sequential = [
        client.predict(r.image, r.prompt, capped(r.params, r.max_new_tokens)) for r in reqs
    ]
    alone = [generator.generate([r], lambda _row: None)[0] for r in reqs]
    assert [p.text for p in alone] == sequential

    for batch_size in (2, 8):
        generator.batch_size = batch_size
        finished: list[int] = []
        batched = generator.predict_many(reqs, finished.append)
        assert batched == alone, f"batch_size={batch_size}"
        assert sorted(finished) == list(range(len(reqs)))  # each row reported once

    # The batch really exercised per-row stopping: some rows ended at their own cap,
    # at least one at its end-of-turn token while the rest of its batch went on.
    capped_rows = [p.tokens == r.max_new_tokens for p, r in zip(alone, reqs, strict=True)]
    assert any(capped_rows) and not all(capped_rows)
    assert len({p.text for p in alone}) == len(reqs)  # every block read differently


def test_rows_are_reported_as_they_finish_not_when_the_batch_ends(engine: MinerUEngine) -> None:
    generator = local(engine).generator
    reqs = requests()[:4]
    short = GenRequest(reqs[0].image, reqs[0].prompt, reqs[0].params, 3)
    order: list[int] = []
    generator.generate([reqs[3], short], order.append)
    assert order == [1, 0]  # the 3-token row first


def test_rows_are_grouped_by_the_processors_own_token_count(engine: MinerUEngine) -> None:
    generator = local(engine).generator
    processor = generator.processor
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for size in ((28, 28), (300, 40), (2000, 3000), (700, 500)):
        image = Image.new("RGB", size)
        ids = processor(text=["<|image_pad|>"], images=[image])["input_ids"][0]
        assert generator.prompt_tokens(image) == 40 + list(ids).count(pad), size


def test_plan_batches_groups_similar_sizes_and_respects_the_limits() -> None:
    sizes = [1000, 60, 70, 1100, 65, 3000, 80]
    assert plan_batches(sizes, batch_size=8) == [[1, 4, 2, 6], [0, 3], [5]]
    assert plan_batches(sizes, batch_size=2) == [[1, 4], [2, 6], [0, 3], [5]]
    assert plan_batches(sizes, batch_size=8, max_tokens=2000) == [[1, 4, 2, 6], [0], [3], [5]]
    assert plan_batches([], batch_size=4) == []
    assert plan_batches(sizes, batch_size=1) == [[i] for i in (1, 4, 2, 6, 0, 3, 5)]


def test_prompt_estimate_follows_the_pixel_budget() -> None:
    assert estimate_prompt_tokens(Image.new("RGB", (28, 28))) == 40 + 4
    assert estimate_prompt_tokens(Image.new("RGB", (280, 280))) == 40 + 100
    assert estimate_prompt_tokens(Image.new("RGB", (5000, 5000)), max_pixels=784 * 10) == 50


class CannedBatch:
    """A runtime with canned outputs, finishing a block step's rows in reverse order."""

    def __init__(self, layout: str) -> None:
        self.layout = layout
        self.seen: list[list[str]] = []
        self.client: MinerUClient = ModelFreeClient.make()

    def predict(self, step: PageStep, on_done: RowDone) -> list[Prediction]:
        if step.kind == LAYOUT:
            return [Prediction(self.layout, 30)]
        reqs = step.requests
        self.seen.append([r.prompt for r in reqs])
        for row in reversed(range(len(reqs))):
            on_done(row)
        texts = ["out 0", "<fcel>out 1<nl>", "out 2"]
        return [Prediction(texts[i], 5 if i else r.max_new_tokens) for i, r in enumerate(reqs)]


def test_run_page_maps_batched_results_to_their_blocks_and_counts_progress() -> None:
    layout = "".join(
        f"<|box_start|>100 {y:03d} 900 {y + 80:03d}<|box_end|><|ref_start|>{kind}<|ref_end|>"
        "<|rotate_up|>\n"
        for y, kind in ((100, "text"), (300, "table"), (500, "text"))
    )
    fake = CannedBatch(layout)
    calls: list[tuple[int, int, str]] = []
    result = run_page(
        PageInput(Image.new("RGB", (1000, 1400), "white"), 0, 1, 100),
        PageOptions(max_new_tokens_block=50),
        lambda done, total, what: calls.append((done, total, what)),
        fake,
    )
    assert fake.seen == [["\nText Recognition:", "\nTable Recognition:", "\nText Recognition:"]]
    text0, table, text2 = result.blocks
    assert (text0.text, text2.text) == ("out 0", "out 2")
    assert table.html is not None and "<td>out 1</td>" in table.html
    assert calls[2:] == [(0, 3, "block"), (1, 3, "block"), (2, 3, "block"), (3, 3, "block")]
    assert result.info["truncated_blocks"] == 1 and result.info["model_blocks"] == 3


def test_engine_parses_a_page_through_the_batched_path(engine: MinerUEngine) -> None:
    # With the random decoder the layout step yields no parsable block: the page is empty,
    # but layout and (zero) recognition ran through the engine's own generate path.
    page = PageInput(Image.new("RGB", (400, 500), "white"), 0, 1, 72)
    result = engine.parse_page(page, PageOptions(max_new_tokens_layout=8), lambda *_a: None)
    tokens = result.info["layout_decode_tokens"]
    assert isinstance(tokens, int) and tokens <= 8
    assert result.blocks == []


# ---------------------------------------------------------------- pages batched together

# Small caps keep the tiny model quick; the layout cap is above where some pages end.
DOC_OPTIONS = PageOptions(
    text_layer="off", dpi=50, max_new_tokens_layout=40, max_new_tokens_block=12
)
LAYOUT_PROMPT = ModelFreeClient.make().prompts["[layout]"]


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinerUEngine]:
    folder = tiny_model_once(tmp_path_factory.mktemp("tiny-mineru-reader"))
    engine = MinerUEngine(
        EngineConfig(model=str(folder), precision="fp32", page_batch=4, batch_size=4)
    )
    engine.load()
    make_random_reader(engine)
    yield engine
    engine.close()


class Calls:
    """Each generate() call of the engine: its rows' prompts (what kind of step they are)."""

    def __init__(self, engine: MinerUEngine, monkeypatch: pytest.MonkeyPatch) -> None:
        generator = local(engine).generator
        self.prompts: list[list[str]] = []
        self.early: list[int] = []  # rows of each call that may start others (early blocks)
        original = generator.generate

        def generate(rows: Sequence[GenRequest], on_done: RowDone) -> list[Prediction]:
            self.prompts.append([r.prompt for r in rows])
            self.early.append(sum(r.early is not None for r in rows))
            return original(rows, on_done)

        monkeypatch.setattr(generator, "generate", generate)

    def layout_rows(self) -> list[int]:
        return [sum(p == LAYOUT_PROMPT for p in call) for call in self.prompts]


def count(result: PageResult, key: str) -> int:
    """An integer fact of a page's info (typed as any JSON value)."""
    value = result.info[key]
    assert isinstance(value, int), (key, value)
    return value


def scan_pdf(path: Path, pages: int) -> Path:
    """A scan whose pages differ in their pixels (all the model sees), saved by Pillow."""
    images = []
    for i in range(pages):
        image = Image.new("RGB", (425, 550), "white")
        draw = ImageDraw.Draw(image)
        draw.text((30, 30), f"Page {i + 1} " + "word " * (3 + 5 * i), fill="black")
        draw.rectangle((20, 100 + 40 * i, 400, 140 + 60 * i), fill=(i * 30 % 255, 0, 0))
        images.append(image)
    images[0].save(path, save_all=True, append_images=images[1:], resolution=50.0)
    return path


def document(tmp_path: Path, pages: int) -> tuple[Path, Any, Config]:
    from daemon.input.sniff import inspect

    pdf = scan_pdf(tmp_path / "doc.pdf", pages)
    cfg = Config(
        inboxes=(), outbox=tmp_path / "o", archive=tmp_path / "a", failed=tmp_path / "f",
        duplicates=tmp_path / "d", state_dir=tmp_path / "s",
    )
    return pdf, inspect(pdf, passwords=(), limits=cfg.limits), cfg


def test_pages_batched_together_equal_pages_one_at_a_time(
    reader: MinerUEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from daemon.input.raster import render_page
    from daemon.worker.crops import finish_page

    pages = 7
    pdf, doc, cfg = document(tmp_path, pages)
    calls = Calls(reader, monkeypatch)
    alone = []
    for i in range(pages):
        page = render_page(pdf, doc, i, dpi=DOC_OPTIONS.dpi, max_long_side=4000,
                           max_image_pixels=cfg.limits.max_image_pixels)
        alone.append(finish_page(page, reader.parse_page(page, DOC_OPTIONS, no_progress)))
    alone_calls = len(calls.prompts)
    assert calls.layout_rows().count(1) == pages  # one page at a time: one layout row

    # The worker's page pipeline, asked page by page with the supervisor's lookahead: up to
    # page_batch pages in the engine at once, from threads.
    progress: dict[int, list[tuple[int, int, str]]] = {}
    pipeline = PagePipeline(
        reader, cfg, 1, pdf, doc, DOC_OPTIONS,
        lambda idx, done, total, what, _n: progress.setdefault(idx, []).append(
            (done, total, what)
        ),
    )
    assert pipeline.in_flight == 4
    calls.prompts.clear()
    calls.early.clear()
    answers = [
        pipeline.run(ParsePage(1, str(pdf), k, DOC_OPTIONS, tuple(range(k + 1, min(pages, k + 4)))))
        for k in range(pages)
    ]
    pipeline.close()

    assert [a.page_idx for a in answers] == list(range(pages))  # answered in page order
    for k, (answer, single) in enumerate(zip(answers, alone, strict=True)):
        assert answer.model_output == single.model_output, f"page {k + 1}"
        assert list(answer.blocks) == single.blocks, f"page {k + 1}"
        assert answer.crops == single.crops
        # block progress of its own, ending at "all of its blocks done"
        blocks = [p for p in progress[k] if p[2] == "block"]
        total = count(single, "model_blocks")
        assert blocks[0] == (0, total, "block") and blocks[-1] == (total, total, "block")
    # Layout steps of several pages shared calls; all in fewer generate() calls. Only the
    # lowest page's layout starts its blocks early: another page's would hold it back.
    assert max(calls.layout_rows()) >= 3, calls.prompts
    assert all(
        early == (1 if layouts else 0)
        for early, layouts in zip(calls.early, calls.layout_rows(), strict=True)
    ), (calls.early, calls.layout_rows())
    assert len(calls.prompts) < alone_calls
    # The document really had pages ending at different lengths and rows at different
    # steps (some capped, some not), and each page its own blocks.
    layout_tokens = [count(r, "layout_decode_tokens") for r in alone]
    assert len(set(layout_tokens)) > 2
    assert max(layout_tokens) == DOC_OPTIONS.max_new_tokens_layout
    assert len({str(r.model_output) for r in alone}) > pages // 2  # most read differently
    assert any(0 < count(r, "truncated_blocks") < count(r, "model_blocks") for r in alone)


def test_a_batch_that_fails_is_run_again_page_by_page(
    reader: MinerUEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    batcher, generator = local(reader).batcher, local(reader).generator
    good, bad = requests()[0], requests()[3]
    expected = generator.generate([good], lambda _row: None)
    original = generator.generate
    seen: list[int] = []

    def generate(rows: Sequence[GenRequest], on_done: RowDone) -> list[Prediction]:
        seen.append(len(rows))
        if any(r.image is bad.image for r in rows):
            raise ValueError("this crop breaks the model")
        return original(rows, on_done)

    monkeypatch.setattr(generator, "generate", generate)
    # Both pages enter the engine before either asks, so their rows meet in one batch.
    inside = threading.Barrier(2)
    outcome: dict[int, Any] = {}

    def page(idx: int, request: GenRequest) -> None:
        with batcher.page():
            inside.wait()
            try:
                outcome[idx] = batcher.run(idx, BLOCK, [request], lambda _row: None)
            except ValueError as exc:
                outcome[idx] = exc

    threads = [threading.Thread(target=page, args=a) for a in ((0, good), (1, bad))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen[0] == 2 and sorted(seen[1:]) == [1, 1]  # together, then each page alone
    assert outcome[0] == expected
    assert isinstance(outcome[1], ValueError)


def test_a_render_that_fails_does_not_keep_the_others_waiting(reader: MinerUEngine) -> None:
    with pytest.raises(OSError), reader.coming_page():
        raise OSError("the page could not be rendered")
    # Nobody is announced any more: a lone page's layout runs at once.
    page = PageInput(Image.new("RGB", (300, 400), "white"), 0, 1, 72)
    result = reader.parse_page(page, PageOptions(max_new_tokens_layout=4), no_progress)
    assert count(result, "layout_decode_tokens") <= 4


# ---------------------------------------------------------------- engine.decode: loop | generate


@pytest.fixture(scope="module")
def generating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinerUEngine]:
    """`reader`'s model and settings with engine.decode: generate (transformers' own)."""
    folder = tiny_model_once(tmp_path_factory.mktemp("tiny-mineru-reader"))
    config = EngineConfig(
        model=str(folder), precision="fp32", page_batch=4, batch_size=4, decode="generate"
    )
    engine = MinerUEngine(config)
    engine.load()
    make_random_reader(engine)  # the same seed: the same weights as `reader`'s
    yield engine
    engine.close()


def scan_page(i: int, text_layer: PageText | None = None) -> PageInput:
    image = Image.new("RGB", (425, 550), "white")
    draw = ImageDraw.Draw(image)
    draw.text((30, 30), f"Page {i + 1} " + "word " * (3 + 5 * i), fill="black")
    draw.rectangle((20, 100 + 40 * i, 400, 140 + 60 * i), fill=(i * 30 % 255, 0, 0))
    return PageInput(image, i, 3, 50, text_layer=text_layer)


def test_decode_loop_and_generate_give_the_same_pages(
    reader: MinerUEngine, generating: MinerUEngine
) -> None:
    """engine.decode switches the way rows are decoded, never what a page says."""
    assert local(reader).generator.loop is not None  # the default
    assert local(generating).generator.loop is None
    blocks = 0
    for i in range(3):
        looped = reader.parse_page(scan_page(i), DOC_OPTIONS, no_progress)
        generated = generating.parse_page(scan_page(i), DOC_OPTIONS, no_progress)
        assert looped.blocks == generated.blocks
        assert looped.model_output == generated.model_output
        assert count(looped, "decode_tokens") == count(generated, "decode_tokens")
        # Every row took at least its prefill in the loop; generate() reports no passes.
        assert count(looped, "decode_passes") >= 1 + count(looped, "model_blocks")
        assert count(generated, "decode_passes") == 0
        blocks += count(looped, "model_blocks")
    assert blocks > 3  # the block step ran, several rows at once


def test_a_text_layer_draft_is_proposed_and_changes_nothing(
    reader: MinerUEngine, generating: MinerUEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan with an invisible OCR layer: not trusted to fill the text blocks (they go to
    the model), but offered to the decode loop as their drafts."""
    from mineru_vl_utils.structs import ContentBlock

    from daemon.document.page import TextLine

    def layout(_output: str) -> list[Any]:  # a text, a table, a title: whatever was written
        return [
            ContentBlock("text", [0.05, 0.05, 0.95, 0.3], angle=0),
            ContentBlock("table", [0.05, 0.35, 0.95, 0.6], angle=0),
            ContentBlock("title", [0.05, 0.65, 0.95, 0.75], angle=0),
        ]

    lines = (
        TextLine("Page 1 word word word", (0.06, 0.06, 0.9, 0.12), invisible=True),
        TextLine("a second line of the text", (0.06, 0.14, 0.9, 0.2), invisible=True),
        TextLine("cell cell cell", (0.06, 0.4, 0.9, 0.45), invisible=True),
        TextLine("A Title", (0.06, 0.66, 0.5, 0.72), invisible=True),
    )
    drafts: list[str | None] = []
    loop = local(reader).loop
    assert loop is not None
    original = loop.request

    def request(row: GenRequest) -> Any:  # every row of the loop: blocks started early too
        drafts.append(row.draft_text)
        return original(row)

    monkeypatch.setattr(loop, "request", request)
    options = PageOptions(text_layer="auto", max_new_tokens_layout=8, max_new_tokens_block=24)
    results = []
    for engine in (reader, generating):
        monkeypatch.setattr(local(engine).client.helper, "parse_layout_output", layout)
        page = scan_page(0, PageText(lines))
        results.append(engine.parse_page(page, options, no_progress))
    looped, generated = results
    assert looped.info["text_layer"] == "untrustworthy"
    assert count(looped, "model_blocks") == 3
    assert looped.blocks == generated.blocks
    assert looped.model_output == generated.model_output
    # The text and the title drafted from the layer; the table (and the layout step) from
    # their own output.
    assert sorted(d for d in drafts if d) == [
        "A Title", "Page 1 word word word a second line of the text"
    ]
    assert drafts.count(None) == 2
    assert count(looped, "draft_proposed") > 0
    assert count(generated, "draft_proposed") == 0


def run_scan(root: Path, model: Path, page_batch: int, *, kill: bool) -> dict[str, bytes]:
    """A 9-page scan through a real supervisor and worker; its output files by name."""
    from daemon.intake.ingest import Ingestor
    from daemon.jobs.states import JobState
    from tests.conftest import present
    from tests.supervisor.harness import drive, setup, stop

    root.mkdir()
    engine = {
        "name": "tests.plugins:RandomReaderMinerU", "fallback_engine": None,
        "model": str(model), "precision": "fp32", "page_batch": page_batch,
        "batch_size": 4, "text_layer": "off", "dpi": DOC_OPTIONS.dpi,
        "max_new_tokens_layout": 120, "max_new_tokens_block": 40,
    }  # fmt: skip
    cfg, store, sup, clock = setup(root, engine=engine)
    pdf = scan_pdf(cfg.inboxes[0].path / "scan.pdf", 9)
    found = Ingestor(cfg, store, clock).ingest(cfg.inboxes[0], pdf)
    assert found is not None
    jid = found.job.id
    if kill:
        drive(sup, clock, lambda: present(store.job(jid)).pages_done >= 1, limit=300)
        assert sup.worker.proc is not None and sup.worker.proc.pid is not None
        assert present(store.job(jid)).pages_done == 1
        os.kill(sup.worker.proc.pid, signal.SIGKILL)  # pages it finished ahead die with it
        drive(sup, clock, lambda: present(store.job(jid)).crashes == 1)
        clock.now += 10  # past the restart back-off
    drive(sup, clock, lambda: present(store.job(jid)).state == JobState.DONE, limit=300)
    assert present(store.job(jid)).crashes == int(kill)
    files = {
        f.name: f.read_bytes()
        for f in sorted((cfg.outbox / "scan").rglob("*"))
        # meta.json holds timings, and the sha256 of a PDF Pillow stamped with the time
        if f.is_file() and not f.name.endswith("meta.json")
    }
    stop(sup, clock)
    return files


@pytest.mark.integration
def test_a_worker_killed_in_the_middle_of_a_batch_resumes_to_the_same_document(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Real supervisor and worker processes: page_batch 1 against page_batch 4 with the
    worker killed (SIGKILL) once the first page is committed while the pages batched with
    it are still in the worker. The resumed document is the same, file for file."""
    model = tiny_model_once(tmp_path_factory.mktemp("tiny-mineru-crash"))
    alone = run_scan(tmp_path / "page_batch_1", model, 1, kill=False)
    batched = run_scan(tmp_path / "page_batch_4", model, 4, kill=True)
    assert "scan_model.json" in alone and "scan.md" in alone
    assert batched == alone
