"""The page estimate before the first page (issue 33 part 3): the arithmetic, the cache and
its key, the warning, where it is shown, and one real timing on the tiny model.

Timings are injected (a counting timer, fixed PassTimings): nothing here sleeps or asserts
on how long something took, except that the real timing's passes took some time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import multiprocessing
import os
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from daemon.cli.main import cmd_check_config, estimate_line
from daemon.cli.status_view import render_status
from daemon.common.estimate import (
    CACHE_FILE,
    TYPICAL_PAGE,
    EstimateCache,
    EstimateKey,
    PassCost,
    PassTimings,
    TypicalPage,
    cached,
    estimate_key,
    generate_passes,
    loop_passes,
    page_breakdown,
    resolve,
    step_seconds,
    vision_cost,
)
from daemon.common.live import SLOW_PAGE_SECONDS, EngineFacts, Live, PageEstimate
from daemon.config.settings import Config, EngineConfig, load_config
from daemon.document.page import EngineInfo
from daemon.document.protocol import Ready
from daemon.jobs.store import Store
from daemon.output.publish import Publisher
from daemon.service import metrics
from daemon.service.health import assess
from daemon.service.status import collect
from daemon.service.web import status_page
from daemon.supervisor.supervisor import Supervisor, _engine_facts
from daemon.supervisor.worker_handle import WorkerHandle
from tests.conftest import DaemonFactory, wait_for, write_config
from tests.tinymodel import tiny_model_once

NOW = 1_700_000_000.0

# In PassTimings' field order: a 256-patch vision pass of a 1280-wide tower in 2 s, a
# 128-token prefill in 1.28 s, a decode step in 50 ms at one row and 120 ms at 8 rows.
TIMINGS = PassTimings(256, 1280, 2.0, 128, 1.28, 0.05, 8, 0.12)


# -- the arithmetic --------------------------------------------------------------------


def test_the_typical_page_is_the_realistic_bench_page() -> None:
    # docs/benchmarks.md: 11,864 patches (the 70x70 layout image and the crops), layout 378
    # tokens, blocks 789 tokens; every recognised block has its crop.
    assert TYPICAL_PAGE.layout_patches + sum(TYPICAL_PAGE.crop_patches) == 11_864
    assert TYPICAL_PAGE.layout_tokens == 378
    assert sum(TYPICAL_PAGE.block_tokens) == 789
    assert len(TYPICAL_PAGE.block_tokens) == len(TYPICAL_PAGE.crop_patches)


def test_vision_scales_linears_linearly_and_attention_quadratically() -> None:
    assert vision_cost(600, 100) == 600 + 600 * 600 / 600
    page = TypicalPage(layout_patches=512, crop_patches=(256,), layout_tokens=1,
                       block_tokens=(1,), prompt_text_tokens=0)
    b = page_breakdown(TIMINGS, batch_size=8, decode="loop", page=page)
    per_unit = 2.0 / (256 + 256 * 256 / (6 * 1280))
    assert b.vision == pytest.approx(per_unit * (vision_cost(512, 1280) + vision_cost(256, 1280)))
    # twice the patches: more than twice the seconds (attention), less than four times
    assert 2 * 2.0 < per_unit * vision_cost(512, 1280) < 4 * 2.0


def test_prefill_is_per_prompt_token() -> None:
    page = TypicalPage(layout_patches=400, crop_patches=(40,), layout_tokens=1,
                       block_tokens=(1,), prompt_text_tokens=10)
    b = page_breakdown(TIMINGS, batch_size=8, decode="loop", page=page)
    assert page.prompt_tokens == (100 + 10) + (10 + 10)
    assert b.prefill == pytest.approx(0.01 * 130)
    assert b.layout_decode == 0 and b.block_decode == 0  # one token each: from the prefill


def test_a_pass_has_a_fixed_cost_and_a_rate() -> None:
    cost = PassCost.fit((10, 1.2), (110, 2.2))  # 1 s a pass whatever its size, 10 ms a unit
    assert cost.fixed == pytest.approx(1.1) and cost.rate == pytest.approx(0.01)
    assert cost(1000) == pytest.approx(11.1)
    # a busy machine made the large pass no slower: all rate, no fixed part
    assert PassCost.fit((10, 3.0), (110, 2.2)) == PassCost(0.0, 0.02)
    assert PassCost.fit((0, 0.0), (110, 2.2)) == PassCost(0.0, 0.02)  # no tiny pass timed


def test_fixed_costs_count_per_image_and_per_prefill() -> None:
    # the tiny passes: 16 patches in 0.5 s (fixed 0.5 s a pass) and 8 tokens in 0.2 s
    base = dataclasses.replace(TIMINGS, vision_base_patches=16, vision_base_seconds=0.5,
                               prefill_base_tokens=8, prefill_base_seconds=0.2)  # fmt: skip
    page = TypicalPage(layout_patches=400, crop_patches=(40, 40, 40), layout_tokens=1,
                       block_tokens=(1, 1, 1), prompt_text_tokens=10)  # fmt: skip
    vision = PassCost.fit((vision_cost(16, 1280), 0.5), (vision_cost(256, 1280), 2.0))
    prefill = PassCost.fit((8, 0.2), (128, 1.28))
    loop = page_breakdown(base, batch_size=2, decode="loop", page=page)
    assert loop.vision == pytest.approx(
        vision(vision_cost(400, 1280)) + 3 * vision(vision_cost(40, 1280))
    )
    assert loop.prefill == pytest.approx(4 * prefill.fixed + prefill.rate * page.prompt_tokens)
    # generate(): the layout row alone, then the blocks in batches of 2: three prefills
    batched = page_breakdown(base, batch_size=2, decode="generate", page=page)
    assert batched.prefill == pytest.approx(3 * prefill.fixed + prefill.rate * page.prompt_tokens)


def test_decode_steps_follow_the_batching() -> None:
    # the loop: a row joins when a slot frees; its first token comes with its prefill
    assert loop_passes((3, 2, 4), slots=2) == [2, 2, 1, 1]
    assert loop_passes((5,), slots=8) == [1] * 4
    # generate(): batches by prompt size, each to its longest row, at full width
    assert generate_passes((3, 2, 4), (30, 10, 20), slots=2) == [2, 2, 2, 1, 1]
    assert step_seconds(TIMINGS, 1) == pytest.approx(0.05)
    assert step_seconds(TIMINGS, 8) == pytest.approx(0.12)
    assert step_seconds(TIMINGS, 4) == pytest.approx(0.05 + 3 / 7 * 0.07)


def test_the_typical_page_in_full() -> None:
    b = page_breakdown(TIMINGS, batch_size=8, decode="loop")
    assert b.layout_decode == pytest.approx(377 * 0.05)
    passes = loop_passes(TYPICAL_PAGE.block_tokens, 8)
    assert sum(passes) == sum(n - 1 for n in TYPICAL_PAGE.block_tokens)
    assert b.block_decode == pytest.approx(sum(step_seconds(TIMINGS, r) for r in passes))
    assert b.total == pytest.approx(b.vision + b.prefill + b.layout_decode + b.block_decode)
    generate = page_breakdown(TIMINGS, batch_size=8, decode="generate")
    assert generate.block_decode >= b.block_decode  # padded rows decode on


# -- the cache and its key ---------------------------------------------------------------


class CountingTimer:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> PassTimings:
        self.calls += 1
        return TIMINGS


def _key(**over: str) -> EstimateKey:
    base = {"cpu": "Intel(R) Celeron(R) J4125", "isa_caps": "", "torch": "2.13.0",
            "docinbox": "0.1.0", "engine": "mineru|transformers|m|None|auto|loop|8|4"}
    return EstimateKey(**{**base, **over})


def test_a_second_start_reads_the_cache(tmp_path: Path) -> None:
    cache, timer, engine = EstimateCache(tmp_path / CACHE_FILE), CountingTimer(), EngineConfig()
    first = resolve(engine, cache, timer, lambda: NOW, key=_key())
    second = resolve(engine, cache, timer, lambda: NOW + 60, key=_key())
    assert timer.calls == 1
    assert first.seconds == second.seconds == pytest.approx(
        page_breakdown(TIMINGS, 8, "loop").total
    )
    assert "timed at this start" in first.basis and "cached" in second.basis


@pytest.mark.parametrize(
    "change",
    [{"cpu": "Intel(R) N100"}, {"torch": "2.14.0"},
     {"engine": "mineru|transformers|m|None|fp32|loop|8|4"},
     {"isa_caps": "ATEN_CPU_CAPABILITY=default"}],
)  # fmt: skip
def test_a_cpu_precision_or_torch_change_times_again(
    tmp_path: Path, change: dict[str, str]
) -> None:
    cache, timer = EstimateCache(tmp_path / CACHE_FILE), CountingTimer()
    resolve(EngineConfig(), cache, timer, lambda: NOW, key=_key())
    resolve(EngineConfig(), cache, timer, lambda: NOW, key=_key(**change))
    assert timer.calls == 2
    resolve(EngineConfig(), cache, timer, lambda: NOW, key=_key())  # both kept
    assert timer.calls == 2


def test_the_key_follows_precision_settings_and_isa_caps() -> None:
    base = estimate_key(EngineConfig(), env={})
    assert estimate_key(EngineConfig(), env={}) == base
    assert estimate_key(EngineConfig(precision="fp32"), env={}) != base
    assert estimate_key(EngineConfig(batch_size=4), env={}) != base
    assert estimate_key(EngineConfig(), env={"ONEDNN_MAX_CPU_ISA": "SSE41"}) != base
    assert base.torch and base.cpu


def test_an_unreadable_cache_is_an_empty_one(tmp_path: Path) -> None:
    path = tmp_path / CACHE_FILE
    path.write_text("{not json")
    timer = CountingTimer()
    estimate = resolve(EngineConfig(), EstimateCache(path), timer, lambda: NOW, key=_key())
    assert timer.calls == 1 and estimate.seconds is not None
    assert json.loads(path.read_text())["entries"]


def test_lite_and_the_http_runtime_have_no_figure(tmp_path: Path) -> None:
    cache, timer = EstimateCache(tmp_path / CACHE_FILE), CountingTimer()
    lite = resolve(EngineConfig(name="lite"), cache, None, lambda: NOW)
    http = resolve(EngineConfig(runtime="http"), cache, timer, lambda: NOW)
    assert lite.seconds is None and lite.basis.startswith("n/a: engine lite")
    assert http.seconds is None and "runtime http" in http.basis
    assert timer.calls == 0 and not (tmp_path / CACHE_FILE).exists()


# -- the warning -------------------------------------------------------------------------


def test_a_slow_machine_is_told_the_two_ways_out() -> None:
    slow = PageEstimate("mineru", SLOW_PAGE_SECONDS + 1, "timed")
    warning = slow.warning()
    assert warning is not None
    assert "engine.name: lite" in warning and "engine.runtime: http" in warning
    assert PageEstimate("mineru", SLOW_PAGE_SECONDS, "timed").warning() is None
    assert PageEstimate("lite", None, "n/a").warning() is None


def test_the_start_warns_in_the_daemons_log(cfg: Config, caplog: pytest.LogCaptureFixture) -> None:
    handle = WorkerHandle(cfg, multiprocessing.get_context("spawn"))
    with caplog.at_level(logging.INFO, logger="docinbox.supervisor"):
        handle.ready(0.0, EngineInfo("mineru"), 1, PageEstimate("mineru", 100.0, "timed"))
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert "page estimate: ~100 s per typical page" in caplog.text
        handle.ready(0.0, EngineInfo("mineru"), 1, PageEstimate("mineru", 900.0, "timed"))
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "15 min per typical page" in warning and "engine.name: lite" in warning
    assert handle.estimate == PageEstimate("mineru", 900.0, "timed")


# -- where it is shown -------------------------------------------------------------------


@pytest.fixture()
def cfg(tmp_path: Path) -> Config:
    """The tests' usual daemon config (conftest), with MinerU as the configured engine."""
    path = write_config(tmp_path, engine={"name": "mineru", "fallback_engine": "lite"})
    cfg = load_config(path)
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    return cfg


def _live(estimate: PageEstimate) -> Live:
    facts = _engine_facts(EngineInfo("mineru", "opendatalab/MinerU2.5-2509-1.2B",
                                     precision="int8"), "mineru", estimate)  # fmt: skip
    row = {"pid": os.getpid(), "updated_at": NOW, "started_at": NOW - 60, "phase": "idle",
           "engine": "mineru", "engine_info": facts.to_json()}
    # Through the runtime row: what `docinbox status` in another process reads back.
    return Live.from_runtime(row)


def test_the_estimate_travels_through_the_runtime_row() -> None:
    estimate = PageEstimate("mineru", 150.0, "timed 2026-12-05 12:00 UTC, cached")
    assert _live(estimate).engine.estimate == estimate
    assert EngineFacts(name="lite").to_json() == {"name": "lite"}


def test_the_supervisor_hands_the_workers_estimate_to_status(cfg: Config) -> None:
    estimate = PageEstimate("mineru", 150.0, "timed at this start, 2026-12-05 12:00 UTC")
    store = Store(cfg.db_path)
    try:
        sup = Supervisor(cfg, store, Publisher(cfg, store, lambda: NOW), wall=lambda: NOW)
        assert sup.snapshot().engine.estimate is None
        sup._handle(0.0, Ready(EngineInfo("mineru", "m"), 1, estimate))
        assert sup.snapshot().engine.estimate == estimate
    finally:
        store.close()


@pytest.mark.parametrize("seconds", [150.0, 600.0])
def test_status_page_and_metrics_show_it(cfg: Config, seconds: float) -> None:
    estimate = PageEstimate("mineru", seconds, "timed 2026-12-05 12:00 UTC, cached")
    store = Store(cfg.db_path)
    try:
        st = collect(cfg, now=NOW, store=store, live=lambda: _live(estimate), monotonic=0.0)
    finally:
        store.close()
    text = render_status(st)
    assert f"estimate: ~{seconds:,.0f} s per typical page" in text
    assert ("SLOW:" in text) is (seconds > SLOW_PAGE_SECONDS)
    assert st.to_json()["estimated_page_seconds"] == seconds
    page = status_page(st, assess(st))
    assert 'id="estimate"' in page and ('id="slow"' in page) is (seconds > SLOW_PAGE_SECONDS)
    families = {f.name: f for f in text_string_to_metric_families(
        metrics.render(st, assess(st)).decode())}  # fmt: skip
    sample = families["docinbox_estimated_page_seconds"].samples[0]
    assert sample.labels == {"engine": "mineru"} and sample.value == seconds


def test_no_gauge_without_a_figure(cfg: Config) -> None:
    store = Store(cfg.db_path)
    try:
        st = collect(cfg, now=NOW, store=store,
                     live=lambda: _live(PageEstimate("lite", None, "n/a")), monotonic=0.0)
    finally:
        store.close()
    body = metrics.render(st, assess(st)).decode()
    assert "docinbox_estimated_page_seconds" not in body
    assert "estimate: n/a" in render_status(st)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (tiny, random) checkpoint folder: what the worker would load."""
    return tiny_model_once(tmp_path_factory.mktemp("tiny-model"))


def _model(cfg: Config, model: Path) -> Config:
    return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, model=str(model)))


def test_check_config_says_the_figure_waits_for_the_weights(cfg: Config, tmp_path: Path) -> None:
    # No weights: the worker's first start loads lite, so the figure comes with the weights.
    line = estimate_line(_model(cfg, tmp_path / "not-pulled"))
    assert "not measured yet: model folder" in line and "does not exist" in line
    assert "engine lite stands in until then" in line and "first worker start with its" in line
    alone = dataclasses.replace(cfg, engine=dataclasses.replace(
        cfg.engine, model=str(tmp_path / "not-pulled"), fallback_engine=None))  # fmt: skip
    assert "the worker cannot start until then" in estimate_line(alone)


def test_check_config_shows_the_cached_figure_or_when_it_comes(
    cfg: Config, weights: Path
) -> None:
    cfg = _model(cfg, weights)
    assert "not measured yet: timed at the worker's first start" in estimate_line(cfg)
    cache = EstimateCache.in_state_dir(cfg)
    cache.put(estimate_key(cfg.engine), TIMINGS, NOW)
    seconds = page_breakdown(TIMINGS, cfg.engine.batch_size, cfg.engine.decode).total
    line = estimate_line(cfg)
    assert f"~{seconds:,.0f} s per typical page" in line and "cached" in line
    assert cached(cfg.engine, cache).seconds == pytest.approx(seconds)
    slow = dataclasses.replace(TIMINGS, vision_seconds=100.0)
    cache.put(estimate_key(cfg.engine), slow, NOW)
    assert "warning: engine mineru is estimated at" in estimate_line(cfg)
    lite = dataclasses.replace(cfg, engine=EngineConfig(name="lite"))
    assert "n/a: engine lite" in estimate_line(lite)


def test_check_config_show_stays_yaml(cfg: Config, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(config=str(cfg.source), systemd=False, show=False)
    assert cmd_check_config(args) == 0
    assert "\npage estimate (mineru): not measured yet" in capsys.readouterr().out
    assert cmd_check_config(argparse.Namespace(**{**vars(args), "show": True})) == 0
    shown = capsys.readouterr().out
    assert "# page estimate (mineru)" in shown
    assert yaml.safe_load(shown)["engine"]["name"] == "mineru"


# -- timed for real ----------------------------------------------------------------------


def test_the_worker_times_the_tiny_model_once(cfg: Config, tmp_path: Path) -> None:
    from daemon.engines.mineru.engine import MinerUEngine
    from daemon.worker.worker import _estimate
    from tests.tinymodel import tiny_model_once

    model = tiny_model_once(tmp_path / "tiny")
    engine_cfg = EngineConfig(model=str(model), threads=1)
    cfg = dataclasses.replace(cfg, engine=engine_cfg)
    engine = MinerUEngine(engine_cfg)
    engine.load()
    try:
        timings = engine.time_passes()
        assert timings is not None
        assert timings.vision_seconds > 0 and timings.prefill_seconds > 0
        assert timings.step_seconds > 0 and timings.batch_rows == engine_cfg.batch_size
        assert (timings.vision_base_patches, timings.prefill_base_tokens) == (16, 8)
        first = _estimate(engine, cfg, "mineru")
        assert first is not None and first.seconds is not None and first.seconds > 0
        assert "timed at this start" in first.basis
        assert (cfg.state_dir / CACHE_FILE).is_file()
        again = _estimate(engine, cfg, "mineru")
        assert again is not None and "cached" in again.basis
        assert again.seconds == first.seconds
    finally:
        engine.close()


def test_a_daemon_shows_its_workers_estimate(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    """The real path: the worker process times the tiny model after loading it, keeps the
    timings in the state folder, and the daemon records the figure for `docinbox status`."""
    from tests.tinymodel import tiny_model_once

    model = tiny_model_once(tmp_path / "tiny")
    d = daemon_factory(engine={"name": "mineru", "model": str(model), "precision": "fp32",
                               "fallback_engine": "lite"}).start()  # fmt: skip

    def estimate() -> dict[str, object] | None:
        info = d.runtime().get("engine_info") or {}
        found = info.get("estimate") if isinstance(info, dict) else None
        return found if isinstance(found, dict) else None

    found = wait_for(estimate, 240, "the worker's estimate in the runtime row", d.proc)
    seconds = found["seconds"]
    assert isinstance(seconds, float) and seconds > 0, found
    assert "timed at this start" in str(found["basis"])
    assert (tmp_path / "state" / CACHE_FILE).is_file()
    d.stop()
    assert "page estimate: ~" in d.output()

