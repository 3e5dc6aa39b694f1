"""`docinbox model pull|info`: fetch MinerU weights explicitly, and report on them.

Per `engine.runtime`: transformers weights (a hub snapshot), llama.cpp's GGUF pair, or,
for `http`, nothing to pull: `info` asks the server which models it serves.

The daemon never downloads weights on its own (see `resolve_weights` in
`engines/mineru/runtimes/transformers_model.py`); these helpers are the one place that goes
online. Everything honours the usual Hugging Face environment: HF_HOME / HF_HUB_CACHE
(where), HF_ENDPOINT (mirror), HF_HUB_OFFLINE (no network), HF_TOKEN. The CLI wiring lives
in `daemon.cli.main`; these functions raise `ModelError` with a plain message (and a hint)
instead of printing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from daemon.common.errors import EngineUnavailable
from daemon.engines.mineru.runtimes.base import PRO_MODEL
from daemon.engines.mineru.runtimes.http import choose_model, probe_server
from daemon.engines.mineru.runtimes.llama_cpp import gguf_pair_for, pair_in_folder, resolve_gguf
from daemon.engines.mineru.runtimes.transformers_model import (
    DEFAULT_MODEL,
    commit_of,
    load_model,
    looks_like_path,
    resolve_weights,
)

if TYPE_CHECKING:
    from daemon.config.settings import EngineConfig, LlamaCppConfig


class ModelError(Exception):
    """A model command failed; `message` is for the user, `hint` what to do next."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def pull(model: str = DEFAULT_MODEL, revision: str | None = None) -> Path:
    """Download (or complete, or verify) the checkpoint into the HF cache; return its folder.

    Shows huggingface_hub's own progress bars. Re-running is cheap: files already in the
    cache are skipped, so an interrupted pull resumes.
    """
    folder = Path(model).expanduser()
    if folder.is_dir() or looks_like_path(model):
        if not folder.is_dir():
            raise ModelError(f"model folder {model} does not exist")
        return folder.resolve()  # a local folder needs no pull

    return _snapshot(model, revision)


def _snapshot(model: str, revision: str | None, files: list[str] | None = None) -> Path:
    """snapshot_download (only `files`, when given) with its errors in plain words."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(
            str(snapshot_download(repo_id=model, revision=revision, allow_patterns=files))
        )
    except LocalEntryNotFoundError as exc:
        # Raised when the hub cannot be reached (or HF_HUB_OFFLINE=1) and nothing is cached.
        if constants.HF_HUB_OFFLINE:
            raise ModelError(
                f"cannot download {model}: HF_HUB_OFFLINE is set",
                hint="unset HF_HUB_OFFLINE, or copy the model folder and set engine.model to it",
            ) from exc
        raise ModelError(
            f"cannot reach {constants.ENDPOINT} to download {model}: {exc}",
            hint="check the network or proxy; HF_ENDPOINT selects a mirror",
        ) from exc
    except RevisionNotFoundError as exc:
        raise ModelError(f"{model} has no revision {revision!r}") from exc
    except GatedRepoError as exc:
        raise ModelError(
            f"{model} is gated: accept its terms on the hub first", hint="set HF_TOKEN"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise ModelError(f"no model {model!r} on {constants.ENDPOINT}") from exc
    except HFValidationError as exc:
        raise ModelError(f"{model!r} is not a valid model id: {exc}") from exc
    except OSError as exc:  # disk full, permissions on the cache, network errors
        raise ModelError(f"downloading {model} failed: {exc}") from exc


def info(
    model: str = DEFAULT_MODEL,
    revision: str | None = None,
    try_load: bool = False,
    precision: str = "auto",
    threads: int = 0,
) -> dict[str, Any]:
    """Where the weights are, how big, which commit; optionally whether they load.

    Never goes online. With `try_load`, loads processor and model the way the daemon
    would (the configured precision and threads, so the check needs no more memory than
    the service itself) and reports the failure message instead of raising, so
    `docinbox model info` can show everything it found.
    """
    result: dict[str, Any] = {
        "model": model,
        "revision": revision,
        "available": False,
        "path": None,
        "commit": None,
        "size_bytes": None,
        "files": None,
        "error": None,
        "hint": None,
    }
    try:
        weights = resolve_weights(model, revision)
    except EngineUnavailable as exc:
        result.update(error=exc.message, hint=exc.hint)
        return result
    files = [p for p in weights.path.rglob("*") if p.is_file()]  # follows cache symlinks
    result.update(
        available=True,
        path=str(weights.path),
        commit=weights.commit or commit_of(weights.path),
        size_bytes=sum(p.stat().st_size for p in files),
        files=len(files),
    )
    if try_load:
        result["loads"] = False
        try:
            loaded = load_model(model, revision, precision=precision, threads=threads)
        except EngineUnavailable as exc:
            result.update(error=exc.message, hint=exc.hint)
        else:
            result.update(
                loads=True,
                load_seconds=round(loaded.load_seconds, 2),
                precision=loaded.precision,
                parameters=sum(p.numel() for p in loaded.model.parameters()),
                processor=type(loaded.processor).__name__,
                image_processor=type(loaded.processor.image_processor).__name__,
            )
    return result


def pull_gguf(model: str, llama: LlamaCppConfig) -> tuple[Path, Path]:
    """`model pull --runtime llama-cpp`: the GGUF pair (main model + mmproj) llama.cpp
    runs, MinerU 4's Q8_0 files for MinerU2.5-Pro. Returns the two local paths."""
    if llama.model is not None:
        try:
            return resolve_gguf(model, llama)  # local files: nothing to download
        except EngineUnavailable as exc:
            raise ModelError(exc.message, exc.hint) from exc
    pair = gguf_pair_for(model, llama)
    if pair is None:
        raise ModelError(
            f"no GGUF is known for {model}",
            hint=f"set engine.model: {PRO_MODEL} (MinerU 4's GGUF pair), or "
            "engine.llama_cpp.repo to a hub repo holding a MinerU GGUF pair",
        )
    files = [pair.model_file, pair.mmproj_file] if pair.model_file else ["*Q8_0.gguf"]
    folder = _snapshot(pair.repo, None, files)
    try:
        return pair_in_folder(folder, pair)
    except EngineUnavailable as exc:
        raise ModelError(exc.message, exc.hint) from exc


def runtime_info(engine: EngineConfig, model: str, try_load: bool) -> dict[str, Any]:
    """`model info` for `engine.runtime` http and llama-cpp (transformers: `info`).

    http asks the server (/health, /v1/models) which model it serves; llama-cpp finds the
    GGUF pair and, with `try_load`, loads it the way the worker would.
    """
    if engine.runtime == "http":
        probe = probe_server(engine.http)
        result: dict[str, Any] = {
            "runtime": "http",
            "server": probe.server,
            "reachable": probe.reachable,
            "healthy": probe.healthy,
            "models": list(probe.models),
            "model_name": None,
            "available": False,
            "error": probe.error,
            "hint": None,
        }
        if probe.reachable and probe.error is None:
            try:
                result.update(model_name=choose_model(engine.http, probe), available=True)
            except EngineUnavailable as exc:
                result.update(error=exc.message, hint=exc.hint)
        elif not probe.reachable:
            result["hint"] = "start the server or fix engine.http.server_url (docs/scale-out.md)"
        return result
    result = {
        "runtime": "llama-cpp",
        "model": model,
        "available": False,
        "model_path": None,
        "mmproj_path": None,
        "size_bytes": None,
        "error": None,
        "hint": None,
    }
    try:
        main, mmproj = resolve_gguf(model, engine.llama_cpp)
    except EngineUnavailable as exc:
        result.update(error=exc.message, hint=exc.hint)
        return result
    result.update(
        available=True,
        model_path=str(main),
        mmproj_path=str(mmproj),
        size_bytes=main.stat().st_size + mmproj.stat().st_size,
    )
    if try_load:
        from daemon.common.cpus import resolve_threads
        from daemon.engines.mineru.runtimes.llama_cpp import LlamaCppRuntime

        threads = resolve_threads(engine.llama_cpp.threads or engine.threads)
        try:
            runtime = LlamaCppRuntime(model, engine.llama_cpp, threads, {})
        except EngineUnavailable as exc:
            result.update(loads=False, error=exc.message, hint=exc.hint)
        else:
            runtime.close()
            result["loads"] = True
    return result
