"""The `llama-cpp` runtime: llama.cpp inside the worker process (`mineru-llama-cpp`).

MinerU 4's own CPU engine: a GGUF main model plus its vision projector (mmproj), run by
OpenDataLab's in-process llama.cpp binding. mineru-vl-utils' llama-cpp client builds the
chat messages and maps MinerU's sampling parameters (no n-gram blocker there: llama.cpp
has none); this module loads the Engine, finds the GGUF pair, and reads the generated
token count from the result (the library's `predict` returns only the text).

`Engine.generate` releases the GIL and decodes all busy slots in one batch, so the blocks
of a page are sent together, up to `parallel` at a time; with `engine.page_batch` pages in
the engine, their layout steps and blocks share the same slots.
"""

from __future__ import annotations

import logging
import threading
from importlib.metadata import version
from pathlib import Path
from typing import Any

from daemon.common.errors import DocumentError, EngineUnavailable, FailureKind
from daemon.config.settings import LlamaCppConfig
from daemon.engines.mineru.runtimes.base import (
    KNOWN_GGUF,
    ClientOptions,
    GenRequest,
    GgufPair,
    Prediction,
    RequestRuntime,
    RuntimeInfo,
    open_client,
)

log = logging.getLogger("docinbox.llama_cpp_runtime")


def gguf_pair_for(model: str, settings: LlamaCppConfig) -> GgufPair | None:
    """The hub GGUF pair for `engine.model` (or `engine.llama_cpp.repo`), when known."""
    if settings.repo:
        known = next((p for p in KNOWN_GGUF.values() if p.repo == settings.repo), None)
        return known or GgufPair(settings.repo, "", "")
    return KNOWN_GGUF.get(model)


def pair_in_folder(folder: Path, pair: GgufPair | None = None) -> tuple[Path, Path]:
    """The (model, mmproj) GGUF files in a folder: the known names, else the one
    `mmproj*.gguf` and the one other `*.gguf` (a Q8_0 one when there are several)."""
    if pair and pair.model_file and pair.mmproj_file:
        model, mmproj = folder / pair.model_file, folder / pair.mmproj_file
        if model.is_file() and mmproj.is_file():
            return model, mmproj
    ggufs = sorted(p for p in folder.glob("*.gguf") if p.is_file())
    mmprojs = [p for p in ggufs if p.name.lower().startswith("mmproj")]
    mains = [p for p in ggufs if p not in mmprojs]
    if len(mains) > 1:
        mains = [p for p in mains if "q8_0" in p.name.lower()] or mains
    if len(mmprojs) > 1:
        mmprojs = [p for p in mmprojs if "q8_0" in p.name.lower()] or mmprojs
    if len(mains) != 1 or len(mmprojs) != 1:
        raise EngineUnavailable(
            f"{folder} does not hold exactly one GGUF model and one mmproj-*.gguf "
            f"(found: {', '.join(p.name for p in ggufs) or 'none'})",
            hint="set engine.llama_cpp.model and engine.llama_cpp.mmproj to the two files",
        )
    return mains[0], mmprojs[0]


def resolve_gguf(model: str, settings: LlamaCppConfig) -> tuple[Path, Path]:
    """Find the GGUF pair locally, never downloading (the daemon never goes online)."""
    if settings.model is not None:
        path = settings.model.expanduser()
        if path.is_dir():
            return pair_in_folder(path, gguf_pair_for(model, settings))
        if settings.mmproj is None:
            raise EngineUnavailable(
                "engine.llama_cpp.model is a file but engine.llama_cpp.mmproj is not set",
                hint="set engine.llama_cpp.mmproj to the vision projector (mmproj-*.gguf)",
            )
        mmproj = settings.mmproj.expanduser()
        missing = [str(p) for p in (path, mmproj) if not p.is_file()]
        if missing:
            raise EngineUnavailable(
                f"GGUF file(s) not found: {', '.join(missing)}",
                hint="check engine.llama_cpp.model / mmproj",
            )
        return path, mmproj
    pair = gguf_pair_for(model, settings)
    if pair is None:
        raise EngineUnavailable(
            f"no GGUF is known for {model}; llama.cpp needs a GGUF pair",
            hint="set engine.model: opendatalab/MinerU2.5-Pro-2605-1.2B and run `docinbox "
            "model pull --runtime llama-cpp`, or convert the model and set "
            "engine.llama_cpp.model / mmproj",
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(str(snapshot_download(repo_id=pair.repo, local_files_only=True)))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError) as exc:
        raise EngineUnavailable(
            f"the GGUF pair {pair.repo} is not in the Hugging Face cache",
            hint="docinbox model pull --runtime llama-cpp",
        ) from exc
    return pair_in_folder(folder, pair)


class LlamaCppRuntime(RequestRuntime):
    """An in-process llama.cpp Engine. `predict` is thread-safe (the Engine has slots)."""

    def __init__(
        self,
        model: str,
        settings: LlamaCppConfig,
        threads: int,
        client_options: ClientOptions,
        *,
        page_batch: int = 1,
    ) -> None:
        main, mmproj = resolve_gguf(model, settings)
        try:
            import mineru_llama_cpp
        except ImportError as exc:
            raise EngineUnavailable(
                "the llama-cpp runtime needs the mineru-llama-cpp package",
                hint="bash scripts/setup.sh (it installs mineru-llama-cpp)",
            ) from exc

        if settings.parallel < 1:
            raise ValueError("engine.llama_cpp.parallel must be at least 1")
        try:
            self.engine = mineru_llama_cpp.Engine(
                str(main),
                str(mmproj),
                n_ctx_seq=settings.context_per_slot,
                n_parallel=settings.parallel,
                n_threads=threads if threads > 0 else -1,
            )
        except (mineru_llama_cpp.MineruLlamaCppError, RuntimeError, ValueError) as exc:
            raise EngineUnavailable(
                f"llama.cpp cannot load {main.name} + {mmproj.name}: {exc}",
                hint="check that both files are a matching MinerU2.5 GGUF pair",
            ) from exc
        self._errors = mineru_llama_cpp
        client = open_client(
            "llama-cpp-engine",
            client_options,
            llama_cpp_engine=self.engine,
            max_concurrency=settings.parallel,
        )
        # Any: mineru-vl-utils' LlamaCppEngineVlmClient, whose message builders we call.
        self._vlm: Any = client.client
        # Several pages' threads call predict() at once: no more requests than slots.
        self._slots = threading.BoundedSemaphore(settings.parallel)
        # engine.page_batch pages in the engine: their layouts and blocks share the slots.
        self.max_pages_in_flight = max(1, page_batch)
        self.info = RuntimeInfo(
            runtime="llama-cpp",
            model=main.name,
            details={
                "model_path": str(main),
                "mmproj_path": str(mmproj),
                "parallel": settings.parallel,
                "threads": threads,
                "mineru_llama_cpp": version("mineru-llama-cpp"),
            },
        )
        super().__init__(client, max_blocks_in_flight=settings.parallel)

    def predict_one(self, request: GenRequest) -> Prediction:
        from mineru_vl_utils.vlm_client.utils import (
            get_image_data_url,
            image_to_bytes_list_and_format,
        )

        images, image_format = image_to_bytes_list_and_format(request.image)
        urls = [get_image_data_url(b, image_format) for b in images]
        messages = self._vlm.build_messages(urls, request.prompt)
        sampling = self._vlm.build_llama_cpp_sampling_params(request.capped_params())
        try:
            with self._slots:
                result = self.engine.generate(messages, sampling)
        except self._errors.InvalidRequestError as exc:
            # e.g. the image needs more tokens than a slot's context holds
            raise DocumentError(FailureKind.ENGINE, f"llama.cpp refused a request: {exc}") from exc
        text = str(self._vlm.get_output_content(result))
        return Prediction(text=text, tokens=int(result.tokens_predicted))

    def close(self) -> None:
        super().close()
        self.engine.close()
