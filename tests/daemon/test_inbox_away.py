"""An inbox moved away under the running daemon: its documents wait, none fails.

The real daemon in this process, one `Daemon.loop(now)` at a time with a made-up clock,
its real watcher (watchdog observers, the inotify watch on the inbox folders), the real
SQLite store, and a real worker process running the `lite` engine behind
tests.plugins:FaultEngine's gate: the worker holds a page whose file it has already read
until the test opens the gate, so "the inbox moved away while a document was being
converted" happens at a step the test chooses, not by a race. Inbox folders move away
and back with os.rename, as `mv`, a NAS or an automounter does.

Real time passes only while the worker answers (its pipe is polled between ticks).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from daemon.config.settings import Config, check_paths, load_config
from daemon.jobs.states import JobState
from daemon.jobs.store import Job, Store
from daemon.service.app import Daemon
from daemon.supervisor.supervisor import Supervisor
from tests.conftest import drop, present, write_config
from tests.docgen import make_text_pdf

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Rig:
    """A daemon whose worker waits at the gate on every page until the gate is open."""

    def __init__(self, root: Path, inboxes: tuple[str, ...]) -> None:
        self.root = root
        self.gate = root / "gate"
        self.gate.mkdir()
        self.sources = root / "sources"
        self.sources.mkdir()
        engine = {"name": "tests.plugins:FaultEngine", "fallback_engine": None,
                  "options": {"fault": "gate", "marker_dir": str(self.gate)}}
        for name in inboxes:
            (root / name).mkdir(exist_ok=True)
        self.cfg: Config = load_config(write_config(
            root, inboxes=[{"path": name} for name in inboxes], engine=engine))
        assert check_paths(self.cfg) == []
        self.clock = Clock()
        self.daemon = Daemon(self.cfg, wall=self.clock)
        self.daemon.start(self.clock.now)

    @property
    def store(self) -> Store:
        return present(self.daemon.store)

    @property
    def sup(self) -> Supervisor:
        return present(self.daemon.supervisor)

    def loop(self, step: Callable[[float], None] | None = None) -> None:
        (step or self.daemon.loop)(self.clock.now)
        conn = self.sup.worker.conn
        if conn is not None:
            conn.poll(0.05)  # the only real wait: for the worker's next answer

    def run_until(self, cond: Callable[[], bool], what: str, *, advance: float = 0.0,
                  step: Callable[[float], None] | None = None) -> None:
        """Tick until `cond()`, the clock moving `advance` s a tick (files become stable,
        rescans and looks fall due). Bounded, not timed: the worker's answers take what
        they take."""
        end = time.monotonic() + 120
        while not cond():
            assert time.monotonic() < end, f"gave up waiting for {what}: {self.jobs()}"
            self.clock.now += advance
            self.loop(step)

    def drop(self, inbox: str, name: str, text: str) -> None:
        src = make_text_pdf(self.sources / name, [[text]])
        drop(src, self.root / inbox)

    def jobs(self) -> dict[str, Job]:
        return {Path(j.source_path).name: j for j in self.store.jobs(newest_first=False)}

    def state(self, name: str) -> JobState | None:
        job = self.jobs().get(name)
        return job.state if job else None

    def at_gate(self) -> bool:
        return (self.gate / "at-gate").exists()

    def open_gate(self) -> None:
        (self.gate / "open").touch()

    def inbox_missing(self, inbox: str) -> str | None:
        folder = str(self.root / inbox)
        facts = [f for f in present(self.daemon.watcher).describe() if f.path == folder]
        return facts[0].missing

    def outputs(self) -> list[Path]:
        return sorted(p.parent for p in self.cfg.outbox.rglob("*.meta.json"))

    def failed_files(self) -> list[Path]:
        return sorted(p for p in self.cfg.failed.rglob("*") if p.is_file())

    def close(self) -> None:
        self.open_gate()  # a worker at the gate finishes its page, then stops
        self.sup.request_stop(self.clock.now)
        end = time.monotonic() + 60
        while not self.sup.stopped and time.monotonic() < end:
            self.loop()
        self.daemon.close()


@pytest.fixture
def rig_factory(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    rigs: list[Rig] = []

    def make(*inboxes: str) -> Rig:
        rigs.append(Rig(tmp_path, inboxes or ("inbox",)))
        return rigs[-1]

    yield make
    for rig in rigs:
        rig.close()


def test_queued_documents_of_an_inbox_moved_away_wait_and_proceed_as_the_same_jobs(
    rig_factory: Callable[..., Rig],
) -> None:
    """Item 6 of docs/reliability.md: the soak moved an inbox away with files queued; the
    daemon said "inbox … is gone" and started them anyway, each failed as `vanished` (an
    error file in failed/ for a document that is not broken), and when the folder came
    back each was queued again as a second job. They must wait in the queue as the
    documents of a missing outbox do, while the other inbox's documents go on."""
    rig = rig_factory("inbox", "scans")
    rig.drop("inbox", "first.pdf", "the first document")
    rig.run_until(rig.at_gate, "the worker holding first.pdf", advance=1.5)
    rig.drop("scans", "a.pdf", "alpha from the share")
    rig.drop("scans", "b.pdf", "bravo from the share")
    rig.run_until(lambda: rig.state("a.pdf") == rig.state("b.pdf") == JobState.QUEUED,
                  "a.pdf and b.pdf queued", advance=1.5)

    away = rig.root / "scans-away"
    os.rename(rig.root / "scans", away)
    rig.run_until(lambda: rig.inbox_missing("scans") is not None, "the inbox seen gone",
                  advance=0.5)
    rig.open_gate()
    rig.drop("inbox", "local.pdf", "a local document meanwhile")
    rig.run_until(lambda: rig.state("local.pdf") == JobState.DONE,
                  "the other inbox's documents done", advance=1.5)
    for _ in range(20):  # half a minute of ticks: they keep waiting
        rig.clock.now += 1.5
        rig.loop()
    jobs = rig.jobs()
    assert jobs["first.pdf"].state == JobState.DONE
    assert jobs["a.pdf"].state == jobs["b.pdf"].state == JobState.QUEUED, jobs
    assert rig.failed_files() == []

    os.rename(away, rig.root / "scans")
    rig.run_until(lambda: rig.state("a.pdf") == rig.state("b.pdf") == JobState.DONE,
                  "a.pdf and b.pdf done once their inbox is back", advance=1.5)
    jobs = rig.jobs()
    assert len(rig.store.jobs()) == 4, rig.store.jobs()  # one job per file: none twice
    assert all(j.state == JobState.DONE for j in jobs.values()), jobs
    assert len(rig.outputs()) == 4, rig.outputs()
    assert sorted(p.name for p in rig.cfg.archive.rglob("*.pdf")) == [
        "a.pdf", "b.pdf", "first.pdf", "local.pdf"]
    assert list((rig.root / "scans").iterdir()) == []
    assert rig.failed_files() == []


@pytest.mark.parametrize("looked", [True, False], ids=["seen-gone", "not-yet-looked-at"])
def test_a_document_finished_while_its_inbox_is_away_is_archived_when_it_returns(
    rig_factory: Callable[..., Rig], caplog: pytest.LogCaptureFixture, looked: bool,
) -> None:
    """Item 7 of docs/reliability.md: a document converted just after its inbox vanished
    was marked done without its original archived (no warning), and when the folder came
    back the file was a known one and stayed in the inbox for good. Its output now waits
    (nothing written, a warning saying why, like a full outbox) and the same job is
    published and its original archived when the inbox is back. `looked`: whether the
    watcher had already seen the inbox gone, or the completion is the first to find it."""
    rig = rig_factory("inbox")
    rig.drop("inbox", "a.pdf", "alpha converted while away")
    rig.run_until(rig.at_gate, "the worker holding a.pdf's page", advance=1.5)

    away = rig.root / "inbox-away"
    os.rename(rig.root / "inbox", away)
    if looked:
        rig.run_until(lambda: rig.inbox_missing("inbox") is not None,
                      "the inbox seen gone", advance=0.5)
    caplog.set_level(logging.INFO)
    rig.open_gate()
    # Not yet looked at: the supervisor alone ticks, as between two looks of the watcher.
    rig.run_until(lambda: rig.state("a.pdf") != JobState.RUNNING, "a.pdf's page done",
                  step=None if looked else rig.sup.tick)
    job = rig.jobs()["a.pdf"]
    assert job.state == JobState.QUEUED, job
    assert rig.outputs() == []  # nothing published while its original cannot follow
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and f"job {job.id}:" in r.getMessage()]
    assert any("inbox" in m and "gone" in m for m in warned), warned

    for _ in range(20):  # it waits, whatever its retry time says
        rig.clock.now += 1.5
        rig.loop()
    assert rig.state("a.pdf") == JobState.QUEUED
    os.rename(away, rig.root / "inbox")
    rig.run_until(lambda: rig.state("a.pdf") == JobState.DONE, "a.pdf done", advance=1.5)
    assert len(rig.store.jobs()) == 1
    assert len(rig.outputs()) == 1
    assert [p.name for p in rig.cfg.archive.rglob("*.pdf")] == ["a.pdf"]
    assert list((rig.root / "inbox").iterdir()) == []
    assert rig.failed_files() == []
