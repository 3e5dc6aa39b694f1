"""The one module that owns SQL.

Everything durable lives in one SQLite file in `state_dir`: which contents we have seen
(documents, by sha256), every path where they turned up (sources), the queue (jobs) and the
per-page results that let a crash at page 40 of 50 resume at page 40 (pages).

Rules that keep it safe under kill -9 and concurrent readers (`docinbox status` runs in
another process while the daemon writes):
- WAL journal, `synchronous=FULL` (a finished page or a `done` must survive power loss;
  the write volume is tiny, one commit per page), a busy timeout so a reader or a
  backup tool holding a lock makes us wait instead of fail.
- Every write is one `BEGIN IMMEDIATE` transaction (huey's pattern): the write lock is
  taken up front, so two writers never deadlock upgrading read locks.
- Every job state change goes through `daemon.jobs.states.check_transition`.
- Timestamps are wall-clock seconds passed in by the caller (`now`), never read here, so
  tests drive time.

One module although it is long: it is one concept, the database, and keeping every SQL
statement (the schema and its migrations included) here is the rule that lets a reader
see every query that touches a table, and every column a migration adds, in one file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from daemon.document.page import Crop
from daemon.document.record import PageRecord, decode_blocks, encode_blocks
from daemon.jobs.states import JobState, check_transition

SCHEMA_VERSION = 5
BUSY_TIMEOUT_MS = 60_000


class StoreBusy(Exception):
    """The database cannot take a write now, for a reason that is not the data's: it
    stayed locked by another process longer than the busy timeout, or (StoreFull) its
    disk is full. Callers wait and write again; nothing is failed for it."""


class StoreFull(StoreBusy):
    """The state disk is full (SQLITE_FULL): writes resume when space is freed."""


def _unavailable(exc: sqlite3.OperationalError) -> StoreBusy | None:
    """The StoreBusy that `exc` means, or None when it is some other error."""
    if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
        return StoreFull(str(exc))
    if "locked" in str(exc) or "busy" in str(exc):
        return StoreBusy(str(exc))
    return None


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
    """A job's outcome, as the transaction recording it sees it: what an event about it
    is built from (daemon.output.events). `event` is the event type."""

    event: str  # document.done | document.reprocessed | document.failed | document.duplicate
    job: Job  # as recorded by this transaction
    original: Job | None = None  # a duplicate's: the job that owns the content


@dataclass(frozen=True)
class NewEvent:
    """An event to record with the outcome, in the same transaction, and who gets it."""

    id: str  # unique; the receiver's deduplication key (webhook-id)
    type: str
    created_at: float  # wall clock
    body: str  # the JSON receivers get, byte for byte (signed as is)
    receivers: tuple[str, ...]  # hook names subscribed to this type


# Builds the event of an outcome, or None when no hook wants it. Called INSIDE the write
# transaction (the transactional outbox): it must not touch the store and must be quick.
EventSource = Callable[[Outcome], "NewEvent | None"]

DeliveryState = Literal["pending", "delivered", "dead"]


@dataclass(frozen=True)
class Delivery:
    """One event for one receiver, and how its delivery stands."""

    seq: int  # the event's place in the order events happened
    event_id: str
    type: str
    job_id: int | None
    created_at: float
    body: str
    receiver: str
    state: DeliveryState
    attempts: int
    next_at: float
    since: float  # when it became due: its age counts from here (a retry resets it)
    last_error: str | None
    finished_at: float | None

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> Delivery:
        return cls(
            seq=int(r["seq"]), event_id=r["id"], type=r["type"], job_id=r["job_id"],
            created_at=float(r["created_at"]), body=r["body"], receiver=r["receiver"],
            state=r["state"], attempts=int(r["attempts"]), next_at=float(r["next_at"]),
            since=float(r["since"]), last_error=r["last_error"], finished_at=r["finished_at"],
        )


@dataclass(frozen=True)
class ReceiverCounts:
    receiver: str
    pending: int
    dead: int
    oldest_pending_at: float | None
    last_error: str | None  # of its oldest pending delivery (the one being retried)


# Migrations: index i upgrades user_version i -> i+1, one statement at a time (a string
# split on ";" would break on the first trigger or literal holding one). Append only; never
# edit one that shipped.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        """
        CREATE TABLE documents (
            id INTEGER PRIMARY KEY,
            sha256 TEXT NOT NULL UNIQUE,
            size INTEGER NOT NULL,
            first_seen REAL NOT NULL
        )
        """,
        """
        CREATE TABLE jobs (
            id INTEGER PRIMARY KEY,
            document_id INTEGER NOT NULL REFERENCES documents(id),
            source_path TEXT NOT NULL,
            inbox TEXT NOT NULL,
            subdir TEXT NOT NULL DEFAULT '',
            state TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            crashes INTEGER NOT NULL DEFAULT 0,
            error_kind TEXT,
            error TEXT,
            created_at REAL NOT NULL,
            started_at REAL,
            finished_at REAL,
            not_before REAL NOT NULL DEFAULT 0,
            engine TEXT,
            duplicate_of INTEGER REFERENCES jobs(id),
            page_count INTEGER,
            pages_done INTEGER NOT NULL DEFAULT 0,
            output_dir TEXT,
            held_path TEXT,
            seconds REAL
        )
        """,
        """
        CREATE INDEX jobs_state ON jobs(state, not_before, id)
        """,
        """
        CREATE INDEX jobs_document ON jobs(document_id)
        """,
        """
        CREATE TABLE sources (
            path TEXT PRIMARY KEY,
            size INTEGER NOT NULL,
            mtime_ns INTEGER NOT NULL,
            sha256 TEXT NOT NULL,
            job_id INTEGER REFERENCES jobs(id),
            first_seen REAL NOT NULL,
            last_seen REAL NOT NULL
        )
        """,
        """
        CREATE TABLE pages (
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            page_idx INTEGER NOT NULL,
            blocks TEXT NOT NULL,
            info TEXT NOT NULL,
            engine TEXT NOT NULL,
            seconds REAL NOT NULL,
            done_at REAL NOT NULL,
            PRIMARY KEY (job_id, page_idx)
        )
        """,
        """
        CREATE TABLE counters (
            name TEXT PRIMARY KEY,
            value REAL NOT NULL
        )
        """,
        """
        CREATE TABLE runtime (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        )
        """,
    ),
    # 1 -> 2: the status page reads the newest pages (throughput over 24 h, seconds per
    # page over the last pages) on every refresh; without an index each read sorts the
    # whole pages table, which only ever grows.
    ("CREATE INDEX pages_done_at ON pages(done_at)",),
    # 2 -> 3: the model's raw answers and the crops of each page (issue 8).
    (
        # The model's raw answers per page, for <stem>_model.json.
        """
        ALTER TABLE pages ADD COLUMN model_output TEXT
        """,
        # JPEG crops of a page's figures, kept with the page so page-level resume keeps them.
        """
        CREATE TABLE page_crops (
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            page_idx INTEGER NOT NULL,
            name TEXT NOT NULL,
            jpeg BLOB NOT NULL,
            width INTEGER NOT NULL,
            height INTEGER NOT NULL,
            PRIMARY KEY (job_id, page_idx, name)
        )
        """,
    ),
    # 3 -> 4: pages.blocks holds one versioned value (daemon.document.record.encode_blocks)
    # instead of a bare list. Rows written before are read as they are (version 0), so
    # nothing is rewritten; the bump keeps an older docinbox, which would misread the new
    # value, from opening the file.
    (),
    # 4 -> 5: hooks (issue 18). An event is written in the transaction that records the
    # outcome it tells of, with one delivery row per receiver (the transactional outbox);
    # a delivery thread works the rows off. seq orders events as they happened.
    (
        """
        CREATE TABLE events (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            type TEXT NOT NULL,
            job_id INTEGER REFERENCES jobs(id),
            created_at REAL NOT NULL,
            body TEXT NOT NULL
        )
        """,
        """
        CREATE TABLE deliveries (
            event_seq INTEGER NOT NULL REFERENCES events(seq),
            receiver TEXT NOT NULL,
            state TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            next_at REAL NOT NULL,
            since REAL NOT NULL,
            last_error TEXT,
            finished_at REAL,
            PRIMARY KEY (receiver, event_seq)
        )
        """,
        # A receiver's next pending event, and the pending/dead counts, without reading
        # the delivered rows, which only ever grow.
        """
        CREATE INDEX deliveries_state ON deliveries(state, receiver, event_seq)
        """,
    ),
]

# What the code needs, checked after migrating: a database file from elsewhere (another
# program's, a damaged restore) is refused at start with the reason, not mid-document.
EXPECTED_COLUMNS: dict[str, frozenset[str]] = {
    "documents": frozenset({"id", "sha256", "size", "first_seen"}),
    "jobs": frozenset({
        "id", "document_id", "source_path", "inbox", "subdir", "state", "attempts", "crashes",
        "error_kind", "error", "created_at", "started_at", "finished_at", "not_before",
        "engine", "duplicate_of", "page_count", "pages_done", "output_dir", "held_path",
        "seconds",
    }),
    "sources": frozenset({"path", "size", "mtime_ns", "sha256", "job_id", "first_seen",
                          "last_seen"}),
    "pages": frozenset({"job_id", "page_idx", "blocks", "info", "engine", "seconds",
                        "done_at", "model_output"}),
    "page_crops": frozenset({"job_id", "page_idx", "name", "jpeg", "width", "height"}),
    "counters": frozenset({"name", "value"}),
    "runtime": frozenset({"key", "value"}),
    "events": frozenset({"seq", "id", "type", "job_id", "created_at", "body"}),
    "deliveries": frozenset({"event_seq", "receiver", "state", "attempts", "next_at",
                             "since", "last_error", "finished_at"}),
}


class SchemaError(RuntimeError):
    """The database file is not one this docinbox can use."""


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    if readonly:
        uri = f"file:{path}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    else:
        conn = sqlite3.connect(str(path), isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    if not readonly:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


class Store:
    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        self.readonly = readonly
        if not readonly:
            path.parent.mkdir(parents=True, exist_ok=True)
            # The database holds file names: readable by the service user only.
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
            os.close(fd)
            with contextlib.suppress(OSError):
                os.chmod(path, 0o600)
        self.conn = connect(path, readonly=readonly)
        # Set by the daemon when hooks are configured: outcomes then carry their event.
        self.event_source: EventSource | None = None
        if not readonly:
            self._migrate()

    def close(self) -> None:
        self.conn.close()

    # -- plumbing -------------------------------------------------------------------

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, write lock taken up front."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            err = _unavailable(exc)
            if err is None:
                raise
            raise err from exc
        try:
            yield self.conn
            # A full disk shows here as often as in the statements: WAL pages are
            # written at commit.
            self.conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            self._rollback()
            err = _unavailable(exc)
            if err is None:
                raise
            raise err from exc
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        # SQLite may have rolled back by itself (SQLITE_FULL, SQLITE_IOERR); a connection
        # left inside a transaction would refuse every later BEGIN.
        if self.conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")

    def _migrate(self) -> None:
        with self.tx() as c:
            version = c.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise SchemaError(
                    f"{self.path} has schema version {version}, newer than this docinbox "
                    f"({SCHEMA_VERSION}); upgrade docinbox or use another state_dir"
                )
            for i in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[i]:
                    c.execute(statement)
            c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._check_schema()

    def _check_schema(self) -> None:
        """Every table and column the code uses exists.

        Read with PRAGMA table_info rather than sqlite-utils' introspection: importing
        sqlite-utils imports numpy whenever numpy is installed (the worker needs it), and
        the daemon process must stay light (tests/test_daemon_imports.py)."""
        problems = []
        tables = {
            r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        for table, wanted in EXPECTED_COLUMNS.items():
            if table not in tables:
                problems.append(f"table {table} is missing")
                continue
            columns = {r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")}
            missing = wanted - columns
            if missing:
                problems.append(f"{table} lacks column(s) {', '.join(sorted(missing))}")
        if problems:
            raise SchemaError(
                f"{self.path} is not a docinbox database this version can use: "
                + "; ".join(problems)
                + " (move it away, or point state_dir at an empty folder)"
            )

    def schema_version(self) -> int:
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

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

    def _bump(self, c: sqlite3.Connection, name: str, by: float = 1) -> None:
        c.execute(
            "INSERT INTO counters(name, value) VALUES(?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
            (name, by),
        )

    # -- ingest ---------------------------------------------------------------------

    def known_source(self, path: str, size: int, mtime_ns: int) -> bool:
        """True when this exact file (path, size, mtime) was already recorded: no re-hash."""
        row = self.conn.execute(
            "SELECT 1 FROM sources WHERE path = ? AND size = ? AND mtime_ns = ?",
            (path, size, mtime_ns),
        ).fetchone()
        return row is not None

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
    ) -> IngestResult | None:
        """Record a stable file and queue it, or mark it a duplicate.

        Returns None when nothing new happened: the same path already maps to this content
        (e.g. `after_success: keep` and the file was touched without changing).
        """
        with self.tx() as c:
            prev = c.execute("SELECT * FROM sources WHERE path = ?", (path,)).fetchone()
            if prev is not None and prev["sha256"] == sha256 and prev["job_id"] is not None:
                c.execute(
                    "UPDATE sources SET size = ?, mtime_ns = ?, last_seen = ? WHERE path = ?",
                    (size, mtime_ns, now, path),
                )
                return None
            doc = c.execute("SELECT id FROM documents WHERE sha256 = ?", (sha256,)).fetchone()
            original: Job | None = None
            if doc is None:
                doc_id = int(
                    c.execute(
                        "INSERT INTO documents(sha256, size, first_seen) VALUES(?, ?, ?)",
                        (sha256, size, now),
                    ).lastrowid
                    or 0
                )
            else:
                doc_id = int(doc["id"])
                row = c.execute(
                    self._JOB_SELECT + " WHERE jobs.document_id = ? AND jobs.state IN (?, ?, ?) "
                    "ORDER BY jobs.id LIMIT 1",
                    (doc_id, JobState.QUEUED.value, JobState.RUNNING.value, JobState.DONE.value),
                ).fetchone()
                original = Job.from_row(dict(row)) if row else None
            # A failed original does not make a re-drop a duplicate: the user most likely
            # fixed something (a password in config) and dropped it again.
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
            if duplicate:
                self._record_event(c, Outcome("document.duplicate", job, original))
            return IngestResult(job=job, duplicate=duplicate, original=original)

    def forget_source(self, path: str) -> None:
        """Drop the (path, size, mtime) memo so a file put back at the same path is seen."""
        with self.tx() as c:
            c.execute("DELETE FROM sources WHERE path = ?", (path,))

    # -- queue ------------------------------------------------------------------------

    def next_job(self, now: float) -> Job | None:
        row = self.conn.execute(
            self._JOB_SELECT + " WHERE jobs.state = ? AND jobs.not_before <= ? "
            "ORDER BY jobs.not_before > 0, jobs.id LIMIT 1",
            (JobState.QUEUED.value, now),
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

    def save_page(self, job_id: int, page: PageRecord, now: float) -> None:
        """Commit one finished page with its crops, in one transaction."""
        page_idx, crops, model_output = page.page_idx, page.crops, page.model_output
        with self.tx() as c:
            c.execute(
                "INSERT OR REPLACE INTO pages(job_id, page_idx, blocks, info, engine, seconds,"
                " done_at, model_output) VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, page_idx, encode_blocks(page.blocks), json.dumps(dict(page.info)),
                 page.engine, page.seconds, now,
                 json.dumps(dict(model_output)) if model_output is not None else None),
            )
            c.execute("DELETE FROM page_crops WHERE job_id = ? AND page_idx = ?",
                      (job_id, page_idx))
            c.executemany(
                "INSERT INTO page_crops(job_id, page_idx, name, jpeg, width, height)"
                " VALUES(?, ?, ?, ?, ?, ?)",
                [(job_id, page_idx, cr.name, cr.jpeg, cr.size[0], cr.size[1]) for cr in crops],
            )
            c.execute(
                "UPDATE jobs SET pages_done = (SELECT COUNT(*) FROM pages WHERE job_id = ?)"
                " WHERE id = ?",
                (job_id, job_id),
            )
            self._bump(c, "pages_total")
            self._bump(c, "page_seconds_total", page.seconds)

    def pages(self, job_id: int) -> list[PageRecord]:
        """A job's finished pages in page order, with their crops."""
        rows = self.conn.execute(
            "SELECT * FROM pages WHERE job_id = ? ORDER BY page_idx", (job_id,)
        ).fetchall()
        crops = self.crops(job_id)
        return [
            PageRecord(
                page_idx=r["page_idx"],
                blocks=decode_blocks(r["blocks"]),
                engine=r["engine"],
                seconds=r["seconds"],
                info=json.loads(r["info"]),
                model_output=json.loads(r["model_output"]) if r["model_output"] else None,
                crops=tuple(crops.get(r["page_idx"], ())),
            )
            for r in rows
        ]

    def crops(self, job_id: int) -> dict[int, list[Crop]]:
        """The stored crops of a job's pages, by page index."""
        rows = self.conn.execute(
            "SELECT page_idx, name, jpeg, width, height FROM page_crops WHERE job_id = ?"
            " ORDER BY page_idx, name",
            (job_id,),
        ).fetchall()
        out: dict[int, list[Crop]] = {}
        for r in rows:
            out.setdefault(int(r["page_idx"]), []).append(
                Crop(name=r["name"], jpeg=bytes(r["jpeg"]), size=(r["width"], r["height"]))
            )
        return out

    def done_pages(self, job_id: int) -> set[int]:
        rows = self.conn.execute("SELECT page_idx FROM pages WHERE job_id = ?", (job_id,))
        return {int(r[0]) for r in rows}

    def finish_job(self, job_id: int, now: float, output_dir: str, seconds: float) -> Job:
        return self._settle(
            job_id, now, JobState.DONE, "documents_done_total", output_dir=output_dir,
            seconds=seconds,
        )

    def fail_job(self, job_id: int, now: float, kind: str, error: str) -> Job:
        return self._settle(
            job_id, now, JobState.FAILED, "documents_failed_total", error_kind=kind, error=error
        )

    def _settle(self, job_id: int, now: float, end: JobState, counter: str, **fields: Any) -> Job:
        """A job reaches `done` or `failed`, and that outcome's counter moves with it."""
        with self.tx() as c:
            before = self._job(c, job_id)
            job = self._set_state(c, job_id, end, finished_at=now, not_before=0, **fields)
            self._bump(c, counter)
            if end == JobState.FAILED:
                event = "document.failed"
            elif before is not None and before.output_dir is not None:
                event = "document.reprocessed"  # it had been done before: `reprocess`
            else:
                event = "document.done"
            self._record_event(c, Outcome(event, job))
            return job

    # -- events and their deliveries (hooks) ------------------------------------------

    def _record_event(self, c: sqlite3.Connection, outcome: Outcome) -> None:
        """The outcome's event, in the caller's transaction: recorded with it or not at all."""
        if self.event_source is None:
            return
        ev = self.event_source(outcome)
        if ev is None or not ev.receivers:
            return
        seq = c.execute(
            "INSERT INTO events(id, type, job_id, created_at, body) VALUES(?, ?, ?, ?, ?)",
            (ev.id, ev.type, outcome.job.id, ev.created_at, ev.body),
        ).lastrowid
        c.executemany(
            "INSERT INTO deliveries(event_seq, receiver, state, next_at, since)"
            " VALUES(?, ?, ?, ?, ?)",
            [(seq, r, "pending", ev.created_at, ev.created_at) for r in ev.receivers],
        )

    _DELIVERY_SELECT = (
        "SELECT events.*, d.receiver, d.state, d.attempts, d.next_at, d.since, d.last_error, "
        "d.finished_at FROM deliveries d JOIN events ON events.seq = d.event_seq"
    )

    def next_delivery(self, receiver: str) -> Delivery | None:
        """The receiver's oldest pending delivery: per receiver, events go in order."""
        row = self.conn.execute(
            self._DELIVERY_SELECT + " WHERE d.state = 'pending' AND d.receiver = ? "
            "ORDER BY d.event_seq LIMIT 1",
            (receiver,),
        ).fetchone()
        return Delivery.from_row(row) if row else None

    def delivery_succeeded(self, d: Delivery, now: float) -> None:
        with self.tx() as c:
            c.execute(
                "UPDATE deliveries SET state = 'delivered', attempts = attempts + 1, "
                "finished_at = ?, last_error = NULL WHERE receiver = ? AND event_seq = ?",
                (now, d.receiver, d.seq),
            )
            self._bump(c, "hook_deliveries_total")

    def delivery_failed(self, d: Delivery, now: float, error: str, next_at: float | None) -> None:
        """A failed attempt: tried again at `next_at`, or (None) given up: dead."""
        with self.tx() as c:
            c.execute(
                "UPDATE deliveries SET attempts = attempts + 1, last_error = ?, next_at = ?, "
                "state = ?, finished_at = ? WHERE receiver = ? AND event_seq = ?",
                (error, next_at if next_at is not None else now,
                 "pending" if next_at is not None else "dead",
                 None if next_at is not None else now, d.receiver, d.seq),
            )
            self._bump(c, "hook_attempts_failed_total")
            if next_at is None:
                self._bump(c, "hook_deliveries_dead_total")

    def expire_deliveries_of_others(self, receivers: Sequence[str], now: float) -> int:
        """Pending deliveries to receivers no longer configured become dead (reported,
        and re-queued by `docinbox hooks retry --dead` once the receiver is back)."""
        marks = ",".join("?" * len(receivers))
        where = "state = 'pending'" + (f" AND receiver NOT IN ({marks})" if receivers else "")
        with self.tx() as c:
            n = c.execute(
                "UPDATE deliveries SET state = 'dead', finished_at = ?, last_error = "
                "'its receiver is no longer in the configuration' WHERE " + where,
                (now, *receivers),
            ).rowcount
            if n:
                self._bump(c, "hook_deliveries_dead_total", n)
            return int(n)

    def deliveries(
        self, states: Sequence[DeliveryState] = ("pending", "dead"), limit: int = 1000
    ) -> list[Delivery]:
        """Deliveries in `states`, oldest event first."""
        marks = ",".join("?" * len(states))
        rows = self.conn.execute(
            self._DELIVERY_SELECT + f" WHERE d.state IN ({marks}) "
            "ORDER BY d.event_seq, d.receiver LIMIT ?",
            (*states, limit),
        ).fetchall()
        return [Delivery.from_row(r) for r in rows]

    def event(self, key: str) -> tuple[int, str] | None:
        """(seq, id) of the event with this id or sequence number."""
        row = self.conn.execute(
            "SELECT seq, id FROM events WHERE id = ? OR seq = ?",
            (key, int(key) if key.isdigit() else -1),
        ).fetchone()
        return (int(row[0]), str(row[1])) if row else None

    def requeue_deliveries(self, now: float, seq: int | None = None) -> int:
        """`docinbox hooks retry`: an event's dead or waiting deliveries (or, seq None,
        every dead one) are due again now, with a fresh age."""
        with self.tx() as c:
            args: tuple[int, ...] = ()
            if seq is None:
                sql = "state = 'dead'"
            else:
                sql, args = "state IN ('dead', 'pending') AND event_seq = ?", (seq,)
            return int(c.execute(
                "UPDATE deliveries SET state = 'pending', next_at = ?, since = ?, attempts = 0, "
                "finished_at = NULL WHERE " + sql, (now, now, *args),
            ).rowcount)

    def receiver_counts(self) -> list[ReceiverCounts]:
        """Pending and dead deliveries per receiver (the index answers it; delivered
        rows are counted by the `hook_deliveries_total` counter)."""
        rows = self.conn.execute(
            "SELECT d.receiver, d.state, COUNT(*), MIN(e.created_at) FROM deliveries d "
            "JOIN events e ON e.seq = d.event_seq WHERE d.state IN ('pending', 'dead') "
            "GROUP BY d.receiver, d.state"
        ).fetchall()
        by: dict[str, dict[str, Any]] = {}
        for receiver, state, n, oldest in rows:
            r = by.setdefault(receiver, {"pending": 0, "dead": 0, "oldest": None})
            r[state] = int(n)
            if state == "pending":
                r["oldest"] = float(oldest)
        out = []
        for receiver, r in sorted(by.items()):
            head = self.next_delivery(receiver) if r["pending"] else None
            out.append(ReceiverCounts(receiver, r["pending"], r["dead"], r["oldest"],
                                      head.last_error if head else None))
        return out

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
            c.execute("DELETE FROM page_crops WHERE job_id = ?", (job_id,))
            c.execute("DELETE FROM pages WHERE job_id = ?", (job_id,))
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

    def counters(self) -> dict[str, float]:
        return {r[0]: float(r[1]) for r in self.conn.execute("SELECT name, value FROM counters")}

    def bump(self, name: str, by: float = 1) -> None:
        with self.tx() as c:
            self._bump(c, name, by)

    def oldest_queued_at(self) -> float | None:
        row = self.conn.execute(
            "SELECT MIN(created_at) FROM jobs WHERE state = ?", (JobState.QUEUED.value,)
        ).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def page_seconds(self, limit: int = 200) -> list[float]:
        rows = self.conn.execute(
            "SELECT seconds FROM pages ORDER BY done_at DESC LIMIT ?", (limit,)
        ).fetchall()
        return [float(r[0]) for r in rows]

    def pages_per_hour(self, now: float, hours: int = 24) -> list[int]:
        """Pages finished in each of the last `hours` hours, oldest first; the last
        bucket ends at `now`."""
        since = now - hours * 3600
        out = [0] * hours
        rows = self.conn.execute(
            "SELECT CAST((done_at - ?) / 3600 AS INTEGER), COUNT(*) FROM pages "
            "WHERE done_at > ? AND done_at <= ? GROUP BY 1",
            (since, since, now),
        ).fetchall()
        for bucket, n in rows:
            out[min(max(int(bucket), 0), hours - 1)] += int(n)
        return out

    # -- runtime facts (for `status` from another process) ------------------------------

    def set_runtime(self, values: dict[str, Any]) -> None:
        with self.tx() as c:
            for key, value in values.items():
                c.execute(
                    "INSERT INTO runtime(key, value) VALUES(?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (key, json.dumps(value)),
                )

    def runtime(self) -> dict[str, Any]:
        return {
            r[0]: json.loads(r[1])
            for r in self.conn.execute("SELECT key, value FROM runtime").fetchall()
        }

