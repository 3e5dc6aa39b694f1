"""The supervisor and an inbox that goes away: its documents wait in the queue, with a
real watcher looking at the real folder; and an original that changed meanwhile, hashed
again off the main loop before it leaves its inbox."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from daemon.common.shares import Lane, Shares
from daemon.document.protocol import Inspect, ParsePage
from daemon.intake.watch_settings import WatcherIO
from daemon.intake.watcher import Watcher
from daemon.jobs.states import JobState
from daemon.output.rehash import Rehashes
from daemon.supervisor.document_run import resume_note
from tests.common.test_lanes import GatedLane
from tests.conftest import present
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


def test_a_run_with_every_page_stored_says_it_only_publishes_not_a_page_past_the_end() -> None:
    """A document finished while its inbox was away waits with every page stored; when
    it is taken again nothing is left to convert. The log said "resuming at page 2 of 1"."""
    assert resume_note([], 1, 1) == "its one page already converted; publishing"
    assert resume_note([], 6, 6) == "all 6 pages already converted; publishing"
    assert resume_note([], 3, 10) == "all 3 pages already converted; publishing"  # a range
    assert resume_note([2, 3, 4, 5], 6, 6) == "resuming at page 3 of 6"


def test_a_document_whose_original_is_hashed_again_waits_while_the_loop_goes_on(
    tmp_path: Path,
) -> None:
    """The original was touched while its document was converted (the same bytes, another
    mtime), so it is hashed again before it is archived, through its share's lane. While
    the share holds the hash's read (the test's gate), the supervisor's ticks go on: the
    job waits in the queue like one whose outbox is full and the next document is
    converted and published; once the hash is done, a later tick publishes the first."""
    gate = threading.Event()
    bench = Bench(tmp_path, hold=lambda msg: isinstance(msg, ParsePage))
    inbox = bench.cfg.inboxes[0].path
    mounts = f"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 0:50 / {inbox} rw - nfs4 n:/s rw\n"
    shares = Shares(600.0, mountinfo=lambda: mounts,  # the real clock: a deadline far off
                    lane=lambda m, d: GatedLane(gate, m, d) if m == str(inbox) else Lane(m, d))
    bench.publisher.rehashes = Rehashes(shares.call)  # as the daemon wires its publisher
    a = bench.queue("a.pdf")
    bench.step_until(bench.held)
    os.utime(inbox / "a.pdf", (1, 1))
    bench.worker.answer(bench.worker.take())
    try:
        bench.step_until(lambda: bench.job(a).state == JobState.QUEUED)
        job = bench.job(a)
        assert job.error_kind == "output_error", job
        assert "the original cannot be archived now" in present(job.error)
        assert "is being hashed again" in present(job.error)
        bench.hold = lambda msg: False
        b = bench.queue("b.pdf")
        bench.step_until(lambda: bench.job(b).state == JobState.DONE)
        assert bench.job(a).state == JobState.QUEUED and (inbox / "a.pdf").exists()
    finally:
        gate.set()
    assert present(bench.publisher.rehashes.done(str(inbox / "a.pdf"))).wait(60.0)
    bench.clock.now += 3600  # past the output retry's wait
    bench.step_until(lambda: bench.job(a).state == JobState.DONE)
    assert sorted(p.name for p in bench.cfg.archive.rglob("*.pdf")) == ["a.pdf", "b.pdf"]
    shares.close()
