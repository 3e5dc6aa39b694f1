"""Documents, sources and jobs: what arrived, the queue, and each job's outcome.

Every job state change goes through `daemon.jobs.states.check_transition`. An outcome
(done, failed, a duplicate) is recorded with its event in one transaction
(daemon.jobs.deliveries: the transactional outbox). The event is built BEFORE that
transaction by whoever reaches the outcome (the publisher knows the files it wrote), and
handed in as a `NewEvent`: the transaction holding the write lock touches no file.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from daemon.jobs.db import Database, StoreBusy
from daemon.jobs.deliveries import NewEvent, record_event
from daemon.jobs.pages import delete_pages
from daemon.jobs.states import JobState, check_transition


@dataclass(frozen=True)
class Job:
    id: int
    document_id: int
    sha256: str
    source_path: str
    inbox: str
    subdir: str
    state: JobState
    attempts: int
    crashes: int
    error_kind: str | None
    error: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    not_before: float
    engine: str | None
    duplicate_of: int | None
    page_count: int | None
    pages_done: int
    output_dir: str | None
    size: int
    # Where the original is now when it is no longer at source_path (archive/ or failed/);
    # retry and reprocess read it from there.
    held_path: str | None = None
    seconds: float | None = None  # time spent converting, once done

    @property
    def read_path(self) -> str:
        return self.held_path or self.source_path

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        return cls(
            id=row["id"],
            document_id=row["document_id"],
            sha256=row["sha256"],
            source_path=row["source_path"],
            inbox=row["inbox"],
            subdir=row["subdir"],
            state=JobState(row["state"]),
            attempts=row["attempts"],
            crashes=row["crashes"],
            error_kind=row["error_kind"],
            error=row["error"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            not_before=row["not_before"],
            engine=row["engine"],
            duplicate_of=row["duplicate_of"],
            page_count=row["page_count"],
            pages_done=row["pages_done"],
            output_dir=row["output_dir"],
            size=row["size"],
            held_path=row["held_path"],
            seconds=row["seconds"],
        )


@dataclass(frozen=True)
class IngestResult:
    """What `record_arrival` decided about one stable file."""

    job: Job
    duplicate: bool  # same content as a document already queued, running or done
    original: Job | None  # for duplicates: the job that owns the content



@dataclass(frozen=True)
class Outcome:
    """A job's outcome as the transaction recording it will leave the job: what an event
    about it is built from (daemon.output.events), before that transaction. `event` is
    the event type."""

    event: str  # document.done | document.reprocessed | document.failed | document.duplicate
    job: Job  # as the transaction recording the outcome leaves it
    original: Job | None = None  # a duplicate's: the job that owns the content

    @classmethod
    def done(cls, job: Job, now: float, output_dir: str, seconds: float) -> Outcome:
        """`job` (as it stands before) published: `document.reprocessed` when it had been
        done before (`docinbox reprocess`), else `document.done`."""
        event = "document.reprocessed" if job.output_dir is not None else "document.done"
        return cls(event, dataclasses.replace(
            job, state=JobState.DONE, finished_at=now, not_before=0.0, output_dir=output_dir,
            seconds=seconds))

    @classmethod
    def failed(cls, job: Job, now: float, kind: str, error: str) -> Outcome:
        return cls("document.failed", dataclasses.replace(
            job, state=JobState.FAILED, finished_at=now, not_before=0.0, error_kind=kind,
            error=error))


class EventMaker(Protocol):
    """Builds the event of an outcome, or None when no receiver wants it (the hooks).

    Called before the transaction that records the outcome, so it may read the disk;
    `files` are the output folder's files when the caller knows them (the publisher wrote
    them), relative to that folder: then the folder is not listed again."""

    def event_for(
        self, outcome: Outcome, files: Sequence[str] | None = None
    ) -> NewEvent | None: ...


class NoEvents:
    """No hooks configured: outcomes carry no event."""

    def event_for(self, outcome: Outcome, files: Sequence[str] | None = None) -> None:
        return None


class StaleEvent(StoreBusy):
    """The event handed in was built for another outcome than the one the transaction
    records (another process changed the job meanwhile): build it again and retry."""


@dataclass(frozen=True)
class Published:
    """A document's output, written: what recording its outcome takes."""

    folder: str  # the outbox folder
    event: NewEvent | None  # its document.done / document.reprocessed event
    pages: int  # converted pages published
    page_seconds: float  # their converting time, summed


class JobRecords(Database):
    _JOB_SELECT = (
        "SELECT jobs.*, documents.sha256 AS sha256, documents.size AS size FROM jobs "
        "JOIN documents ON documents.id = jobs.document_id"
    )

    def _job(self, c: sqlite3.Connection, job_id: int) -> Job | None:
        row = c.execute(self._JOB_SELECT + " WHERE jobs.id = ?", (job_id,)).fetchone()
        return Job.from_row(dict(row)) if row else None

    def _set_state(
        self,
        c: sqlite3.Connection,
        job_id: int,
        new: JobState,
        *,
        count: Literal["attempts", "crashes"] | None = None,
        **fields: Any,
    ) -> Job:
        """Move a job to `new` (legal moves only), set `fields`, add one to `count`."""
        job = self._job(c, job_id)
        if job is None:
            raise KeyError(job_id)
        check_transition(job_id, job.state, new)
        fields["state"] = new.value
        sets = [f"{k} = ?" for k in fields] + ([f"{count} = {count} + 1"] if count else [])
        c.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?", (*fields.values(), job_id))
        updated = self._job(c, job_id)
        assert updated is not None
        return updated

    # -- ingest ---------------------------------------------------------------------

    def known_source(
        self, path: str, size: int, mtime_ns: int, *, sha256: str | None = None
    ) -> bool:
        """True when this exact file (path, size, mtime) was already recorded: no re-hash.
        With `sha256`: recorded as that content."""
        row = self.conn.execute(
            "SELECT sha256 FROM sources WHERE path = ? AND size = ? AND mtime_ns = ?",
            (path, size, mtime_ns),
        ).fetchone()
        return row is not None and (sha256 is None or row["sha256"] == sha256)

    def record_arrival(
        self,
        *,
        path: str,
        inbox: str,
        subdir: str,
        size: int,
        mtime_ns: int,
        sha256: str,
        now: float,
        event: NewEvent | None = None,
    ) -> IngestResult | None:
        """Record a stable file and queue it, or mark it a duplicate.

        Returns None when nothing new happened: the same path already maps to this content
        (e.g. `after_success: keep` and the file was touched without changing). `event`
        is the duplicate's, built from `arrival_outcome`; recorded with it.
        """
        with self.tx() as c:
            prev = c.execute("SELECT * FROM sources WHERE path = ?", (path,)).fetchone()
            if prev is not None and prev["sha256"] == sha256 and prev["job_id"] is not None:
                c.execute(
                    "UPDATE sources SET size = ?, mtime_ns = ?, last_seen = ? WHERE path = ?",
                    (size, mtime_ns, now, path),
                )
                return None
            doc_id, original = self._owner(c, sha256)
            if doc_id is None:
                doc_id = int(
                    c.execute(
                        "INSERT INTO documents(sha256, size, first_seen) VALUES(?, ?, ?)",
                        (sha256, size, now),
                    ).lastrowid
                    or 0
                )
            duplicate = original is not None
            job_id = int(
                c.execute(
                    "INSERT INTO jobs(document_id, source_path, inbox, subdir, state, created_at,"
                    " duplicate_of, finished_at) VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        doc_id,
                        path,
                        inbox,
                        subdir,
                        (JobState.DUPLICATE if duplicate else JobState.QUEUED).value,
                        now,
                        original.id if original else None,
                        now if duplicate else None,
                    ),
                ).lastrowid
                or 0
            )
            c.execute(
                "INSERT INTO sources(path, size, mtime_ns, sha256, job_id, first_seen, last_seen)"
                " VALUES(?, ?, ?, ?, ?, ?, ?) ON CONFLICT(path) DO UPDATE SET size=excluded.size,"
                " mtime_ns=excluded.mtime_ns, sha256=excluded.sha256, job_id=excluded.job_id,"
                " last_seen=excluded.last_seen",
                (path, size, mtime_ns, sha256, job_id, now, now),
            )
            self._bump(c, "duplicates_total" if duplicate else "documents_queued_total")
            job = self._job(c, job_id)
            assert job is not None
            if event is not None:
                if not duplicate or event.job_id != job_id:
                    raise StaleEvent(f"the event {event.id} was built for another arrival")
                record_event(c, job_id, event)
            return IngestResult(job=job, duplicate=duplicate, original=original)

    def _owner(self, c: sqlite3.Connection, sha256: str) -> tuple[int | None, Job | None]:
        """The document with this content, and the job that owns it (queued, running or
        done). A failed original does not make a re-drop a duplicate: the user most likely
        fixed something (a password in config) and dropped it again."""
        doc = c.execute("SELECT id FROM documents WHERE sha256 = ?", (sha256,)).fetchone()
        if doc is None:
            return None, None
        row = c.execute(
            self._JOB_SELECT + " WHERE jobs.document_id = ? AND jobs.state IN (?, ?, ?) "
            "ORDER BY jobs.id LIMIT 1",
            (int(doc["id"]), JobState.QUEUED.value, JobState.RUNNING.value, JobState.DONE.value),
        ).fetchone()
        return int(doc["id"]), Job.from_row(dict(row)) if row else None

    def arrival_outcome(
        self, *, path: str, inbox: str, subdir: str, sha256: str, now: float
    ) -> Outcome | None:
        """The duplicate outcome `record_arrival` would record for this file now, or None
        when it would queue it (or record nothing): its event is built from this before
        the transaction, and `record_arrival` checks that it still holds."""
        prev = self.conn.execute(
            "SELECT sha256, job_id FROM sources WHERE path = ?", (path,)
        ).fetchone()
        if prev is not None and prev["sha256"] == sha256 and prev["job_id"] is not None:
            return None
        _, original = self._owner(self.conn, sha256)
        if original is None:
            return None
        # The job the transaction will insert: ids are handed out in order (no
        # AUTOINCREMENT, and jobs are never deleted), checked there.
        next_id = self.conn.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM jobs").fetchone()[0]
        job = dataclasses.replace(
            original, id=int(next_id), source_path=path, inbox=inbox, subdir=subdir,
            state=JobState.DUPLICATE, attempts=0, crashes=0, error_kind=None, error=None,
            created_at=now, started_at=None, finished_at=now, not_before=0.0, engine=None,
            duplicate_of=original.id, page_count=None, pages_done=0, output_dir=None,
            held_path=None, seconds=None)
        return Outcome("document.duplicate", job, original)

    def forget_source(self, path: str) -> None:
        """Drop the (path, size, mtime) memo so a file put back at the same path is seen."""
        with self.tx() as c:
            c.execute("DELETE FROM sources WHERE path = ?", (path,))

    # -- inboxes seen -------------------------------------------------------------------

    # The runtime row's key that lists them: kept there rather than in a table of its
    # own, so that no schema change keeps an older docinbox from opening the file.
    SEEN_INBOXES = "inboxes_seen"

    def note_inboxes(self, inboxes: Collection[str]) -> None:
        """Remember inboxes found there and watched (named as jobs name them). One that
        is missing at a later start is then a share away, waited for, not a typo."""
        seen = self.seen_inboxes()
        if set(inboxes) <= seen:
            return
        self.set_runtime({self.SEEN_INBOXES: sorted(seen | set(inboxes))})

    def seen_inboxes(self) -> set[str]:
        """The inboxes this database has seen: noted ones, and those any job came from
        (a database from before inboxes were noted)."""
        seen = {str(r[0]) for r in self.conn.execute("SELECT DISTINCT inbox FROM jobs")}
        row = self.conn.execute(
            "SELECT value FROM runtime WHERE key = ?", (self.SEEN_INBOXES,)
        ).fetchone()
        noted = json.loads(row[0]) if row is not None else []
        if isinstance(noted, list):  # JSON another version may have written: not trusted
            seen.update(str(i) for i in noted)
        return seen

    # -- queue ------------------------------------------------------------------------

    def next_job(self, now: float, skip_inboxes: Collection[str] = ()) -> Job | None:
        """The job to start next; none of the `skip_inboxes` (away: their jobs wait)."""
        skip = sorted(skip_inboxes)
        row = self.conn.execute(
            self._JOB_SELECT + " WHERE jobs.state = ? AND jobs.not_before <= ? "
            f"AND jobs.inbox NOT IN ({', '.join('?' * len(skip))}) "
            "ORDER BY jobs.not_before > 0, jobs.id LIMIT 1",
            (JobState.QUEUED.value, now, *skip),
        ).fetchone()
        return Job.from_row(dict(row)) if row else None

    def start_job(self, job_id: int, now: float, engine: str) -> Job:
        with self.tx() as c:
            return self._set_state(
                c, job_id, JobState.RUNNING, count="attempts",
                started_at=now, engine=engine, error=None, error_kind=None,
            )

    def set_page_count(self, job_id: int, page_count: int) -> None:
        with self.tx() as c:
            c.execute("UPDATE jobs SET page_count = ? WHERE id = ?", (page_count, job_id))

    def finish_job(
        self, job_id: int, now: float, output_dir: str, seconds: float,
        *, event: NewEvent | None = None,
    ) -> Job:
        """A published document is done, with its event. Its pages and crops leave the
        database in the same transaction: the outbox folder is their copy now (and a
        `reprocess` starts from page 0). What stays is what dedup, `status`, `list`,
        `retry`, `reprocess` and the status page read: the job row with its counts,
        outcome and error, the document's hash, the page times."""
        with self.tx() as c:
            job = self._settle(c, job_id, now, JobState.DONE, "documents_done_total", event,
                               output_dir=output_dir, seconds=seconds)
            delete_pages(c, job_id)
            return job

    def fail_job(
        self, job_id: int, now: float, kind: str, error: str, *, event: NewEvent | None = None
    ) -> Job:
        """Failed, with its event; its finished pages stay for `docinbox retry`."""
        with self.tx() as c:
            return self._settle(c, job_id, now, JobState.FAILED, "documents_failed_total",
                                event, error_kind=kind, error=error)

    def _settle(
        self, c: sqlite3.Connection, job_id: int, now: float, end: JobState, counter: str,
        event: NewEvent | None, **fields: Any,
    ) -> Job:
        """A job reaches `done` or `failed`, that outcome's counter moves with it, and its
        event is recorded: together or not at all."""
        job = self._set_state(c, job_id, end, finished_at=now, not_before=0, **fields)
        self._bump(c, counter)
        if event is not None:
            record_event(c, job_id, event)
        return job

    def requeue(
        self,
        job_id: int,
        now: float,
        *,
        not_before: float = 0.0,
        crashed: bool = False,
        error_kind: str | None = None,
        error: str | None = None,
    ) -> Job:
        """Back to the queue: after a worker crash, a daemon stop, or a transient error."""
        with self.tx() as c:
            job = self._set_state(
                c, job_id, JobState.QUEUED, count="crashes" if crashed else None,
                not_before=not_before, error_kind=error_kind, error=error,
            )
            if crashed:
                self._bump(c, "worker_crashes_total")
            return job

    def recover_running(self, now: float) -> list[int]:
        """At start: jobs a killed daemon left `running` go back to the queue.

        Their finished pages stay, so they resume at the first missing page. The attempt
        was already counted when it started; a daemon kill is not held against the document.
        """
        with self.tx() as c:
            ids = [
                int(r[0])
                for r in c.execute(
                    "SELECT id FROM jobs WHERE state = ?", (JobState.RUNNING.value,)
                ).fetchall()
            ]
            for job_id in ids:
                self._set_state(c, job_id, JobState.QUEUED, not_before=0)
            if ids:
                self._bump(c, "jobs_recovered_total", len(ids))
            return ids

    # Fields cleared when a finished job is queued again by the user.
    _CLEAN_SLATE: dict[str, Any] = {  # noqa: RUF012 - read-only class constant
        "not_before": 0, "crashes": 0, "error": None, "error_kind": None, "finished_at": None,
    }

    def retry(self, job_id: int, now: float) -> Job:
        """`docinbox retry`: a failed job goes back to the queue; finished pages are kept."""
        with self.tx() as c:
            return self._set_state(c, job_id, JobState.QUEUED, **self._CLEAN_SLATE)

    def reprocess(self, job_id: int, now: float) -> Job:
        """`docinbox reprocess`: a done job runs again from page 0 (e.g. after a fallback)."""
        with self.tx() as c:
            job = self._set_state(c, job_id, JobState.QUEUED, pages_done=0, **self._CLEAN_SLATE)
            delete_pages(c, job_id)
            return job

    def set_held_path(self, job_id: int, held_path: str | None) -> None:
        with self.tx() as c:
            c.execute("UPDATE jobs SET held_path = ? WHERE id = ?", (held_path, job_id))

    # -- reading --------------------------------------------------------------------

    def job(self, job_id: int) -> Job | None:
        return self._job(self.conn, job_id)

    def jobs(
        self, state: JobState | None = None, limit: int = 1000, newest_first: bool = True
    ) -> list[Job]:
        sql = self._JOB_SELECT
        args: list[Any] = []
        if state is not None:
            sql += " WHERE jobs.state = ?"
            args.append(state.value)
        sql += " ORDER BY jobs.id " + ("DESC" if newest_first else "ASC") + " LIMIT ?"
        args.append(limit)
        return [Job.from_row(dict(r)) for r in self.conn.execute(sql, args).fetchall()]

    def duplicates_of(self, job_id: int) -> list[Job]:
        rows = self.conn.execute(
            self._JOB_SELECT + " WHERE jobs.duplicate_of = ? ORDER BY jobs.id", (job_id,)
        ).fetchall()
        return [Job.from_row(dict(r)) for r in rows]

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in JobState}
        for r in self.conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state"):
            out[r[0]] = int(r[1])
        return out

    def oldest_queued_at(self) -> float | None:
        row = self.conn.execute(
            "SELECT MIN(created_at) FROM jobs WHERE state = ?", (JobState.QUEUED.value,)
        ).fetchone()
        return float(row[0]) if row and row[0] is not None else None

