"""Generation for the transformers runtime of the `mineru` engine: several prompts, one generate().

Why batching pays on a CPU: decoding is memory-bound. Each new token reads every decoder
weight once (about 1 GB in bf16 for MinerU2.5); computing the token for 8 blocks at once reads
them once too, so 8 blocks cost little more per step than one. Prefill and the vision tower are
compute-bound and gain nothing, so blocks of similar size go together (little padding).

How a batch stays equal to running its rows one by one (the tests check it token for token):

- prompts are padded on the LEFT and carry an attention mask, so every row's last prompt token
  sits at the end, where generation continues; Qwen2-VL derives each row's M-RoPE positions
  from the mask, so padding shifts nothing;
- each row has its own image (its own grid): the processor expands each row's image
  placeholder to that image's token count and the vision tower runs on all images at once;
- each row stops on its own, at EOS or at its own token cap (`RowStops`); a finished row is
  padded while the others go on and its padding is cut off;
- MinerU's sampling rules (greedy, no_repeat_ngram_size=100) are the ones mineru-vl-utils'
  transformers client passes (`build_generate_kwargs`); transformers applies the n-gram rule
  per row. Left padding cannot create a false n-gram match: a padded window only equals the
  current suffix when it IS that suffix.

Across pages (`PageBatcher`, engine.page_batch): the worker parses several pages of a
document at once, each in its own thread; their rows meet here and share generate() calls,
the layout steps of several pages as rows of one batch and block batches filled from every
page whose layout is done. Which rows share a call changes nothing in any row's tokens (the
rules above), so pages come out as they do one at a time.

With `engine.decode: loop` (the default) a batch's greedy rows go through the decode loop of
our own (`decode_loop.LoopGenerator`, set as `BatchedGenerator.loop`) instead of generate():
the same tokens (its tests compare them with generate()'s), but a finished row leaves at once
and a waiting one takes its place, so a block call there holds every waiting block row.

Nothing here imports torch at module level: the daemon process imports the engine package.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, cast

from daemon.engines.mineru.runtimes.base import (
    LAYOUT,
    GenRequest,
    ImageInput,
    Prediction,
    RowDone,
    SamplingParams,
    StepKind,
    capped,
)

if TYPE_CHECKING:
    import torch
    from PIL import Image
    from transformers import Qwen2VLForConditionalGeneration, Qwen2VLProcessor, StoppingCriteria

# Runs a batch's generate() (the zero-argument callable) and returns its result.
ModelRunner = Callable[[Callable[[], list[Prediction]]], list[Prediction]]

# Upper bound on the padded prompt tokens of one batch (rows x longest prompt): bounds the
# prefill's activation and attention memory when several large table crops meet.
MAX_BATCH_PROMPT_TOKENS = 8192
# Rows whose prompt lengths differ by more than this factor go to different batches: the
# short ones would pay the long one's padding in prefill and attention at every step.
MAX_LENGTH_RATIO = 2.0
# Qwen2-VL: one image token per 2x2 merged 14-px patches.
_PIXELS_PER_TOKEN = 28 * 28
# Chat template, system prompt and MinerU's task prompt around the image tokens.
_TEXT_TOKENS = 40


class VlmClient(Protocol):
    """mineru_vl_utils' TransformersVlmClient, as far as a batch reuses it."""

    skip_token_ids: set[int]

    def build_messages(self, prompt: str) -> list[dict[str, object]]: ...

    def build_generate_kwargs(self, sampling_params: SamplingParams) -> dict[str, object]: ...


class GreedyLoop(Protocol):
    """The decode loop of our own (`decode_loop.LoopGenerator`), as a batch hands it rows:
    it decodes greedy rows, or answers None (having run nothing) for other params."""

    def greedy(self, rows: Sequence[GenRequest], on_done: RowDone) -> list[Prediction] | None: ...


# The key one generate() call's rows share: the generate kwargs, sorted.
KwargsKey = tuple[tuple[str, object], ...]


def pil_image(image: ImageInput) -> Image.Image:
    """The transformers backend's helper prepares PIL images; PNG bytes are a server's."""
    if isinstance(image, bytes):
        raise TypeError("the transformers runtime reads PIL images, not encoded bytes")
    return image


def estimate_prompt_tokens(image: Image.Image, max_pixels: int = 1_003_520) -> int:
    """About how many prompt tokens a block crop becomes (image tokens + chat text).

    Only used to group similar rows, so Qwen2-VL's resize is approximated by the area,
    clamped to the processor's pixel budget.
    """
    width, height = (int(v) for v in image.size)
    return _TEXT_TOKENS + max(4, min(width * height, max_pixels) // _PIXELS_PER_TOKEN)


def plan_batches(
    sizes: Sequence[int],
    batch_size: int,
    max_tokens: int = MAX_BATCH_PROMPT_TOKENS,
    max_ratio: float = MAX_LENGTH_RATIO,
) -> list[list[int]]:
    """Group request indices into batches of similar prompt size, smallest first.

    A batch is closed when it has `batch_size` rows, when one more row would push its padded
    size (rows x longest) past `max_tokens`, or when the next row is more than `max_ratio`
    times longer than its shortest row.
    """
    order = sorted(range(len(sizes)), key=lambda i: (sizes[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current:
            rows = len(current) + 1
            too_many = rows > max(1, batch_size)
            too_big = rows * sizes[i] > max_tokens
            too_uneven = sizes[i] > max_ratio * sizes[current[0]]
            if too_many or too_big or too_uneven:
                batches.append(current)
                current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def make_row_stops(caps: Sequence[int], eos_ids: set[int], on_done: RowDone) -> StoppingCriteria:
    """A transformers StoppingCriteria that stops each row at EOS or at its own cap.

    transformers (>= 4.39) accepts a per-row boolean; a finished row is then padded until the
    whole batch is done. `on_done(row)` is called once per row, when it finishes, so the
    caller can report "block k/K" while the rest of the batch is still decoding.
    """
    import torch
    from transformers import StoppingCriteria

    class RowStops(StoppingCriteria):
        def __init__(self) -> None:
            self.prompt_len: int | None = None
            self.finished = [False] * len(caps)
            self.eos = torch.tensor(sorted(eos_ids), dtype=torch.long)
            self.caps = torch.tensor(list(caps), dtype=torch.long)

        def __call__(
            self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: object
        ) -> torch.BoolTensor:
            if self.prompt_len is None:  # first call: one new token so far
                self.prompt_len = input_ids.shape[1] - 1
            generated = input_ids.shape[1] - self.prompt_len
            done = torch.isin(input_ids[:, -1], self.eos) | (generated >= self.caps)
            for row, flag in enumerate(done.tolist()):
                if flag and not self.finished[row]:
                    self.finished[row] = True
                    on_done(row)
            # A bool tensor is what transformers means by its legacy BoolTensor hint.
            return cast("torch.BoolTensor", torch.tensor(self.finished, dtype=torch.bool))

    return RowStops()


class BatchedGenerator:
    """generate() for many (image, prompt) rows on a loaded Qwen2-VL, MinerU's way.

    `client` is mineru-vl-utils' TransformersVlmClient for the same model and processor: its
    message builder, generate kwargs and skip-token set are reused so a row produces exactly
    what `client.predict` would.
    """

    def __init__(
        self,
        model: Qwen2VLForConditionalGeneration,
        processor: Qwen2VLProcessor,
        client: VlmClient,
        batch_size: int,
    ) -> None:
        self.model = model
        self.processor = processor
        self.client = client
        self.batch_size = max(1, batch_size)
        generation_config = getattr(model, "generation_config", None)
        eos = getattr(generation_config, "eos_token_id", None)
        if eos is None:
            eos = processor.tokenizer.eos_token_id
        self.eos_ids: set[int] = set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}
        self.max_pixels = int(getattr(processor.image_processor, "max_pixels", 0) or 1_003_520)
        # engine.decode: loop: greedy rows go through the decode loop (rows leave as they
        # finish, waiting rows join, drafts confirmed); None: generate() for every row.
        self.loop: GreedyLoop | None = None

    def predict_many(self, requests: Sequence[GenRequest], on_done: RowDone) -> list[Prediction]:
        """All requests, batched by size and sampling params; results in request order."""
        out: list[Prediction | None] = [None] * len(requests)
        # One generate() call takes one set of generate kwargs: group by them first. MinerU's
        # per-type params differ only in presence/frequency penalties, which the transformers
        # client does not pass on, so in practice every block type shares one group.
        groups: dict[KwargsKey, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(self.kwargs_key(request.params), []).append(i)
        for indices in groups.values():
            sizes = [self.prompt_tokens(requests[i].image) for i in indices]
            for batch in plan_batches(sizes, self.batch_size):
                rows = [indices[b] for b in batch]
                results = self.generate([requests[i] for i in rows], _remap(on_done, rows))
                for i, result in zip(rows, results, strict=True):
                    out[i] = result
        return [p for p in out if p is not None]

    def prompt_tokens(self, image: ImageInput) -> int:
        """A block's prompt length: the processor's own image-token count (after its resize
        to the pixel budget) + the chat text; the area estimate where it cannot say."""
        try:
            width, height = pil_image(image).size
            patches = self.processor.image_processor.get_number_of_image_patches(height, width)
            merge = int(getattr(self.processor.image_processor, "merge_size", 2))
            return _TEXT_TOKENS + int(patches) // (merge * merge)
        except (AttributeError, TypeError, ValueError):
            return estimate_prompt_tokens(pil_image(image), self.max_pixels)

    def kwargs_key(self, params: SamplingParams | None) -> KwargsKey:
        kwargs = self.client.build_generate_kwargs(capped(params, 1))
        kwargs.pop("max_new_tokens", None)
        return tuple(sorted(kwargs.items()))

    def generate(self, rows: Sequence[GenRequest], on_done: RowDone) -> list[Prediction]:
        """`rows` (same sampling params) through the decode loop when there is one and it
        takes their params, else one generate() call."""
        if self.loop is not None:
            predictions = self.loop.greedy(rows, on_done)
            if predictions is not None:
                return predictions
        return self.generate_padded(rows, on_done)

    def generate_padded(self, rows: Sequence[GenRequest], on_done: RowDone) -> list[Prediction]:
        """One generate() call for `rows` (same sampling params), left-padded."""
        from transformers import StoppingCriteriaList

        client = self.client
        prompts = [
            self.processor.apply_chat_template(
                # transformers' hint says str contents; chat templates take MinerU's
                # content lists (an image part, a text part) as well.
                cast("list[dict[str, str]]", client.build_messages(row.prompt)),
                tokenize=False,
                add_generation_prompt=True,
            )
            for row in rows
        ]
        inputs = self.processor(
            text=prompts,
            images=[pil_image(row.image) for row in rows],
            padding=True,
            padding_side="left",
            return_tensors="pt",
        )
        # As the client does: floating inputs (pixel_values) in the dtype of the model's first
        # parameter, the vision tower's (see transformers_model.load_model).
        inputs = inputs.to(device=self.model.device, dtype=self.model.dtype)
        caps = [row.max_new_tokens for row in rows]
        kwargs = client.build_generate_kwargs(capped(rows[0].params, max(caps)))
        kwargs.pop("max_length", None)
        stops = make_row_stops(caps, self.eos_ids, on_done)
        output_ids = self.model.generate(
            **inputs,
            use_cache=True,
            stopping_criteria=StoppingCriteriaList([stops]),
            **kwargs,
        )
        prompt_len = inputs["input_ids"].shape[1]
        generated = output_ids[:, prompt_len:].tolist()
        del output_ids
        skip = client.skip_token_ids
        results: list[Prediction] = []
        for ids, cap in zip(generated, caps, strict=True):
            ids = ids[:cap]
            end = next((k for k, t in enumerate(ids) if t in self.eos_ids), None)
            if end is not None:
                ids = ids[: end + 1]
            kept = [t for t in ids if t not in skip]
            text = self.processor.batch_decode(  # type: ignore[no-untyped-call]
                [kept], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )[0]
            results.append(Prediction(text=text, tokens=len(ids)))
        return results


@dataclass(eq=False)
class _Step:
    """One page's rows for one step (its layout, or its blocks), and who waits for them."""

    page: int  # the page's index in its document: the lowest page's rows run first
    left: int  # rows not finished yet
    released: bool = False  # finished, and counted as working again


@dataclass(eq=False)
class _Row:
    request: GenRequest
    kind: StepKind  # LAYOUT | BLOCK: batched apart, capped by page_batch | batch_size
    step: _Step
    index: int  # position in its step's request list
    seq: int  # submission order, among rows of the same page
    tokens: int  # prompt tokens, for grouping similar rows
    on_done: RowDone
    result: Prediction | None = None
    error: BaseException | None = None
    reported: bool = False  # on_done called (once, even when the row is run again)


@dataclass
class _State:
    coming: int = 0  # pages announced (being rendered) that have not entered the engine
    working: int = 0  # pages in the engine doing their own work (parsing, cropping)
    running: bool = False  # a generate() call is under way (for one of the page threads)
    pending: list[_Row] = field(default_factory=list)


class PageBatcher:
    """The rows of every page in the engine, run as shared generate() calls.

    Page threads call `run` with one step's rows and block until those rows are done; the
    waiting thread that finds the model free and the moment right runs the next batch for
    everybody (through `run_model`: the transformers runtime hands it to its model thread,
    so that one OS thread makes every torch call). The moment is right when no page in
    the engine is between two steps (it is about to add rows: waiting for it fills the
    batch), and, when only layout rows wait, when no announced page is still being
    rendered or a full `page_batch` of layouts waits. The batch run is the one holding the
    lowest page's oldest row: pages are committed in order, so the page asked for first is
    served first, with the other pages' similar rows filling its batch.

    A batch that fails and holds rows of several pages is run again page by page, so an
    error fails only the page it belongs to.
    """

    def __init__(
        self, generator: BatchedGenerator, page_batch: int, run_model: ModelRunner | None = None
    ) -> None:
        self.generator = generator
        self.page_batch = max(1, page_batch)
        # Where a batch's generate() runs: the runtime's model thread (model_thread.py), or
        # the calling page thread without one.
        self.run_model: ModelRunner = run_model or (lambda generate: generate())
        self._cond = threading.Condition()
        self._state = _State()
        self._seq = itertools.count()
        self._local = threading.local()

    @contextmanager
    def coming(self) -> Iterator[None]:
        """Around the work that brings a page to the engine (rendering) and its parse: a
        layout batch waits for announced pages rather than leaving without them."""
        with self._cond:
            self._state.coming += 1
            self._local.announced = getattr(self._local, "announced", 0) + 1
        try:
            yield
        finally:
            with self._cond:
                if self._local.announced > 0:  # never entered the engine (render failed)
                    self._local.announced -= 1
                    self._state.coming -= 1
                self._cond.notify_all()

    @contextmanager
    def page(self) -> Iterator[None]:
        """Around one page's parse: the page counts as working except while it waits."""
        with self._cond:
            if getattr(self._local, "announced", 0) > 0:
                self._local.announced -= 1
                self._state.coming -= 1
            self._state.working += 1
        try:
            yield
        finally:
            with self._cond:
                self._state.working -= 1
                self._cond.notify_all()

    def run(
        self, page: int, kind: StepKind, requests: Sequence[GenRequest], on_done: RowDone
    ) -> list[Prediction]:
        """`requests` of one page's step, batched with whatever the other pages need.
        Called inside `page()`; results in request order; a failed row raises its error."""
        if not requests:
            return []
        step = _Step(page, len(requests))
        rows = [
            _Row(r, kind, step, i, next(self._seq), self.generator.prompt_tokens(r.image), on_done)
            for i, r in enumerate(requests)
        ]
        state = self._state
        with self._cond:
            state.pending.extend(rows)
            state.working -= 1
            try:
                while step.left:
                    if state.running or not self._ready():
                        self._cond.wait()
                        continue
                    batch = self._take()
                    state.running = True
                    self._cond.release()
                    try:
                        self._execute(batch)
                    finally:
                        self._cond.acquire()
                        state.running = False
                        self._finish(batch)
                        self._cond.notify_all()
            finally:
                if step.left:  # interrupted while waiting: take our rows back
                    state.pending[:] = [r for r in state.pending if r.step is not step]
                if not step.released:
                    step.released = True
                    state.working += 1
        for row in rows:
            if row.error is not None:
                raise row.error
        return [row.result for row in rows if row.result is not None]

    def _ready(self) -> bool:
        state = self._state
        if not state.pending or state.working > 0:
            return False
        if any(row.kind != LAYOUT for row in state.pending):
            return True  # the model has block work: pages still rendering join later
        return state.coming == 0 or len(state.pending) >= self.page_batch

    def _take(self) -> list[_Row]:
        state = self._state
        groups: dict[tuple[StepKind, KwargsKey], list[_Row]] = {}
        for row in state.pending:
            key = (row.kind, self.generator.kwargs_key(row.request.params))
            groups.setdefault(key, []).append(row)
        candidates: list[list[_Row]] = []
        for (kind, _kwargs), rows in groups.items():
            if kind != LAYOUT and self.generator.loop is not None:
                candidates.append(self._loop_batch(rows))
                continue
            cap = self.page_batch if kind == LAYOUT else self.generator.batch_size
            for planned in plan_batches([r.tokens for r in rows], cap):
                candidates.append([rows[i] for i in planned])
        batch = min(candidates, key=lambda rows: min((r.step.page, r.seq) for r in rows))
        taken = {id(r) for r in batch}
        state.pending[:] = [r for r in state.pending if id(r) not in taken]
        return batch

    def _loop_batch(self, rows: list[_Row]) -> list[_Row]:
        """A block call of the decode loop: every row of the lowest page's step, and other
        pages' rows while the call has fewer than batch_size. The loop keeps batch_size rows
        active and lets the next one join as a row finishes (its own prompt-size bound:
        LoopGenerator's max_tokens), so the page's whole block step is one call; it ends
        with the page's last row, not with the rows of every page waiting (the page is
        committed first, as with generate()'s batches)."""
        ordered = sorted(rows, key=lambda r: (r.step.page, r.seq))
        own = [r for r in ordered if r.step is ordered[0].step]
        others = [r for r in ordered if r.step is not ordered[0].step]
        return own + others[: max(0, self.generator.batch_size - len(own))]

    def _execute(self, batch: list[_Row]) -> None:
        def done(i: int) -> None:
            row = batch[i]
            if not row.reported:
                row.reported = True
                row.on_done(row.index)

        try:
            requests = [r.request for r in batch]
            lowest = min(r.step.page for r in batch)
            if any(r.step.page != lowest for r in batch):
                # Rows a row asks for (the layout's early blocks) ride along for the lowest
                # page only: the call ends when they do, so other pages' blocks started here
                # would hold the lowest page back (pages are committed in order). Its blocks
                # done in this call, the next is the next page's, as it would have been.
                requests = [
                    r.request if r.step.page == lowest else replace(r.request, early=None)
                    for r in batch
                ]
            results = self.run_model(lambda: self.generator.generate(requests, done))
        except BaseException as exc:
            if not isinstance(exc, Exception):  # interrupted: nobody gets a result
                for row in batch:
                    row.error = exc
                raise
            steps = list(dict.fromkeys(r.step for r in batch))
            if len(steps) == 1:
                for row in batch:
                    row.error = exc
                return
            for step in steps:  # whose row broke it? each page again, alone
                self._execute([r for r in batch if r.step is step])
            return
        for row, result in zip(batch, results, strict=True):
            row.result = result

    def _finish(self, batch: list[_Row]) -> None:
        for row in batch:
            row.step.left -= 1
            if row.step.left == 0 and not row.step.released:
                # Working again from now: the next batch waits for its next step's rows.
                row.step.released = True
                self._state.working += 1


def _remap(on_done: RowDone, rows: list[int]) -> RowDone:
    """Row index within a batch -> index in the caller's request list."""
    return lambda row: on_done(rows[row])
