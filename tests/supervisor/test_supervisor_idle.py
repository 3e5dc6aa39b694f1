"""The supervisor's opt-in idle unload (`worker.idle_unload_seconds`), ticked with a fake
worker (tests/fakeworker.py) and the clock passed in; the whole service's memory while
unloaded is measured in test_idle_unload.py."""

from __future__ import annotations

from pathlib import Path

from daemon.common.live import Phase
from daemon.jobs.states import JobState
from tests.supervisor.harness import Bench

# ------------------------------------------------------------------ idle unload (opt-in)


def test_an_idle_worker_is_unloaded_and_the_next_document_starts_one(tmp_path: Path) -> None:
    bench = Bench(tmp_path, worker={"idle_unload_seconds": 600})
    a = bench.queue("a.pdf")
    bench.step_until(lambda: bench.job(a).state == JobState.DONE)
    first = bench.worker
    bench.clock.now += 599  # not yet: idle since the document ended
    bench.step()
    assert first.alive and bench.sup.worker.proc is not None
    bench.clock.now += 1
    bench.step_until(lambda: bench.sup.phase == Phase.UNLOADED)
    assert first.exitcode == 0  # told to stop, not killed
    facts = bench.sup.snapshot().worker
    assert facts.phase == "unloaded (idle)" and facts.pid is None
    bench.clock.now += 86_400  # nothing queued: no worker, however long
    for _ in range(5):
        bench.step()
    assert len(bench.ctx.workers) == 1 and bench.sup.phase == Phase.UNLOADED
    b = bench.queue("b.pdf")
    bench.step_until(lambda: bench.job(b).state == JobState.DONE)
    assert len(bench.ctx.workers) == 2 and bench.worker.page_requests(b) == [0]
    assert bench.sup.worker.restarts == 0  # planned, not a restart after a crash


def test_idle_unload_is_off_by_default(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    bench.step_until(lambda: bench.sup.phase == Phase.IDLE)
    bench.clock.now += 9_000  # (the fake worker sends no heartbeats: under their timeout)
    bench.step()
    assert bench.worker.alive and bench.sup.phase == Phase.IDLE


def test_a_document_arriving_while_the_worker_unloads_starts_a_new_one(tmp_path: Path) -> None:
    bench = Bench(tmp_path, worker={"idle_unload_seconds": 60})
    bench.step_until(lambda: bench.sup.phase == Phase.IDLE)
    first = bench.worker
    bench.clock.now += 60
    bench.sup.tick(bench.clock.now)  # asked to stop; it has not read the Stop yet
    assert bench.sup.phase == Phase.STOPPING and first.alive
    a = bench.queue("a.pdf")  # arrives during the unload
    bench.step_until(lambda: bench.job(a).state == JobState.DONE)
    assert first.exitcode == 0 and first.page_requests(a) == []
    assert len(bench.ctx.workers) == 2 and bench.worker.page_requests(a) == [0]


def test_sigterm_while_unloaded_stops_at_once(tmp_path: Path) -> None:
    bench = Bench(tmp_path, worker={"idle_unload_seconds": 60})
    bench.step_until(lambda: bench.sup.phase == Phase.IDLE)
    bench.clock.now += 60
    bench.step_until(lambda: bench.sup.phase == Phase.UNLOADED)
    bench.queue("late.pdf")  # queued, but the daemon is stopping: no worker for it
    bench.sup.request_stop(bench.clock.now)
    assert bench.sup.stopped
    bench.step()
    assert len(bench.ctx.workers) == 1


def test_held_documents_do_not_wake_an_unloaded_worker(tmp_path: Path) -> None:
    bench = Bench(tmp_path, worker={"idle_unload_seconds": 60})
    bench.step_until(lambda: bench.sup.phase == Phase.IDLE)
    bench.clock.now += 60
    bench.step_until(lambda: bench.sup.phase == Phase.UNLOADED)
    bench.sup.hold_new_documents("the outbox is missing")
    a = bench.queue("a.pdf")
    for _ in range(5):
        bench.step()
    assert len(bench.ctx.workers) == 1
    bench.sup.take_new_documents()
    bench.step_until(lambda: bench.job(a).state == JobState.DONE)
