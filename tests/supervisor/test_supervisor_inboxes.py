"""The supervisor and an inbox that goes away: its documents wait in the queue, with a
real watcher looking at the real folder."""

from __future__ import annotations

import os
from pathlib import Path

from daemon.document.protocol import Inspect
from daemon.intake.watch_settings import WatcherIO
from daemon.intake.watcher import Watcher
from daemon.jobs.states import JobState
from tests.supervisor.harness import Bench

# ------------------------------------------------------------------ an inbox that goes away


def test_a_document_whose_inbox_went_away_waits_and_one_whose_file_vanished_fails(
    tmp_path: Path,
) -> None:
    """The worker cannot read a document because its inbox was moved away after the
    watcher's last look (it looks every few seconds): not the document's fault. The job
    goes back to the queue, the supervisor asks the watcher to look now, and none of that
    inbox's documents starts until it is back; then the same job proceeds. A file that
    really vanished from an inbox that is there is still failed as `vanished`."""
    bench = Bench(tmp_path, hold=lambda msg: isinstance(msg, Inspect))
    watcher = Watcher.from_config(bench.cfg, WatcherIO(wall=bench.clock))
    watcher.start()  # real observers, the real look at the inbox folder
    try:
        watcher.tick(bench.clock.now)
        bench.inboxes = watcher
        bench.restart()
        a, b = bench.queue("a.pdf"), bench.queue("b.pdf")
        bench.step_until(bench.held)
        inbox = bench.cfg.inboxes[0].path
        os.rename(inbox, tmp_path / "away")
        bench.worker.fail(bench.worker.take(), "vanished", "the file disappeared")
        for _ in range(5):
            bench.step()
        assert bench.job(a).state == bench.job(b).state == JobState.QUEUED
        assert not bench.held() and bench.worker.seen == [Inspect(a, str(inbox / "a.pdf"))]
        assert list(bench.cfg.failed.rglob("*")) == []

        os.rename(tmp_path / "away", inbox)
        bench.clock.now += 5
        watcher.tick(bench.clock.now)  # the next look: it is back
        bench.step_until(bench.held)
        bench.worker.answer(bench.worker.take())  # a's Inspect, the same job again
        bench.step_until(bench.held)
        (inbox / "b.pdf").unlink()  # gone for real, from an inbox that is there
        bench.worker.fail(bench.worker.take(), "vanished", "the file disappeared")
        bench.step_until(lambda: bench.job(b).state == JobState.FAILED)
        assert bench.job(a).state == JobState.DONE
        assert bench.job(b).error_kind == "vanished"
        assert len(bench.store.jobs()) == 2
    finally:
        watcher.stop()
