"""Where the `mineru` engine's generate() runs: its runtime, and what every runtime is asked.

The engine's document logic (MinerU's two steps, the text-layer fill, post-processing, the
block mapping) is the same whatever the runtime; only the call that turns a page's step
(its requests: an image, a prompt, sampling params, a token cap each) into text changes:

- ``transformers`` (default): MinerU2.5 loaded in the worker with transformers + torch; the
  steps of the pages in the engine share generate() calls (`transformers.py`).
- ``http``: an OpenAI-compatible server (vLLM, SGLang, LMDeploy, llama.cpp's llama-server,
  MinerU's own ``mineru-openai-server``) does the generation; the worker keeps several
  pages and blocks in flight so the server's continuous batching is fed.
- ``llama-cpp``: llama.cpp in the worker process (``mineru-llama-cpp``) with a GGUF pair.

This module holds the one interface every runtime implements (`Runtime`: predict a page's
step as a batch), the request types, small Protocols over the parts of mineru-vl-utils the
engine touches (the library ships no type hints), the base of the two runtimes that send
one request per call, and what is known about the GGUF files of MinerU models. It imports
nothing heavy: the daemon process may import it without pulling in torch or llama.cpp.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager, nullcontext
from dataclasses import Field, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, Protocol, TypeAlias

from daemon.document.page import Json

if TYPE_CHECKING:
    from PIL import Image

    from daemon.config.settings import RuntimeKind

# What MinerU's helper hands a runtime to look at: a PIL image, or the image already
# encoded as PNG bytes (its http-client backend does that for a server).
ImageInput: TypeAlias = "Image.Image | bytes"
# MinerUClient flags (image analysis, formula wrapping in tables, ...): on or off.
ClientOptions: TypeAlias = dict[str, bool]


class SamplingParams(Protocol):
    """mineru_vl_utils' SamplingParams, a dataclass: how MinerU samples one request."""

    # dataclasses.replace() wants this (typeshed's DataclassInstance, whose Field is Any).
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]
    max_new_tokens: int | None


class LayoutBlock(Protocol):
    """mineru_vl_utils' ContentBlock (a dict with properties): one block of a page."""

    type: str
    bbox: list[float]  # 0..1 of the page, (x0, y0, x1, y1)
    angle: int | None
    content: str | None

    def get(self, key: str, default: object = None, /) -> object: ...


class Helper(Protocol):
    """mineru_vl_utils' MinerUClientHelper: MinerU's document logic around the model calls."""

    def prepare_for_layout(self, image: Image.Image) -> ImageInput: ...

    def parse_layout_output(self, output: str) -> list[LayoutBlock]: ...

    def prepare_for_extract(
        self, image: Image.Image, blocks: list[LayoutBlock]
    ) -> tuple[list[ImageInput], list[str], list[SamplingParams | None], list[int]]: ...

    def post_process(self, blocks: list[LayoutBlock]) -> list[LayoutBlock]: ...


class MinerUClient(Protocol):
    """mineru_vl_utils' MinerUClient, as the engine reads it: its helper, and MinerU's
    prompt and sampling params per block type (`[layout]`, `[default]`, `table`, ...)."""

    helper: Helper
    prompts: dict[str, str]
    sampling_params: dict[str, SamplingParams | None]


@dataclass(frozen=True)
class Prediction:
    """What a runtime answers for one request."""

    text: str
    tokens: int  # generated tokens, EOS included: for throughput figures and truncation
    # The transformers runtime's decode loop (engine.decode: loop): forward passes the row
    # took (its prefill included), draft tokens scored and confirmed. 0 elsewhere. Not
    # compared: two predictions are equal when they say the same, however they were decoded.
    passes: int = field(default=0, compare=False)
    drafted: int = field(default=0, compare=False)
    accepted: int = field(default=0, compare=False)


class EarlyRows(Protocol):
    """What a request's output so far lets start: the layout step's finished lines are
    blocks to recognise while the rest is written (engine's early_blocks.EarlyBlocks).

    A runtime that decodes rows side by side and lets rows join (the decode loop) calls
    `poll` with the row's text after its passes and once at its end (`final`), runs each
    request it answers beside the row, and hands each result to `done` (a request whose
    row could not start gets none: its owner runs it again the usual way)."""

    def poll(self, text: str, tokens: int, final: bool) -> list[GenRequest]: ...

    def done(self, request: GenRequest, prediction: Prediction) -> None: ...


@dataclass(frozen=True)
class GenRequest:
    """One image + prompt to complete, with MinerU's sampling params and our token cap."""

    image: ImageInput
    prompt: str
    params: SamplingParams | None  # None: MinerU's defaults
    max_new_tokens: int
    # What another reader already has for this block (the PDF text layer inside its box):
    # a draft the decode loop lets the model confirm. Never trusted; None: no such text.
    draft_text: str | None = None
    # Rows this request's own output lets start before it ends (the layout step's blocks,
    # engine's early_blocks.py); a runtime that cannot run them ignores it. Not compared.
    early: EarlyRows | None = field(default=None, compare=False)

    def capped_params(self) -> SamplingParams:
        """`params` with our cap set: what a backend is handed (see `capped`)."""
        return capped(self.params, self.max_new_tokens)


StepKind = Literal["layout", "block"]
LAYOUT: Final = "layout"
BLOCK: Final = "block"


@dataclass(frozen=True)
class PageStep:
    """One page's requests for one of MinerU's two steps: what a runtime predicts at once."""

    page_idx: int  # where pages share batches, the lowest page's rows go first
    kind: StepKind  # LAYOUT (one request) or BLOCK (one per block left to the model)
    requests: Sequence[GenRequest]


# Called with a request's index (in the list given) as soon as its row has finished.
RowDone = Callable[[int], None]


def open_client(backend: str, options: ClientOptions, **backend_args: object) -> Any:
    """mineru_vl_utils' MinerUClient for `backend`, with `options` (the flags every runtime
    shares, so every runtime gives the same output) and no progress bars.

    Any: the library's class is untyped; a runtime keeps it as a `MinerUClient` and reads
    its backend client (`.client`), which differs per backend, for its own calls.
    """
    from mineru_vl_utils import MinerUClient as Client

    return Client(backend=backend, use_tqdm=False, **backend_args, **options)


def in_turn(
    predict_one: Callable[[GenRequest], Prediction],
    requests: Sequence[GenRequest],
    on_done: RowDone,
) -> list[Prediction]:
    """`requests` one after the other, in this thread."""
    results = []
    for row, request in enumerate(requests):
        results.append(predict_one(request))
        on_done(row)
    return results


def capped(params: SamplingParams | None, max_new_tokens: int) -> SamplingParams:
    """MinerU's params with an explicit token cap (it leaves it unset: up to 32k tokens)."""
    import dataclasses

    from mineru_vl_utils import MinerUSamplingParams

    if params is None:
        fresh: SamplingParams = MinerUSamplingParams(max_new_tokens=max_new_tokens)
        return fresh
    return dataclasses.replace(params, max_new_tokens=max_new_tokens)


# The keys themselves (engine.runtime, engine.http.*, engine.llama_cpp.*) are declared
# once, in daemon/config/settings.py (EngineHttpConfig, LlamaCppConfig).

PRO_MODEL = "opendatalab/MinerU2.5-Pro-2605-1.2B"


@dataclass(frozen=True)
class GgufPair:
    """Where the llama.cpp files of a MinerU model live on the hub."""

    repo: str
    model_file: str
    mmproj_file: str


# MinerU 4 downloads this Q8_0 pair for its llama.cpp engine (its model registry names it
# MINERU_2_5_PRO_2605_1_2B_GGUF); `docinbox model pull --runtime llama-cpp` fetches the
# same files. MinerU2.5-2509 has no published GGUF: convert it (bench/make_gguf.py).
KNOWN_GGUF: dict[str, GgufPair] = {
    PRO_MODEL: GgufPair(
        repo="jinzhenj/MinerU2.5-Pro-2605-1.2B-GGUF",
        model_file="MinerU2.5-Pro-2605-1.2B-Q8_0.gguf",
        mmproj_file="mmproj-MinerU2.5-Pro-2605-1.2B-Q8_0.gguf",
    ),
}


@dataclass(frozen=True)
class RuntimeInfo:
    """What meta.json and `docinbox status` say about where generation ran."""

    runtime: RuntimeKind
    model: str  # served model name, GGUF file, or hub id
    server: str | None = None  # http: the server URL (never with credentials)
    details: dict[str, Json] = field(default_factory=dict)
    revision: str | None = None  # transformers: the checkpoint's commit
    precision: str | None = None  # transformers: the effective precision


class Predictor(Protocol):
    """What one page needs from a runtime: MinerU's client (helper, prompts, params) and
    a prediction of one step's requests."""

    client: MinerUClient

    def predict(self, step: PageStep, on_done: RowDone) -> list[Prediction]:
        """One Prediction per request of `step`, in order; `on_done(i)` as request i
        finishes. Raises EngineUnavailable when the place generation runs has gone away
        for good (server unreachable after all retries), DocumentError for this page."""
        ...


class Runtime(Predictor, Protocol):
    """A loaded runtime. `predict` is called from several page threads at once when
    `max_pages_in_flight` > 1, each inside `page()`."""

    info: RuntimeInfo
    max_pages_in_flight: int  # how many pages the worker may parse at once

    def coming_page(self) -> AbstractContextManager[None]:
        """Around bringing a page to the engine (the worker renders it inside)."""
        ...

    def page(self) -> AbstractContextManager[None]:
        """Around one page's parse, in the page's thread."""
        ...

    def close(self) -> None: ...


class RequestRuntime:
    """Base of the runtimes whose backend completes one request per call and takes several
    at once from threads (a server's continuous batching, llama.cpp's slots): a page's
    block step goes out as concurrent requests, up to `max_blocks_in_flight` for all pages.

    A subclass sets `info` and `max_pages_in_flight`, implements `predict_one`, and calls
    `__init__` with its MinerU client and block width once it can predict.
    """

    info: RuntimeInfo
    max_pages_in_flight: int

    def __init__(self, client: MinerUClient, max_blocks_in_flight: int) -> None:
        self.client = client
        self.max_blocks_in_flight = max_blocks_in_flight
        self._pool: ThreadPoolExecutor | None = None
        if max_blocks_in_flight > 1:
            self._pool = ThreadPoolExecutor(
                max_workers=max_blocks_in_flight, thread_name_prefix="mineru-block"
            )

    def predict_one(self, request: GenRequest) -> Prediction:
        """Generate for one request (its params capped). Thread-safe."""
        raise NotImplementedError

    def predict(self, step: PageStep, on_done: RowDone) -> list[Prediction]:
        pool = self._pool
        if pool is None or step.kind == LAYOUT:
            # In the page's thread, one by one: the layout step, or a backend of one slot.
            return in_turn(self.predict_one, step.requests, on_done)
        futures: dict[Future[Prediction], int] = {
            pool.submit(self.predict_one, r): row for row, r in enumerate(step.requests)
        }
        results_by_row: dict[int, Prediction] = {}
        try:
            for future in as_completed(futures):
                # Each lands in its own row whatever the finishing order.
                results_by_row[futures[future]] = future.result()
                on_done(futures[future])
        finally:
            for future in futures:  # one block failed: do not leave the others queued
                future.cancel()
        return [results_by_row[row] for row in range(len(step.requests))]

    def coming_page(self) -> AbstractContextManager[None]:
        return nullcontext()  # the backend batches whatever arrives, nothing to wait for

    def page(self) -> AbstractContextManager[None]:
        return nullcontext()

    def close(self) -> None:
        """Stops the block pool; a subclass closes its backend after this."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
