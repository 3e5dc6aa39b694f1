"""The worker's page pipeline with the real lite engine on real PDFs, in this process.

The engine is wrapped so a page can be held inside `parse_page` until something else has
happened (the next page rendered, other pages entered the engine). Each hold is bounded:
a pipeline that does not work ahead fails the test after the bound instead of hanging.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from daemon.config.settings import Config, load_config
from daemon.document.page import EngineInfo, PageInput, PageOptions, PageResult, ProgressFn
from daemon.document.protocol import PageDone, ParsePage
from daemon.engines.registry import create_engine
from daemon.input import raster, sniff
from daemon.worker.pipeline import PagePipeline
from tests.conftest import write_config
from tests.docgen import make_text_pdf

BOUND = 60.0  # seconds a held page waits for what it waits for; never reached when it works


class GatedEngine:
    """The real lite engine; `gates[page]` must open before that page is parsed."""

    name = "gated"

    def __init__(self, inner: object, in_flight: int = 1) -> None:
        self.inner = inner
        self.max_pages_in_flight = in_flight
        self.gates: dict[int, Callable[[], bool]] = {}
        self.entered: dict[int, threading.Event] = {}
        self.ended: dict[int, threading.Event] = {}
        self.fail_on: int | None = None
        self.lock = threading.Lock()
        self.active = 0
        self.most_active = 0
        self.threads: dict[int, str] = {}
        self.pages: dict[int, PageInput] = {}  # what each page's parse_page was handed

    def event(self, table: dict[int, threading.Event], idx: int) -> threading.Event:
        with self.lock:
            return table.setdefault(idx, threading.Event())

    def load(self) -> EngineInfo:
        return EngineInfo(name="gated")

    def parse_page(self, page: PageInput, options: PageOptions, progress: ProgressFn) -> PageResult:
        idx = page.page_idx
        with self.lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
            self.threads[idx] = threading.current_thread().name
            self.pages[idx] = page
        self.event(self.entered, idx).set()
        try:
            gate = self.gates.get(idx)
            if gate is not None:
                assert wait_until(gate), f"page {idx + 1} was held and nothing came"
            if idx == self.fail_on:
                raise RuntimeError(f"the engine broke on page {idx + 1}")
            result: PageResult = self.inner.parse_page(page, options, progress)  # type: ignore[attr-defined]
            return result
        finally:
            with self.lock:
                self.active -= 1
            self.event(self.ended, idx).set()

    def close(self) -> None:
        return None


def wait_until(cond: Callable[[], bool]) -> bool:
    done = threading.Event()
    deadline = threading.Timer(BOUND, done.set)
    deadline.start()
    try:
        while not cond():
            if done.wait(0.01):
                return cond()
        return True
    finally:
        deadline.cancel()


@pytest.fixture(scope="module")
def lite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Config, object]]:
    root = tmp_path_factory.mktemp("lite")
    cfg = load_config(write_config(root))
    engine = create_engine("lite", cfg.engine)
    engine.load()
    yield cfg, engine
    engine.close()


@pytest.fixture()
def renders(monkeypatch: pytest.MonkeyPatch) -> dict[int, str]:
    """page index -> the thread that rendered it, recorded around the real renderer."""
    seen: dict[int, str] = {}
    real = raster.render_page

    def recording(path: Path, info: sniff.DocumentInfo, page_idx: int, **kw: int) -> PageInput:
        page = real(path, info, page_idx, **kw)
        seen[page_idx] = threading.current_thread().name
        return page

    monkeypatch.setattr(raster, "render_page", recording)
    return seen


def pipeline_for(cfg: Config, engine: GatedEngine, pdf: Path) -> tuple[PagePipeline, PageOptions]:
    doc = sniff.inspect(pdf, passwords=[], limits=cfg.limits)
    options = PageOptions(dpi=72)
    progress: list[tuple[int, ...]] = []

    def report(page_idx: int, done: int, total: int, what: str, in_flight: int) -> None:
        progress.append((page_idx, done))

    pipe = PagePipeline(engine, cfg, 7, pdf, doc, options, report)
    return pipe, options


def ask(pipe: PagePipeline, pdf: Path, options: PageOptions, idx: int,
        lookahead: tuple[int, ...]) -> PageDone:
    done = pipe.run(ParsePage(7, str(pdf), idx, options, lookahead))
    assert done.page_idx == idx and done.job_id == 7
    return done


def text_of(done: PageDone) -> str:
    return " ".join(b.text for b in done.blocks)


def test_one_page_at_a_time_renders_the_next_page_while_the_engine_works(
    tmp_path: Path, lite: tuple[Config, object], renders: dict[int, str]
) -> None:
    cfg, inner = lite
    pdf = make_text_pdf(tmp_path / "d.pdf", [[f"wombat page {i}"] for i in range(3)])
    engine = GatedEngine(inner)
    # page 1 stays in the engine until page 2 has been rendered: only a pipeline that
    # renders ahead lets it out
    engine.gates[0] = lambda: 1 in renders
    pipe, options = pipeline_for(cfg, engine, pdf)

    first = ask(pipe, pdf, options, 0, (1, 2))
    assert "wombat page 0" in text_of(first)
    assert renders[0] == threading.current_thread().name  # nothing was ahead yet
    assert renders[1] != threading.current_thread().name  # rendered in the background
    assert 2 not in renders and pipe.ahead == [1]  # one page ahead, no more
    ahead = pipe.slots[1]
    assert wait_until(ahead.done.is_set)
    assert ahead.page is not None and ahead.page.text_layer is not None  # its text layer too
    assert first.info["idle_seconds"] is None  # the first page has no gap before it
    engine_seconds = first.info["engine_seconds"]
    assert isinstance(engine_seconds, float) and engine_seconds > 0

    second = ask(pipe, pdf, options, 1, (2,))
    assert "wombat page 1" in text_of(second)
    assert engine.pages[1] is ahead.page  # handed on as read ahead, text layer and all
    assert isinstance(second.info["idle_seconds"], float) and second.info["idle_seconds"] >= 0
    third = ask(pipe, pdf, options, 2, ())
    assert "wombat page 2" in text_of(third)
    assert engine.most_active == 1
    assert set(engine.threads.values()) == {threading.current_thread().name}


def test_many_pages_in_flight_are_parsed_together_and_answered_in_order(
    tmp_path: Path, lite: tuple[Config, object], renders: dict[int, str]
) -> None:
    cfg, inner = lite
    pdf = make_text_pdf(tmp_path / "d.pdf", [[f"numbat page {i}"] for i in range(4)])
    engine = GatedEngine(inner, in_flight=3)

    def entered(i: int) -> bool:
        return engine.event(engine.entered, i).is_set()

    def ended(i: int) -> bool:
        return engine.event(engine.ended, i).is_set()

    engine.gates[0] = lambda: entered(1) and entered(2)  # three pages in the engine at once
    engine.gates[1] = lambda: ended(2)  # page 3 finishes before page 2
    pipe, options = pipeline_for(cfg, engine, pdf)

    answers = [ask(pipe, pdf, options, 0, (1, 2, 3))]
    assert 3 not in engine.entered  # max_pages_in_flight bounds it
    answers.append(ask(pipe, pdf, options, 1, (2, 3)))
    answers.append(ask(pipe, pdf, options, 2, (3,)))
    answers.append(ask(pipe, pdf, options, 3, ()))
    assert [a.page_idx for a in answers] == [0, 1, 2, 3]
    for i, a in enumerate(answers):
        assert f"numbat page {i}" in text_of(a)
    assert engine.most_active == 3
    assert threading.current_thread().name not in engine.threads.values()


def test_a_page_that_fails_ahead_fails_in_its_turn(
    tmp_path: Path, lite: tuple[Config, object], renders: dict[int, str]
) -> None:
    cfg, inner = lite
    pdf = make_text_pdf(tmp_path / "d.pdf", [[f"quokka page {i}"] for i in range(3)])
    engine = GatedEngine(inner, in_flight=3)
    engine.fail_on = 1
    engine.gates[0] = lambda: engine.event(engine.ended, 1).is_set()  # page 2 failed first
    pipe, options = pipeline_for(cfg, engine, pdf)
    assert "quokka page 0" in text_of(ask(pipe, pdf, options, 0, (1, 2)))
    with pytest.raises(RuntimeError, match="broke on page 2"):
        ask(pipe, pdf, options, 1, (2,))


def test_a_changed_plan_or_a_close_drops_the_work_ahead(
    tmp_path: Path, lite: tuple[Config, object], renders: dict[int, str]
) -> None:
    cfg, inner = lite
    pdf = make_text_pdf(tmp_path / "d.pdf", [[f"bilby page {i}"] for i in range(4)])
    pipe, options = pipeline_for(cfg, GatedEngine(inner), pdf)
    ask(pipe, pdf, options, 0, (1, 2))
    assert pipe.ahead == [1]
    ask(pipe, pdf, options, 3, ())  # the supervisor now wants page 4 only
    assert pipe.ahead == []
    ask(pipe, pdf, options, 1, (2,))
    assert pipe.ahead == [2]
    pipe.close()
    assert pipe.ahead == []
    assert not pipe.serves(ParsePage(8, str(pdf), 2, options, ()))  # another document
    assert not pipe.serves(ParsePage(7, str(pdf), 2, PageOptions(dpi=100), ()))
