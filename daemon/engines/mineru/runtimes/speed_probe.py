"""The passes the page estimate is built from, timed on the loaded model (seconds in all).

`time_passes` runs, under inference mode, with the model as the runtime loaded it (its
precision, its attention kernel, its threads): one vision-tower pass over a synthetic
16x16-patch image and one over 4x4 patches, one decoder prefill of one row of 128 tokens
and one of 8, and one decode step at one row and at `engine.batch_size` rows. The tiny
passes tell a pass's fixed cost (the same ops whatever the size: on a busy 2-core machine a
256-patch pass took 13 s where its per-patch rate said 4) from its rate per patch or token.

Each is run once untimed at the same shape first, then timed twice, the best kept: the
first pass at a new shape pays for oneDNN's kernel generation and the first touch of its
buffers (a 256-patch bf16 pass took 2-5x the later ones on a Zen 4 class CPU under load),
which a page's hundreds of passes spread thin. The arithmetic that turns them into a page
is daemon/common/estimate.py's; the clock is injected so tests do not sleep.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from daemon.common.estimate import PassTimings

if TYPE_CHECKING:
    import torch
    from transformers import Qwen2VLForConditionalGeneration

# The timed vision image: 16x16 patches (256: about the median block crop of the typical
# page, large enough for the GEMMs to run at their pace, small enough for a slow CPU).
VISION_SIDE = 16
# The tiny passes beside them: a pass's cost whatever its size (the same ops, barriers and
# dispatches for 16 patches as for 4,900), cheap to time.
BASE_SIDE = 4
BASE_TOKENS = 8
PREFILL_TOKENS = 128
# Context of the decode steps: short, the steps' cost is the weights' (KV reads are ~1 %).
STEP_CONTEXT = 16
TOKEN = 100  # any id of the vocabulary: the cost does not depend on which

Clock = Callable[[], float]


def time_passes(
    model: Qwen2VLForConditionalGeneration, batch_rows: int, clock: Clock = time.perf_counter
) -> PassTimings:
    """Time the passes on `model`, as the runtime loaded it."""
    import torch

    visual = model.model.visual
    with torch.inference_mode():
        vision = _best_after_warmup(clock, lambda: _vision_pass(visual, VISION_SIDE))
        vision_base = _best_after_warmup(clock, lambda: _vision_pass(visual, BASE_SIDE))
        prefill = _best_after_warmup(clock, lambda: _decoder_pass(model, 1, PREFILL_TOKENS))
        prefill_base = _best_after_warmup(clock, lambda: _decoder_pass(model, 1, BASE_TOKENS))
        step = _step_seconds(model, 1, clock)
        rows = max(1, batch_rows)
        batch_step = step if rows == 1 else _step_seconds(model, rows, clock)
    # In PassTimings' field order: the vision pass (patches, tower width, seconds), the
    # prefill (tokens, seconds), the decode steps (one row, rows of a batch, its seconds),
    # then the tiny vision pass and prefill (patches or tokens, seconds).
    patches, width = VISION_SIDE * VISION_SIDE, int(visual.config.embed_dim)
    return PassTimings(patches, width, vision, PREFILL_TOKENS, prefill, step, rows, batch_step,
                       BASE_SIDE * BASE_SIDE, vision_base, BASE_TOKENS, prefill_base)


def _best_after_warmup(clock: Clock, work: Callable[[], object]) -> float:
    """`work`'s seconds: run once untimed, then the best of two (the passes that follow a
    first one at the same shape ran at a steady pace; a busy machine slows some of them)."""
    work()
    times = []
    for _ in range(2):
        start = clock()
        work()
        times.append(clock() - start)
    return min(times)


def _vision_pass(visual: Any, side: int) -> object:
    """One synthetic image of side x side patches through the tower (and its merger)."""
    import torch

    cfg = visual.config
    patch = int(cfg.patch_size)
    channels = int(cfg.in_channels) * int(cfg.temporal_patch_size) * patch * patch
    pixels = torch.randn(side * side, channels, dtype=visual.get_dtype())
    grid = torch.tensor([[1, side, side]])
    return visual(pixels, grid_thw=grid)


def _positions(rows: int, start: int, length: int) -> torch.Tensor:
    """M-RoPE positions of text: the same position on all three axes."""
    import torch

    return torch.arange(start, start + length).expand(3, rows, length)


def _decoder_pass(model: Any, rows: int, length: int, cache: Any = None, start: int = 0) -> Any:
    """`rows` rows of `length` text tokens through the decoder and the head's last column."""
    import torch

    ids = torch.full((rows, length), TOKEN, dtype=torch.long)
    return model(
        input_ids=ids,
        position_ids=_positions(rows, start, length),
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )


def _step_seconds(model: Any, rows: int, clock: Clock) -> float:
    """One decode step of `rows` rows after a short prefill (each step one position on)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    _decoder_pass(model, rows, STEP_CONTEXT, cache)
    position = itertools.count(STEP_CONTEXT)
    return _best_after_warmup(clock, lambda: _decoder_pass(model, rows, 1, cache, next(position)))
