"""The state database is pruned while the daemon is busy, a bounded batch a tick.

The real daemon in this process (`Daemon.loop(now)` with made-up clocks), its real store
and a real worker running tests.plugins:FaultEngine's gate: the worker holds the first
document's page until the test opens the gate, so the daemon is never idle while the
test ticks it, and a second document waits in the queue. Pruning used to run only in
idle ticks: a queue that never empties never pruned.

Two clocks, as in production: `now` (monotonic, the supervisor's deadlines and the
worker's heartbeats) moves a little a tick; the wall clock (retention, the prune
schedule) jumps past the next prune pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from daemon.config.settings import check_paths, load_config
from daemon.jobs.states import JobState
from daemon.jobs.store import Store
from daemon.jobs.upkeep import PRUNE_BATCH, PRUNE_EVERY
from daemon.service.app import Daemon
from tests.conftest import drop, present, write_config
from tests.docgen import make_text_pdf
from tests.jobs.test_store import old_deliveries, rows

pytestmark = pytest.mark.integration

DAY = 86400.0


class Clock:
    def __init__(self, at: float) -> None:
        self.now = at

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def busy(tmp_path: Path) -> Iterator[tuple[Daemon, Clock, Clock]]:
    """A started daemon, its monotonic and wall clocks; stopped after the test."""
    gate = tmp_path / "gate"
    gate.mkdir()
    (tmp_path / "inbox").mkdir()
    engine = {"name": "tests.plugins:FaultEngine", "fallback_engine": None,
              "options": {"fault": "gate", "marker_dir": str(gate)}}
    cfg = load_config(write_config(tmp_path, engine=engine))
    assert check_paths(cfg) == []
    mono, wall = Clock(1000.0), Clock(1_700_000_000.0)
    daemon = Daemon(cfg, wall=wall)
    daemon.start(mono.now)
    yield daemon, mono, wall
    (gate / "open").touch()  # a worker at the gate finishes its page, then stops
    sup = present(daemon.supervisor)
    sup.request_stop(mono.now)
    end = time.monotonic() + 60
    while not sup.stopped and time.monotonic() < end:
        tick(daemon, mono)
    daemon.close()


def tick(daemon: Daemon, mono: Clock, advance: float = 0.0) -> None:
    mono.now += advance
    daemon.loop(mono.now)
    conn = present(daemon.supervisor).worker.conn
    if conn is not None:
        conn.poll(0.05)  # the only real wait: for the worker's next answer


def tick_until(daemon: Daemon, mono: Clock, cond: Callable[[], bool], what: str) -> None:
    """Bounded, not timed: the worker's answers take what they take."""
    end = time.monotonic() + 120
    while not cond():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        tick(daemon, mono, advance=1.5)  # files become stable, rescans fall due


def test_a_daemon_that_is_never_idle_prunes_old_events_a_batch_a_tick(
    busy: tuple[Daemon, Clock, Clock], tmp_path: Path,
) -> None:
    daemon, mono, wall = busy
    store: Store = present(daemon.store)
    sources = tmp_path / "sources"
    sources.mkdir()
    for name in ("a.pdf", "b.pdf"):
        drop(make_text_pdf(sources / name, [[f"the document {name}"]]), tmp_path / "inbox")
    tick_until(daemon, mono, lambda: (tmp_path / "gate" / "at-gate").exists(),
               "the worker holding a page")
    tick_until(daemon, mono, lambda: len(store.jobs()) == 2, "both documents recorded")
    # Months of finished deliveries, past hooks.retention_days (30).
    backlog = 3 * PRUNE_BATCH // 2  # events, told to two receivers each
    old_deliveries(store, backlog, wall.now - 40 * DAY)
    assert rows(store, "deliveries") == 2 * backlog

    wall.now += PRUNE_EVERY  # the next pass is due, whatever the daemon is doing
    left = []
    for _ in range(4):
        tick(daemon, mono, advance=0.25)
        left.append(rows(store, "deliveries"))
    # Busy all along: the first document at the gate, the second one queued.
    states = sorted(j.state for j in store.jobs())
    assert states == [JobState.QUEUED, JobState.RUNNING], states
    assert present(daemon.supervisor).current is not None
    # A bounded batch a tick, then the rest on the following ticks, until none is left.
    assert left == [2 * backlog - PRUNE_BATCH, 2 * backlog - 2 * PRUNE_BATCH,
                    2 * backlog - 3 * PRUNE_BATCH, 0], left
    assert rows(store, "events") == 0
