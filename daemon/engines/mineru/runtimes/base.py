"""Where the `mineru` engine's generate() runs: its runtime.

The engine's document logic (MinerU's two steps, the text-layer fill, post-processing, the
block mapping) is the same whatever the runtime; only the call that turns (image, prompt,
sampling params) into text changes:

- ``transformers`` (default): MinerU2.5 loaded in the worker with transformers + torch.
- ``http``: an OpenAI-compatible server (vLLM, SGLang, LMDeploy, llama.cpp's llama-server,
  MinerU's own ``mineru-openai-server``) does the generation; the worker keeps several
  pages and blocks in flight so the server's continuous batching is fed.
- ``llama-cpp``: llama.cpp in the worker process (``mineru-llama-cpp``) with a GGUF pair.

This module holds the interface every runtime implements and what is known about the
GGUF files of MinerU models. It
imports nothing heavy: the daemon process may import it without pulling in torch or
llama.cpp.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from daemon.config.settings import RuntimeKind


@dataclass(frozen=True)
class Prediction:
    """What every runtime's predict() returns."""

    text: str
    tokens: int  # generated tokens, EOS included: for throughput figures and truncation


@dataclass(frozen=True)
class GenRequest:
    """One image + prompt to complete, with MinerU's sampling params and our token cap."""

    image: Any  # PIL.Image.Image
    prompt: str
    params: Any  # mineru_vl_utils SamplingParams | None
    max_new_tokens: int


# Called with a request's index (in the list given) as soon as its row has finished.
RowDone = Callable[[int], None]
# predict_many(requests, on_done) -> one Prediction per request, in order.
PredictManyFn = Callable[[Sequence[GenRequest], RowDone], list[Prediction]]


def capped(params: Any, max_new_tokens: int) -> Any:
    """MinerU's params with an explicit token cap (it leaves it unset: up to 32k tokens)."""
    import dataclasses

    from mineru_vl_utils import MinerUSamplingParams

    if params is None:
        return MinerUSamplingParams(max_new_tokens=max_new_tokens)
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
    details: dict[str, Any] = field(default_factory=dict)


class Runtime(Protocol):
    """A loaded runtime. `predict` is thread-safe when `max_blocks_in_flight` > 1."""

    info: RuntimeInfo
    client: Any  # the mineru_vl_utils.MinerUClient whose helper, prompts and params we use
    max_pages_in_flight: int
    max_blocks_in_flight: int

    def predict(self, image: Any, prompt: str, params: Any, max_new_tokens: int) -> Prediction:
        """Generate for one image and prompt. Raises EngineUnavailable when the place
        generation runs has gone away for good (server unreachable after all retries)."""
        ...

    def close(self) -> None: ...
