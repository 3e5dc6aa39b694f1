"""A worker that dies before its engine is loaded, every time: real worker processes that
really segfault while loading (`tests.plugins:FaultEngine` with `on_load`), the real
supervisor, a made-up clock for the backoff.

Such a worker never takes a document, so no job records the crash: the daemon keeps
restarting it (with backoff) and says why in its facts; `docinbox parse` gives up.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from daemon.common.live import Live, Phase
from daemon.config.settings import check_paths, load_config
from daemon.jobs.states import JobState
from daemon.jobs.store import Store
from daemon.output.publish import Publisher
from daemon.supervisor.states import WorkerState
from daemon.supervisor.supervisor import Supervisor
from daemon.supervisor.worker_handle import GiveUp
from tests.conftest import present, write_config
from tests.supervisor.harness import Clock, queue_pdf

pytestmark = pytest.mark.integration

SEGFAULT_ON_LOAD = {"name": "tests.plugins:FaultEngine", "fallback_engine": None,
                    "options": {"fault": "segfault", "on_load": True}}


def crashing(tmp_path: Path, give_up: GiveUp | None, **worker: Any) -> tuple[Supervisor, Clock]:
    cfg = load_config(write_config(tmp_path, engine=SEGFAULT_ON_LOAD, worker=worker))
    assert check_paths(cfg) == []
    store = Store(cfg.db_path)
    clock = Clock()
    sup = Supervisor(cfg, store, Publisher(cfg, store, clock), wall=clock, give_up=give_up)
    queue_pdf(cfg, store, clock, "waiting.pdf")
    return sup, clock


def tick_until_starts_failed(sup: Supervisor, clock: Clock, n: int, limit: float = 120) -> None:
    """Tick until `n` workers in a row died loading; the backoff passes on the made-up
    clock, so only the real processes' own start and death take time."""
    end = time.monotonic() + limit
    while sup.worker.failed_starts < n and sup.phase != Phase.FATAL:
        assert time.monotonic() < end, f"gave up; phase={sup.phase}"
        if sup.worker.state is WorkerState.RECOVERING:
            clock.now = max(clock.now, sup.worker.restart_at)
        sup.tick(clock.now)
        sup.wait(0.05)


def test_the_daemon_keeps_restarting_a_worker_that_dies_loading_and_says_why(
    tmp_path: Path,
) -> None:
    sup, clock = crashing(tmp_path, None, restart_backoff_seconds=10,
                          restart_backoff_max_seconds=15)
    tick_until_starts_failed(sup, clock, 3)
    assert sup.phase == Phase.DOWN  # not fatal: it tries again after the backoff
    assert sup.worker.restart_at == clock.now + 15  # 10, 20 capped at 15
    assert sup.worker.next_start_in(clock.now) == 15
    facts = sup.snapshot().worker
    assert facts.failed_starts == 3 and facts.restarts == 2
    assert facts.last_crash == "the worker crashed (SIGSEGV) before its engine was loaded"
    # What `docinbox status` reads back from the runtime row, from another process.
    live = Live(pid=1, started_at=None, updated_at=None, version=None, configured_engine=None,
                engine=sup.snapshot().engine, fallback_reason=None, fatal=None, stopping=False,
                worker=facts, current=None, inboxes=())
    assert Live.from_runtime(live.to_runtime()).worker == facts
    store = sup.records.store
    assert [j.state for j in store.jobs(None, limit=10)] == [JobState.QUEUED]


def test_a_caller_that_gives_up_gets_a_fatal_naming_the_crash(tmp_path: Path) -> None:
    give_up = GiveUp(after=2, see="the log above", hint="reinstall it")
    sup, clock = crashing(tmp_path, give_up, restart_backoff_seconds=10)
    tick_until_starts_failed(sup, clock, 2)
    assert sup.phase == Phase.FATAL and sup.worker.proc is None
    message = present(sup.fatal_message)
    assert "failed to start 2 times in a row" in message, message
    assert "tests.plugins:FaultEngine" in message and "crashed (SIGSEGV)" in message
    assert message.endswith("see the log above") and sup.fatal_hint == "reinstall it"
    assert sup.worker.restarts == 1  # the second start was the one restart


def test_a_worker_that_hangs_loading_counts_as_a_failed_start(tmp_path: Path) -> None:
    engine = {**SEGFAULT_ON_LOAD, "options": {"fault": "hang", "on_load": True}}
    cfg = load_config(write_config(tmp_path, engine=engine,
                                   worker={"startup_timeout_seconds": 600}))
    store = Store(cfg.db_path)
    clock = Clock()
    give_up = GiveUp(after=1, see="the log above", hint="")
    sup = Supervisor(cfg, store, Publisher(cfg, store, clock), wall=clock, give_up=give_up)
    sup.tick(clock.now)
    assert sup.worker.state is WorkerState.STARTING
    clock.now += 601  # no Ready: the load deadline passes on the made-up clock
    sup.tick(clock.now)
    assert sup.phase == Phase.FATAL and sup.worker.proc is None  # killed, reaped
    assert sup.worker.last_crash == (
        "the worker did not load the engine within startup_timeout_seconds"
    )
    assert "the last time it did not load the engine within startup_timeout_seconds" in (
        present(sup.fatal_message)
    )
