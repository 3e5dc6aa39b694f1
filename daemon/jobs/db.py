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

The counters and the runtime facts (two one-row-per-name tables every family writes or
`status` reads) live here too.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from daemon.jobs.schema import EXPECTED_COLUMNS, MIGRATIONS, SCHEMA_VERSION

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



class Database:
    """The connection, its transactions and the schema; the table families
    (daemon.jobs.queue, .pages, .deliveries) are mixins over it."""

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

