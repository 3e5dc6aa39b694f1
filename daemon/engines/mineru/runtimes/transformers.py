"""The `transformers` runtime: MinerU2.5 loaded in the worker, the pages' steps batched.

Loading and precision are `transformers_model.py`'s; several prompts in one generate(),
and the rows of every page in the engine sharing those calls, are
`transformers_generate.py`'s (`BatchedGenerator`, `PageBatcher`); with `engine.decode: loop`
(the default) their greedy rows are decoded by the loop of our own (`decode_loop.py`), with
the drafts and draft budget chosen here. This module puts them behind the `Runtime`
interface, so the engine drives it exactly as it drives a server.
torch and transformers are imported inside functions: the module itself costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from daemon.engines.mineru.runtimes.base import (
    ClientOptions,
    GenRequest,
    MinerUClient,
    PageStep,
    Prediction,
    RowDone,
    RuntimeInfo,
    open_client,
)
from daemon.engines.mineru.runtimes.model_thread import ModelThread
from daemon.engines.mineru.runtimes.schedule import PassCost, PassScheduler

if TYPE_CHECKING:
    from daemon.common.estimate import PassTimings
    from daemon.config.settings import EngineConfig
    from daemon.engines.mineru.runtimes.decode_loop import LoopGenerator
    from daemon.engines.mineru.runtimes.drafts import DraftSource
    from daemon.engines.mineru.runtimes.transformers_generate import (
        BatchedGenerator,
        PageBatcher,
        VlmClient,
    )
    from daemon.engines.mineru.runtimes.transformers_model import LoadedModel


class TransformersRuntime:
    """MinerU2.5 on this machine's CPU. `predict` may be called from several page threads:
    their rows meet in the shared `PageBatcher`, which makes one generate() call at a time,
    on the runtime's model thread (the one that loaded the model)."""

    def __init__(self, config: EngineConfig, client_options: ClientOptions) -> None:
        from transformers.utils import logging as hf_logging

        from daemon.engines.mineru.runtimes.transformers_generate import (
            BatchedGenerator,
            PageBatcher,
        )
        from daemon.engines.mineru.runtimes.transformers_model import load_model, share_main_arena

        # Worker logs go to journald/files: progress bars there are noise.
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        # Every torch call of the model on one OS thread, its load included (model_thread.py:
        # a second thread's OpenMP pool makes every pass pay futex wake-ups), allocating
        # from the heap whose freed blocks are kept (share_main_arena, keep_freed_memory).
        share_main_arena()
        self.model_thread = ModelThread()
        try:
            loaded = self.model_thread.call(
                lambda: load_model(config.model, config.revision, config.precision, config.threads)
            )
        except BaseException:
            self.model_thread.close()  # no idle thread left behind by a failed load
            raise
        client = open_client(
            "transformers", client_options, model=loaded.model, processor=loaded.processor
        )
        self.loaded: LoadedModel = loaded
        self.client: MinerUClient = client
        # client.client: mineru-vl-utils' TransformersVlmClient for the same model
        self.generator: BatchedGenerator = BatchedGenerator(
            loaded.model, loaded.processor, client.client, config.batch_size
        )
        self.loop: LoopGenerator | None = None
        budget = draft_budget(loaded.precision, cpu_capability())
        if config.decode == "loop":
            self.loop = make_loop(loaded, client.client, self.generator, config.batch_size)
            self.generator.loop = self.loop
        self.batcher: PageBatcher = PageBatcher(
            self.generator, config.page_batch, self._on_model_thread
        )
        # engine.page_batch pages in the engine at once: their steps share batches.
        self.max_pages_in_flight = max(1, config.page_batch)
        self.info = RuntimeInfo(
            runtime="transformers",
            model=config.model,
            revision=loaded.weights.commit or config.revision,
            precision=loaded.precision,
            details={
                "threads": loaded.threads,
                "batch_size": config.batch_size,
                "page_batch": config.page_batch,
                "decode": config.decode,
                # loop: a draft's ceiling and the positions a pass scores (see DraftBudget)
                "draft_k_max": budget.k_max if self.loop else 0,
                "draft_positions": budget.max_positions if self.loop else 0,
                "draft_schedule": bool(self.loop and budget.cost is not None),
                "dtype_vision": loaded.dtype_vision,
                # "sdpa" or "chunked": which exact attention kernel the tower's load chose
                "vision_attention": loaded.details["vision_attention"],
                # "grouped": verify passes fold query heads onto the cache (decoder_attention)
                "decoder_attention": loaded.details["decoder_attention"],
                "dtype_decoder": loaded.dtype_decoder,
                "requested_precision": config.precision,
                "weights_path": str(loaded.weights.path),
                "load_seconds": round(loaded.load_seconds, 2),
            },
        )

    def predict(self, step: PageStep, on_done: RowDone) -> list[Prediction]:
        """The step's rows, batched with whatever the other pages in the engine need: the
        same generate() path for layout and blocks, so both share MinerU's sampling rules
        and our per-row stopping."""
        return self.batcher.run(step.page_idx, step.kind, step.requests, on_done)

    def coming_page(self) -> AbstractContextManager[None]:
        """The layout step of the pages in the engine waits for this page to join."""
        return self.batcher.coming()

    def _on_model_thread(self, generate: Callable[[], list[Prediction]]) -> list[Prediction]:
        """A batch's generate() on the model thread, without autograd bookkeeping (a mode
        of the thread that runs it)."""
        import torch

        def run() -> list[Prediction]:
            with torch.inference_mode():
                return generate()

        return self.model_thread.call(run)

    @contextmanager
    def page(self) -> Iterator[None]:
        """The page counted as working in the shared batches."""
        from daemon.engines.mineru.runtimes.transformers_model import return_freed_memory

        try:
            with self.batcher.page():
                yield
        finally:
            # The heap keeps freed blocks for the next pass (keep_freed_memory): a page's
            # end hands them back, so a worker between pages holds only what it uses.
            return_freed_memory()

    def time_passes(self) -> PassTimings:
        """The passes the page estimate is built from, timed on this model (seconds)."""
        from daemon.engines.mineru.runtimes.speed_probe import time_passes

        return self.model_thread.call(
            lambda: time_passes(self.loaded.model, self.generator.batch_size)
        )

    def close(self) -> None:
        """The model thread stops after what it was handed (the worker process exits or
        recycles soon after)."""
        self.model_thread.close()


@dataclass(frozen=True)
class DraftBudget:
    """How long a row's draft may be (`AdaptiveK.k_max`) and how many positions one pass
    scores for all rows (`DecodeBatch.max_positions`: rows x (1 + K)); or, with `cost` (a
    pass's measured seconds by rows and width), the pass scheduler's choice of each pass's
    rows and K (schedule.py; `max_positions` then unused), no row waiting more than
    `max_wait` passes in a row."""

    k_max: int
    max_positions: int
    cost: PassCost | None = None
    max_wait: int = 2
    held: float = 0.0  # seconds a pass leaving rows out pays on top (PassScheduler.held)

    def scheduler(self) -> PassScheduler | None:
        if self.cost is None:
            return None
        return PassScheduler(self.cost, self.k_max, self.max_wait, self.held)


# From what a verify pass costs on a Zen 4 CPU (docs/benchmarks.md, 2026-12-05):
# - the weight-only int8 decoder (`int8`, `bf16-int8`: `auto` on AMX, AVX2) runs a kernel whose
#   cost grows with rows x (1 + K): one row pays 1.2x a step for K = 1-2 and 1.6x for K = 4,
#   a batch of 4 already 2x at K = 1, and from 32 positions int8_linear falls back to a dense
#   GEMM dearer than bf16's. So K <= 4, and 12 positions a pass: K = 4 for 1-2 rows, 2 for 4
#   rows, 1 for 6, none for 8 (where drafts would pay only above ~2.5 tokens a pass);
# - dense decoders (fp32, bf16, mixed): one row scores up to K = 12 for about one step, 8
#   rows x K = 8 for 1.6x: AdaptiveK's default ceiling, and 48 positions (K = 5 at 8 rows).
INT8_DRAFTS = DraftBudget(k_max=4, max_positions=12)
DENSE_DRAFTS = DraftBudget(k_max=12, max_positions=48)


# One decode pass of the real-shape weight-only int8 decoder by (rows, width = 1 + K),
# seconds, measured alone on an AMD EPYC Zen 2 (AVX2 only, 2 cores, torch's AVX2 kernels,
# 512-token prompts; the fastest of two runs of bench/bench_verify.py --out, docs/benchmarks.md
# 2026-12-06). Past 8 rows x K = 2 int8_linear runs dense GEMMs (DENSE_ROWS, 32 positions):
# dearer per pass, far cheaper per position, which is where long drafts pay here.
# fmt: off
INT8_AVX2_PASS_SECONDS: tuple[tuple[int, int, float], ...] = (
    (1, 1, 0.086), (1, 2, 0.174), (1, 3, 0.192), (1, 4, 0.211), (1, 5, 0.278), (1, 6, 0.32),
    (1, 7, 0.301), (1, 8, 0.318), (1, 9, 0.353), (1, 12, 0.367), (1, 16, 0.373),
    (2, 1, 0.165), (2, 2, 0.217), (2, 3, 0.274), (2, 4, 0.282), (2, 5, 0.359), (2, 6, 0.432),
    (2, 7, 0.433), (2, 8, 0.487), (2, 9, 0.556), (2, 12, 0.65), (2, 16, 0.851),
    (3, 1, 0.211), (3, 2, 0.306), (3, 3, 0.42), (3, 4, 0.38), (3, 5, 0.457), (3, 6, 0.471),
    (3, 7, 0.639), (3, 8, 0.55), (3, 9, 0.834), (3, 12, 0.986), (3, 16, 1.143),
    (4, 1, 0.219), (4, 2, 0.327), (4, 3, 0.389), (4, 4, 0.425), (4, 5, 0.487), (4, 6, 0.55),
    (4, 7, 0.588), (4, 8, 0.889), (4, 9, 0.962), (4, 12, 1.132), (4, 16, 1.242),
    (6, 1, 0.262), (6, 2, 0.404), (6, 3, 0.487), (6, 4, 0.552), (6, 5, 0.66), (6, 6, 0.942),
    (6, 7, 1.055), (6, 8, 1.236), (6, 9, 1.351), (6, 12, 1.3), (6, 16, 1.536),
    (8, 1, 0.293), (8, 2, 0.507), (8, 3, 0.613), (8, 4, 0.946), (8, 5, 1.049), (8, 6, 1.177),
    (8, 7, 1.203), (8, 8, 1.292), (8, 9, 1.373), (8, 12, 1.545), (8, 16, 1.871),
)
# fmt: on
# K up to 12, a row waits at most 2 passes, a pass leaving rows out pays ~15 ms of cache
# copies (bench_verify.py --held): the best of the policies bench/sched_replay.py compared
# (0.67x today's modelled block decode with text-layer drafts, 0.83x with OCR readings).
INT8_AVX2_SCHEDULED = DraftBudget(
    k_max=12,
    max_positions=0,
    cost=PassCost(INT8_AVX2_PASS_SECONDS, dense_from=32),
    max_wait=2,
    held=0.015,
)

# The pass scheduler per CPU class (torch's kernels) where its curve was measured and it paid
# on a page; every other class keeps the position budget. Not AVX512 without AMX (Zen 4):
# its curve (at 512 and at 1,300 prompt tokens) replays to 0.49-0.85x of the block decode,
# but on the realistic page the scheduler took 20-33 % fewer passes for 1.03-1.10x the decode
# time (docs/benchmarks.md, 2026-12-07, later). Emptied by bench/mineru_child.py for its
# `--drafts positions` runs.
INT8_SCHEDULED: dict[str, DraftBudget] = {"AVX2": INT8_AVX2_SCHEDULED}


def draft_budget(precision: str, capability: str = "") -> DraftBudget:
    """The budget for the loaded decoder's effective precision (LoadedModel.precision) on
    torch's CPU kernels of `capability` (torch.backends.cpu.get_cpu_capability(): "AVX2",
    "AVX512", ...; "" when not known): the pass scheduler where its pass cost was measured
    and it paid (docs/benchmarks.md, 2026-12-06), else the position budget."""
    if "int8" not in precision:
        return DENSE_DRAFTS
    return INT8_SCHEDULED.get(capability.upper(), INT8_DRAFTS)


def make_loop(
    loaded: LoadedModel, client: VlmClient, generator: BatchedGenerator, max_rows: int
) -> LoopGenerator:
    """The decode loop for the loaded model, MinerU's client, drafts as `draft_for` says."""
    from daemon.engines.mineru.runtimes.decode_loop import LoopGenerator
    from daemon.engines.mineru.runtimes.drafts import AdaptiveK
    from daemon.engines.mineru.runtimes.transformers_generate import MAX_BATCH_PROMPT_TOKENS
    from daemon.engines.mineru.runtimes.transformers_model import return_freed_memory

    budget = draft_budget(loaded.precision, cpu_capability())
    tokenizer = loaded.processor.tokenizer

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    return LoopGenerator(
        loaded.model,
        loaded.processor,
        client,
        generator.eos_ids,
        max_rows,
        lambda row: draft_for(row, encode),
        lambda: AdaptiveK(k_max=budget.k_max, k=min(4, budget.k_max)),
        budget.max_positions,
        # As generate()'s batches are bounded (rows x longest prompt): the cache's columns.
        MAX_BATCH_PROMPT_TOKENS,
        # What the last joins and passes freed goes back before the next join allocates.
        release=return_freed_memory,
        scheduler=budget.scheduler(),
    )


def cpu_capability() -> str:
    """The CPU kernels torch runs here ("AVX2", "AVX512", ...: ATEN_CPU_CAPABILITY caps it)."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def draft_for(row: GenRequest, encode: Callable[[str], list[int]]) -> DraftSource:
    """A block the PDF text layer has text for follows that text (the engine puts it in
    `draft_text`); everything else (the layout step, tables, formulas, scans) drafts from
    its own output so far: coordinates, tags and LaTeX repeat."""
    from daemon.engines.mineru.runtimes.drafts import ExternalDraft, PromptLookup

    if row.draft_text:
        return ExternalDraft.from_text(row.draft_text, encode)
    return PromptLookup()
