"""bench/draft_replay.py counts, without the model, the passes the decode loop takes.

The replay runs the loop's own draft bookkeeping (`plan_draft`, `settle_draft`) against a
recorded output; on the tiny Qwen2-VL of `tests/tinymodel.py` (the fixtures of
test_decode_loop.py) its passes, proposed and accepted draft tokens must be the loop's, for
drafts right, garbled and useless, with the adaptive policy and a fixed K.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench.draft_acceptance import fixed_k
from bench.draft_replay import POLICIES, Recorded, RecordedDraft, cases, replay
from daemon.engines.mineru.runtimes.decode_loop import (
    DecodeBatch,
    DecodeRequest,
    decode,
    greedy_processors,
)
from daemon.engines.mineru.runtimes.drafts import AdaptiveK, ExternalDraft
from tests.engines.test_decode_loop import Tiny, tiny  # noqa: F401 (a fixture)
from tests.engines.test_mineru_batching import block_image as image


def test_a_perfect_draft_with_a_fixed_k_takes_the_fewest_passes() -> None:
    output = list(range(100, 125))
    run = replay(output, 25, ExternalDraft(output), fixed_k(12)())
    # The prefill writes 1; then 12 accepted + 1, then the 10 left room for + 1.
    assert (run.passes, run.proposed, run.accepted) == (3, 22, 22)
    assert run.wasted == 0


def test_a_useless_draft_wastes_few_positions_with_the_shipped_policy() -> None:
    output = list(range(100, 196))
    useless = ExternalDraft(list(range(1000, 1096)))
    run = replay(output, 96, useless, AdaptiveK())
    assert run.passes == 96 and run.accepted == 0
    # K 4 then 2 refused, a rest of 64 passes the watch cannot end, 1 refused, a rest again.
    assert run.wasted == 4 + 2 + 1
    blind = replay(output, 96, ExternalDraft(useless.tokens), POLICIES["old"]())
    assert blind.wasted == 4 + 2 + 1 + 5  # the old policy: then 1 after each of 5 rests of 16


def test_the_cases_cover_every_draft_and_the_useless_ones() -> None:
    recorded = [
        Recorded("english-1", "english", [1, 2, 3], 8, [RecordedDraft("source", [1, 2, 3], 0.0)]),
        Recorded("german-1", "german", [4, 5], 8, [RecordedDraft("ocr 300dpi", [4, 6], 0.02)]),
    ]
    buckets = [(c.sample, c.bucket) for c in cases(recorded)]
    assert ("english-1", "paragraph, source") in buckets
    assert ("german-1", "paragraph, OCR 1-3 %") in buckets
    for name in ("english-1", "german-1"):
        for bucket in ("prompt lookup", "random tokens", "other language"):
            assert (name, bucket) in buckets


@pytest.mark.parametrize("policy", ["now", "old", "k12"])
def test_the_replay_counts_what_the_loop_counts(tiny: Tiny, policy: str) -> None:  # noqa: F811
    cap = 22
    ref = tiny.reference(image(200, 100, 7), cap)
    never = [t for t in range(tiny.vocab) if t not in set(ref) | tiny.eos]
    drafts = [ref, [*ref[:4], *never[:6], *ref[10:]], never[:cap]]
    make: Callable[[], AdaptiveK] = POLICIES[policy]
    for draft in drafts:
        batch = DecodeBatch(
            tiny.model, greedy_processors(tiny.model, tiny.kwargs(cap)), tiny.eos, make
        )
        request = DecodeRequest(tiny.inputs(image(200, 100, 7)), cap, ExternalDraft(draft))
        [result] = decode(batch, [request], 1, lambda _r: None)
        assert result.tokens == ref
        run = replay(ref, cap, ExternalDraft(draft), make())
        stats = result.stats
        assert (run.passes, run.proposed, run.accepted) == (
            stats.passes, stats.proposed, stats.accepted
        )
