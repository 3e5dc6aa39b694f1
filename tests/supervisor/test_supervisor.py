"""The supervisor driven tick by tick with a made-up clock.

Deadlines, backoff and recycling are decided from the `now` we pass in, so a "page that
takes 15 minutes" is one tick at now+901: no test waits for a deadline in real time.

Most tests tick against a worker the test answers for (`Bench` in harness.py, over
tests/fakeworker.py: the real pipe and messages, the real store and publisher; only the
child process is replaced), so when an answer arrives relative to a tick is the test's
choice, not a race. The tests at
the end start real worker processes with the real engine and are marked `integration`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from daemon.common.live import CurrentDoc, Phase
from daemon.config.settings import load_config
from daemon.document.protocol import Inspect, ParsePage, Progress, Request
from daemon.jobs.states import TERMINAL, JobState
from daemon.jobs.store import Published, StoreBusy
from daemon.output.publish import Publisher
from daemon.supervisor.document_run import page_options
from daemon.supervisor.worker_handle import exit_reason
from tests.conftest import present, write_config
from tests.supervisor.harness import Bench, Clock, drive, fault_engine, queue_pdf, setup, stop


def test_page_deadline_kills_the_worker_and_fails_the_document(tmp_path: Path) -> None:
    bench = Bench(tmp_path, hold=lambda msg: isinstance(msg, ParsePage),
                  limits={"page_timeout_seconds": 900})
    jid = bench.queue("slow.pdf")
    bench.step_until(bench.held)  # the page is in the engine and stays there
    hung = bench.worker
    bench.clock.now += 899  # not yet
    bench.step()
    assert hung.alive
    bench.clock.now += 2
    bench.step()
    assert not hung.alive and hung.exitcode == -9
    job = bench.job(jid)
    assert job.state == JobState.FAILED and job.error_kind == "timeout"
    assert "page 1 took longer than limits.page_timeout_seconds (900 s)" in present(job.error)
    assert (bench.cfg.failed / "slow.pdf.error.json").exists()
    # the next document gets a fresh worker
    bench.hold = lambda msg: False
    jid2 = bench.queue("next.pdf")
    bench.step_until(lambda: bench.job(jid2).state == JobState.DONE)
    assert len(bench.ctx.workers) == 2


def test_crash_backoff_and_give_up_after_max_attempts(tmp_path: Path) -> None:
    bench = Bench(tmp_path, hold=lambda msg: isinstance(msg, ParsePage),
                  worker={"max_attempts": 3, "restart_backoff_seconds": 10,
                          "restart_backoff_max_seconds": 15})
    jid = bench.queue("poison.pdf")
    sup, clock = bench.sup, bench.clock

    def crash_on_the_page(crashes: int) -> None:
        bench.step_until(bench.held)
        bench.worker.take()
        bench.worker.exit(77)
        bench.step_until(lambda: bench.job(jid).crashes == crashes)

    crash_on_the_page(1)
    assert sup.phase == Phase.DOWN and sup.worker.restart_at == clock.now + 10
    bench.clock.now += 9
    bench.step()
    assert sup.worker.proc is None and len(bench.ctx.workers) == 1  # still backing off
    clock.now += 1
    crash_on_the_page(2)
    assert sup.worker.restart_at == clock.now + 15  # doubled, capped by restart_backoff_max
    assert sup.worker.restarts == 1  # the worker after the first crash; the next is not up yet
    clock.now += 15
    crash_on_the_page(3)
    job = bench.job(jid)
    assert job.state == JobState.FAILED and job.error_kind == "crashed"
    assert "exited with status 77" in present(job.error) and "3 times" in present(job.error)


def test_fallback_engine_when_the_configured_one_cannot_load(tmp_path: Path) -> None:
    engine = fault_engine(fault="unavailable")
    engine["fallback_engine"] = "lite"
    bench = Bench(tmp_path, unavailable=frozenset({engine["name"]}), engine=engine)
    jid = bench.queue("a.pdf")
    bench.step_until(lambda: bench.job(jid).state == JobState.DONE)
    assert bench.sup.choice.name == "lite"
    assert "weights are missing" in (bench.sup.choice.fallback_reason or "")
    assert bench.job(jid).engine == "lite"
    assert [w.engine for w in bench.ctx.workers] == [engine["name"], "lite"]
    # A planned switch, shown as one: not a restart after a crash.
    facts = bench.sup.snapshot().worker
    assert (facts.restarts, facts.switches) == (0, 1)


def test_no_fallback_is_fatal_with_the_hint(tmp_path: Path) -> None:
    engine = fault_engine(fault="unavailable")
    bench = Bench(tmp_path, unavailable=frozenset({engine["name"]}), engine=engine)
    bench.step_until(lambda: bench.sup.phase == Phase.FATAL)
    assert "weights are missing" in (bench.sup.fatal_message or "")
    assert bench.sup.fatal_hint == "make weights"
    assert len(bench.ctx.workers) == 1


def test_worker_is_recycled_after_n_documents(tmp_path: Path) -> None:
    bench = Bench(tmp_path, worker={"recycle_after_documents": 1})
    a = bench.queue("a.pdf")
    bench.step_until(lambda: bench.job(a).state == JobState.DONE)
    first = bench.worker
    b = bench.queue("b.pdf")
    bench.step_until(lambda: bench.job(b).state == JobState.DONE)
    assert bench.worker is not first and first.exitcode == 0  # told to stop, not killed
    assert bench.worker.page_requests(b) == [0] and first.page_requests(b) == []
    assert bench.sup.worker.consecutive_failures == 0
    assert bench.sup.worker.restarts == 0  # a recycle is planned, not a restart


def test_a_worker_over_max_rss_from_its_start_still_takes_work(tmp_path: Path) -> None:
    # The "worker" is measured as this test process (tens of MiB) against a 1 MiB limit: a
    # model bigger than max_rss_mb. Recycling it before it did anything would loop forever.
    bench = Bench(tmp_path, worker={"max_rss_mb": 1})
    bench.ctx.pid = os.getpid()
    a = bench.queue("a.pdf", pages=2)
    bench.step_until(lambda: bench.job(a).state == JobState.DONE)
    # recycled at the page boundary (a fresh worker per page here), each page asked once
    assert [i for w in bench.ctx.workers for i in w.page_requests(a)] == [0, 1]
    bench.step()
    # a worker that did a document and is over the limit is recycled: told to stop
    assert not bench.worker.alive and bench.worker.exitcode == 0


def test_heartbeat_timeout_counts_as_a_crash(tmp_path: Path) -> None:
    bench = Bench(tmp_path, worker={"heartbeat_timeout_seconds": 30})
    bench.step_until(lambda: bench.sup.phase == Phase.IDLE)
    silent = bench.worker  # sends no heartbeats: a wedged process
    bench.clock.now += 29
    bench.step()
    assert silent.alive  # not yet
    bench.clock.now += 2
    bench.step()
    assert not silent.alive and silent.exitcode == -9
    assert bench.sup.worker.proc is None and bench.sup.worker.consecutive_failures == 1
    assert bench.sup.phase == Phase.DOWN


def test_a_page_finished_while_the_database_is_locked_is_recorded_after(
    tmp_path: Path,
) -> None:
    bench = Bench(tmp_path, hold=lambda msg: isinstance(msg, ParsePage) and msg.page_idx == 0)
    store, sup = bench.store, bench.sup
    store.conn.execute("PRAGMA busy_timeout=100")  # instead of 60 s: the test ticks fast
    jid = bench.queue("a.pdf", pages=2)
    bench.step_until(bench.held)
    # Another process holds the write lock when page 1's answer arrives ...
    other = sqlite3.connect(str(bench.cfg.db_path), isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    bench.worker.answer(bench.worker.take())
    for _ in range(3):  # ... and over several ticks after it
        with pytest.raises(StoreBusy):
            sup.tick(bench.clock.now)
    assert sup.pending is not None  # the finished page waits, it is not dropped
    other.execute("COMMIT")
    other.close()
    bench.step_until(lambda: bench.job(jid).state == JobState.DONE)
    job = bench.job(jid)
    assert job.pages_done == 2 and job.crashes == 0 and job.error is None
    # each page recorded once: the replay did not count the page twice
    assert store.counters()["pages_total"] == 2
    assert sup.pending is None
    assert bench.worker.page_requests(jid) == [0, 1]


# ------------------------------------------------------------------ no worker at all


def test_exit_reasons_are_plain_words() -> None:
    assert "out-of-memory" in exit_reason(-9)
    assert "SIGSEGV" in exit_reason(-11)
    assert exit_reason(3) == "exited with status 3"


def test_output_errors_name_the_folder_in_the_users_words(tmp_path: Path) -> None:
    import errno

    from daemon.supervisor.output_retry import folder_of

    cfg, _, _, _ = setup(tmp_path)
    inbox = cfg.inboxes[0].path
    # deleting the original out of a read-only inbox (an inbox missing from systemd's
    # ReadWritePaths=): only one end is known
    gone = OSError(errno.EROFS, "Read-only file system", str(inbox / "a.pdf"))
    assert folder_of(cfg, gone) == f"the inbox ({inbox})"
    # a rename names both ends; with both writable, the destination is named
    both = OSError(errno.ENOSPC, "No space left on device", str(inbox / "a.pdf"), None,
                   str(cfg.archive / "a.pdf"))
    assert folder_of(cfg, both) == f"the archive ({cfg.archive})"
    assert folder_of(cfg, OSError(errno.EIO, "I/O error")) == f"the outbox ({cfg.outbox})"


def test_an_unwritable_output_waits_longer_each_time_up_to_the_cap(tmp_path: Path) -> None:
    import errno

    from daemon.supervisor.output_retry import output_wait

    cfg, _, _, _ = setup(tmp_path)
    w = cfg.worker
    full = OSError(errno.ENOSPC, "No space left on device", str(cfg.outbox / "x"))
    delays = [output_wait(cfg, attempts, full).delay for attempts in range(1, 30)]
    assert delays[0] == w.output_retry_seconds
    assert delays[1] == 2 * w.output_retry_seconds
    assert delays == sorted(delays) and delays[-1] == w.output_retry_max_seconds
    wait = output_wait(cfg, 1, full)
    assert wait.message == (
        f"waiting: cannot write the outbox ({cfg.outbox}) (No space left on device); "
        f"retry in {w.output_retry_seconds:.0f} s"
    )


def test_a_state_folder_open_to_others_is_made_private_at_start(tmp_path: Path) -> None:
    from daemon.service.app import tighten_state_dir

    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    tighten_state_dir(state)
    assert state.stat().st_mode & 0o777 == 0o700


# ------------------------------------------------------------------ stopping, every way


def _end_done(b: Bench, req: Request) -> None:
    b.worker.answer(req)


def _end_failed_by_worker(b: Bench, req: Request) -> None:
    b.worker.fail(req, "corrupt", "the PDF is damaged on page 2")


def _end_failed_by_supervisor(b: Bench, req: Request) -> None:
    b.publisher.fail_with = RuntimeError("a bug in completing it")
    b.worker.answer(req)


def _end_vanished(b: Bench, req: Request) -> None:
    assert isinstance(req, ParsePage)
    Path(req.path).unlink()
    b.worker.fail(req, "vanished", "the file disappeared from the inbox")


def _end_output_wait(b: Bench, req: Request) -> None:
    import errno

    b.publisher.fail_with = OSError(errno.ENOSPC, "No space left on device")
    b.worker.answer(req)


def _end_deadline_kill(b: Bench, req: Request) -> None:
    b.clock.now += b.cfg.limits.page_timeout_seconds + 1  # the page never answers


def _end_crash(b: Bench, req: Request) -> None:
    b.worker.exit(77)


ENDINGS: dict[str, Callable[[Bench, Request], None]] = {
    "done": _end_done,
    "failed_by_worker": _end_failed_by_worker,
    "failed_by_supervisor": _end_failed_by_supervisor,
    "vanished": _end_vanished,
    "output_wait": _end_output_wait,
    "deadline_kill": _end_deadline_kill,
    "crash": _end_crash,
}

# The first document's state after the stop: (state, error_kind, pages kept, crashes).
# A page the stop interrupted is not kept and is asked for again on the next start.
EXPECTED: dict[str, tuple[JobState, str | None, int, int]] = {
    "done": (JobState.DONE, None, 2, 0),
    "failed_by_worker": (JobState.FAILED, "corrupt", 1, 0),
    "failed_by_supervisor": (JobState.FAILED, "engine_error", 2, 0),
    "vanished": (JobState.FAILED, "vanished", 1, 0),
    "output_wait": (JobState.QUEUED, "output_error", 2, 0),
    "deadline_kill": (JobState.QUEUED, None, 1, 0),  # stopping: requeued, not failed
    "crash": (JobState.QUEUED, "crashed", 1, 1),
}


@pytest.mark.parametrize("when", ["before", "during", "after"])
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_sigterm_stops_the_worker_however_the_document_ends(
    tmp_path: Path, ending: str, when: str
) -> None:
    """SIGTERM before the document's last page answers (a tick passes while stopping),
    during (the answer is already on the pipe), or after it (the next document has been
    taken): the supervisor stops, the job's state is right, and the next start finishes
    the queue without asking for a page twice."""
    pages: dict[int, int] = {}

    def hold(msg: Request) -> bool:  # `a`'s last page, and all of `b`
        if isinstance(msg, ParsePage) and msg.job_id == a and msg.page_idx == 1:
            return True
        return isinstance(msg, Inspect | ParsePage) and msg.job_id == b_id

    bench = Bench(tmp_path, pages, hold)
    cfg, store, clock = bench.cfg, bench.store, bench.clock
    a = queue_pdf(cfg, store, clock, "a.pdf", pages=2)
    b_id = queue_pdf(cfg, store, clock, "b.pdf")
    pages.update({a: 2, b_id: 1})
    bench.step_until(lambda: bool(bench.ctx.workers and bench.worker.held))
    req = bench.worker.take()  # page 2 of `a` is in the engine
    assert present(store.job(a)).pages_done == 1

    if when == "before":
        bench.sup.request_stop(clock.now)
        bench.step()
        assert not bench.sup.stopped  # a page is in flight: it may finish
        ENDINGS[ending](bench, req)
    elif when == "during":
        ENDINGS[ending](bench, req)
        bench.sup.request_stop(clock.now)
    else:
        ENDINGS[ending](bench, req)
        bench.step()
        bench.step()  # the next document is taken (or the worker restarts)
        bench.sup.request_stop(clock.now)
    bench.settle_stop(hangs=req)

    state, kind, kept, crashes = EXPECTED[ending]
    if ending == "deadline_kill" and when == "after":
        state, kind = JobState.FAILED, "timeout"  # the deadline passed before the stop
    job = present(store.job(a))
    assert (job.state, job.error_kind, job.pages_done, job.crashes) == (
        state, kind, kept, crashes), job
    other = present(store.job(b_id))
    assert other.state == JobState.QUEUED and other.pages_done == 0
    assert not [j for j in store.jobs() if j.state == JobState.RUNNING]

    # The next start: everything left in the queue completes, each page asked for once.
    bench.publisher.fail_with = None
    bench.hold = lambda msg: False
    bench.restart()
    clock.now += 3600  # past any retry back-off
    bench.step_until(lambda: all(j.state in TERMINAL for j in store.jobs()))
    asked = bench.worker.page_requests(a)
    if state == JobState.QUEUED:
        assert present(store.job(a)).state == JobState.DONE
        assert asked == list(range(kept, 2)), asked  # resumes at the first missing page
    else:
        assert present(store.job(a)).state == state and asked == []  # finished is finished
    assert bench.worker.page_requests(b_id) == [0]


# ------------------------------------------------------------------ the page pipeline


def test_each_page_request_names_the_pages_that_come_next(tmp_path: Path) -> None:
    pages: dict[int, int] = {}
    bench = Bench(tmp_path, pages, lambda msg: False, engine={"pages": "1-3,5"})
    a = queue_pdf(bench.cfg, bench.store, bench.clock, "a.pdf", pages=6)
    pages[a] = 6
    with bench.store.tx() as c:  # page 2 was done by an earlier worker
        c.execute("INSERT INTO pages(job_id, page_idx, blocks, info, engine, seconds, done_at)"
                  " VALUES(?, 1, '[]', '{}', 'lite', 1.0, 0)", (a,))
    bench.step_until(lambda: present(bench.store.job(a)).state == JobState.DONE)
    asked = [(m.page_idx, m.lookahead) for m in bench.worker.seen if isinstance(m, ParsePage)]
    assert asked == [(0, (2, 4)), (2, (4,)), (4, ())]
    first = next(m for m in bench.worker.seen if isinstance(m, ParsePage))
    assert first.options == page_options(bench.cfg, present(bench.store.job(a)))


# ------------------------------------------------------------------ real worker processes


@pytest.mark.integration
def test_processes_a_document_page_by_page(tmp_path: Path) -> None:
    cfg, store, sup, clock = setup(tmp_path)
    jid = queue_pdf(cfg, store, clock, "a.pdf", pages=3)
    drive(sup, clock, lambda: present(store.job(jid)).state == JobState.DONE)
    job = present(store.job(jid))
    assert job.page_count == 3 and job.pages_done == 3 and job.attempts == 1
    assert (cfg.outbox / "a" / "a.md").exists()
    assert (cfg.archive / "a.pdf").exists()
    assert sup.snapshot().engine.name == "lite"
    stop(sup, clock)



@pytest.mark.integration
def test_memory_hog_is_recycled_at_a_page_boundary_and_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="docinbox.supervisor")
    marker = tmp_path / "m"
    marker.mkdir()
    cfg, store, sup, clock = setup(
        tmp_path, engine=fault_engine(fault="hog", hog_mb=700, marker_dir=str(marker)),
        worker={"max_rss_mb": 600},
    )
    jid = queue_pdf(cfg, store, clock, "big.pdf", pages=3)
    drive(sup, clock, lambda: present(store.job(jid)).state == JobState.DONE)
    job = present(store.job(jid))
    assert job.pages_done == 3 and job.crashes == 0
    # Recycled after the page that grew past max_rss_mb: a planned stop, not a restart.
    assert any("over max_rss_mb" in r.getMessage() for r in caplog.records)
    assert sup.worker.restarts == 0
    stop(sup, clock)



@pytest.mark.integration
def test_stop_lets_the_page_finish_then_requeues(tmp_path: Path) -> None:
    cfg, store, sup, clock = setup(
        tmp_path, engine=fault_engine(fault="slow", slow_seconds=1.0)
    )
    jid = queue_pdf(cfg, store, clock, "a.pdf", pages=3)
    drive(sup, clock, lambda: sup.current is not None and sup.current.page_idx is not None)
    sup.request_stop(clock.now)
    drive(sup, clock, lambda: sup.stopped)
    job = present(store.job(jid))
    assert job.state == JobState.QUEUED and job.pages_done >= 1 and job.crashes == 0



@pytest.mark.integration
def test_an_internal_error_fails_the_document_not_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from daemon.config.settings import check_paths
    from daemon.service.app import Daemon

    cfg = load_config(write_config(tmp_path))
    assert check_paths(cfg) == []
    clock = Clock()
    d = Daemon(cfg, wall=clock)

    def broken(self: Publisher, job: Any, engine: Any, seconds: float) -> Published:  # our bug
        raise RuntimeError("boom")

    monkeypatch.setattr(Publisher, "complete", broken)
    d.start(clock.now)
    assert d.store is not None and d.supervisor is not None
    store, sup = d.store, d.supervisor

    def run_until(cond: Callable[[], bool]) -> None:
        end = time.monotonic() + 90
        while not cond():
            assert time.monotonic() < end, f"gave up; phase={sup.phase}"
            d.loop(clock.now)  # must not raise
            if sup.worker.conn is not None:
                sup.worker.conn.poll(0.05)

    try:
        a = queue_pdf(cfg, store, clock, "a.pdf")
        run_until(lambda: present(store.job(a)).state == JobState.FAILED)
        job = present(store.job(a))
        assert job.error_kind == "engine_error"
        assert "internal error in docinbox: RuntimeError: boom" in present(job.error)
        assert (cfg.failed / "a.pdf.error.json").exists()
        monkeypatch.undo()  # the bug is fixed; the daemon was never down
        b = queue_pdf(cfg, store, clock, "b.pdf")
        run_until(lambda: present(store.job(b)).state == JobState.DONE)
    finally:
        sup.request_stop(clock.now)
        run_until(lambda: sup.stopped)
        d.close()


@pytest.mark.integration
def test_the_status_row_shows_the_fallback_before_any_document_it_converts(
    tmp_path: Path,
) -> None:
    """`docinbox status` reads the row the daemon records every RUNTIME_EVERY seconds. A
    fallback engine loads and converts a small document in less than that: the row is
    recorded at once when what it says changes, so it can never be older than the jobs
    it sits beside. The made-up clock never advances, so only that rule writes it."""
    from daemon.config.settings import check_paths
    from daemon.service.app import Daemon

    engine = fault_engine(fault="unavailable")
    engine["fallback_engine"] = "lite"
    cfg = load_config(write_config(tmp_path, engine=engine))
    assert check_paths(cfg) == []
    clock = Clock()
    d = Daemon(cfg, wall=clock)
    d.start(clock.now)
    assert d.store is not None and d.supervisor is not None
    store, sup = d.store, d.supervisor
    seen: list[tuple[str, str | None]] = []
    try:
        jid = queue_pdf(cfg, store, clock, "a.pdf")
        end = time.monotonic() + 90
        while present(store.job(jid)).state != JobState.DONE:
            assert time.monotonic() < end, f"gave up; phase={sup.phase}"
            d.loop(clock.now)
            row = store.runtime()
            seen.append((str(row.get("phase")), row.get("fallback_reason")))
            if sup.worker.conn is not None:
                sup.worker.conn.poll(0.05)
        row = store.runtime()
        assert "unavailable" in str(row["fallback_reason"]), row
        assert row["worker_restarts"] == 0 and row["worker_switches"] == 1, row
        assert ("busy", row["fallback_reason"]) in seen  # recorded while lite worked
    finally:
        sup.request_stop(clock.now)
        end = time.monotonic() + 60
        while not sup.stopped and time.monotonic() < end:
            d.loop(clock.now)
            if sup.worker.conn is not None:
                sup.worker.conn.poll(0.05)
        d.close()


def test_an_engine_with_many_pages_in_flight_is_told_enough_pages_ahead(
    tmp_path: Path,
) -> None:
    bench = Bench(tmp_path, hold=lambda msg: isinstance(msg, ParsePage))
    bench.ctx.pages_in_flight = 12  # a server taking 12 pages at once
    bench.queue("a.pdf", pages=15)
    bench.step_until(bench.held)
    first = bench.worker.take()
    assert isinstance(first, ParsePage)
    assert (first.page_idx, first.lookahead) == (0, tuple(range(1, 12)))


def test_progress_shows_the_asked_page_and_how_many_are_in_flight(tmp_path: Path) -> None:
    bench = Bench(tmp_path, hold=lambda msg: isinstance(msg, ParsePage))
    a = bench.queue("a.pdf", pages=3)
    bench.step_until(bench.held)
    req = bench.worker.held[0]
    assert isinstance(req, ParsePage) and req.page_idx == 0
    bench.worker.send(Progress(a, 1, 9, 10, "block", pages_in_flight=3))  # a page ahead
    bench.worker.send(Progress(a, 0, 2, 17, "block", pages_in_flight=3))
    bench.step()
    cur = present(bench.sup.snapshot().current)
    assert (cur.page, cur.block, cur.stage, cur.pages_in_flight) == (1, (2, 17), "block", 3)
    assert CurrentDoc.from_json(cur.to_json()) == cur


@pytest.mark.integration
def test_a_crash_with_pages_in_flight_resumes_at_the_first_unfinished_page(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "m"
    marker.mkdir()
    cfg, store, sup, clock = setup(
        tmp_path, engine=fault_engine(fault="crash", on_page=2, marker_dir=str(marker),
                                      pages_in_flight=3),
    )
    jid = queue_pdf(cfg, store, clock, "four.pdf", pages=4)
    drive(sup, clock, lambda: present(store.job(jid)).crashes == 1)
    clock.now += 10  # past the restart back-off
    drive(sup, clock, lambda: present(store.job(jid)).state == JobState.DONE)
    job = present(store.job(jid))
    assert job.crashes == 1 and job.pages_done == 4
    # every page recorded exactly once, in order, with its own text
    assert store.counters()["pages_total"] == 4
    md = (cfg.outbox / "four" / "four.md").read_text()
    positions = [md.index(f"four.pdf page {i}") for i in range(4)]
    assert positions == sorted(positions), md
    stop(sup, clock)


def test_the_document_in_progress_has_an_eta_from_its_pages_so_far(tmp_path: Path) -> None:
    bench = Bench(tmp_path, hold=lambda msg: isinstance(msg, ParsePage))
    a = bench.queue("a.pdf", pages=4)
    bench.step_until(bench.held)
    current = bench.sup.snapshot().current
    assert current is not None and current.eta_seconds is None  # no page done yet
    for left in (3, 2):
        bench.clock.now += 100  # a page takes 100 s
        bench.worker.answer(bench.worker.take())
        bench.step_until(bench.held)
        current = bench.sup.snapshot().current
        assert current is not None and current.eta_seconds == pytest.approx(100 * left)
    assert CurrentDoc.from_json(current.to_json()) == current  # as `docinbox status` reads it
    bench.hold = lambda msg: False
    bench.worker.answer(bench.worker.take())
    bench.step_until(lambda: bench.job(a).state == JobState.DONE)
