"""Where the `mineru` engine's generate() runs: its runtime.

The engine's document logic (MinerU's two steps, the text-layer fill, post-processing, the
block mapping) is the same whatever the runtime; only the call that turns (image, prompt,
sampling params) into text changes:

- ``transformers`` (default): MinerU2.5 loaded in the worker with transformers + torch.
- ``http``: an OpenAI-compatible server (vLLM, SGLang, LMDeploy, llama.cpp's llama-server,
  MinerU's own ``mineru-openai-server``) does the generation; the worker keeps several
  pages and blocks in flight so the server's continuous batching is fed.
- ``llama-cpp``: llama.cpp in the worker process (``mineru-llama-cpp``) with a GGUF pair.

This module holds the typed settings and the interface every runtime implements. It
imports nothing heavy: the daemon process reads these settings (status, re-probing a
server) without pulling in torch or llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from daemon.engines.mineru_generate import Prediction

__all__ = ["Prediction"]  # what every runtime's predict() returns

RuntimeKind = Literal["transformers", "http", "llama-cpp"]
RUNTIMES: tuple[RuntimeKind, ...] = ("transformers", "http", "llama-cpp")

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
class HttpSettings:
    """`engine.http.*`: an OpenAI-compatible MinerU2.5 server."""

    server_url: str = ""
    # Sent as `Authorization: Bearer ...`. A secret: repr=False keeps it out of logs.
    api_key: str | None = field(default=None, repr=False)
    model_name: str | None = None  # None: the one model the server lists at /v1/models
    max_in_flight: int = 8  # requests outstanding at once (pages and blocks together)
    timeout_seconds: float = 600.0  # one request, including the server's queueing
    connect_timeout_seconds: float = 10.0
    # Retries of one request on connection errors, timeouts, 429 and 5xx, with exponential
    # back-off starting at retry_backoff_seconds (Retry-After wins when the server sends
    # it). The defaults ride out a server restart of about a minute.
    retries: int = 6
    retry_backoff_seconds: float = 1.0
    retry_backoff_max_seconds: float = 30.0
    ca_bundle: Path | None = None  # PEM file of CAs to trust for an https:// server
    # While the fallback engine runs because the server did not answer: how often the
    # daemon looks at the server again (it switches back by itself when it answers).
    reprobe_seconds: float = 60.0


@dataclass(frozen=True)
class LlamaCppSettings:
    """`engine.llama_cpp.*`: llama.cpp in the worker process."""

    # The main GGUF file (or a folder holding the pair, as MinerU keeps them) and its
    # vision projector. When None, the pair is looked up in the Hugging Face cache:
    # `repo`, or the GGUF repo known for `engine.model` (`docinbox model pull` fetches it).
    model: Path | None = None
    mmproj: Path | None = None
    repo: str | None = None
    threads: int = 0  # 0 = physical cores
    parallel: int = 2  # llama.cpp slots: blocks of a page decoded together in one batch
    context_per_slot: int = 0  # tokens per slot; 0 = the model's training context


@dataclass(frozen=True)
class RuntimeSettings:
    kind: RuntimeKind = "transformers"
    http: HttpSettings = field(default_factory=HttpSettings)
    llama_cpp: LlamaCppSettings = field(default_factory=LlamaCppSettings)


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


def settings_from(config: Any) -> RuntimeSettings:
    """The runtime settings of an engine config (`engine.runtime`, `engine.http`,
    `engine.llama_cpp`); the transformers runtime for configs that predate the keys."""
    kind = str(getattr(config, "runtime", "transformers"))
    if kind not in RUNTIMES:
        raise ValueError(f"unknown engine.runtime {kind!r} (one of {', '.join(RUNTIMES)})")
    http = getattr(config, "http", None)
    llama = getattr(config, "llama_cpp", None)
    return RuntimeSettings(
        kind=kind,
        http=http if isinstance(http, HttpSettings) else HttpSettings(),
        llama_cpp=llama if isinstance(llama, LlamaCppSettings) else LlamaCppSettings(),
    )
