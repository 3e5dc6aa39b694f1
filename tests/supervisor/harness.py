"""The supervisor's test bench, shared by the supervisor's test modules: a made-up clock,
a supervisor on a real store and publisher, and `Bench`, which ticks it against a worker
the test answers for (tests/fakeworker.py: the real pipe and messages; only the child
process is replaced). `setup`, `drive` and `stop` run real worker processes instead.

No tests here: the tests that use it are test_supervisor.py, test_supervisor_idle.py,
test_supervisor_inboxes.py, test_failed_starts.py and tests/engines/test_mineru_batching.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemon.config.settings import Config, load_config
from daemon.document.page import EngineInfo
from daemon.document.protocol import Request
from daemon.intake.ingest import Ingestor
from daemon.intake.presence import InboxLooks
from daemon.jobs.store import Job, Published, Store, StoreBusy
from daemon.output.publish import Publisher
from daemon.supervisor.supervisor import Supervisor
from tests.conftest import present, write_config
from tests.docgen import make_text_pdf
from tests.fakeworker import FakeContext, FakeWorker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def setup(tmp_path: Path, **overrides: Any) -> tuple[Config, Store, Supervisor, Clock]:
    cfg = load_config(write_config(tmp_path, **overrides))
    from daemon.config.settings import check_paths

    assert check_paths(cfg) == []
    store = Store(cfg.db_path)
    clock = Clock()
    sup = Supervisor(cfg, store, Publisher(cfg, store, clock), wall=clock)
    return cfg, store, sup, clock


def queue_pdf(cfg: Config, store: Store, clock: Clock, name: str, pages: int = 1) -> int:
    path = make_text_pdf(cfg.inboxes[0].path / name, [[f"{name} page {i}"] for i in range(pages)])
    res = Ingestor(cfg, store, clock).ingest(cfg.inboxes[0], path)
    assert res is not None
    return res.job.id


def drive(sup: Supervisor, clock: Clock, until: Callable[[], bool], limit: float = 90) -> None:
    """Tick at the current made-up time until `until()`; waits only on the worker's pipe."""
    end = time.monotonic() + limit
    while not until():
        assert time.monotonic() < end, f"gave up; phase={sup.phase}"
        sup.tick(clock.now)
        if sup.worker.conn is not None:
            sup.worker.conn.poll(0.05)


def stop(sup: Supervisor, clock: Clock) -> None:
    sup.request_stop(clock.now)
    drive(sup, clock, lambda: sup.stopped)


def fault_engine(**options: Any) -> dict[str, Any]:
    return {"name": "tests.plugins:FaultEngine", "fallback_engine": None, "options": options}


# ------------------------------------------------------------------ a worker the test answers for


class FlakyPublisher(Publisher):
    """The real publisher, made to fail completion on demand."""

    fail_with: BaseException | None = None

    def complete(self, job: Job, engine: EngineInfo | None, seconds: float) -> Published:
        if self.fail_with is not None:
            raise self.fail_with
        return super().complete(job, engine, seconds)


class Bench:
    """A supervisor on a real store and publisher, against a worker the test answers for.

    `step` is what `Daemon.loop` does with the supervisor: tick, and an exception that is
    not a busy database fails the document in progress (`internal_error`).
    """

    def __init__(self, tmp_path: Path, pages: dict[int, int] | None = None,
                 hold: Callable[[Request], bool] = lambda msg: False,
                 unavailable: frozenset[str] = frozenset(), **overrides: Any) -> None:
        worker = {"heartbeat_timeout_seconds": 10_000, **overrides.pop("worker", {})}
        self.cfg = load_config(write_config(tmp_path, worker=worker, **overrides))
        from daemon.config.settings import check_paths

        assert check_paths(self.cfg) == []
        self.store = Store(self.cfg.db_path)
        self.clock = Clock()
        self.publisher = FlakyPublisher(self.cfg, self.store, self.clock)
        self.pages = {} if pages is None else pages
        self.hold = hold
        self.unavailable = unavailable
        self.inboxes: InboxLooks | None = None  # the watcher, where a test gives one
        self.restart()

    def restart(self) -> None:
        """A fresh supervisor on the same store, as after the daemon's next start."""
        self.ctx = FakeContext(lambda job_id: self.pages.get(job_id, 1),
                               lambda msg: self.hold(msg), self.unavailable)
        self.sup = Supervisor(self.cfg, self.store, self.publisher, wall=self.clock,
                              context=self.ctx, inboxes=self.inboxes)

    @property
    def worker(self) -> FakeWorker:
        return self.ctx.worker

    def queue(self, name: str, pages: int = 1) -> int:
        job_id = queue_pdf(self.cfg, self.store, self.clock, name, pages)
        self.pages[job_id] = pages
        return job_id

    def job(self, job_id: int) -> Job:
        return present(self.store.job(job_id))

    def held(self) -> bool:
        """Whether the live worker holds a request the test has not answered."""
        return bool(self.ctx.workers) and self.worker.alive and bool(self.worker.held)

    def step(self) -> None:
        try:
            self.sup.tick(self.clock.now)
        except StoreBusy:
            pass
        except Exception as exc:
            self.sup.internal_error(self.clock.now, exc)
        for w in self.ctx.workers:
            w.serve()

    def step_until(self, cond: Callable[[], bool], ticks: int = 50) -> None:
        for _ in range(ticks):
            if cond():
                return
            self.step()
        raise AssertionError(f"gave up; phase={self.sup.phase}")

    def settle_stop(self, hangs: Request) -> None:
        """Tick until stopped: the supervisor must get there within one tick of the worker
        exiting, and must tell the worker to exit without any real time passing. Requests
        other than the hanging page are answered as a healthy worker would."""
        for _ in range(6):
            if self.sup.stopped:
                return
            self.step()
            for w in self.ctx.workers:
                for msg in [m for m in w.held if m is not hangs and w.alive]:
                    w.held.remove(msg)
                    w.answer(msg)
            if self.ctx.workers and not self.worker.alive and not self.sup.stopped:
                self.sup.tick(self.clock.now)
                assert self.sup.stopped, f"worker exited, supervisor still {self.sup.phase}"
                return
        assert self.sup.stopped, f"not stopped; phase={self.sup.phase}"
