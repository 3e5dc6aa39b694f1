"""Blocks recognised while the layout is written (early_blocks.py) change no page.

A canned model whose answer to a block is a digest of its request (crop pixels, prompt,
cap): a page whose blocks were answered early comes out exactly as the page whose blocks
all waited for the block step, or an early answer to another request slipped through.
The runtime is played by `Streaming`: it polls the layout row's `early` with the layout
text a few characters at a time, as the decode loop does after its passes, and answers
what it asks at once (the decode loop's own part is in test_decode_loop.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any

import pytest
from PIL import Image, ImageDraw

from daemon.document.page import PageInput, PageOptions, PageText, TextLine
from daemon.engines.mineru.early_blocks import EarlyBlocks, same_image
from daemon.engines.mineru.engine import ModelFreeClient, Prediction, run_page
from daemon.engines.mineru.runtimes.base import GenRequest, MinerUClient, PageStep, RowDone
from tests.engines.test_mineru_engine import (
    FILL_LAYOUT,
    FILL_LINES,
    LAYOUT_PROMPT,
    PAGE_LAYOUT,
    box,
    pdf_page,
)


class Digests:
    """The layout as given; a block's answer a digest of what was asked."""

    def __init__(self, layout: str) -> None:
        self.layout = layout
        self.asked: list[str] = []  # block answers, in the order they were asked

    def __call__(self, request: GenRequest) -> Prediction:
        if request.prompt == LAYOUT_PROMPT:
            return Prediction(self.layout, 40)
        image = request.image
        assert isinstance(image, Image.Image)
        digest = hashlib.sha256(image.tobytes())
        digest.update(repr((image.size, request.max_new_tokens, request.draft_text)).encode())
        answer = f"{request.prompt.strip()} {digest.hexdigest()[:10]}"
        self.asked.append(answer)
        return Prediction(answer, 7)


class Plain:
    """A runtime without early rows: every request answered when asked."""

    def __init__(self, model: Digests) -> None:
        self.model = model
        self.client: MinerUClient = ModelFreeClient.make()

    def predict(self, step: PageStep, on_done: RowDone) -> list[Prediction]:
        out = []
        for i, request in enumerate(step.requests):
            out.append(self.model(request))
            on_done(i)
        return out


class Streaming(Plain):
    """A runtime that polls a row's `early` as its text grows (`every` characters a pass)
    and answers each request it gets at once, then the row."""

    def __init__(self, model: Digests, every: int = 5) -> None:
        super().__init__(model)
        self.every = every
        self.early_answers = 0

    def predict(self, step: PageStep, on_done: RowDone) -> list[Prediction]:
        for request in step.requests:
            if request.early is None:
                continue
            text = self.model(request).text
            for end in [*range(self.every, len(text), self.every), len(text)]:
                final = end == len(text)
                for follower in request.early.poll(text[:end], end, final):
                    request.early.done(follower, self.model(follower))
                    self.early_answers += 1
        return super().predict(step, on_done)


def pages(
    layout: str, page: PageInput | None = None, lines: list[TextLine] | None = None
) -> tuple[Any, Any, Digests, Streaming]:
    """The page through the plain runtime and through the streaming one."""
    page = page or PageInput(Image.new("RGB", (2000, 3000), "white"), 0, 1, 200)
    if lines is not None:
        page = dataclasses.replace(page, text_layer=PageText(tuple(lines)))
    options = PageOptions(max_new_tokens_layout=300, max_new_tokens_block=50)
    plain_model, early_model = Digests(layout), Digests(layout)
    streaming = Streaming(early_model)
    progress: list[tuple[int, int, str]] = []
    plain = run_page(page, options, lambda *a: None, Plain(plain_model))
    early = run_page(page, options, lambda *a: progress.append(a), streaming)
    assert progress[-1][0] == progress[-1][1]  # every block counted, early ones too
    return plain, early, plain_model, streaming


def same_page(plain: Any, early: Any) -> None:
    def kept(info: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in info.items() if not k.endswith("seconds") and k != "early_blocks"}

    assert early.blocks == plain.blocks
    assert early.model_output == plain.model_output
    assert kept(early.info) == kept(plain.info)


def test_a_page_whose_blocks_were_answered_early_is_the_same_page() -> None:
    plain, early, plain_model, streaming = pages(PAGE_LAYOUT)
    same_page(plain, early)
    # Every block the model reads was answered while the layout was written; the block
    # step asked the runtime for none of them again.
    assert plain.info["early_blocks"] == 0 and early.info["early_blocks"] == 5
    assert streaming.early_answers == 5 and len(streaming.model.asked) == 5
    assert sorted(streaming.model.asked) == sorted(plain_model.asked)


def test_blocks_the_finished_layout_changes_run_again_in_the_block_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A table whose crop masks an image listed after it, and a caption a later image
    turns out to hold (MinerU reads it with the image): their early requests are not the
    final ones. The table runs again; the caption's early answer is dropped unused."""
    from mineru_vl_utils import mineru_client

    # MinerU writes a random code into each image it masks in a table (so a table with
    # images inside never matches an earlier crop of itself, nor one page run another):
    # seeded per table here, so the two runs of the page can be compared.
    mask = mineru_client.mask_and_encode_table_image

    def seeded(*args: Any, **kwargs: Any) -> Any:
        random.seed(0)
        return mask(*args, **kwargs)

    monkeypatch.setattr(mineru_client, "mask_and_encode_table_image", seeded)
    image = Image.new("RGB", (2000, 3000), "white")
    ImageDraw.Draw(image).rectangle((400, 1100, 1200, 1500), fill="black")  # in the table
    layout = (
        box(100, 50, 900, 100, "title")
        + box(100, 320, 900, 600, "table")
        + box(150, 640, 850, 660, "image_caption")
        + box(150, 350, 650, 520, "image")  # inside the table: the table's crop masks it
        + box(100, 620, 900, 700, "image")  # holds the caption
        + box(100, 720, 900, 800, "text")
    )
    plain, early, plain_model, streaming = pages(layout, PageInput(image, 0, 1, 200))
    same_page(plain, early)
    tables = [a for a in streaming.model.asked if a.startswith("Table")]
    # Asked early (the image not listed yet: unmasked) and again in the block step (masked),
    # which is what the plain page asked.
    assert len(tables) == 2 and tables[0] != tables[1]
    assert [a for a in plain_model.asked if a.startswith("Table")] == tables[1:]
    assert early.info["early_blocks"] < early.info["model_blocks"]


def test_blocks_the_text_layer_fills_are_not_started_early() -> None:
    plain, early, _plain_model, streaming = pages(FILL_LAYOUT, pdf_page(), FILL_LINES)
    same_page(plain, early)
    assert early.info["text_layer"] == "used" and early.info["text_layer_blocks"] == 2
    assert streaming.early_answers == 2 == early.info["early_blocks"]  # the table, one text


def test_early_blocks_polls_finished_lines_only_and_starts_each_block_once() -> None:
    asked: list[str] = []

    def jobs(text: str) -> list[tuple[GenRequest, Any]]:
        asked.append(text)
        lines = [line for line in text.split("<|box_start|>") if line]
        return [(GenRequest(b"x", line, None, 5), (line, (0.0,), None)) for line in lines]

    early = EarlyBlocks(jobs)
    first, second = box(1, 2, 3, 4, "text"), box(5, 6, 7, 8, "title")
    assert early.poll(first[:20], 3, False) == []  # no line finished: nothing parsed
    assert early.poll(first, 10, False) == [] and asked == []
    got = early.poll(first + second[:15], 12, False)
    assert [r.prompt for r in got] == [first.removeprefix("<|box_start|>")]
    assert early.poll(first + second[:18], 13, False) == []  # nothing new finished
    got = early.poll(first + second, 20, True)
    assert [r.prompt for r in got] == [second.removeprefix("<|box_start|>")]
    assert len(asked) == 2
    # An answer is handed out for the same request only, and once it is there.
    request, key = jobs(first)[0]
    assert early.take(request, key) is None  # not answered yet
    early.done(got[0], Prediction("t", 1))
    assert early.take(dataclasses.replace(request, max_new_tokens=6), key) is None


def test_same_image_compares_pixels() -> None:
    a, b = Image.new("RGB", (4, 4), "white"), Image.new("RGB", (4, 4), "white")
    assert same_image(a, b) and same_image(b"png", b"png") and not same_image(a, b"png")
    b.putpixel((1, 1), (0, 0, 0))
    assert not same_image(a, b) and not same_image(a, a.convert("L"))

