"""What docinbox is doing, as one typed value: `Status`, collected once per request.

Every reader of the daemon's state goes through here: `docinbox status` (text and
`--json`), `/healthz` (judged by `daemon.service.health.assess`), `/metrics`
(`daemon.service.metrics`) and the HTTP server. A new status fact is added in one place: a
field on the dataclass below that owns it, filled in `collect` (or in `daemon.common.live`,
when only the running daemon knows it), and written out by the `to_json` next to it.

Two sources, one shape:
- The store (SQLite): the queue, counters, recent pages and failures. Read with the
  caller's Store; the HTTP thread opens its own read-only Store per request, because a
  sqlite connection must not cross threads and WAL lets a reader run beside the writer.
- `Live` (daemon.common.live): what only the running daemon knows (worker phase and memory, the
  page in progress, inbox observers); from its memory when the daemon serves the page
  itself, else from the `runtime` row it records every few seconds.

Disk usage and the oldest queued job's age are computed here once per collection.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from daemon.common.errors import hint_for
from daemon.common.live import (
    CurrentDoc,
    EngineFacts,
    FolderFacts,
    InboxFacts,
    Live,
    LiveFn,
    WorkerFacts,
)
from daemon.common.shares import NotAnswering, Shares
from daemon.config.settings import Config
from daemon.jobs.states import JobState
from daemon.jobs.store import Store, StoreBusy

# A runtime row older than this (or written by a dead pid) means no daemon is running.
RUNNING_WITHIN_SECONDS = 60.0
# Windows over the pages table: the metrics histogram and the seconds-per-page average
# (also the page's chart).
RECENT_PAGES = 500
AVERAGE_PAGES = 200
# How many of each list a reader gets: enough for a glance, bounded per request.
RECENT_FAILURES = 5
RECENT_DONE = 15
NEXT_QUEUED = 10
# How long a request waits for a folder's free space through its share's lane: the page
# and /healthz must answer within a couple of seconds even while a share hangs.
SHARE_PATIENCE_SECONDS = 1.0


@dataclass(frozen=True)
class Failure:
    job_id: int
    path: str
    kind: str | None
    error: str | None  # the reason in plain words
    when: float | None
    hint: str  # what to do about it, with the retry command ready to paste

    @property
    def retry_command(self) -> str:
        return f"docinbox retry {self.job_id}"

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "path": self.path,
            "kind": self.kind,
            "error": self.error,
            "when": self.when,
            "hint": self.hint,
            "retry_command": self.retry_command,
        }


@dataclass(frozen=True)
class QueuedDoc:
    """A document waiting its turn."""

    job_id: int
    path: str
    size: int
    queued_at: float

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "path": self.path,
            "size": self.size,
            "queued_at": self.queued_at,
        }


@dataclass(frozen=True)
class DoneDoc:
    """A document converted recently."""

    job_id: int
    path: str
    pages: int | None  # in the document
    pages_done: int  # converted (fewer when `engine.pages` picks some)
    engine: str | None
    finished_at: float | None
    seconds: float | None

    @property
    def seconds_per_page(self) -> float | None:
        if self.seconds is None or not self.pages_done:
            return None
        return self.seconds / self.pages_done

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "path": self.path,
            "pages": self.pages,
            "pages_done": self.pages_done,
            "engine": self.engine,
            "finished_at": self.finished_at,
            "seconds_per_page": self.seconds_per_page,
        }


@dataclass(frozen=True)
class Waiting:
    """A queued job held back by a problem that is not its own (outbox full...)."""

    job_id: int
    path: str
    error: str | None
    retry_at: float

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "path": self.path,
            "error": self.error,
            "retry_at": self.retry_at,
        }


@dataclass(frozen=True)
class HookReceiver:
    """One configured hook (or one events still wait for) and how its deliveries stand."""

    name: str
    pending: int
    dead: int
    oldest_pending_at: float | None
    last_error: str | None  # of the delivery being retried
    disabled: str | None = None  # why it stopped sending (410 Gone): until `hooks retry`
    configured: bool = True

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "pending": self.pending,
            "dead": self.dead,
            "oldest_pending_at": self.oldest_pending_at,
            "last_error": self.last_error,
            "disabled": self.disabled,
            "configured": self.configured,
        }


@dataclass(frozen=True)
class Deliveries:
    """Hooks: events waiting, given up, delivered."""

    receivers: tuple[HookReceiver, ...]
    delivered: int  # lifetime, from the counters
    failed_attempts: int  # lifetime, from the counters

    @property
    def pending(self) -> int:
        return sum(r.pending for r in self.receivers)

    @property
    def dead(self) -> int:
        return sum(r.dead for r in self.receivers)

    @property
    def oldest_pending_at(self) -> float | None:
        times = [r.oldest_pending_at for r in self.receivers if r.oldest_pending_at is not None]
        return min(times) if times else None

    def to_json(self) -> dict[str, object]:
        return {
            "pending": self.pending,
            "dead": self.dead,
            "delivered": self.delivered,
            "failed_attempts": self.failed_attempts,
            "oldest_pending_at": self.oldest_pending_at,
            "receivers": [r.to_json() for r in self.receivers],
        }


def read_deliveries(
    store: Store, configured: tuple[str, ...], disabled: Mapping[str, object]
) -> Deliveries:
    counts = {c.receiver: c for c in store.receiver_counts()}
    names = list(configured) + sorted(n for n in counts if n not in configured)
    counters = store.counters()
    return Deliveries(
        receivers=tuple(
            HookReceiver(
                name=n,
                pending=counts[n].pending if n in counts else 0,
                dead=counts[n].dead if n in counts else 0,
                oldest_pending_at=counts[n].oldest_pending_at if n in counts else None,
                last_error=counts[n].last_error if n in counts else None,
                disabled=str(disabled[n]) if n in disabled else None,
                configured=n in configured,
            )
            for n in names
        ),
        delivered=int(counters.get("hook_deliveries_total", 0)),
        failed_attempts=int(counters.get("hook_attempts_failed_total", 0)),
    )


@dataclass(frozen=True)
class DiskFree:
    name: str  # the config key: outbox | state_dir
    folder: str
    free: int | None  # bytes an unprivileged writer can still use; None: unreadable
    error: str | None = None


@dataclass(frozen=True)
class ShareState:
    """A share (mount point) holding watched inboxes or output folders, and whether it
    answers: a hung hard NFS mount does not vanish, its calls never return."""

    mount: str
    answering: bool
    folders: tuple[str, ...]  # the inboxes and output folders on it


@dataclass(frozen=True)
class Queue:
    """Facts from the database."""

    counts: Mapping[str, int]  # JobState value -> jobs
    counters: Mapping[str, float]  # the store's persistent counters
    oldest_queued_at: float | None
    recent_page_seconds: tuple[float, ...]  # newest first, up to RECENT_PAGES
    avg_pages_per_document: float  # over the last 50 done documents (1.0 when none)
    recent_failures: tuple[Failure, ...]
    waiting: tuple[Waiting, ...]
    next_queued: tuple[QueuedDoc, ...]  # oldest first, up to NEXT_QUEUED
    recent_done: tuple[DoneDoc, ...]  # newest first, up to RECENT_DONE
    pages_per_hour: tuple[int, ...]  # the last 24 hours, oldest first
    deliveries: Deliveries | None = None  # hooks: None when none is configured or waiting

    @property
    def last_page_seconds(self) -> tuple[float, ...]:
        """The last AVERAGE_PAGES pages' seconds, oldest first (as a chart reads them)."""
        return tuple(reversed(self.recent_page_seconds[:AVERAGE_PAGES]))

    @property
    def seconds_per_page(self) -> float | None:
        window = self.recent_page_seconds[:AVERAGE_PAGES]
        return sum(window) / len(window) if window else None


@dataclass(frozen=True)
class WorkerLimits:
    """The configured timings `assess` judges the worker by."""

    heartbeat_timeout_seconds: float
    restart_backoff_max_seconds: float


@dataclass(frozen=True)
class Status:
    now: float  # wall clock when collected
    configured_engine: str
    limits: WorkerLimits
    # True when a daemon is up: `live` came from its memory, or it recorded its facts in
    # the database lately from a pid that is alive.
    running: bool
    # The database holds facts from a live daemon written within RUNNING_WITHIN_SECONDS.
    recorded: bool
    live: Live | None  # None: no daemon has ever recorded anything
    live_error: str | None  # the daemon's in-memory facts could not be read (a bug)
    loop_age: float | None  # seconds since the main loop last ticked (in-process only)
    queue: Queue | None  # None: the database could not be read (store_error says why)
    store_error: str | None
    disks: tuple[DiskFree, ...]

    @property
    def uptime(self) -> float | None:
        if not self.running or self.live is None or not self.live.started_at:
            return None
        return self.now - self.live.started_at

    @property
    def current(self) -> CurrentDoc | None:
        return self.live.current if self.running and self.live else None

    @property
    def engine(self) -> EngineFacts:
        return self.live.engine if self.live else EngineFacts(name=None)

    @property
    def fallback_reason(self) -> str | None:
        return self.live.fallback_reason if self.live else None

    @property
    def fallback_fix(self) -> str | None:
        """What brings the configured engine back, for a person reading a FALLBACK."""
        reason = self.fallback_reason
        if not reason:
            return None
        if "server" in reason:
            return (
                "start the MinerU server (docs/scale-out.md); docinbox looks at it every "
                "engine.http.reprobe_seconds and switches back by itself"
            )
        return "`docinbox model pull`, restart, then `docinbox reprocess --all`"

    @property
    def fatal(self) -> str | None:
        return self.live.fatal if self.live else None

    @property
    def inboxes(self) -> tuple[InboxFacts, ...]:
        return self.live.inboxes if self.live else ()

    @property
    def missing_folders(self) -> tuple[FolderFacts, ...]:
        """Output folders that are gone (a share unmounted): documents wait for them."""
        if not self.running or self.live is None:
            return ()
        return tuple(f for f in self.live.folders if f.missing is not None)

    @property
    def shares(self) -> tuple[ShareState, ...]:
        """Every share the running daemon calls into, in the order first met."""
        if not self.running or self.live is None:
            return ()
        found: dict[str, ShareState] = {}
        places = [(ib.share, ib.answering, ib.path) for ib in self.live.inboxes]
        places += [(f.share, f.answering, f.path) for f in self.live.folders]
        for mount, answering, path in places:
            if mount is None:
                continue
            old = found.get(mount)
            found[mount] = ShareState(
                mount,
                answering and (old is None or old.answering),
                (old.folders if old else ()) + (path,),
            )
        return tuple(found.values())

    @property
    def worker(self) -> WorkerFacts:
        """The worker as a reader should see it: only a running daemon has one."""
        w = self.live.worker if self.live else WorkerFacts(phase="stopped")
        if self.running:
            taken = self.live.updated_at if self.live else None
            if w.next_start_in is None or taken is None:
                return w
            # Counted from when the facts were taken (the row is rewritten every few
            # seconds), down to now.
            left = max(0.0, w.next_start_in - max(0.0, self.now - taken))
            return dataclasses.replace(w, next_start_in=left)
        return WorkerFacts(
            phase="stopped", peak_rss=w.peak_rss, restarts=w.restarts, switches=w.switches
        )

    @property
    def seconds_per_page(self) -> float | None:
        return self.queue.seconds_per_page if self.queue else None

    @property
    def eta_seconds(self) -> float | None:
        """Pages left (the current document's plus queued documents at the recent
        average size) times the recent seconds per page."""
        avg = self.seconds_per_page
        if self.queue is None or avg is None:
            return None
        remaining = 0
        cur = self.current
        if cur and cur.pages:
            remaining += cur.pages - (cur.page or 1) + 1
        remaining += int(self.queue.counts.get(JobState.QUEUED.value, 0)
                         * self.queue.avg_pages_per_document)
        return remaining * avg if remaining else None

    @property
    def queue_age_seconds(self) -> float | None:
        """Age of the oldest queued job, including jobs waiting out a retry backoff."""
        if self.queue is None or self.queue.oldest_queued_at is None:
            return None
        return self.now - self.queue.oldest_queued_at

    @property
    def disk_free(self) -> dict[str, int | None]:
        return {d.name: d.free for d in self.disks}

    def to_json(self) -> dict[str, object]:
        """`docinbox status --json` (and the page's /status.json)."""
        live, w, q = self.live, self.worker, self.queue
        estimate = self.engine.estimate
        return {
            "running": self.running,
            "pid": live.pid if live and self.running else None,
            "version": live.version if live else None,
            "uptime": self.uptime,
            "engine": self.engine.to_json(),
            "estimated_page_seconds": estimate.seconds if estimate else None,
            "configured_engine": self.configured_engine,
            "fallback_reason": self.fallback_reason,
            "fatal": self.fatal,
            "worker": {
                "phase": w.phase,
                "pid": w.pid,
                "rss": w.rss,
                "peak_rss": w.peak_rss,
                "restarts": w.restarts,
                "engine_switches": w.switches,
                "last_heartbeat_age": w.last_heartbeat_age,
                "failed_starts": w.failed_starts,
                "last_crash": w.last_crash,
                "next_start_in": w.next_start_in,
            },
            "current": self.current.to_json() if self.current else None,
            "counts": dict(q.counts) if q else None,
            "counters": dict(q.counters) if q else None,
            "seconds_per_page": self.seconds_per_page,
            "eta_seconds": self.eta_seconds,
            "queue_age_seconds": self.queue_age_seconds,
            "disk_free_bytes": self.disk_free,
            "inboxes": [ib.to_json() for ib in self.inboxes],
            "folders": [f.to_json() for f in live.folders] if live and self.running else [],
            "recent_failures": [f.to_json() for f in q.recent_failures] if q else [],
            "waiting": [wt.to_json() for wt in q.waiting] if q else [],
            "next_queued": [d.to_json() for d in q.next_queued] if q else [],
            "recent_documents": [d.to_json() for d in q.recent_done] if q else [],
            "pages_per_hour": list(q.pages_per_hour) if q else [],
            "recent_page_seconds": list(q.last_page_seconds) if q else [],
            "hooks": q.deliveries.to_json() if q and q.deliveries else None,
        }

    @property
    def hooks_oldest_pending_age(self) -> float | None:
        d = self.queue.deliveries if self.queue else None
        if d is None or d.oldest_pending_at is None:
            return None
        return max(0.0, self.now - d.oldest_pending_at)


# -- collecting -----------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by someone else
    return True


def read_queue(store: Store, now: float) -> Queue:
    done = store.jobs(JobState.DONE, limit=50)
    sized = [j for j in done if j.page_count]
    avg_pages = sum(j.page_count or 0 for j in sized) / len(sized) if sized else 1.0
    return Queue(
        counts=store.counts(),
        counters=store.counters(),
        oldest_queued_at=store.oldest_queued_at(),
        recent_page_seconds=tuple(store.page_seconds(limit=RECENT_PAGES)),
        avg_pages_per_document=avg_pages,
        recent_failures=tuple(
            Failure(
                j.id,
                j.source_path,
                j.error_kind,
                j.error,
                j.finished_at,
                hint_for(j.error_kind or "", j.id),
            )
            for j in store.jobs(JobState.FAILED, limit=RECENT_FAILURES)
        ),
        waiting=tuple(
            Waiting(j.id, j.source_path, j.error, j.not_before)
            for j in store.jobs(JobState.QUEUED, limit=200)
            if j.error
        ),
        next_queued=tuple(
            QueuedDoc(j.id, j.source_path, j.size, j.created_at)
            for j in store.jobs(JobState.QUEUED, limit=NEXT_QUEUED, newest_first=False)
        ),
        recent_done=tuple(
            DoneDoc(
                j.id, j.source_path, j.page_count, j.pages_done, j.engine, j.finished_at,
                j.seconds,
            )
            for j in done[:RECENT_DONE]
        ),
        pages_per_hour=tuple(store.pages_per_hour(now)),
    )


def disk_free(
    name: str,
    folder: Path,
    hung: frozenset[str] = frozenset(),
    shares: Shares | None = None,
) -> DiskFree:
    """`hung`: folders whose share does not answer (the running daemon's facts): asking
    the file system would hang this request too, so their free space is unknown.
    `shares`: the running daemon's lanes; the question then goes through the folder's
    lane with a short patience, so a share that hangs before the daemon has marked it
    (or while a look into it is outstanding) costs this request a second, not a deadline.
    """
    if str(folder) in hung:
        return DiskFree(name, str(folder), None)
    try:
        # shutil.disk_usage().free is f_bavail: what an unprivileged user can still
        # write, not counting the blocks reserved for root.
        if shares is None:
            return DiskFree(name, str(folder), int(shutil.disk_usage(folder).free))
        usage = shares.call(
            folder, lambda: shutil.disk_usage(folder), patience=SHARE_PATIENCE_SECONDS
        )
        return DiskFree(name, str(folder), int(usage.free))
    except NotAnswering:
        return DiskFree(name, str(folder), None)  # as for a share known to hang
    except OSError as exc:
        return DiskFree(name, str(folder), None, f"{folder}: {exc.strerror or exc}")


def collect(
    cfg: Config,
    *,
    now: float,
    store: Store | None = None,
    live: LiveFn | None = None,
    monotonic: float | None = None,
    shares: Shares | None = None,
) -> Status:
    """One Status. `store`: an open Store to read (else a read-only one is opened and
    closed here). `live`: the running daemon's own facts (in-process only), with
    `monotonic` the caller's monotonic clock to age them; `shares`: its share lanes, for
    the folders' free space (see `disk_free`)."""
    recorded_live: Live | None = None
    queue: Queue | None = None
    store_error: str | None = None
    own = store is None
    try:
        if store is None:
            store = Store.of(cfg, readonly=True)
    except sqlite3.Error as exc:
        store_error = f"cannot open {cfg.db_path}: {exc}"
    else:
        try:
            rt = store.runtime()
            recorded_live = Live.from_runtime(rt) if rt else None
            queue = read_queue(store, now)
            configured = tuple(h.receiver for h in cfg.hooks.webhooks) + tuple(
                h.receiver for h in cfg.hooks.commands
            )
            disabled = rt.get("hooks_disabled")
            deliveries = read_deliveries(
                store, configured, disabled if isinstance(disabled, dict) else {}
            )
            if deliveries.receivers:
                queue = dataclasses.replace(queue, deliveries=deliveries)
        except (sqlite3.Error, StoreBusy, ValueError) as exc:
            queue = None
            store_error = f"cannot read {cfg.db_path}: {exc}"
        finally:
            if own:
                store.close()
    recorded = bool(
        recorded_live is not None
        and recorded_live.pid is not None
        and pid_alive(recorded_live.pid)
        and now - (recorded_live.updated_at or 0.0) < RUNNING_WITHIN_SECONDS
    )

    current: Live | None = recorded_live
    live_error: str | None = None
    loop_age: float | None = None
    if live is not None:
        try:
            current = live()
        except Exception as exc:  # a bug in the daemon's live() must show up as failing
            live_error = f"{type(exc).__name__}: {exc}"
        else:
            if current.taken_at is not None and monotonic is not None:
                loop_age = max(0.0, monotonic - current.taken_at)
    return Status(
        now=now,
        configured_engine=cfg.engine.name,
        limits=WorkerLimits(
            cfg.worker.heartbeat_timeout_seconds, cfg.worker.restart_backoff_max_seconds
        ),
        running=recorded or (live is not None and live_error is None),
        recorded=recorded,
        live=current,
        live_error=live_error,
        loop_age=loop_age,
        queue=queue,
        store_error=store_error,
        disks=_disks(cfg, current, shares),
    )


def _disks(cfg: Config, live: Live | None, shares: Shares | None) -> tuple[DiskFree, ...]:
    hung = frozenset(f.path for f in (live.folders if live is not None else ()) if not f.answering)
    return (
        disk_free("outbox", cfg.outbox, hung, shares),
        disk_free("state_dir", cfg.state_dir, hung, shares),
    )
