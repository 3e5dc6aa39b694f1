"""A decode loop of our own for Qwen2-VL: rows that leave and join, drafts the model confirms.

transformers' generate() runs a batch until its longest row ends (finished rows are padded
along) and writes one token per row per forward pass. On a CPU a decode step is memory-bound:
it reads every decoder weight once whether it scores 1 token or 16, and whether 1 row or 8
rows are active. So this loop

- keeps a set of active rows (`DecodeBatch`), each with its own KV rows in one shared
  `DynamicCache`, its own attention-mask row and its own next M-RoPE position. A row that
  finishes (EOS or its own cap) leaves at once: its KV rows are sliced out of every layer and
  the cache columns no remaining row uses are trimmed. A waiting row joins after its own
  prefill: its cache is left-padded (or the batch's is) so both end at the same column, then
  concatenated on the batch dimension;
- lets each row carry a draft of its next tokens (`drafts.DraftSource`): one forward pass
  scores [last token, d0 .. dk-1] for every row (shorter drafts padded and masked), and the
  row keeps the longest draft prefix equal to the model's own greedy choices, plus the
  model's next token. The KV entries of rejected positions stay in the cache with mask 0.

Why it is exact (the tests compare it token for token with generate()):
- positions are tracked per row and passed explicitly (3 x B x Q): a row's next position is
  its prompt's largest M-RoPE position + 1 + tokens written, which is what generate() derives
  from `rope_deltas`; padding, holes and the join column change no position;
- a masked KV column contributes exactly nothing to attention, so holes and left padding are
  invisible to a row;
- at every scored position the row's token is the argmax of the SAME logits processors
  generate() builds from MinerU's kwargs (`greedy_processors`: no_repeat_ngram_size=100),
  applied to fp32 logits with the row's own prefix up to that position. A draft token is kept
  only when it is that argmax, so the output is the model's greedy output whatever the draft.

`LoopGenerator` runs it under `BatchedGenerator.generate`'s contract (the engine's switch);
`DecodeBatch(max_positions=...)` bounds rows x (1 + K) per pass, which is what a pass costs on
the weight-only int8 decoder (docs/benchmarks.md, 2026-12-05); `DecodeBatch(scheduler=...)`
instead chooses each pass's rows and K from the measured pass cost and each row's acceptance
(schedule.py). A row left out of a pass feeds nothing: its cache rows get the pass's columns
masked, as a rejected draft's are, so it sees exactly what it would have seen.

Floating-point sums over a different number of masked columns or rows may differ in the last
bits (as batching in generate() already does), so in bf16 a near-tie may flip; in fp32 the
tests see none.

Worker-only (imports torch and transformers at module level); not imported by the daemon.
"""

from __future__ import annotations

import copy
import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast, overload

import torch
import torch.nn.functional as F
from transformers import (
    DynamicCache,
    LogitsProcessorList,
    Qwen2VLForConditionalGeneration,
    Qwen2VLProcessor,
)
from transformers.cache_utils import DynamicLayer

from daemon.engines.mineru.runtimes.base import (
    EarlyRows,
    GenRequest,
    Prediction,
    RowDone,
    SamplingParams,
    capped,
)
from daemon.engines.mineru.runtimes.drafts import AdaptiveK, DraftPlan, DraftSource
from daemon.engines.mineru.runtimes.schedule import (
    PassScheduler,
    RowDrafts,
    plan_pass,
    settle_row,
)

log = logging.getLogger(__name__)

# Holes (rejected draft positions) inside the cache are compacted away once they are more
# than this share of the live columns; below it, carrying them costs less than the copy.
HOLE_SHARE = 0.125


@dataclass
class RowStats:
    """What drafting did for one row: the engine reports these per document."""

    passes: int = 0  # forward passes the row took part in, its prefill included
    proposed: int = 0  # draft tokens scored
    accepted: int = 0  # draft tokens the model confirmed
    tokens: int = 0  # tokens written

    def add(self, other: RowStats) -> None:
        self.passes += other.passes
        self.proposed += other.proposed
        self.accepted += other.accepted
        self.tokens += other.tokens


@dataclass
class DecodeRequest:
    """One row: its processor inputs (a batch of one, unpadded), its cap, its draft source."""

    inputs: Mapping[str, torch.Tensor]
    max_new_tokens: int
    draft: DraftSource | None = None


@dataclass
class DecodeResult:
    index: int  # the request's index given to `join`
    tokens: list[int]  # generated ids, EOS included when the row ended on it
    stats: RowStats


RowFinished = Callable[[DecodeResult], None]


@dataclass(eq=False)
class _Row:
    index: int
    request: DecodeRequest
    prompt: list[int]
    generated: list[int]  # its last token is not in the cache yet: the next pass feeds it
    next_pos: int  # M-RoPE position of generated[-1]
    drafts: RowDrafts
    stats: RowStats = field(default_factory=RowStats)

    def result(self) -> DecodeResult:
        self.stats.tokens = len(self.generated)
        return DecodeResult(self.index, list(self.generated), self.stats)


def greedy_processors(
    model: Qwen2VLForConditionalGeneration, generate_kwargs: Mapping[str, object]
) -> LogitsProcessorList:
    """The logits processors generate() would apply for these kwargs (MinerU's
    `build_generate_kwargs`), from the model's own generation config updated with them.

    Raises ValueError for sampling or beam search: drafted decoding verifies greedy decoding
    only, the caller keeps generate() for anything else."""
    config = copy.deepcopy(model.generation_config)
    for key, value in generate_kwargs.items():
        if key in _LENGTH_KWARGS:
            continue  # the loop stops each row at its own cap
        if not hasattr(config, key):
            raise ValueError(f"the decode loop does not handle generate kwarg {key!r}")
        setattr(config, key, value)  # what GenerationConfig.update does for known keys
    if config.do_sample or (config.num_beams or 1) > 1:
        raise ValueError("the decode loop verifies greedy decoding only")
    # generate()'s own builder, so the list is whatever generate() would apply. Its `self` is
    # annotated with a protocol the Qwen2-VL class does not declare (mypy cannot see it).
    # A non-zero prompt length says the processors see the prompt's ids too (as they do).
    processors: LogitsProcessorList = model._get_logits_processor(  # type: ignore[misc]
        generation_config=config, input_ids_seq_length=1
    )
    return processors


_LENGTH_KWARGS = ("max_new_tokens", "max_length")


def _layers(cache: DynamicCache) -> list[DynamicLayer]:
    layers = []
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer) or layer.keys is None or layer.values is None:
            raise TypeError(f"the decode loop handles full-attention dynamic caches, not {layer}")
        layers.append(layer)
    return layers


def _pad_left(tensor: torch.Tensor, width: int, dim_from_end: int) -> torch.Tensor:
    """Left-pad `tensor` with zeros to `width` along the dimension `dim_from_end` from the end
    (1: the last, 2: the one before it)."""
    missing = width - tensor.shape[-dim_from_end]
    if missing <= 0:
        return tensor
    return F.pad(tensor, (0, 0) * (dim_from_end - 1) + (missing, 0))


class DecodeBatch:
    """The active rows, their shared KV cache and attention mask (see the module docstring).

    `join` prefills a row and adds it; `step` runs one drafted forward pass for every active
    row and returns the rows that finished in it. Both run under torch.no_grad()."""

    def __init__(
        self,
        model: Qwen2VLForConditionalGeneration,
        processors: LogitsProcessorList,
        eos_ids: set[int],
        k_policy: Callable[[], AdaptiveK] = AdaptiveK,
        max_positions: int = 0,
        scheduler: PassScheduler | None = None,
    ) -> None:
        self.model = model
        self.processors = processors
        self.eos_ids = set(eos_ids)
        self.k_policy = k_policy
        # Rows x (1 + longest draft) scored per pass, at most (0: no limit). What a position
        # costs depends on the decoder's kernels: the weight-only int8 one grows with rows
        # (docs/benchmarks.md, 2026-12-05), so a batch there affords shorter drafts.
        self.max_positions = max_positions
        # Or, with a scheduler: the rows of each pass and their drafts' lengths chosen by
        # expected tokens per second on the measured pass cost (schedule.py); rows left
        # out wait a pass. `max_positions` then does not apply.
        self.scheduler = scheduler
        self.rows: list[_Row] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [rows, cache columns], 1 = attend
        self.passes = 0  # forward passes of this batch (prefills included)

    def fits(self, request: DecodeRequest, max_tokens: int) -> bool:
        """Whether `request` may join without the cache passing `max_tokens` columns x rows
        (0: no bound): a joining prompt longer than the batch's columns left-pads them all."""
        if not max_tokens or not self.rows or self.mask is None:
            return True
        length = int(request.inputs["input_ids"].shape[1])
        return (len(self.rows) + 1) * max(self.mask.shape[1], length) <= max_tokens

    def done(self, row: _Row) -> bool:
        return row.generated[-1] in self.eos_ids or len(row.generated) >= row.request.max_new_tokens

    @torch.no_grad()
    def join(self, index: int, request: DecodeRequest) -> DecodeResult | None:
        """Prefill `request` alone and add it to the batch; its result if it finished at once
        (EOS first, or a cap of one token)."""
        inputs = dict(request.inputs)
        input_ids = inputs.pop("input_ids")
        if input_ids.shape[0] != 1:
            raise ValueError("join one row at a time")
        positions, _deltas = self.model.model.get_rope_index(
            input_ids,
            mm_token_type_ids=inputs["mm_token_type_ids"],
            image_grid_thw=inputs.get("image_grid_thw"),
            attention_mask=inputs.get("attention_mask"),
        )
        cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=input_ids,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
            **inputs,
        )
        self.passes += 1
        prompt = [int(t) for t in input_ids[0].tolist()]
        drafts = RowDrafts(request.draft, self.k_policy())
        row = _Row(index, request, prompt, [], int(positions[:, 0, -1].max()) + 1, drafts)
        row.stats.passes = 1
        row.generated.append(self._choose(input_ids, _logits(out)[0, -1:]))
        if self.done(row):
            return row.result()
        self._merge(cache, len(prompt))
        self.rows.append(row)
        return None

    def _choose(self, prefix: torch.Tensor, logits: torch.Tensor) -> int:
        """generate()'s greedy choice after `prefix` ([1, L]) from fp32 `logits` ([1, V])."""
        scores = self.processors(cast(torch.LongTensor, prefix), logits.clone())
        return int(scores.argmax(dim=-1)[0])

    def _merge(self, cache: DynamicCache, length: int) -> None:
        if self.cache is None or self.mask is None:
            self.cache = cache
            self.mask = torch.ones((1, length), dtype=torch.long)
            return
        width = max(self.mask.shape[1], length)
        for layer, joiner in zip(_layers(self.cache), _layers(cache), strict=True):
            assert layer.keys is not None and layer.values is not None  # _layers checked
            assert joiner.keys is not None and joiner.values is not None
            layer.keys = torch.cat(
                [_pad_left(layer.keys, width, 2), _pad_left(joiner.keys, width, 2)]
            )
            layer.values = torch.cat(
                [_pad_left(layer.values, width, 2), _pad_left(joiner.values, width, 2)]
            )
        joined = torch.ones((1, length), dtype=torch.long)
        self.mask = torch.cat([_pad_left(self.mask, width, 1), _pad_left(joined, width, 1)])

    @torch.no_grad()
    def step(self) -> list[DecodeResult]:
        """One forward pass for the active rows the pass takes (all of them without a
        scheduler); the results of the rows that finished."""
        if not self.rows or self.cache is None or self.mask is None:
            return []
        count = len(self.rows)
        limit = self.max_positions // count - 1 if self.max_positions else 1 << 30
        plans = plan_pass(
            [row.drafts for row in self.rows],
            [row.generated for row in self.rows],
            # Each pass writes at most k + 1 tokens: the draft never runs past the row's cap.
            [row.request.max_new_tokens - len(row.generated) - 1 for row in self.rows],
            self.scheduler,
            limit,
        )
        taken = [r for r, plan in enumerate(plans) if plan is not None]
        ran = [(self.rows[r], plan) for r, plan in enumerate(plans) if plan is not None]
        width = 1 + max(len(plan.tokens) for _row, plan in ran)
        ids = torch.zeros((len(ran), width), dtype=torch.long)
        positions = torch.zeros((3, len(ran), width), dtype=torch.long)
        fed = torch.zeros((len(ran), width), dtype=torch.long)
        offsets = torch.arange(width)
        for r, (row, plan) in enumerate(ran):
            draft = plan.tokens
            ids[r, : 1 + len(draft)] = torch.tensor([row.generated[-1], *draft])
            positions[:, r, :] = row.next_pos + offsets
            fed[r, : 1 + len(draft)] = 1
        logits = self._forward(taken, ids, positions, fed)
        self.passes += 1
        kept = torch.zeros((count, width), dtype=torch.long)
        for r, (row, plan) in enumerate(ran):
            kept[taken[r], : self._verify(row, plan, logits[r])] = 1
        self.mask = torch.cat([self.mask, kept], dim=1)
        finished = [row for row in self.rows if self.done(row)]
        if finished:
            self._leave(finished)
        self._trim()
        return [row.result() for row in finished]

    def _forward(
        self, taken: list[int], ids: torch.Tensor, positions: torch.Tensor, fed: torch.Tensor
    ) -> torch.Tensor:
        """The model's fp32 logits for the rows `taken` (indices into `self.rows`), their
        KV appended to the cache; rows left out get the pass's columns masked (holes)."""
        assert self.cache is not None and self.mask is not None
        if len(taken) == len(self.rows):
            mask = torch.cat([self.mask, fed], dim=1)
            return _logits(
                self.model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions,
                    cache=self.cache,
                    use_cache=True,
                )
            )
        # The rows taken through the model on a cache of their own rows (copies), their new
        # KV written back into the batch's cache widened by the pass's columns.
        index = torch.tensor(taken, dtype=torch.long)
        layers = _layers(self.cache)
        full = [(layer.keys, layer.values) for layer in layers]
        for layer, (keys, values) in zip(layers, full, strict=True):
            assert keys is not None and values is not None  # _layers checked
            layer.keys = keys.index_select(0, index)
            layer.values = values.index_select(0, index)
        try:
            out = self.model(
                input_ids=ids,
                attention_mask=torch.cat([self.mask.index_select(0, index), fed], dim=1),
                position_ids=positions,
                cache=self.cache,
                use_cache=True,
            )
        finally:
            width = ids.shape[1]
            for layer, (keys, values) in zip(layers, full, strict=True):
                assert keys is not None and values is not None and layer.keys is not None
                assert layer.values is not None
                if layer.keys.shape[-2] == keys.shape[-2] + width:  # the pass ran
                    layer.keys = F.pad(keys, (0, 0, 0, width)).index_copy_(0, index, layer.keys)
                    layer.values = F.pad(values, (0, 0, 0, width)).index_copy_(
                        0, index, layer.values
                    )
                else:  # it failed before this layer: the cache as it was
                    layer.keys, layer.values = keys, values
        return _logits(out)

    def _verify(self, row: _Row, plan: DraftPlan, logits: torch.Tensor) -> int:
        """Append the tokens the model chose for `row` at its scored positions, up to the first
        that differs from the draft (or EOS / the cap); how many of the fed columns are now
        valid KV (the last token and every confirmed draft token)."""
        draft = plan.tokens
        prefix = torch.tensor([[*row.prompt, *row.generated, *draft]], dtype=torch.long)
        start = len(row.prompt) + len(row.generated)
        written: list[int] = []
        for j in range(len(draft) + 1):
            token = self._choose(prefix[:, : start + j], logits[j : j + 1])
            row.generated.append(token)
            written.append(token)
            if self.done(row) or j >= len(draft) or token != draft[j]:
                break
        row.stats.passes += 1
        row.stats.proposed += len(draft)
        row.stats.accepted += settle_row(row.drafts, plan, written)
        row.next_pos += len(written)
        return len(written)

    def _leave(self, finished: list[_Row]) -> None:
        gone = {id(row) for row in finished}
        keep = [r for r, row in enumerate(self.rows) if id(row) not in gone]
        self.rows = [self.rows[r] for r in keep]
        if not keep or self.cache is None or self.mask is None:
            self.cache = self.mask = None
            return
        index = torch.tensor(keep, dtype=torch.long)
        for layer in _layers(self.cache):
            assert layer.keys is not None and layer.values is not None  # _layers checked
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        self.mask = self.mask.index_select(0, index)

    def _trim(self) -> None:
        """Drop the cache columns no row attends to: left padding nobody needs any more,
        rejected draft positions at the end, and holes once they are a noticeable share."""
        if self.cache is None or self.mask is None:
            return
        live = self.mask.any(dim=0)
        if bool(live.all()):
            return
        columns = live.nonzero().squeeze(1)
        first, end = int(columns[0]), int(columns[-1]) + 1
        holes = end - first - columns.numel()
        if holes > HOLE_SHARE * columns.numel():
            self._select(lambda t: t.index_select(-2, columns), columns)
        else:
            self._select(lambda t: t[..., first:end, :], torch.arange(first, end))

    def _select(self, cut: Callable[[torch.Tensor], torch.Tensor], columns: torch.Tensor) -> None:
        assert self.cache is not None and self.mask is not None
        for layer in _layers(self.cache):
            assert layer.keys is not None and layer.values is not None  # _layers checked
            layer.keys = cut(layer.keys)
            layer.values = cut(layer.values)
        self.mask = self.mask.index_select(1, columns)


def _logits(out: object) -> torch.Tensor:
    logits = getattr(out, "logits", None)
    if not isinstance(logits, torch.Tensor):
        raise TypeError("the model returned no logits")
    # generate() applies its processors to fp32 copies of the logits; so does the loop.
    return logits.float()


# Told a row's tokens so far (`final`: the row has ended) by `decode`; it may append
# requests to the sequence `decode` was given, which join as followers (see there).
Follow = Callable[[int, list[int], bool], None]


def decode(
    batch: DecodeBatch,
    requests: Sequence[DecodeRequest],
    max_rows: int,
    on_done: RowFinished,
    max_tokens: int = 0,
    release: Callable[[], None] | None = None,
    follow: Follow | None = None,
) -> list[DecodeResult]:
    """Every request through `batch`, at most `max_rows` active at once, in request order:
    a row joins as soon as another leaves (and, with `max_tokens`, as soon as the cache has
    room for its prompt: `DecodeBatch.fits`). `on_done` hears each row when it finishes;
    `release` runs before each join (LoopGenerator's: see there).

    `follow` hears every row's tokens after each pass (and a finished row's once more, as
    final) and may append requests to `requests` (a list it owns): those follow the given
    ones into the batch. A follower that cannot join (its prefill raises) is dropped with
    a warning: whoever asked for it gets no result and runs it again its own way. Only the
    given requests' results are returned; a follower's reaches `on_done` alone."""
    given = len(requests)
    # Indices, not requests: a request is read only when its row is next to join, so a lazy
    # sequence (LoopGenerator's) holds a few blocks' pixel values, not the whole step's.
    waiting = deque(range(given))
    results: dict[int, DecodeResult] = {}
    head: tuple[int, DecodeRequest] | None = None  # the next to join, already built

    def finish(result: DecodeResult) -> None:
        if result.index < given:
            results[result.index] = result
        on_done(result)
        if follow is not None:
            follow(result.index, result.tokens, True)

    queued = given  # requests[given:queued] are followers already in `waiting`
    index = 0
    while waiting or head is not None or batch.rows or len(requests) > queued:
        waiting.extend(range(queued, len(requests)))  # what `follow` appended
        queued = len(requests)
        while (waiting or head is not None) and len(batch.rows) < max(1, max_rows):
            try:
                if head is None:
                    index = waiting.popleft()
                    head = (index, requests[index])
                if not batch.fits(head[1], max_tokens):
                    break  # it joins when rows have left
                if release is not None:
                    release()
                joined = batch.join(*head)
            except Exception:
                if (head[0] if head is not None else index) < given:
                    raise
                log.warning("a row started early could not join; it runs later", exc_info=True)
                head = None
                continue
            head = None
            if joined is not None:
                finish(joined)
        for result in batch.step():
            finish(result)
        if follow is not None:
            for row in list(batch.rows):
                follow(row.index, row.generated, False)
    return [results[i] for i in range(given)]


class MinerUClient(Protocol):
    """The parts of mineru-vl-utils' transformers client reused: MinerU's messages, its
    generate kwargs and the ids it drops from the text."""

    skip_token_ids: set[int]

    def build_messages(self, prompt: str) -> object: ...

    def build_generate_kwargs(self, sampling_params: SamplingParams) -> Mapping[str, object]: ...


class LoopGenerator:
    """`BatchedGenerator.generate`'s contract run by the decode loop (the engine's switch).

    Rows of one set of sampling params, results in request order, `on_done(i)` as row i
    finishes; at most `max_rows` decode together and a waiting row takes a finished row's
    place at once. `draft_for` gives each row its draft source (none by default), `k_policy`
    each row's draft length policy, `max_positions` bounds rows x (1 + K) per pass, or
    `scheduler` chooses each pass's rows and K (see `DecodeBatch`), `max_tokens` rows x
    cache columns (`decode`). `totals` adds up every
    row's `RowStats`, for the engine to report; each Prediction carries its own row's.

    `release` runs before each row's join (its vision pass and prefill: the largest
    allocations a row makes). The engine gives it the heap trim (malloc_trim): a join's
    buffers differ in size from crop to crop and across the page threads that run the
    batches, and glibc kept what they freed, so a worker with page_batch 4 grew from 3.0 to
    3.9 GB over one document's block joins (bench/rss_phases.py, docs/benchmarks.md)."""

    def __init__(
        self,
        model: Qwen2VLForConditionalGeneration,
        processor: Qwen2VLProcessor,
        client: MinerUClient,
        eos_ids: set[int],
        max_rows: int,
        draft_for: Callable[[GenRequest], DraftSource | None] = lambda _row: None,
        k_policy: Callable[[], AdaptiveK] = AdaptiveK,
        max_positions: int = 0,
        max_tokens: int = 0,
        release: Callable[[], None] | None = None,
        scheduler: PassScheduler | None = None,
    ) -> None:
        self.model = model
        self.processor = processor
        self.client = client
        self.eos_ids = set(eos_ids)
        self.max_rows = max(1, max_rows)
        self.draft_for = draft_for
        self.k_policy = k_policy
        self.max_positions = max_positions
        self.max_tokens = max_tokens
        self.release = release
        self.scheduler = scheduler
        self.totals = RowStats()

    def processors(self, rows: Sequence[GenRequest]) -> LogitsProcessorList | None:
        """The greedy processors for `rows`' sampling params; None when the loop refuses
        them (sampling, beams): the caller keeps generate() for those."""
        cap = max(row.max_new_tokens for row in rows)
        kwargs = self.client.build_generate_kwargs(capped(rows[0].params, cap))
        try:
            return greedy_processors(self.model, kwargs)
        except ValueError:
            return None

    def generate(
        self,
        rows: Sequence[GenRequest],
        on_done: RowDone,
        processors: LogitsProcessorList | None = None,
    ) -> list[Prediction]:
        if not rows:
            return []
        if processors is None:
            processors = self.processors(rows)
        if processors is None:
            raise ValueError("the decode loop verifies greedy decoding only")
        batch = DecodeBatch(
            self.model,
            processors,
            self.eos_ids,
            self.k_policy,
            self.max_positions,
            self.scheduler,
        )
        requests = _LazyRequests(self, rows)
        given = len(rows)
        early_of: dict[int, EarlyRows] = {}  # a follower's index -> whom it reports to
        read = [0] * given  # tokens of each given row its `early` has seen

        def follow(index: int, tokens: list[int], final: bool) -> None:
            # A given row's output so far to its `early` (the layout step's: its finished
            # lines are blocks), when it has grown; what that answers joins as followers.
            early = rows[index].early if index < given else None
            if early is None or (len(tokens) == read[index] and not final):
                return
            read[index] = len(tokens)
            for follower in early.poll(self.text(tokens), len(tokens), final):
                early_of[len(requests)] = early
                requests.rows.append(follower)

        def finished(result: DecodeResult) -> None:
            if result.index < given:
                on_done(result.index)
                return
            self.totals.add(result.stats)
            follower = requests.rows[result.index]
            early_of[result.index].done(follower, self.prediction(result))

        results = decode(
            batch,
            requests,
            self.max_rows,
            finished,
            self.max_tokens,
            self.release,
            follow if any(row.early is not None for row in rows) else None,
        )
        for result in results:
            self.totals.add(result.stats)
        return [self.prediction(result) for result in results]

    def text(self, tokens: list[int]) -> str:
        """A row's tokens as MinerU's client reads them: its skip tokens dropped, special
        tokens kept (the layout's boxes are special tokens)."""
        skip = self.client.skip_token_ids
        kept = [t for t in tokens if t not in skip]
        text: str = self.processor.batch_decode(  # type: ignore[no-untyped-call]
            [kept], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )[0]
        return text

    def prediction(self, result: DecodeResult) -> Prediction:
        stats = result.stats
        return Prediction(
            self.text(result.tokens), len(result.tokens), stats.passes, stats.proposed,
            stats.accepted,
        )  # fmt: skip

    def greedy(self, rows: Sequence[GenRequest], on_done: RowDone) -> list[Prediction] | None:
        """`generate` for rows of greedy params; None, having run nothing, for the params
        the loop refuses (sampling, beams)."""
        processors = self.processors(rows) if rows else None
        return None if processors is None else self.generate(rows, on_done, processors)

    def request(self, row: GenRequest) -> DecodeRequest:
        return DecodeRequest(self.inputs(row), row.max_new_tokens, self.draft_for(row))

    def inputs(self, row: GenRequest) -> dict[str, torch.Tensor]:
        """One row's prompt as MinerU's client builds it, alone (no padding); floating inputs
        (pixel values) in the model's dtype, as the client does."""
        text = self.processor.apply_chat_template(
            # transformers' hint says str contents; chat templates take MinerU's content
            # lists (an image part, a text part) as well.
            cast("list[dict[str, str]]", self.client.build_messages(row.prompt)),
            tokenize=False,
            add_generation_prompt=True,
        )
        inputs = self.processor(text=[text], images=[row.image], return_tensors="pt")
        return {
            key: value.to(self.model.dtype) if value.is_floating_point() else value
            for key, value in inputs.items()
        }


class _LazyRequests(Sequence[DecodeRequest]):
    """A step's rows as DecodeRequests built when `decode` reads them (when a row joins)."""

    def __init__(self, generator: LoopGenerator, rows: Sequence[GenRequest]) -> None:
        self.generator = generator
        self.rows = list(rows)  # followers are appended (LoopGenerator.generate's follow)

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> DecodeRequest: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[DecodeRequest]: ...
    def __getitem__(self, index: int | slice) -> DecodeRequest | Sequence[DecodeRequest]:
        if isinstance(index, slice):
            return [self.generator.request(row) for row in self.rows[index]]
        return self.generator.request(self.rows[index])
