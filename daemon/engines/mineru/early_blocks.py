"""The layout step's blocks, recognised while the layout is still being written.

MinerU's layout step writes one line per block (`<|box_start|>x0 y0 x1 y1<|box_end|>
<|ref_start|>type<|ref_end|>...`) over a few hundred decode passes of ONE row: on a CPU those
passes read the whole decoder for one token each (13 s of the realistic page's 24 s of
decoding on Zen 4, docs/benchmarks.md), while the page's blocks wait for the last line. A
block whose line is finished can already be cropped and recognised: in the decode loop its
row joins beside the layout row, and its passes ride on passes that read the weights anyway.

Exact by construction. A block started early is used only where the block step, built from
the FINAL layout exactly as before, asks for the same request: same crop pixels, prompt,
sampling params, cap and draft. Whatever the finished layout changes (a block its parse
drops or merges, a caption found inside a later image, a table whose crop masks an image
listed after it) makes a different request, which runs as it always did; a row decodes the
same tokens whichever rows share its passes (decode_loop.py), so an early answer is the
answer. What is lost at worst is the work spent on a block the final layout does not keep.

Model-free: the engine hands in how text becomes requests (`jobs`); the runtime (the
transformers runtime's decode loop: `base.EarlyRows`) polls and reports back. Other runtimes
ignore it and every block runs in the block step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from daemon.engines.mineru.runtimes.base import GenRequest, ImageInput, LayoutBlock, Prediction

log = logging.getLogger(__name__)

# Where a layout block's line starts: a block is finished once the next one has begun (its
# tail, e.g. a text block's merge marker, runs up to the next box).
BOX_START = "<|box_start|>"

# A block's identity across polls: the same line parsed again is not started twice.
BlockKey = tuple[str, tuple[float, ...], int | None]


def block_key(block: LayoutBlock) -> BlockKey:
    return (block.type, tuple(float(v) for v in block.bbox), block.angle)


# The requests the block step would make for the blocks of a layout text, with their keys.
Jobs = Callable[[str], list[tuple[GenRequest, BlockKey]]]


@dataclass
class _Started:
    request: GenRequest
    prediction: Prediction | None = None


class EarlyBlocks:
    """One page's layout row's `early` (base.EarlyRows): polled with the layout's text so
    far, it answers the requests of blocks whose lines are finished and not started yet;
    `take` then hands the block step an early answer where its request is the same."""

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs
        self.parsed_to = 0  # characters of layout text already turned into requests
        self.started: dict[BlockKey, _Started] = {}

    def poll(self, text: str, tokens: int, final: bool) -> list[GenRequest]:
        end = len(text) if final else text.rfind(BOX_START)
        if end <= self.parsed_to:
            return []
        self.parsed_to = end
        try:
            jobs = self.jobs(text[:end])
        except Exception:  # a parse of half a layout: the block step parses the whole one
            log.debug("the layout so far made no blocks", exc_info=True)
            return []
        new = []
        for request, key in jobs:
            if key not in self.started:
                self.started[key] = _Started(request)
                new.append(request)
        return new

    def done(self, request: GenRequest, prediction: Prediction) -> None:
        for started in self.started.values():
            if started.request is request:
                started.prediction = prediction
                return

    def take(self, request: GenRequest, key: BlockKey) -> Prediction | None:
        """The early answer to exactly `request` (the block step's, for the block `key`),
        or None: never started, not finished, or started as another request."""
        started = self.started.get(key)
        if started is None or started.prediction is None:
            return None
        if not same_request(started.request, request):
            return None
        return started.prediction


def same_request(a: GenRequest, b: GenRequest) -> bool:
    """Whether a model asked `a` answers what it answers for `b`: the same pixels, prompt,
    params, cap and draft (the draft changes only how fast, but is compared all the same)."""
    return (
        a.prompt == b.prompt
        and a.params == b.params
        and a.max_new_tokens == b.max_new_tokens
        and a.draft_text == b.draft_text
        and same_image(a.image, b.image)
    )


def same_image(a: ImageInput, b: ImageInput) -> bool:
    if isinstance(a, bytes) or isinstance(b, bytes):
        return a == b
    return a.size == b.size and a.mode == b.mode and a.tobytes() == b.tobytes()
