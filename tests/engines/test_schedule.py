"""The pass scheduler: rows and draft lengths by expected tokens per second (schedule.py)."""

from __future__ import annotations

import pytest

from daemon.engines.mineru.runtimes.drafts import AdaptiveK, ExternalDraft
from daemon.engines.mineru.runtimes.schedule import (
    Acceptance,
    Candidate,
    PassCost,
    PassScheduler,
    RowDrafts,
    expected_tokens,
    plan_pass,
    settle_row,
)


def linear(per_position: float, fixed: float = 1.0, dense_from: int = 0) -> PassCost:
    """seconds = fixed + per_position x rows x width (dense_from: a cheaper kernel above)."""
    points = []
    for rows in (1, 2, 4, 8):
        for width in (1, 2, 4, 8, 16):
            positions = rows * width
            dense = dense_from and positions >= dense_from
            points.append((rows, width, 3 * fixed if dense else fixed + per_position * positions))
    return PassCost(tuple(points), dense_from)


def test_the_cost_interpolates_between_measured_points() -> None:
    cost = PassCost(((1, 1, 1.0), (1, 5, 3.0), (4, 1, 2.0), (4, 5, 6.0)))
    assert cost.seconds(1, 1) == 1.0 and cost.seconds(4, 5) == 6.0
    assert cost.seconds(1, 3) == pytest.approx(2.0)  # along the width
    assert cost.seconds(1, 7) == pytest.approx(4.0)  # beyond it, along its last step
    assert cost.seconds(2, 1) == pytest.approx(1 + 1 / 3)  # along the rows
    assert cost.seconds(8, 1) == pytest.approx(4.0)  # beyond: in proportion to the rows


def test_the_cost_keeps_the_dense_kernel_jump() -> None:
    cost = linear(0.1, dense_from=32)
    assert cost.seconds(8, 3) == pytest.approx(1 + 2.4)  # 24 positions: the int8 kernel
    assert cost.seconds(8, 4) == pytest.approx(3.0)  # 32: the dense one, not interpolated
    assert cost.seconds(4, 8) == pytest.approx(3.0)


def test_expected_tokens_follow_the_acceptance() -> None:
    assert expected_tokens(0.0, 8) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_acceptance_follows_recent_drafts() -> None:
    seen = Acceptance()
    assert seen.rate == 0.5
    for _ in range(5):
        seen.update(4, 4)
    assert seen.rate > 0.95
    for _ in range(5):
        seen.update(4, 0)
    assert seen.rate < 0.3
    seen.update(0, 0)  # nothing scored: nothing learnt
    assert seen.rate < 0.3


def test_without_drafts_every_row_runs() -> None:
    rows = [Candidate(0, 0.5, 0) for _ in range(8)]
    assert PassScheduler(linear(0.1)).choose(rows) == [0] * 8


def test_where_positions_cost_alike_good_drafts_run_long() -> None:
    # A pass costs about the same whatever its size (a dense decoder): every row, full K.
    rows = [Candidate(8, 0.95, 0), Candidate(8, 0.9, 0), Candidate(3, 0.9, 0)]
    assert PassScheduler(linear(0.001), k_max=8).choose(rows) == [8, 8, 3]


def test_where_positions_are_dear_rows_with_bad_drafts_wait() -> None:
    # Each position costs as much as the pass's fixed part: the good drafters run alone,
    # the rows whose drafts fail wait (they would write one token for a padded width).
    rows = [Candidate(4, 0.98, 0), Candidate(4, 0.1, 0), Candidate(4, 0.98, 0)]
    ks = PassScheduler(linear(0.02, fixed=0.2), k_max=4).choose(rows)
    assert ks == [4, -1, 4]


def test_no_row_waits_longer_than_the_bound() -> None:
    rows = [Candidate(4, 0.98, 0), Candidate(4, 0.1, 2)]
    ks = PassScheduler(linear(0.02, fixed=0.2), k_max=4, max_wait=2).choose(rows)
    assert ks[1] >= 0


def test_a_held_row_keeps_its_draft_and_its_policy_is_asked_once() -> None:
    output = list(range(100, 120))
    held = RowDrafts(ExternalDraft(output), AdaptiveK(k_max=8, k=4, cooldown=3, patience=1))
    good = RowDrafts(ExternalDraft(output), AdaptiveK(k_max=8, k=4))
    held.acceptance.hits, held.acceptance.misses = 0.0, 5.0  # its drafts kept failing
    good.acceptance.hits, good.acceptance.misses = 10.0, 0.0  # its were all accepted
    scheduler = PassScheduler(linear(0.02, fixed=0.2), k_max=8, max_wait=1)
    generated = [output[:1], output[:1]]
    plans = plan_pass([good, held], generated, [18, 18], scheduler, 0)
    assert plans[0] is not None and plans[1] is None
    pending = held.pending
    assert pending is not None and held.waited == 1
    settle_row(good, plans[0], output[1 : 2 + len(plans[0].tokens)])
    # The next pass: the held row must run, with the draft planned for it before.
    plans = plan_pass([good, held], [output[:6], output[:1]], [14, 18], scheduler, 0)
    assert plans[1] is not None and plans[1].tokens == pending.tokens[: len(plans[1].tokens)]
    assert held.waited == 0 and held.pending is None


def test_without_a_scheduler_every_row_runs_cut_to_the_limit() -> None:
    output = list(range(100, 120))
    rows = [RowDrafts(ExternalDraft(output), AdaptiveK(k_max=8, k=8)) for _ in range(2)]
    plans = plan_pass(rows, [output[:1], output[:1]], [18, 18], None, 3)
    assert [None if p is None else p.tokens for p in plans] == [output[1:4], output[1:4]]


def test_the_int8_budget_follows_the_cpu_class() -> None:
    from daemon.engines.mineru.runtimes.transformers import (
        DENSE_DRAFTS,
        INT8_AVX2_SCHEDULED,
        INT8_DRAFTS,
        draft_budget,
    )

    # The scheduler where its pass cost was measured and it paid on a page (AVX2), the
    # position budget elsewhere (on Zen 4 it did not pay: docs/benchmarks.md, 2026-12-07).
    assert draft_budget("int8", "AVX2") is INT8_AVX2_SCHEDULED
    assert INT8_AVX2_SCHEDULED.scheduler() is not None
    assert draft_budget("bf16-int8", "AVX512") is INT8_DRAFTS
    assert draft_budget("bf16-int8") is INT8_DRAFTS and INT8_DRAFTS.scheduler() is None
    assert draft_budget("fp32", "AVX2") is DENSE_DRAFTS
