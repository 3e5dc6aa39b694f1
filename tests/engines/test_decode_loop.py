"""The decode loop writes, token for token, what generate() writes, whatever the drafts say.

Runs on the tiny Qwen2-VL of `tests/tinymodel.py` in fp32 with a random decoder (fixed seed)
and MinerU's own generate kwargs (`build_generate_kwargs`: greedy, no_repeat_ngram_size=100).
The reference for every row is plain generate() on that row alone. The random decoder
settles into repeating one token after a while; each test checks that its rows really do what
it claims (drafts accepted or refused, rows ending early, rows joining a running batch).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from daemon.engines.mineru.engine import ModelFreeClient
from daemon.engines.mineru.runtimes import decode_loop
from daemon.engines.mineru.runtimes.base import GenRequest, capped
from daemon.engines.mineru.runtimes.decode_loop import (
    DecodeBatch,
    DecodeRequest,
    DecodeResult,
    LoopGenerator,
    decode,
    greedy_processors,
)
from daemon.engines.mineru.runtimes.drafts import (
    AdaptiveK,
    DraftPlan,
    ExternalDraft,
    PromptLookup,
    plan_draft,
    settle_draft,
)
from daemon.engines.mineru.runtimes.schedule import PassCost, PassScheduler
from daemon.engines.mineru.runtimes.transformers_generate import BatchedGenerator
from tests.engines.test_mineru_batching import block_image as image
from tests.tinymodel import randomize_language_model, tiny_model_once

# (width, height, cap): images of different grid sizes, so prompts differ in length.
SHAPES = [
    (300, 40, 30),
    (500, 300, 24),
    (120, 60, 36),
    (600, 200, 28),
    (80, 30, 40),
    (700, 500, 20),
]


class Tiny:
    def __init__(self, folder: Path) -> None:
        from mineru_vl_utils.vlm_client.transformers_client import TransformersVlmClient
        from transformers import Qwen2VLForConditionalGeneration

        from daemon.engines.mineru.runtimes.transformers_model import load_processor

        self.model = Qwen2VLForConditionalGeneration.from_pretrained(
            str(folder), dtype=torch.float32, attn_implementation="sdpa"
        )  # in eval mode, as from_pretrained leaves it
        self.processor = load_processor(folder)
        self.client = TransformersVlmClient(self.model, self.processor, use_tqdm=False)
        self.params = ModelFreeClient.make().sampling_params["[default]"]
        self.eos = set(self.model.generation_config.eos_token_id)
        self.eos_id = self.processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.vocab = int(self.model.lm_head.weight.shape[0])

    def kwargs(self, cap: int, **override: Any) -> dict[str, Any]:
        kwargs: dict[str, Any] = self.client.build_generate_kwargs(capped(self.params, cap))
        kwargs.pop("max_length", None)
        kwargs.update(override)
        return kwargs

    def inputs(self, image: Image.Image) -> dict[str, torch.Tensor]:
        text = self.processor.apply_chat_template(
            self.client.build_messages("\nText Recognition:"),
            tokenize=False,
            add_generation_prompt=True,
        )
        return dict(self.processor(text=[text], images=[image], return_tensors="pt"))

    def reference(self, image: Image.Image, cap: int, **override: Any) -> list[int]:
        """Plain generate() on the row alone, with MinerU's kwargs."""
        inputs = self.inputs(image)
        with torch.no_grad():
            out = self.model.generate(**inputs, **self.kwargs(cap, **override))
        ids: list[int] = out[0, inputs["input_ids"].shape[1] :].tolist()
        return ids

    def batch(self, cap: int = 40) -> RecordingBatch:
        return RecordingBatch(self.model, greedy_processors(self.model, self.kwargs(cap)), self.eos)


class RecordingBatch(DecodeBatch):
    """Records how rows joined, and checks the cache stays trimmed after every step."""

    joins: list[tuple[int, int, int]]  # (active rows, batch columns, joiner's prompt length)
    holes = 0  # steps after which a row had a masked column between two it attends to

    def _merge(self, cache: Any, length: int) -> None:
        if not hasattr(self, "joins"):
            self.joins = []
        width = 0 if self.mask is None else self.mask.shape[1]
        self.joins.append((len(self.rows), width, length))
        super()._merge(cache, length)

    def step(self) -> list[DecodeResult]:
        finished = super().step()
        if self.mask is not None and self.cache is not None:
            assert self.cache.get_seq_length() == self.mask.shape[1]
            live = self.mask.any(dim=0)
            assert bool(live[0]) and bool(live[-1])  # no dead column at either end
            assert bool(live.all()) or decode_loop.HOLE_SHARE > 0  # 0: compacted at once
        return finished

    def _trim(self) -> None:
        if self.mask is not None:
            seen = self.mask.cumsum(dim=1) > 0  # from each row's first attended column on
            self.holes += bool((seen & (self.mask == 0)).any())
        super()._trim()


class RecordingDraft:
    """A draft source that records what it proposed, after how many generated tokens."""

    def __init__(self, inner: ExternalDraft) -> None:
        self.inner = inner
        self.calls: list[tuple[int, list[int]]] = []

    def propose(self, generated: Sequence[int], k: int) -> list[int]:
        proposal = self.inner.propose(generated, k)
        self.calls.append((len(generated), proposal))
        return proposal


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiny]:
    t = Tiny(tiny_model_once(tmp_path_factory.mktemp("tiny-decode-loop")))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        randomize_language_model(t.model, generator)
        head = t.model.lm_head.weight
        head.copy_(torch.randn(head.shape, generator=generator) * 0.125)
        # End-of-turn wins wherever the 4th token of one probe row would: some rows end early.
        probe = t.reference(image(500, 300, 1), 4)
        head[t.eos_id] = head[probe[-1]] * 1.5
    yield t


@pytest.fixture(scope="module")
def refs(tiny: Tiny) -> list[list[int]]:
    return [tiny.reference(image(w, h, i), cap) for i, (w, h, cap) in enumerate(SHAPES)]


def requests(tiny: Tiny, drafts: Sequence[list[int] | None] | None = None) -> list[DecodeRequest]:
    out = []
    for i, (w, h, cap) in enumerate(SHAPES):
        draft = None if drafts is None or drafts[i] is None else ExternalDraft(drafts[i] or [])
        out.append(DecodeRequest(tiny.inputs(image(w, h, i)), cap, draft))
    return out


def run(
    tiny: Tiny, reqs: list[DecodeRequest], max_rows: int
) -> tuple[list[DecodeResult], list[int]]:
    order: list[int] = []
    results = decode(tiny.batch(), reqs, max_rows, lambda r: order.append(r.index))
    return results, order


def test_refs_exercise_early_ends_and_caps(refs: list[list[int]], tiny: Tiny) -> None:
    ended = [r[-1] in tiny.eos for r in refs]
    capped_rows = [len(r) == cap for r, (_w, _h, cap) in zip(refs, SHAPES, strict=True)]
    assert any(ended) and any(capped_rows)
    assert len({len(r) for r in refs}) > 2  # rows finish at different steps


def test_no_drafts_one_batch_rows_finish_at_different_steps(
    tiny: Tiny, refs: list[list[int]]
) -> None:
    results, order = run(tiny, requests(tiny), max_rows=8)
    assert [r.tokens for r in results] == refs
    # Reported as they finish: the shortest rows first, not in request order at the end.
    lengths = [len(refs[i]) for i in order]
    assert lengths == sorted(lengths) and order != sorted(order)
    assert all(r.stats.proposed == 0 and r.stats.passes == len(r.tokens) for r in results)


def test_rows_join_mid_batch_on_both_sides_of_the_alignment(
    tiny: Tiny, refs: list[list[int]]
) -> None:
    batch = tiny.batch()
    results = decode(batch, requests(tiny), 2, lambda _r: None)
    assert [r.tokens for r in results] == refs
    mid = [(rows, width, length) for rows, width, length in batch.joins if rows > 0]
    assert len(mid) >= 3  # joined a running batch
    assert any(length > width for _r, width, length in mid)  # the batch was left-padded
    assert any(length < width for _r, width, length in mid)  # the joiner was left-padded


@pytest.mark.parametrize("hole_share", [decode_loop.HOLE_SHARE, 0.0])
def test_perfect_drafts_accept_several_tokens_per_pass(
    tiny: Tiny, refs: list[list[int]], hole_share: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rows accept different numbers of tokens per pass: the others' columns become holes,
    # carried along or (share 0) compacted away at once.
    monkeypatch.setattr(decode_loop, "HOLE_SHARE", hole_share)
    batch = tiny.batch()
    results = decode(batch, requests(tiny, refs), 3, lambda _r: None)
    assert [r.tokens for r in results] == refs
    assert batch.holes > 0
    for r in results:
        assert r.stats.accepted == r.stats.proposed > 0
        # Tokens per decode pass (the prefill writes the first): K starts at 4 and doubles.
        assert (len(r.tokens) - 1) / (r.stats.passes - 1) >= min(3, len(r.tokens) - 1)


def test_a_position_budget_shortens_drafts_and_changes_no_token(
    tiny: Tiny, refs: list[list[int]]
) -> None:
    batch = DecodeBatch(
        tiny.model, greedy_processors(tiny.model, tiny.kwargs(40)), tiny.eos, max_positions=8
    )
    widths: list[int] = []
    forward = batch.model.forward

    def spy(*args: Any, **kwargs: Any) -> Any:
        if "pixel_values" not in kwargs:  # a decode pass, not a prefill
            widths.append(int(kwargs["input_ids"].numel()))
        return forward(*args, **kwargs)

    batch.model.forward = spy
    try:
        results = decode(batch, requests(tiny, refs), 3, lambda _r: None)
    finally:
        del batch.model.forward  # back to the class's own
    assert [r.tokens for r in results] == refs
    assert widths and max(widths) <= 8 and sum(r.stats.accepted for r in results) > 0


def by_rows_squared() -> PassCost:
    """A pass cost that grows with the square of its rows and hardly with its width: the
    scheduler runs one row with a long draft and lets the others wait."""
    return PassCost(tuple((r, w, r * r + 0.01 * w) for r in (1, 2, 4, 8) for w in (1, 4, 16)))


class HoldingBatch(RecordingBatch):
    """Records, per pass, the rows it ran against the rows active, and the longest wait."""

    ran: list[tuple[int, int]]
    longest_wait = 0

    def _forward(self, taken: list[int], *args: Any) -> torch.Tensor:
        if not hasattr(self, "ran"):
            self.ran = []
        self.ran.append((len(taken), len(self.rows)))
        waits = [row.drafts.waited for row in self.rows]
        self.longest_wait = max(self.longest_wait, *waits)
        return super()._forward(taken, *args)


@pytest.mark.parametrize("hole_share", [decode_loop.HOLE_SHARE, 0.0])
def test_rows_held_back_a_pass_change_no_token(
    tiny: Tiny, refs: list[list[int]], hole_share: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decode_loop, "HOLE_SHARE", hole_share)
    seen = {t for ref in refs for t in ref} | tiny.eos
    never = [t for t in range(tiny.vocab) if t not in seen]
    # Half the rows drafted perfectly, half garbled from their third token on.
    drafts = [ref if i % 2 == 0 else [*ref[:2], *never[: len(ref)]] for i, ref in enumerate(refs)]
    scheduler = PassScheduler(by_rows_squared(), k_max=8, max_wait=2)
    processors = greedy_processors(tiny.model, tiny.kwargs(40))
    batch = HoldingBatch(tiny.model, processors, tiny.eos, scheduler=scheduler)
    results = decode(batch, requests(tiny, drafts), 4, lambda _r: None)
    assert [r.tokens for r in results] == refs
    assert any(ran < active for ran, active in batch.ran)  # rows were held back
    assert 0 < batch.longest_wait <= 2  # and none longer than the scheduler allows
    assert sum(r.stats.accepted for r in results) > 0


def test_grouped_decoder_attention_changes_no_token(
    tiny: Tiny, refs: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """load_model routes the decoder through decoder_attention's grouped heads (verify
    passes: several positions a row, with a mask): the loop's tokens stay generate()'s on
    transformers' own SDPA (refs), with drafts good and garbled, rows leaving and joining."""
    from types import SimpleNamespace

    from daemon.engines.mineru.runtimes import decoder_attention

    config = tiny.model.model.language_model.config
    monkeypatch.setattr(config, "_attn_implementation", "sdpa")  # put back afterwards
    assert decoder_attention.use_grouped_attention(config)
    folded: list[int] = []

    def sdpa(query: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        folded.append(query.shape[2])
        return F.scaled_dot_product_attention(query, *args, **kwargs)

    monkeypatch.setattr(decoder_attention, "F", SimpleNamespace(scaled_dot_product_attention=sdpa))
    seen = {t for ref in refs for t in ref} | tiny.eos
    never = [t for t in range(tiny.vocab) if t not in seen]
    drafts = [ref if i % 2 == 0 else [*ref[:2], *never[: len(ref)]] for i, ref in enumerate(refs)]
    results = decode(tiny.batch(), requests(tiny, drafts), 3, lambda _r: None)
    assert [r.tokens for r in results] == refs
    assert folded  # the verify passes went through the grouped heads


def test_drafts_wrong_from_the_first_token(tiny: Tiny, refs: list[list[int]]) -> None:
    seen = {t for ref in refs for t in ref} | tiny.eos
    never = [t for t in range(tiny.vocab) if t not in seen]
    # Right where the prefill's token is (the draft's start), then nothing the model writes.
    wrong = [[ref[0], *never[: len(ref)]] for ref in refs]
    results, _order = run(tiny, requests(tiny, wrong), max_rows=4)
    assert [r.tokens for r in results] == refs
    for r in results:
        assert r.stats.accepted == 0 < r.stats.proposed
        assert r.stats.passes == len(r.tokens)  # no pass saved, none lost
        # AdaptiveK gave up: 4, 2, 1, then one token after each rest of 16 passes.
        assert r.stats.proposed <= 4 + 2 + 1 + len(r.tokens) // 16


def test_drafts_right_then_wrong_then_right(tiny: Tiny, refs: list[list[int]]) -> None:
    cap = 22
    ref = tiny.reference(image(200, 100, 7), cap)
    # Mostly distinct, with its own first five tokens again at 15-19: re-alignment must pick
    # the occurrence near where it is, not the first one.
    assert len(ref) == cap and ref[15:20] == ref[:5] and len(set(ref)) >= 15
    seen = {t for r in refs for t in r} | set(ref) | tiny.eos
    never = [t for t in range(tiny.vocab) if t not in seen]
    # Right for 6, two substituted, right for 4, one inserted, right to the end.
    draft = [*ref[:6], never[0], never[1], *ref[8:12], never[2], *ref[12:]]
    source = RecordingDraft(ExternalDraft(draft))
    reqs = [*requests(tiny), DecodeRequest(tiny.inputs(image(200, 100, 7)), cap, source)]
    results, _order = run(tiny, reqs, max_rows=8)
    assert [r.tokens for r in results] == [*refs, ref]
    stats = results[-1].stats
    assert stats.proposed > stats.accepted and stats.passes < cap // 2

    def right(lo: int, hi: int) -> bool:  # a proposal made in [lo, hi), its first 2 right
        # (a long one may run on into the next error: the first tokens show the re-alignment)
        return any(lo <= g < hi and p[:2] == ref[g : g + 2] for g, p in source.calls)

    assert right(1, 6) and right(7, 12) and right(13, cap)  # right, again, and again


def test_a_garbled_stretch_longer_than_the_patience_does_not_cost_the_rest(
    tiny: Tiny, refs: list[list[int]]
) -> None:
    cap = 22
    ref = tiny.reference(image(200, 100, 7), cap)
    seen = {t for r in refs for t in r} | set(ref) | tiny.eos
    never = [t for t in range(tiny.vocab) if t not in seen]
    # Right for 4, then a garbled "line" of 6 (more rejections than the patience), then
    # right to the end: AdaptiveK rests, watches the re-aligned draft agree, and wakes.
    draft = [*ref[:4], *never[:6], *ref[10:]]

    def drafted(policy: AdaptiveK) -> tuple[list[int], RecordingDraft]:  # one row, alone
        source = RecordingDraft(ExternalDraft(draft))
        batch = DecodeBatch(
            tiny.model, greedy_processors(tiny.model, tiny.kwargs(cap)), tiny.eos, lambda: policy
        )
        request = DecodeRequest(tiny.inputs(image(200, 100, 7)), cap, source)
        [result] = decode(batch, [request], 1, lambda _r: None)
        return result.tokens, source

    def right_after_the_garble(source: RecordingDraft) -> bool:
        return any(g >= 10 and len(p) >= 2 and p == ref[g : g + len(p)] for g, p in source.calls)

    tokens, woken = drafted(AdaptiveK())
    assert tokens == ref
    assert right_after_the_garble(woken)


def test_drafts_longer_than_the_cap(tiny: Tiny, refs: list[list[int]]) -> None:
    longer = [[*ref, *ref] for ref in refs]
    results, _order = run(tiny, requests(tiny, longer), max_rows=8)
    assert [r.tokens for r in results] == refs
    for r, (_w, _h, cap) in zip(results, SHAPES, strict=True):
        assert len(r.tokens) <= cap


def test_the_ngram_rule_blocks_a_repetition_inside_a_draft(tiny: Tiny) -> None:
    # This row settles into one repeated token: after 100 of them the rule bans it.
    w, h, seed, cap = 90, 90, 6, 140
    banned = tiny.reference(image(w, h, seed), cap)
    free = tiny.reference(image(w, h, seed), cap, no_repeat_ngram_size=0)
    first = next(k for k, (a, b) in enumerate(zip(banned, free, strict=True)) if a != b)
    assert first > 100 and len(set(free[first - 100 : first + 1])) == 1
    batch = DecodeBatch(tiny.model, greedy_processors(tiny.model, tiny.kwargs(cap)), tiny.eos)
    draft = RecordingDraft(ExternalDraft(free))
    request = DecodeRequest(tiny.inputs(image(w, h, seed)), cap, draft)
    [result] = decode(batch, [request], 1, lambda _r: None)
    assert result.tokens == banned
    # The draft carried the row up to the ban, and proposed the banned token itself.
    assert len([g for g, _p in draft.calls if g <= first]) < first // 4
    assert any(g <= first < g + len(p) and p[first - g] == free[first] for g, p in draft.calls)


def test_loop_generator_gives_what_batched_generate_gives(tiny: Tiny) -> None:
    """The engine's switch: same Predictions (text, token count) as one padded generate()."""
    defaults = ModelFreeClient.make()
    prompts, params = defaults.prompts, defaults.sampling_params
    kinds = ["[default]", "table", "equation", "[default]", "[default]", "table"]
    rows = [
        GenRequest(image(w, h, i), prompts[kind], params[kind], cap)
        for i, ((w, h, cap), kind) in enumerate(zip(SHAPES, kinds, strict=True))
    ]
    batched = BatchedGenerator(tiny.model, tiny.processor, tiny.client, 8)
    expected = batched.generate(rows, lambda _i: None)
    loop = LoopGenerator(
        tiny.model, tiny.processor, tiny.client, batched.eos_ids, 3, lambda _row: PromptLookup()
    )
    finished: list[int] = []
    assert loop.generate(rows, finished.append) == expected
    assert sorted(finished) == list(range(len(rows))) and finished != sorted(finished)
    assert loop.totals.tokens == sum(p.tokens for p in expected)
    assert loop.totals.proposed > 0  # the repeats the random decoder falls into get drafted


def test_the_release_runs_before_every_join_and_changes_no_token(
    tiny: Tiny, refs: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's heap trim: once before each row's join, never between two passes."""
    batch = tiny.batch()
    events: list[str] = []
    join = batch.join

    def recorded_join(index: int, request: DecodeRequest) -> DecodeResult | None:
        events.append("join")
        return join(index, request)

    monkeypatch.setattr(batch, "join", recorded_join)
    results = decode(batch, requests(tiny), 2, lambda _r: None, release=lambda: events.append("r"))
    assert [r.tokens for r in results] == refs
    assert events == ["r", "join"] * len(SHAPES)


def test_prompt_lookup_proposes_what_followed_the_last_tail() -> None:
    lookup = PromptLookup(ngram_max=3, ngram_min=1)
    assert lookup.propose([1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]
    assert lookup.propose([1, 2, 3, 4, 1, 2, 9, 2], 2) == [9, 2]  # the latest occurrence
    assert lookup.propose([5, 6, 7], 4) == []
    assert PromptLookup(prompt=[8, 9, 10, 11]).propose([8, 9], 2) == [10, 11]


def test_external_draft_realigns_after_a_mismatch() -> None:
    draft = ExternalDraft([10, 11, 12, 13, 14, 15, 16, 17])
    assert draft.propose([], 3) == [10, 11, 12]
    assert draft.propose([10, 11], 2) == [12, 13]
    out = [10, 11, 12, 99]  # 99 is nowhere in the draft: a substitution, keep in step
    assert draft.propose(out, 2) == [14, 15]
    out.append(14)
    assert draft.propose(out, 2) == [15, 16]
    out += [77, 15]  # an inserted token: the tail is found again just behind it
    assert draft.propose(out, 2) == [16, 17]
    out += [17]  # a skipped one
    assert draft.propose(out, 5) == []
    assert ExternalDraft([1, 2, 3, 4]).propose([7, 8], 2) == [3, 4]  # two substitutions
    assert ExternalDraft([1, 2]).propose([7, 8], 2) == []  # past its end


def test_an_external_text_drafts_what_the_tokenizer_makes_of_it(tiny: Tiny) -> None:
    tokenizer = tiny.processor.tokenizer
    text = "Table Recognition of the equation"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    draft = ExternalDraft.from_text(
        text, lambda t: tokenizer(t, add_special_tokens=False)["input_ids"]
    )
    assert draft.propose(ids[:2], 3) == ids[2:5]


def test_adaptive_k_grows_shrinks_and_rests() -> None:
    k = AdaptiveK(k_max=8, k=2, patience=2, cooldown=3)
    k.update(2, 2)
    assert k.current() == 4
    k.update(4, 1)
    assert k.current() == 2
    k.update(2, 0)
    k.update(1, 0)
    assert [k.current() for _ in range(4)] == [0, 0, 0, 1]
    k.update(0, 0)  # nothing proposed: nothing learnt
    assert k.current() == 1
    k.update(1, 0)  # failed again after resting: rests again at once
    assert k.current() == 0


def test_adaptive_k_watches_while_resting_and_wakes_on_agreement() -> None:
    k = AdaptiveK(k_max=8, k=1, patience=1, cooldown=10, wake=2, k_wake=3)
    k.update(1, 0)  # rests
    assert k.current() == 0 and k.watching()
    k.observe(True)
    k.observe(False)  # an agreement must be followed by another, not by a disagreement
    k.observe(True)
    assert k.current() == 0 and k.watching()
    k.observe(True)  # two in a row: awake, at k_wake
    assert not k.watching() and k.current() == 3


def test_adaptive_k_without_wake_rests_blind_for_its_cooldown() -> None:
    k = AdaptiveK(k_max=8, k=1, patience=1, cooldown=3, wake=0)
    k.update(1, 0)
    assert not k.watching()
    k.observe(True)
    k.observe(True)
    assert [k.current() for _ in range(4)] == [0, 0, 0, 1]


def test_a_resting_plan_watches_one_token_and_scores_none() -> None:
    source = ExternalDraft([1, 2, 3, 4, 5, 6])
    k = AdaptiveK(k_max=4, k=1, patience=1, cooldown=5, wake=1, k_wake=2)
    plan = plan_draft(source, k, [9], room=10)
    assert len(plan.tokens) == 1 and plan.watched == []
    assert settle_draft(k, plan, [7]) == 0  # rejected: rests from here
    plan = plan_draft(source, k, [9, 7], room=10)
    assert plan.tokens == [] and len(plan.watched) == 1
    # The model wrote the watched token: with wake=1 the next pass drafts k_wake tokens.
    assert settle_draft(k, plan, plan.watched) == 0
    plan = plan_draft(source, k, [9, 7, *plan.watched], room=10)
    assert len(plan.tokens) == 2 and plan.watched == []
    # No room left in the row: no draft, nothing watched, and no source call needed.
    assert plan_draft(source, k, [1], room=0) == DraftPlan([], [])


class RecordingEarly:
    """A row's `early` (base.EarlyRows) that asks for rows once the row has written
    `after` tokens and more at its end, and records what it heard."""

    def __init__(self, after: int, first: list[GenRequest], last: list[GenRequest]) -> None:
        self.after, self.first, self.last = after, first, last
        self.polls: list[tuple[int, bool]] = []
        self.answers: dict[int, Any] = {}  # id(request) -> Prediction
        self.events: list[str] = []

    def poll(self, text: str, tokens: int, final: bool) -> list[GenRequest]:
        self.polls.append((tokens, final))
        if final:
            self.events.append("final")
            return self.last
        if tokens >= self.after and self.first:
            asked, self.first = self.first, []
            return asked
        return []

    def done(self, request: GenRequest, prediction: Any) -> None:
        self.answers[id(request)] = prediction
        self.events.append(f"done {id(request)}")


def test_rows_asked_for_by_a_row_join_beside_it_and_write_what_they_write_alone(
    tiny: Tiny,
) -> None:
    """The layout step's early blocks, in the loop: rows that a given row's `early` asks
    for after its third token (and at its end) join the running batch and decode the tokens
    they decode alone; the given rows' own answers are unchanged; a follower that cannot
    start (an image the processor refuses) is dropped, not fatal, and gets no answer."""
    defaults = ModelFreeClient.make()
    prompt, params = defaults.prompts["[default]"], defaults.sampling_params["[default]"]
    rows = [GenRequest(image(w, h, i), prompt, params, cap) for i, (w, h, cap) in enumerate(SHAPES)]
    batched = BatchedGenerator(tiny.model, tiny.processor, tiny.client, 8)
    alone = [batched.generate([row], lambda _i: None)[0] for row in rows]
    # The longest row asks; the shortest follows first, so it ends while the asker runs.
    by_length = sorted(range(len(rows)), key=lambda i: (alone[i].tokens, i))
    ask, short, other, rest = by_length[-1], by_length[0], by_length[1], by_length[2:-1]
    assert alone[short].tokens + 3 < alone[ask].tokens
    broken = GenRequest(b"not an image", prompt, params, 8)
    early = RecordingEarly(3, [rows[short], broken, rows[rest[0]]], [rows[rest[1]]])
    asking = GenRequest(rows[ask].image, prompt, params, rows[ask].max_new_tokens, early=early)
    loop = LoopGenerator(tiny.model, tiny.processor, tiny.client, batched.eos_ids, 3)
    finished: list[int] = []
    got = loop.generate([asking, rows[other]], finished.append)
    assert got == [alone[ask], alone[other]] and sorted(finished) == [0, 1]
    followers = [short, rest[0], rest[1]]
    assert early.answers == {id(rows[i]): alone[i] for i in followers}
    # Polled as the row grew (not on passes that wrote nothing new), once at its end; the
    # first follower finished before the asking row did: it ran beside it.
    tokens = [t for t, final in early.polls if not final]
    assert tokens == sorted(set(tokens)) and early.polls[-1] == (alone[ask].tokens, True)
    assert early.events.index(f"done {id(rows[short])}") < early.events.index("final")
    assert loop.totals.tokens == sum(alone[i].tokens for i in [ask, other, *followers])
