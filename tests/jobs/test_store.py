"""The store: schema, dedup decisions, the job state machine, crash recovery, locking."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.document.page import Block, Crop, Json
from daemon.document.record import (
    BLOCKS_VERSION,
    PageRecord,
    StoredBlocksError,
    decode_blocks,
    encode_blocks,
)
from daemon.jobs.pages import PAGE_TIMES_KEPT_ROWS, PAGE_TIMES_KEPT_SECONDS
from daemon.jobs.states import TRANSITIONS, IllegalTransition, JobState, check_transition
from daemon.jobs.store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    IngestResult,
    NewEvent,
    SchemaError,
    Store,
)
from daemon.jobs.upkeep import CHECKPOINT_EVERY, PRUNE_BATCH, Upkeep
from tests.conftest import present


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "state" / "db.sqlite3")
    yield s
    s.close()


def arrive(
    store: Store, path: str, sha: str, now: float = 100.0, size: int = 10
) -> IngestResult | None:
    return store.record_arrival(
        path=path, inbox="/in", subdir="", size=size, mtime_ns=int(now * 1e9), sha256=sha, now=now
    )


def test_schema_and_pragmas(store: Store, tmp_path: Path) -> None:
    assert store.schema_version() == SCHEMA_VERSION
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # FULL = 2: a finished page must survive power loss.
    assert store.conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert (tmp_path / "state" / "db.sqlite3").stat().st_mode & 0o777 == 0o600


def test_reopen_keeps_data_and_refuses_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    s = Store(path)
    arrive(s, "/in/a.pdf", "a" * 64)
    s.close()
    s = Store(path)
    assert s.counts()["queued"] == 1
    s.conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    s.close()
    with pytest.raises(RuntimeError, match="newer than this docinbox"):
        Store(path)


def test_a_database_from_elsewhere_is_refused_with_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    foreign = sqlite3.connect(str(path))
    # user_version says "ours", the tables say otherwise (another program's file, a
    # damaged restore)
    foreign.executescript(
        "CREATE TABLE documents (id INTEGER PRIMARY KEY, sha256 TEXT);"
        f"PRAGMA user_version={SCHEMA_VERSION};"
    )
    foreign.close()
    with pytest.raises(SchemaError) as caught:
        Store(path)
    msg = str(caught.value)
    assert "documents lacks column(s) first_seen, size" in msg
    assert "table jobs is missing" in msg and "point state_dir at an empty folder" in msg


def test_migrations_run_statement_by_statement_from_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    sqlite3.connect(str(path)).close()  # version 0: an empty database
    s = Store(path)
    assert s.schema_version() == SCHEMA_VERSION
    names = {r[0] for r in s.conn.execute("SELECT name FROM sqlite_master")}
    assert {"documents", "jobs", "sources", "pages", "counters", "runtime",
            "jobs_state", "jobs_document"} <= names
    s.close()


def test_transition_table_is_complete_and_enforced() -> None:
    assert set(TRANSITIONS) == set(JobState)
    check_transition(1, JobState.QUEUED, JobState.RUNNING)
    with pytest.raises(IllegalTransition):
        check_transition(1, JobState.DONE, JobState.RUNNING)
    with pytest.raises(IllegalTransition):
        check_transition(1, JobState.DUPLICATE, JobState.QUEUED)


def test_new_content_is_queued_and_same_content_is_a_duplicate(store: Store) -> None:
    first = arrive(store, "/in/a.pdf", "a" * 64)
    assert first is not None and not first.duplicate
    assert first.job.state == JobState.QUEUED
    second = arrive(store, "/in/copy of a.pdf", "a" * 64, now=101)
    assert second is not None and second.duplicate
    assert second.job.state == JobState.DUPLICATE
    assert second.original is not None and second.original.id == first.job.id
    assert store.counts() == {"queued": 1, "running": 0, "done": 0, "failed": 0, "duplicate": 1}
    assert [j.id for j in store.duplicates_of(first.job.id)] == [second.job.id]


def test_known_source_skips_rehash_and_same_path_same_content_is_silent(store: Store) -> None:
    arrive(store, "/in/a.pdf", "a" * 64, now=100)
    assert store.known_source("/in/a.pdf", 10, int(100 * 1e9))
    assert not store.known_source("/in/a.pdf", 11, int(100 * 1e9))
    # touched, same content, same path: no new job
    assert arrive(store, "/in/a.pdf", "a" * 64, now=200) is None
    # forgotten (archived away) and dropped again: now it is a duplicate of the original
    store.forget_source("/in/a.pdf")
    again = arrive(store, "/in/a.pdf", "a" * 64, now=300)
    assert again is not None and again.duplicate


def test_redrop_after_failure_is_queued_not_duplicate(store: Store) -> None:
    first = arrive(store, "/in/a.pdf", "a" * 64)
    assert first is not None
    store.start_job(first.job.id, 101, "lite")
    store.fail_job(first.job.id, 102, "encrypted", "no matching password in config")
    store.forget_source("/in/a.pdf")
    again = arrive(store, "/in/a.pdf", "a" * 64, now=200)
    assert again is not None and not again.duplicate and again.job.state == JobState.QUEUED


def test_job_lifecycle_pages_and_resume(store: Store) -> None:
    res = arrive(store, "/in/a.pdf", "a" * 64)
    assert res is not None
    jid = res.job.id
    assert present(store.next_job(100)).id == jid
    job = store.start_job(jid, 101, "lite")
    assert job.state == JobState.RUNNING and job.attempts == 1 and job.engine == "lite"
    store.set_page_count(jid, 3)
    first = PageRecord(0, (Block("text", (0.1, 0.2, 0.9, 0.3), text="x"),), "lite", 1.5,
                       info={"k": 1, "page_size_pt": [612.0, 792.0]})
    store.save_page(jid, first, 102)
    store.save_page(jid, PageRecord(1, (), "lite", 2.5), 103)
    assert store.done_pages(jid) == {0, 1}
    assert present(store.job(jid)).pages_done == 2
    # the daemon is killed: on start the job goes back to the queue with its pages
    assert store.recover_running(200) == [jid]
    job = present(store.job(jid))
    assert job.state == JobState.QUEUED and job.crashes == 0
    assert store.done_pages(jid) == {0, 1}
    store.start_job(jid, 201, "lite")
    store.save_page(jid, PageRecord(2, (), "lite", 1.0), 202)
    pages = store.pages(jid)  # what the publisher reads
    assert [p.page_idx for p in pages] == [0, 1, 2]
    assert pages[0] == first and pages[0].size_pt == (612.0, 792.0)  # the same record back
    done = store.finish_job(jid, 203, "/out/a", 5.0)
    assert done.state == JobState.DONE and done.output_dir == "/out/a"
    # published: the outbox folder is the copy now, the pages leave the database
    assert store.pages(jid) == [] and store.crops(jid) == {} and done.pages_done == 3
    with pytest.raises(IllegalTransition):
        store.start_job(jid, 204, "lite")
    # reprocess clears pages and starts over
    store.reprocess(jid, 300)
    assert store.done_pages(jid) == set() and present(store.job(jid)).state == JobState.QUEUED
    c = store.counters()
    assert c["pages_total"] == 3 and c["documents_done_total"] == 1


def test_crash_requeue_counts_and_backoff_respected(store: Store) -> None:
    jid = present(arrive(store, "/in/a.pdf", "a" * 64)).job.id
    store.start_job(jid, 101, "lite")
    job = store.requeue(jid, 102, crashed=True, error_kind="crashed", error="segfault")
    assert job.crashes == 1 and job.error == "segfault"
    store.start_job(jid, 103, "lite")
    store.requeue(jid, 104, not_before=500.0)
    assert store.next_job(499.0) is None
    assert present(store.next_job(500.0)).id == jid


def test_retry_resets_crashes(store: Store) -> None:
    jid = present(arrive(store, "/in/a.pdf", "a" * 64)).job.id
    store.start_job(jid, 101, "lite")
    store.requeue(jid, 102, crashed=True)
    store.fail_job(jid, 103, "crashed", "boom")
    job = store.retry(jid, 104)
    assert job.state == JobState.QUEUED and job.crashes == 0 and job.error is None


def test_fifo_order(store: Store) -> None:
    ids = [present(arrive(store, f"/in/{i}.pdf", str(i) * 64)).job.id for i in range(3)]
    assert present(store.next_job(1e9)).id == ids[0]
    store.start_job(ids[0], 1, "x")
    assert present(store.next_job(1e9)).id == ids[1]


def test_readonly_reader_sees_writer(store: Store) -> None:
    arrive(store, "/in/a.pdf", "a" * 64)
    reader = Store(store.path, readonly=True)
    assert reader.counts()["queued"] == 1
    with pytest.raises(sqlite3.OperationalError):
        reader.conn.execute("DELETE FROM jobs")
    reader.close()


def test_writer_waits_for_a_lock_held_by_another_process(store: Store) -> None:
    """Another process holding the write lock for a while: we wait, then go on."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys, time\n"
         "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
         "c.execute('BEGIN IMMEDIATE')\n"
         "print('locked', flush=True)\n"
         "time.sleep(1.5)\n"
         "c.execute('COMMIT')\n",
         str(store.path)],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    res = arrive(store, "/in/a.pdf", "a" * 64)  # blocks on the busy timeout, then succeeds
    assert holder.wait(30) == 0
    assert res is not None and store.counts()["queued"] == 1


def test_runtime_facts_roundtrip(store: Store) -> None:
    store.set_runtime({"pid": 12, "current": {"page": 3}})
    store.set_runtime({"pid": 13})
    assert store.runtime() == {"pid": 13, "current": {"page": 3}}


def test_crops_and_model_answers_survive_a_restart_and_go_with_reprocess(tmp_path: Path) -> None:
    db = tmp_path / "state.sqlite3"
    s = Store(db)
    res = arrive(s, "/in/a.pdf", "a" * 64)
    assert res is not None
    jid = res.job.id
    s.start_job(jid, 101, "mineru")
    crop = Crop(name="page_0_table_3.jpg", jpeg=b"\xff\xd8jpeg", size=(40, 20))
    answers: dict[str, Json] = {"layout": {"raw_output": "<|box_start|>..."}, "blocks": []}
    page = PageRecord(0, (), "mineru", 1.0, crops=(crop,), model_output=answers)
    s.save_page(jid, page, 102)
    redone = PageRecord(0, (), "mineru", 1.0, crops=(crop,))
    s.save_page(jid, redone, 103)  # a page redone: no dupes
    s.close()
    s = Store(db)  # a restart: page-level resume keeps the page's crops
    assert s.crops(jid) == {0: [crop]}
    assert s.pages(jid)[0] == redone  # replaced with the redone page, crops included
    s.save_page(jid, PageRecord(1, (), "mineru", 1.0, model_output=answers), 104)
    assert s.pages(jid)[1].model_output == answers
    s.finish_job(jid, 105, "/out/a", 2.0)
    s.reprocess(jid, 106)
    assert s.crops(jid) == {} and s.pages(jid) == []
    s.close()


def test_stored_blocks_carry_their_version_and_an_unknown_one_is_refused() -> None:
    blocks = (Block("title", (0.1, 0.1, 0.9, 0.2), text="T", text_level=1, index=0),)
    text = encode_blocks(blocks)
    assert json.loads(text)["version"] == BLOCKS_VERSION
    assert decode_blocks(text) == blocks
    # version 0, an older release's bare list, with a key this version no longer has
    assert decode_blocks('[{"type": "text", "bbox": [0, 0, 1, 1], "md": "x"}]') == (
        Block("text", (0, 0, 1, 1)),
    )
    for unknown in ('{"version": 99, "blocks": []}', '"text"', '{"version": 1, "blocks": 3}'):
        with pytest.raises(StoredBlocksError):
            decode_blocks(unknown)


# -- bounded state (issue 31) ---------------------------------------------------------------


def rows(store: Store, table: str) -> int:
    return int(store.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def new_event(job_id: int, now: float, receivers: tuple[str, ...] = ("r",)) -> NewEvent:
    return NewEvent(f"msg_{job_id}_{now}", "document.done", job_id, now, "{}", receivers)


def convert(store: Store, name: str, sha: str, now: float, pages: int = 3) -> int:
    """A document with `pages` pages of blocks and a figure crop each, converted."""
    jid = present(arrive(store, f"/in/{name}", sha, now=now)).job.id
    store.start_job(jid, now, "lite")
    store.set_page_count(jid, pages)
    for i in range(pages):
        crop = Crop(name=f"page_{i}_image_1.jpg", jpeg=b"\xff\xd8" + b"j" * 20_000,
                    size=(400, 300))
        blocks = tuple(Block("text", (0.1, 0.1, 0.9, 0.2), text="words " * 200)
                       for _ in range(5))
        store.save_page(jid, PageRecord(i, blocks, "lite", 1.5, crops=(crop,)), now + i)
    return jid


def test_a_published_document_leaves_its_pages_and_crops_but_what_commands_read(
    store: Store,
) -> None:
    """Pages and crops leave with the outcome; the job row keeps what dedup, `status`,
    `list`, `retry`, `reprocess` and the status page read. Per finished document the
    database keeps one job, document and source row, its page times and its event."""
    done_ids = []
    for n in range(20):
        jid = convert(store, f"d{n}.pdf", f"{n:064x}", 1000.0 + n)
        store.finish_job(jid, 1100.0 + n, f"/out/d{n}", 4.5, event=new_event(jid, 1100.0 + n))
        done_ids.append(jid)
    failed = convert(store, "bad.pdf", "f" * 64, 2000.0)
    store.fail_job(failed, 2001.0, "timeout", "too slow")
    assert rows(store, "pages") == 3 and rows(store, "page_crops") == 3  # the failed one's
    assert store.done_pages(failed) == {0, 1, 2}  # `retry` resumes at its first missing page
    # per finished document: a job, a document, a source, its event and delivery, and
    # three page times (plus the failed document's row of each but the event)
    kept = {t: rows(store, t) for t in
            ("jobs", "documents", "sources", "events", "deliveries", "page_times")}
    assert kept == {"jobs": 21, "documents": 21, "sources": 21, "events": 20,
                    "deliveries": 20, "page_times": 63}
    job = present(store.job(done_ids[0]))
    assert job.state == JobState.DONE and job.page_count == 3 and job.pages_done == 3
    assert job.output_dir == "/out/d0" and job.seconds == 4.5
    assert store.pages(job.id) == [] and store.crops(job.id) == {}
    # dedup still knows the content; the status page still has its throughput figures
    dup = present(arrive(store, "/in/again.pdf", f"{0:064x}", now=3000.0))
    assert dup.duplicate and dup.original is not None and dup.original.id == job.id
    assert store.page_seconds(limit=100) == [1.5] * 63
    assert sum(store.pages_per_hour(2000.0 + 3600)) == 63
    # reprocess starts from page 0, as after any publish
    store.reprocess(job.id, 3001.0)
    again = present(store.job(job.id))
    assert again.state == JobState.QUEUED and again.pages_done == 0
    assert store.done_pages(job.id) == set()


def test_retention_prunes_finished_deliveries_and_old_page_times_with_a_ticked_clock(
    store: Store,
) -> None:
    day = 86400.0
    t0 = 1_700_000_000.0
    ids = [convert(store, f"d{n}.pdf", f"{n:064x}", t0, pages=1) for n in range(3)]
    for jid in ids:
        store.finish_job(jid, t0, f"/out/{jid}", 1.0, event=new_event(jid, t0, ("r", "s")))
    delivered, dead, waiting = store.deliveries(("pending",))[:3]
    assert delivered.event_id == dead.event_id != waiting.event_id  # one event, both receivers
    store.delivery_succeeded(delivered, t0 + 60)
    store.delivery_failed(dead, t0 + 60, "HTTP 500", None)
    upkeep = Upkeep(store, retention_seconds=30 * day)
    assert upkeep.tick(t0 + 29 * day) is not None
    assert rows(store, "deliveries") == 6 and rows(store, "events") == 3
    done = upkeep.tick(t0 + 31 * day)
    assert done is not None and done.deliveries_pruned == 2
    # the pending ones stay, whatever their age; an event goes with its last delivery
    left = store.deliveries(("pending", "delivered", "dead"))
    assert len(left) == 4 and {d.state for d in left} == {"pending"}
    assert delivered.event_id not in {d.event_id for d in left}
    assert rows(store, "deliveries") == 4 and rows(store, "events") == 2
    assert rows(store, "page_times") == 3  # fewer than the newest rows kept: all stay
    assert store.counters()["hook_deliveries_total"] == 1  # the counters keep the history


def old_deliveries(store: Store, events: int, finished_at: float) -> None:
    """`events` events told to two receivers, delivered (or given up) at `finished_at`."""
    with store.tx() as c:
        for n in range(events):
            seq = c.execute("INSERT INTO events(id, type, job_id, created_at, body) VALUES("
                            "?, 'document.done', NULL, ?, '{}')",
                            (f"ev-{n}", finished_at - 5)).lastrowid
            c.executemany(
                "INSERT INTO deliveries(event_seq, receiver, state, attempts, next_at, since,"
                " finished_at) VALUES(?, ?, ?, 1, ?, ?, ?)",
                [(seq, r, state, finished_at, finished_at, finished_at + n * 0.001)
                 for r, state in (("n8n", "delivered"), ("mail", "dead"))],
            )


def test_a_backlog_of_old_deliveries_is_pruned_in_batches_over_following_ticks(
    store: Store,
) -> None:
    """Months of events (an upgrade, a shortened retention) are not deleted in one
    transaction that holds the write lock for as long: PRUNE_BATCH rows a tick, the
    next batch at the next tick, not PRUNE_EVERY later, until none is left."""
    day = 86400.0
    t0 = 1_700_000_000.0
    old_deliveries(store, 600, t0)  # 1200 deliveries
    upkeep = Upkeep(store, retention_seconds=30 * day)
    now = t0 + 31 * day
    left = []
    for tick in range(4):
        done = upkeep.tick(now + tick)  # a tick a second, as the main loop's
        assert done is None or done.deliveries_pruned <= PRUNE_BATCH
        left.append(rows(store, "deliveries"))
    assert left == [1200 - PRUNE_BATCH, 1200 - 2 * PRUNE_BATCH, 0, 0]
    assert rows(store, "events") == 0  # each went with its last delivery
    assert not upkeep.pruning


def test_page_times_are_kept_for_a_while_then_forgotten(store: Store) -> None:
    t0 = 1_700_000_000.0
    jid = convert(store, "a.pdf", "a" * 64, t0, pages=2)
    store.finish_job(jid, t0, "/out/a", 1.0)
    assert store.prune_page_times(t0 + PAGE_TIMES_KEPT_SECONDS - 10) == 0
    # old enough, but among the newest rows: the "seconds per page" figure still has them
    assert store.prune_page_times(t0 + PAGE_TIMES_KEPT_SECONDS + 10) == 0
    store.conn.executemany(
        "INSERT INTO page_times(job_id, page_idx, done_at, seconds) VALUES(?, ?, ?, ?)",
        [(1000 + i, 0, t0 + 10 + i, 2.0) for i in range(PAGE_TIMES_KEPT_ROWS)])
    later = t0 + PAGE_TIMES_KEPT_SECONDS + 100_000
    assert store.prune_page_times(later, limit=1) == 1  # a batch, as the main loop prunes
    assert store.prune_page_times(later) == 1
    assert rows(store, "page_times") == PAGE_TIMES_KEPT_ROWS


def test_the_inboxes_seen_are_remembered_and_known_from_old_jobs(tmp_path: Path) -> None:
    """What lets a restart tell a share away (seen before) from a typo (never seen)."""
    db = tmp_path / "state.sqlite3"
    s = Store(db)
    assert s.seen_inboxes() == set()
    arrive(s, "/in/a.pdf", "a" * 64)  # a job from /in: a database from before noting
    assert s.seen_inboxes() == {"/in"}
    s.note_inboxes(["/srv/scans", "/in"])
    s.note_inboxes(["/srv/fax"])
    s.close()
    reader = Store(db, readonly=True)  # as `docinbox run` reads it before it starts
    assert reader.seen_inboxes() == {"/in", "/srv/scans", "/srv/fax"}
    reader.close()


def test_a_receiver_disabled_by_410_stays_disabled_across_a_reopen(tmp_path: Path) -> None:
    db = tmp_path / "state.sqlite3"
    s = Store(db)
    s.disable_receiver("n8n", "id-1", "HTTP 410: gone", 100.0)
    s.close()
    s = Store(db)  # a restart
    assert s.receiver_disabled("n8n", "id-1") == "HTTP 410: gone"
    assert s.receiver_disabled("other", "id-9") is None
    # `docinbox hooks retry` enables it again
    assert s.enable_receivers() == ["n8n"]
    assert s.receiver_disabled("n8n", "id-1") is None
    # so does a change of its configuration
    s.disable_receiver("n8n", "id-1", "HTTP 410", 200.0)
    assert s.receiver_disabled("n8n", "id-2") is None
    assert s.receiver_disabled("n8n", "id-1") is None  # the mark is gone, not hidden
    s.close()


def _schema_5(path: Path) -> None:
    """A database as docinbox wrote it before bounded state: schema 5, no auto_vacuum,
    a done document's pages and crops kept, and a queued one halfway."""
    old = sqlite3.connect(str(path), isolation_level=None)
    old.execute("PRAGMA journal_mode=WAL")
    for statement in (s for step in MIGRATIONS[:5] for s in step):
        old.execute(statement)
    old.execute("PRAGMA user_version=5")
    blob = b"\xff\xd8" + b"j" * 50_000
    for jid, state in ((1, "done"), (2, "queued")):
        old.execute("INSERT INTO documents(id, sha256, size, first_seen) VALUES(?, ?, 10, 1)",
                    (jid, f"{jid:064x}"))
        old.execute("INSERT INTO jobs(id, document_id, source_path, inbox, state, created_at,"
                    " output_dir, pages_done) VALUES(?, ?, ?, '/in', ?, 1, ?, 40)",
                    (jid, jid, f"/in/{jid}.pdf", state, "/out/1" if state == "done" else None))
        for i in range(40):
            old.execute("INSERT INTO pages(job_id, page_idx, blocks, info, engine, seconds,"
                        " done_at) VALUES(?, ?, '[]', '{}', 'lite', 2.0, ?)", (jid, i, 10 + i))
            old.execute("INSERT INTO page_crops VALUES(?, ?, 'page.jpg', ?, 4, 3)",
                        (jid, i, blob))
    old.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    old.close()


def test_an_old_database_is_migrated_its_published_pages_dropped_and_compacted(
    tmp_path: Path,
) -> None:
    db = tmp_path / "state.sqlite3"
    _schema_5(db)
    before = db.stat().st_size
    s = Store(db)
    assert s.schema_version() == SCHEMA_VERSION == 6
    assert s.conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental from now on
    assert s.done_pages(1) == set() and rows(s, "page_crops") == 40  # the queued one's stay
    assert s.done_pages(2) == set(range(40))  # it resumes where it was
    assert rows(s, "page_times") == 80 and sum(s.pages_per_hour(60, hours=1)) == 80
    assert present(s.job(1)).pages_done == 40  # the counts stay
    s.close()
    assert db.stat().st_size < before * 0.6  # compacted once, at the migration
    s = Store(db)  # and not again: it is incremental now
    assert s.conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    s.close()


def test_free_pages_go_back_and_the_wal_is_truncated_in_ticks(tmp_path: Path) -> None:
    db = tmp_path / "state.sqlite3"
    s = Store(db)
    t0 = 1_700_000_000.0
    for n in range(4):
        jid = convert(s, f"d{n}.pdf", f"{n:064x}", t0, pages=10)
        s.finish_job(jid, t0, f"/out/{n}", 1.0)  # its pages and crops are freed pages now
    assert s.free_pages() > 40
    upkeep = Upkeep(s, retention_seconds=30 * 86400.0)
    # a reader (the status page) holds the WAL: the checkpoint neither waits nor truncates
    reader = Store(db, readonly=True)
    reader.conn.execute("BEGIN")
    reader.conn.execute("SELECT COUNT(*) FROM jobs").fetchone()
    done = upkeep.tick(t0)
    assert done is not None and done.checkpoint is not None and not done.checkpoint.truncated
    reader.conn.execute("COMMIT")
    reader.close()
    ticks = 0
    while upkeep.vacuuming or ticks == 0:
        upkeep.tick(t0 + ticks)
        ticks += 1
    assert s.free_pages() == 0
    done = upkeep.tick(t0 + CHECKPOINT_EVERY + ticks)
    assert done is not None and done.checkpoint is not None and done.checkpoint.truncated
    wal = db.with_name(db.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    s.close()
