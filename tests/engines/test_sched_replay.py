"""bench/sched_replay.py counts, without the model, what the decode loop's batch does.

The replay runs the loop's own per-pass planning (`plan_pass`, `settle_row`) and `decode`'s
joins against recorded outputs; on the tiny Qwen2-VL (the fixtures of test_decode_loop.py)
its decode passes, positions, and proposed and accepted draft tokens must be the loop's,
with the position budget of today and with a scheduler that holds rows back.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from bench.draft_replay import external
from bench.sched_replay import Policy, Row, replay_batch
from daemon.engines.mineru.runtimes.decode_loop import (
    DecodeBatch,
    DecodeRequest,
    decode,
    greedy_processors,
)
from daemon.engines.mineru.runtimes.drafts import AdaptiveK, ExternalDraft
from daemon.engines.mineru.runtimes.schedule import PassCost, PassScheduler
from tests.engines.test_decode_loop import Tiny, tiny  # noqa: F401 (a fixture)
from tests.engines.test_mineru_batching import block_image as image

# A cost that grows with the square of the rows: the scheduler holds rows back.
STEEP = PassCost(tuple((r, w, r * r + 0.01 * w) for r in (1, 2, 4, 8) for w in (1, 4, 16)))


class CountingBatch(DecodeBatch):
    positions = 0

    def _forward(self, taken: list[int], ids: torch.Tensor, *args: Any) -> torch.Tensor:
        self.positions += int(ids.numel())
        return super()._forward(taken, ids, *args)


@pytest.mark.parametrize(
    "policy",
    [
        Policy(lambda: AdaptiveK(k_max=4, k=4), None, 12),
        Policy(lambda: AdaptiveK(k_max=8, k=4), PassScheduler(STEEP, 8, 2), 0),
    ],
    ids=["today", "scheduler"],
)
def test_the_batch_replay_counts_what_the_loop_counts(tiny: Tiny, policy: Policy) -> None:  # noqa: F811
    shapes = [(200, 100, 7, 22), (300, 40, 1, 30), (120, 60, 2, 36), (80, 30, 4, 40)]
    refs = [tiny.reference(image(w, h, seed), cap) for w, h, seed, cap in shapes]
    never = [t for t in range(tiny.vocab) if t not in {t for r in refs for t in r} | tiny.eos]
    # Right, garbled after 4, right, useless.
    drafts = [refs[0], [*refs[1][:4], *never[:6], *refs[1][10:]], refs[2], never[:40]]
    cap_of = [cap for *_shape, cap in shapes]
    processors = greedy_processors(tiny.model, tiny.kwargs(40))
    batch = CountingBatch(
        tiny.model, processors, tiny.eos, policy.k_policy, policy.max_positions, policy.scheduler
    )
    requests = [
        DecodeRequest(tiny.inputs(image(w, h, seed)), cap, ExternalDraft(draft))
        for (w, h, seed, cap), draft in zip(shapes, drafts, strict=True)
    ]
    results = decode(batch, requests, 3, lambda _r: None)
    assert [r.tokens for r in results] == refs
    rows = [
        Row(ref, cap, external(draft)) for ref, cap, draft in zip(refs, cap_of, drafts, strict=True)
    ]
    run = replay_batch(rows, 3, policy, STEEP)
    joins = len(results)  # each row's prefill is a pass of the batch too
    assert (run.passes, run.positions) == (batch.passes - joins, batch.positions)
    assert run.proposed == sum(r.stats.proposed for r in results) > 0
    assert run.accepted == sum(r.stats.accepted for r in results) > 0
    if policy.scheduler is not None:
        assert run.waits > 0  # the case the scheduler adds: rows held back
