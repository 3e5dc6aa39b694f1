"""The schema: every table and column, as the migrations that built it.

A migration is appended, never edited once shipped; `EXPECTED_COLUMNS` is what the code
reads, checked after migrating.
"""

from __future__ import annotations

SCHEMA_VERSION = 6

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
    # 5 -> 6: bounded state (issue 31). A published document's pages and crops leave the
    # database (the outbox folder is their copy); the status page's throughput figures
    # read page_times instead, which keeps a page's time only for a while. Pages of
    # documents done before are dropped here; the file is compacted once after this
    # migration (auto_vacuum, `Database._compact_once`). A receiver that answered 410
    # Gone stays disabled across restarts (receivers).
    (
        """
        CREATE TABLE page_times (
            job_id INTEGER NOT NULL,
            page_idx INTEGER NOT NULL,
            done_at REAL NOT NULL,
            seconds REAL NOT NULL,
            PRIMARY KEY (job_id, page_idx)
        )
        """,
        """
        INSERT INTO page_times(job_id, page_idx, done_at, seconds)
        SELECT job_id, page_idx, done_at, seconds FROM pages
        """,
        """
        CREATE INDEX page_times_done_at ON page_times(done_at)
        """,
        """
        DELETE FROM page_crops WHERE job_id IN (SELECT id FROM jobs WHERE state = 'done')
        """,
        """
        DELETE FROM pages WHERE job_id IN (SELECT id FROM jobs WHERE state = 'done')
        """,
        """
        CREATE TABLE receivers (
            name TEXT PRIMARY KEY,
            identity TEXT NOT NULL,
            disabled TEXT NOT NULL,
            since REAL NOT NULL
        )
        """,
        # Finished deliveries by age, for pruning them after hooks.retention_days.
        """
        CREATE INDEX deliveries_finished ON deliveries(finished_at)
        WHERE state IN ('delivered', 'dead')
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
    "page_times": frozenset({"job_id", "page_idx", "done_at", "seconds"}),
    "receivers": frozenset({"name", "identity", "disabled", "since"}),
}

