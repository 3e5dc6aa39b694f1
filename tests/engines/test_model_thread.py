"""The model thread: every torch call of a loaded model on one OS thread, whoever asks.

Why it exists (libgomp's throttled spinning once two threads have OpenMP pools) is a speed
matter and is measured in docs/benchmarks.md, not here; here: that calls run there, in
order, with their results and errors, and that the transformers runtime loads and runs its
model only there while pages come from several threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from daemon.config.settings import EngineConfig
from daemon.document.page import PageInput, PageOptions, no_progress
from daemon.engines.mineru.engine import MinerUEngine
from daemon.engines.mineru.runtimes import transformers_model
from daemon.engines.mineru.runtimes.model_thread import ModelThread
from daemon.engines.mineru.runtimes.transformers import TransformersRuntime
from tests.tinymodel import make_random_reader


def callers(count: int, fn: Callable[[int], None]) -> None:
    """`fn(i)` from `count` threads at once, all joined; the first error raised here."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            fn(i)
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def test_calls_from_many_threads_run_on_one_and_return_their_results() -> None:
    model = ModelThread()
    seen: list[int] = []
    results: dict[int, int] = {}

    def square(i: int) -> int:
        seen.append(threading.get_ident())
        return i * i

    def ask(i: int) -> None:
        results[i] = model.call(lambda: square(i))

    callers(6, ask)
    assert results == {i: i * i for i in range(6)}
    assert set(seen) == {model.ident} and model.ident != threading.get_ident()
    model.close()


def test_an_error_reaches_the_caller_and_the_thread_goes_on() -> None:
    model = ModelThread()

    def fail() -> None:
        raise ValueError("bad page")

    with pytest.raises(ValueError, match="bad page"):
        model.call(fail)
    assert model.call(lambda: 7) == 7
    model.close()


def test_a_call_made_on_the_model_thread_runs_at_once() -> None:
    model = ModelThread()
    assert model.call(lambda: model.call(lambda: "inner") + " outer") == "inner outer"
    model.close()


def test_closed_it_stops_and_refuses_calls() -> None:
    model = ModelThread()
    model.call(lambda: None)
    model.close()
    thread = next(t for t in threading.enumerate() if t.ident == model.ident)
    thread.join()
    with pytest.raises(RuntimeError, match="stopped"):
        model.call(lambda: None)


def page(idx: int) -> PageInput:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (400, 300), "white")
    ImageDraw.Draw(image).text((20, 20 + 30 * idx), f"page {idx + 1}", fill="black")
    return PageInput(image=image, page_idx=idx, page_count=3, dpi=50)


def test_the_runtime_loads_and_runs_its_model_on_one_thread(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages from three threads (as the worker's page pipeline parses them with page_batch
    > 1), the load on the test's thread: every forward of the tower and the decoder, and
    the load itself, ran on the runtime's model thread."""
    load_model = transformers_model.load_model
    loaded_on: list[int] = []

    def recorded_load(*args: Any, **kwargs: Any) -> Any:
        loaded_on.append(threading.get_ident())
        return load_model(*args, **kwargs)

    monkeypatch.setattr(transformers_model, "load_model", recorded_load)
    engine = MinerUEngine(
        EngineConfig(model=str(tiny_model), precision="fp32", page_batch=3, batch_size=4)
    )
    engine.load()
    make_random_reader(engine)  # blocks of its own for each page: block steps run too
    try:
        runtime = engine.runtime
        assert isinstance(runtime, TransformersRuntime)
        qwen = runtime.loaded.model
        forwards: list[int] = []
        for part in (qwen.model.visual, qwen.model.language_model):
            part.register_forward_pre_hook(lambda *_: forwards.append(threading.get_ident()))
        options = PageOptions(text_layer="off", dpi=50, max_new_tokens_layout=30,
                              max_new_tokens_block=8)  # fmt: skip
        results = {}

        def parse(i: int) -> None:
            results[i] = engine.parse_page(page(i), options, no_progress)

        callers(3, parse)
        assert all(r.blocks for r in results.values()) and len(results) == 3
        assert forwards, "the pages ran no forward pass"
        assert set(forwards) == {runtime.model_thread.ident}
        assert loaded_on == [runtime.model_thread.ident]
        assert runtime.time_passes().step_seconds > 0
        assert set(forwards) == {runtime.model_thread.ident}  # the timings' passes too
    finally:
        engine.close()


def test_a_load_that_fails_closes_its_model_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from daemon.engines.mineru.engine import client_options
    from daemon.engines.mineru.runtimes import transformers

    started: list[ModelThread] = []
    closed: list[ModelThread] = []

    class Recorded(ModelThread):
        def __init__(self) -> None:
            super().__init__()
            started.append(self)

        def close(self) -> None:
            closed.append(self)
            super().close()

    monkeypatch.setattr(transformers, "ModelThread", Recorded)
    with pytest.raises(Exception, match="model"):
        TransformersRuntime(
            EngineConfig(model=str(tmp_path / "no-such-model"), precision="fp32"),
            client_options(),
        )
    assert len(started) == 1 and closed == started
