"""bench/draft_estimate.py drafts as transformers' prompt lookup does, or its estimate is of
something nobody can run."""

from __future__ import annotations

import random

import pytest

from bench.draft_estimate import draft, simulate, step_ms


@pytest.mark.parametrize(("k", "n"), [(1, 1), (2, 2), (3, 3), (4, 2)])
def test_drafts_are_the_prompt_lookup_candidates_of_transformers(k: int, n: int) -> None:
    import torch
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng = random.Random(k * 10 + n)
    # Layout-like: a few recurring separators between random "digits".
    tokens = [rng.randint(1, 9) if rng.random() < 0.5 else 0 for _ in range(80)]
    lookup = PromptLookupCandidateGenerator(
        num_output_tokens=k, max_matching_ngram_size=n, max_length=10_000
    )
    for done in range(2, len(tokens)):
        ids = torch.tensor([tokens[:done]])
        candidates, _ = lookup.get_candidates(ids)  # type: ignore[arg-type]
        want = candidates[0, done:].tolist()
        got = draft([bytes([t]) for t in tokens[:done]], k, n)
        assert [t[0] for t in got] == want, done


def test_accepted_drafts_save_steps_and_rejected_ones_cost_rows() -> None:
    costs = [(1, 50.0), (4, 62.0)]
    assert step_ms(costs, 2) == pytest.approx(54.0)
    assert step_ms(costs, 8) == pytest.approx(78.0)  # the last slope, beyond the table
    repeated = [b"a", b"b", b"c"] * 10
    passes, ms = simulate(repeated, 3, 2, costs)
    # The repetition is drafted and accepted: fewer passes, less time than a token a step.
    assert passes < len(repeated) - 1 and ms < (len(repeated) - 1) * 50.0
    never = [bytes([i]) for i in range(30)]  # nothing recurs: no drafts, one token a step
    assert simulate(never, 3, 2, costs) == (29, 29 * 50.0)
