"""The store: everything durable, in one SQLite file in `state_dir`.

Which contents we have seen (documents, by sha256), every path where they turned up
(sources), the queue (jobs), the per-page results that let a crash at page 40 of 50 resume
at page 40 (pages), and the events told to hooks with their deliveries.

`Store` is one object over one connection; its table families are modules of their own,
all SQL of the daemon stays in this package:

- daemon.jobs.db: the connection, `tx()`, the schema check, counters and runtime facts;
- daemon.jobs.schema: the migrations;
- daemon.jobs.queue: documents, sources, jobs and their outcomes;
- daemon.jobs.pages: finished pages and their crops;
- daemon.jobs.deliveries: events and their deliveries;
- daemon.jobs.upkeep (over a Store): what keeps the file bounded, a batch a tick.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daemon.jobs.db import (
    BUSY_TIMEOUT_MS,
    SchemaError,
    StoreBusy,
    StoreFull,
    _unavailable,
    connect,
)
from daemon.jobs.deliveries import (
    Delivery,
    DeliveryState,
    EventRecords,
    NewEvent,
    ReceiverCounts,
)
from daemon.jobs.pages import PageRecords
from daemon.jobs.queue import (
    EventMaker,
    IngestResult,
    Job,
    JobRecords,
    NoEvents,
    Outcome,
    Published,
    StaleEvent,
)
from daemon.jobs.schema import EXPECTED_COLUMNS, MIGRATIONS, SCHEMA_VERSION

__all__ = [
    "BUSY_TIMEOUT_MS",
    "EXPECTED_COLUMNS",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Delivery",
    "DeliveryState",
    "EventMaker",
    "IngestResult",
    "Job",
    "NewEvent",
    "NoEvents",
    "Outcome",
    "Published",
    "ReceiverCounts",
    "SchemaError",
    "StaleEvent",
    "Store",
    "StoreBusy",
    "StoreFull",
    "_unavailable",
    "connect",
]


if TYPE_CHECKING:
    from daemon.config.settings import Config


class Store(JobRecords, PageRecords, EventRecords):
    """The database of one daemon (or a reader of it: `readonly`)."""

    @classmethod
    def of(cls, cfg: Config, *, readonly: bool = False) -> Store:
        """The store of `cfg`'s state_dir, its writes waiting limits.database_wait_seconds
        for another process's lock."""
        wait_ms = round(cfg.limits.database_wait_seconds * 1000)
        return cls(cfg.db_path, readonly=readonly, busy_ms=wait_ms)
