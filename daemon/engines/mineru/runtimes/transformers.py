"""The `transformers` runtime: MinerU2.5 loaded in the worker, the pages' steps batched.

Loading and precision are `transformers_model.py`'s; several prompts in one generate(),
and the rows of every page in the engine sharing those calls, are
`transformers_generate.py`'s (`BatchedGenerator`, `PageBatcher`). This module puts them
behind the `Runtime` interface, so the engine drives it exactly as it drives a server.
torch and transformers are imported inside functions: the module itself costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from daemon.engines.mineru.runtimes.base import (
    ClientOptions,
    MinerUClient,
    PageStep,
    Prediction,
    RowDone,
    RuntimeInfo,
    open_client,
)

if TYPE_CHECKING:
    from daemon.config.settings import EngineConfig
    from daemon.engines.mineru.runtimes.transformers_generate import (
        BatchedGenerator,
        PageBatcher,
    )
    from daemon.engines.mineru.runtimes.transformers_model import LoadedModel


class TransformersRuntime:
    """MinerU2.5 on this machine's CPU. `predict` may be called from several page threads:
    their rows meet in the shared `PageBatcher`, which makes one generate() call at a time."""

    def __init__(self, config: EngineConfig, client_options: ClientOptions) -> None:
        from transformers.utils import logging as hf_logging

        from daemon.engines.mineru.runtimes.transformers_generate import (
            BatchedGenerator,
            PageBatcher,
        )
        from daemon.engines.mineru.runtimes.transformers_model import load_model

        # Worker logs go to journald/files: progress bars there are noise.
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        loaded = load_model(config.model, config.revision, config.precision, config.threads)
        client = open_client(
            "transformers", client_options, model=loaded.model, processor=loaded.processor
        )
        self.loaded: LoadedModel = loaded
        self.client: MinerUClient = client
        # client.client: mineru-vl-utils' TransformersVlmClient for the same model
        self.generator: BatchedGenerator = BatchedGenerator(
            loaded.model, loaded.processor, client.client, config.batch_size
        )
        self.batcher: PageBatcher = PageBatcher(self.generator, config.page_batch)
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
                "dtype_vision": loaded.dtype_vision,
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

    @contextmanager
    def page(self) -> Iterator[None]:
        """No autograd bookkeeping (per thread: whichever page thread runs a batch runs it
        in this mode), and the page counted as working in the shared batches."""
        import torch

        with torch.inference_mode(), self.batcher.page():
            yield

    def close(self) -> None:
        """Nothing to stop: the worker process exits or recycles soon after."""
