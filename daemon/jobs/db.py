"""The database file and its one connection: every transaction of the store goes through
`Database.tx()` (huey's pattern: one storage module family owns all SQL).

Rules that keep it safe under kill -9 and concurrent readers (`docinbox status` runs in
another process while the daemon writes):
- WAL journal, `synchronous=FULL` (a finished page or a `done` must survive power loss;
  the write volume is tiny, one commit per page), a busy timeout so a reader or a
  backup tool holding a lock makes us wait instead of fail.
- Every write is one `BEGIN IMMEDIATE` transaction: the write lock is taken up front, so
  two writers never deadlock upgrading read locks.
- Timestamps are wall-clock seconds passed in by the caller (`now`), never read here, so
  tests drive time.

The file stays small on its own (issue 31): `auto_vacuum=INCREMENTAL` lets the main loop's
ticks give freed pages back, a bounded batch a tick (`incremental_vacuum`,
daemon.jobs.upkeep), and the WAL is checkpointed and truncated there too
(`journal_size_limit` caps what a checkpoint leaves behind).

The counters and the runtime facts (two one-row-per-name tables every family writes or
`status` reads) live here too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemon.jobs.schema import EXPECTED_COLUMNS, MIGRATIONS, SCHEMA_VERSION

log = logging.getLogger("docinbox.store")

# How long a write waits for another process's lock (limits.database_wait_seconds' default).
BUSY_TIMEOUT_MS = 60_000
# What a checkpoint leaves of the WAL file at most (PRAGMA journal_size_limit).
WAL_LIMIT_BYTES = 64 * 1024 * 1024
# How long a checkpoint in the main loop waits for a reader (the status page, `docinbox
# status`) to let go of the WAL before it copies what it can and tries again later.
CHECKPOINT_WAIT_MS = 200
AUTO_VACUUM_INCREMENTAL = 2


class StoreBusy(Exception):
    """The database cannot take a write now, for a reason that is not the data's: it
    stayed locked by another process longer than the busy timeout, or (StoreFull) its
    disk is full. Callers wait and write again; nothing is failed for it."""


class StoreFull(StoreBusy):
    """The state disk is full (SQLITE_FULL): writes resume when space is freed."""


@contextlib.contextmanager
def _as_store_errors() -> Iterator[None]:
    """A lock held too long or a full disk raised as StoreBusy/StoreFull; the rest as is."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        err = _unavailable(exc)
        if err is None:
            raise
        raise err from exc


def _unavailable(exc: sqlite3.OperationalError) -> StoreBusy | None:
    """The StoreBusy that `exc` means, or None when it is some other error."""
    if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
        return StoreFull(str(exc))
    if "locked" in str(exc) or "busy" in str(exc):
        return StoreBusy(str(exc))
    return None



class SchemaError(RuntimeError):
    """The database file is not one this docinbox can use."""


def connect(
    path: Path, *, readonly: bool = False, busy_ms: int = BUSY_TIMEOUT_MS
) -> sqlite3.Connection:
    if readonly:
        uri = f"file:{path}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=busy_ms / 1000)
    else:
        conn = sqlite3.connect(str(path), isolation_level=None, timeout=busy_ms / 1000)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout={busy_ms}")
    if not readonly:
        # Before WAL: on a new, empty file it takes effect at once; an older file is
        # rebuilt with it once (Database._compact_once).
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
        conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn



@dataclass(frozen=True)
class Checkpoint:
    """What one WAL checkpoint did."""

    truncated: bool  # every frame copied and the WAL file cut to zero bytes
    frames: int  # in the WAL (-1 when not in WAL mode)
    moved: int  # copied into the database


class Database:
    """The connection, its transactions and the schema; the table families
    (daemon.jobs.queue, .pages, .deliveries) are mixins over it."""

    def __init__(
        self, path: Path, *, readonly: bool = False, busy_ms: int = BUSY_TIMEOUT_MS
    ) -> None:
        self.path = path
        self.readonly = readonly
        self.busy_ms = busy_ms  # how long a statement waits for another process's lock
        if not readonly:
            path.parent.mkdir(parents=True, exist_ok=True)
            # The database holds file names: readable by the service user only.
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
            os.close(fd)
            with contextlib.suppress(OSError):
                os.chmod(path, 0o600)
        # Opening recovers the WAL a kill left behind, which needs space: on a full state
        # disk that is StoreFull (the caller says so plainly), not a bare OperationalError.
        with _as_store_errors():
            self.conn = connect(path, readonly=readonly, busy_ms=busy_ms)
            try:
                if not readonly:
                    self._migrate()
                    self._compact_once()
            except BaseException:
                self.conn.close()
                raise

    def close(self) -> None:
        self.conn.close()

    # -- plumbing -------------------------------------------------------------------

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, write lock taken up front."""
        with _as_store_errors():
            self.conn.execute("BEGIN IMMEDIATE")
        try:
            with _as_store_errors():
                yield self.conn
                # A full disk shows here as often as in the statements: WAL pages are
                # written at commit.
                self.conn.execute("COMMIT")
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
        the daemon process must stay light (tests/house/test_daemon_imports.py)."""
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

    def _compact_once(self) -> None:
        """A file from before auto_vacuum (schema 5 and older) is rebuilt with it once, and
        so shrinks by what its migration dropped. A full disk or a lock leaves it for the
        next start: the file works the same meanwhile, it only does not shrink."""
        if self.conn.execute("PRAGMA auto_vacuum").fetchone()[0] == AUTO_VACUUM_INCREMENTAL:
            return
        log.info("compacting %s once (auto_vacuum); this may take a while", self.path)
        try:
            self.vacuum()
        except StoreBusy as exc:
            log.warning("could not compact %s now (%s); trying again at the next start",
                        self.path, exc)

    # -- keeping the file small -------------------------------------------------------

    def _outside_tx(self, sql: str) -> None:
        """A statement that runs as its own transaction (VACUUM, incremental_vacuum),
        run to its end (a PRAGMA that returns rows would stop after the first step)."""
        with _as_store_errors():
            self.conn.executescript(sql)

    def vacuum(self) -> None:
        """Rebuild the file without its free pages (`docinbox vacuum`). It holds the
        write lock while it copies, and needs free space for a copy of the file."""
        self.conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        self._outside_tx("VACUUM;")
        self.checkpoint()

    def free_pages(self) -> int:
        return int(self.conn.execute("PRAGMA freelist_count").fetchone()[0])

    def incremental_vacuum(self, pages: int) -> int:
        """Give up to `pages` free pages back to the file system; return how many."""
        before = self.free_pages()
        if before:
            self._outside_tx(f"PRAGMA incremental_vacuum({int(pages)});")
        return before - self.free_pages()

    def checkpoint(self) -> Checkpoint:
        """Copy the WAL into the database and truncate it when no reader holds it; with a
        reader, copy what it allows (PASSIVE) and leave the rest for the next time. Waits
        at most CHECKPOINT_WAIT_MS for readers, not the busy timeout: it runs in the
        main loop."""
        self.conn.execute(f"PRAGMA busy_timeout={CHECKPOINT_WAIT_MS}")
        try:
            with _as_store_errors():
                busy, frames, moved = self.conn.execute(
                    "PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                truncated = not busy
                if busy:
                    _, frames, moved = self.conn.execute(
                        "PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        finally:
            self.conn.execute(f"PRAGMA busy_timeout={self.busy_ms}")
        return Checkpoint(truncated=truncated, frames=frames, moved=moved)

    def schema_version(self) -> int:
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    def _bump(self, c: sqlite3.Connection, name: str, by: float = 1) -> None:
        c.execute(
            "INSERT INTO counters(name, value) VALUES(?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
            (name, by),
        )

    def counters(self) -> dict[str, float]:
        return {r[0]: float(r[1]) for r in self.conn.execute("SELECT name, value FROM counters")}

    def bump(self, name: str, by: float = 1) -> None:
        with self.tx() as c:
            self._bump(c, name, by)

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

