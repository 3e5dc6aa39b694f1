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
from daemon.jobs.states import TRANSITIONS, IllegalTransition, JobState, check_transition
from daemon.jobs.store import SCHEMA_VERSION, IngestResult, SchemaError, Store
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
    done = store.finish_job(jid, 203, "/out/a", 5.0)
    assert done.state == JobState.DONE and done.output_dir == "/out/a"
    pages = store.pages(jid)
    assert [p.page_idx for p in pages] == [0, 1, 2]
    assert pages[0] == first and pages[0].size_pt == (612.0, 792.0)  # the same record back
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
