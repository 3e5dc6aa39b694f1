"""What only the running daemon knows, as frozen values: `Live` and its parts.

The daemon builds one `Live` per main-loop tick (worker phase and memory, the page in
progress, inbox observers, the engine the worker loaded) and rebinds it for its HTTP
thread, which reads it without a lock. Every few seconds it is also written to the
store's `runtime` table (`Live.to_runtime`) for `docinbox status`, which runs in another
process and reads it back with `Live.from_runtime`: that row is JSON written by another
process (maybe an older version), so reading it never trusts a type.

`daemon.service.status` combines a Live with what the database says into the one `Status`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# JSON-able leaf values: what the runtime table and the engine's free-form facts hold.
Scalar = str | int | float | bool | None


# -- parsing the loosely typed runtime row (JSON written by another process) ------------


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _int(value: object) -> int | None:
    n = _num(value)
    return None if n is None else int(n)


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _map(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def scalars(value: object) -> dict[str, Scalar]:
    """The scalar values of a mapping as they are, anything else as its text."""
    return {
        str(k): v if isinstance(v, str | int | float | bool) or v is None else str(v)
        for k, v in _map(value).items()
    }


# -- the parts ------------------------------------------------------------------------

# Above this many seconds per typical page, the start says MinerU is slow here and names
# the two ways out.
SLOW_PAGE_SECONDS = 180.0
WAYS_OUT = (
    "set engine.name: lite (text layer + OCR, seconds per page), or engine.runtime: http "
    "with engine.http.server_url (a MinerU server on a faster machine)"
)

@dataclass(frozen=True)
class PageEstimate:
    """What every surface shows of the page estimate (daemon/common/estimate.py): seconds
    per typical page on this machine, or why there is no figure."""

    engine: str
    seconds: float | None  # None: not applicable to this engine or runtime (`basis` says why)
    basis: str  # how it was got: timed now, read from the cache, or why none

    @property
    def slow(self) -> bool:
        return self.seconds is not None and self.seconds > SLOW_PAGE_SECONDS

    def warning(self) -> str | None:
        """The start's warning when MinerU would take minutes per page here."""
        if not self.slow or self.seconds is None:
            return None
        return (
            f"engine {self.engine} is estimated at {self.seconds / 60:.0f} min per typical "
            f"page on this machine; for faster pages {WAYS_OUT}"
        )

    def describe(self) -> str:
        if self.seconds is None:
            return self.basis
        return f"~{self.seconds:,.0f} s per typical page ({self.basis})"

    def to_json(self) -> dict[str, object]:
        return {"engine": self.engine, "seconds": self.seconds, "basis": self.basis}

    @classmethod
    def from_json(cls, raw: object) -> PageEstimate | None:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("basis"), str):
            return None
        seconds = raw.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            seconds = None
        return cls(str(raw.get("engine") or ""), seconds, raw["basis"])




@dataclass(frozen=True)
class EngineFacts:
    """The engine the worker loaded (`loaded`), or only the configured name before that."""

    name: str | None
    model_id: str | None = None
    revision: str | None = None
    precision: str | None = None
    details: Mapping[str, Scalar] = field(default_factory=dict)
    loaded: bool = False
    # Seconds per typical page on this machine, as the worker timed (or read) it at start.
    estimate: PageEstimate | None = None

    @property
    def runtime(self) -> str | None:
        """How the model runs (transformers, http, llama-cpp), when the engine says."""
        return _str(self.details.get("runtime"))

    @property
    def server(self) -> str | None:
        """The model server, for the http runtime."""
        return _str(self.details.get("server"))

    def to_json(self) -> dict[str, object]:
        if not self.loaded:
            return {"name": self.name}
        return {
            "name": self.name,
            "model_id": self.model_id,
            "revision": self.revision,
            "precision": self.precision,
            "details": dict(self.details),
            "estimate": self.estimate.to_json() if self.estimate else None,
        }

    @classmethod
    def from_json(cls, raw: object, name: str | None) -> EngineFacts:
        """`raw`: the worker's EngineInfo as a dict ({} before the worker is ready)."""
        info = _map(raw)
        if not info:
            return cls(name=name)
        return cls(
            name=_str(info.get("name")) or name,
            model_id=_str(info.get("model_id")),
            revision=_str(info.get("revision")),
            precision=_str(info.get("precision")),
            details=scalars(info.get("details")),
            loaded=True,
            estimate=PageEstimate.from_json(info.get("estimate")),
        )


@dataclass(frozen=True)
class CurrentDoc:
    """The document in progress: page n/N (1-based) and block k/K inside the page."""

    job_id: int
    path: str
    page: int | None
    pages: int | None
    block: tuple[int, int] | None
    stage: str | None
    # Pages of the document in the engine at once (engines with max_pages_in_flight > 1).
    pages_in_flight: int = 1
    # Seconds left for the document's remaining pages, at the pace of the pages done so
    # far in this run (None before the first page is done), as of the last page done.
    eta_seconds: float | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "path": self.path,
            "page": self.page,
            "pages": self.pages,
            "block": list(self.block) if self.block else None,
            "stage": self.stage,
            "pages_in_flight": self.pages_in_flight,
            "eta_seconds": self.eta_seconds,
        }

    @classmethod
    def from_json(cls, raw: object) -> CurrentDoc | None:
        d = _map(raw)
        job_id = _int(d.get("job_id"))
        if job_id is None:
            return None
        block = d.get("block")
        pair: tuple[int, int] | None = None
        if isinstance(block, list | tuple) and len(block) == 2:
            k, n = _int(block[0]), _int(block[1])
            pair = (k, n) if k is not None and n is not None else None
        return cls(
            job_id=job_id,
            path=str(d.get("path") or ""),
            page=_int(d.get("page")),
            pages=_int(d.get("pages")),
            block=pair,
            stage=_str(d.get("stage")),
            pages_in_flight=_int(d.get("pages_in_flight")) or 1,
            eta_seconds=_num(d.get("eta_seconds")),
        )


class Phase(str, enum.Enum):
    """Where the supervisor is with its worker. Kept here, with the facts that carry it,
    so the surfaces (health, metrics) read its values without importing the supervisor."""

    DOWN = "down"  # no worker; (re)start when backoff allows
    STARTING = "starting"  # spawned, loading the engine
    IDLE = "idle"
    BUSY = "busy"
    STOPPING = "stopping"  # asked to exit; waiting for it
    FATAL = "fatal"  # the engine cannot run here and there is no fallback
    # No worker on purpose: idle for worker.idle_unload_seconds, its memory given back; the
    # next document starts one. Healthy. The value is what every surface shows as is.
    UNLOADED = "unloaded (idle)"


@dataclass(frozen=True)
class WorkerFacts:
    phase: str  # a Phase value; "stopped" when no daemon runs
    pid: int | None = None
    rss: int | None = None  # bytes, last sample
    peak_rss: int | None = None
    restarts: int | None = None  # worker restarts after a crash since the daemon started
    # Planned engine switches: to the fallback engine when the configured one cannot run,
    # and back when its server answers again. Not restarts: nothing went wrong.
    switches: int = 0
    # Seconds since the supervisor last heard from the worker, as of the main loop's
    # tick (None: no worker process).
    last_heartbeat_age: float | None = None
    # Workers in a row that died before their engine was loaded (a crash at import: they
    # never take a document, so no job says so), why the last one died unasked, and the
    # seconds until the next restart (None: none waits), as of the main loop's tick.
    failed_starts: int = 0
    last_crash: str | None = None
    next_start_in: float | None = None


@dataclass(frozen=True)
class SupervisorFacts:
    """What `Supervisor.snapshot()` knows."""

    engine: EngineFacts
    fallback_reason: str | None
    fatal: str | None
    worker: WorkerFacts
    current: CurrentDoc | None


@dataclass(frozen=True)
class InboxFacts:
    """One watched inbox, as `Watcher.describe()` reports it (and, as JSON, the runtime
    row `docinbox status` reads back)."""

    path: str
    recursive: bool | None = None
    watch: str | None = None
    observer: str | None = None  # inotify|poll|none|...
    observer_alive: bool = True
    reason: str | None = None  # why this observer was chosen
    pending: int = 0  # files settling (stability check)
    open_for_write: int = 0  # of those, still open for writing by someone
    scan_error: str | None = None
    scanned_at: float | None = None  # wall, when the last complete scan began
    ignored: int = 0  # files matching no pattern (not junk), left in place
    ignored_names: tuple[str, ...] = ()  # a few of them, relative to the inbox
    # Set while the folder is gone, replaced by a bare mount point or unreachable: why,
    # and since when (wall clock).
    missing: str | None = None
    missing_since: float | None = None
    # The mount point holding it (its share), and whether that share answers: False
    # while a call into it has not returned for the deadline (a hung NFS mount).
    share: str | None = None
    answering: bool = True

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "recursive": self.recursive,
            "watch": self.watch,
            "observer": self.observer,
            "observer_alive": self.observer_alive,
            "reason": self.reason,
            "pending": self.pending,
            "open_for_write": self.open_for_write,
            "scan_error": self.scan_error,
            "scanned_at": self.scanned_at,
            "ignored": self.ignored,
            "ignored_names": list(self.ignored_names),
            "missing": self.missing,
            "missing_since": self.missing_since,
            "share": self.share,
            "answering": self.answering,
        }

    @classmethod
    def from_json(cls, raw: object) -> InboxFacts | None:
        if isinstance(raw, str):
            return cls(path=raw)
        d = _map(raw)
        if d.get("path") is None:
            return None
        alive = d.get("observer_alive")
        recursive = d.get("recursive")
        names = d.get("ignored_names")
        return cls(
            path=str(d["path"]),
            recursive=recursive if isinstance(recursive, bool) else None,
            watch=_str(d.get("watch")),
            observer=_str(d.get("observer")),
            observer_alive=alive if isinstance(alive, bool) else True,
            reason=_str(d.get("reason")),
            pending=_int(d.get("pending")) or 0,
            open_for_write=_int(d.get("open_for_write")) or 0,
            scan_error=_str(d.get("scan_error")),
            scanned_at=_num(d.get("scanned_at")),
            ignored=_int(d.get("ignored")) or 0,
            ignored_names=tuple(str(n) for n in names) if isinstance(names, list) else (),
            missing=_str(d.get("missing")),
            missing_since=_num(d.get("missing_since")),
            share=_str(d.get("share")),
            answering=d.get("answering") is not False,
        )


@dataclass(frozen=True)
class FolderFacts:
    """An output folder (outbox, archive, failed, duplicates) the daemon looks at every
    few seconds: documents wait while one is missing."""

    name: str  # the config key
    path: str
    missing: str | None = None
    missing_since: float | None = None  # wall
    share: str | None = None  # the mount point holding it
    answering: bool = True  # False while its share hangs

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "path": self.path,
            "missing": self.missing,
            "missing_since": self.missing_since,
            "share": self.share,
            "answering": self.answering,
        }

    @classmethod
    def from_json(cls, raw: object) -> FolderFacts | None:
        d = _map(raw)
        if d.get("name") is None or d.get("path") is None:
            return None
        return cls(
            name=str(d["name"]),
            path=str(d["path"]),
            missing=_str(d.get("missing")),
            missing_since=_num(d.get("missing_since")),
            share=_str(d.get("share")),
            answering=d.get("answering") is not False,
        )


@dataclass(frozen=True)
class Live:
    """What the running daemon knows in memory, taken once per main-loop tick."""

    pid: int | None
    started_at: float | None  # wall
    updated_at: float | None  # wall, when taken
    version: str | None
    configured_engine: str | None
    engine: EngineFacts
    fallback_reason: str | None
    fatal: str | None
    stopping: bool
    worker: WorkerFacts
    current: CurrentDoc | None
    inboxes: tuple[InboxFacts, ...]
    folders: tuple[FolderFacts, ...] = ()
    # time.monotonic() of the main loop when taken: its age is how long the loop has not
    # ticked. None when read back from the database (another process' clock).
    taken_at: float | None = None

    def headline(self) -> tuple[object, ...]:
        """What a reader must see as soon as it changes: the daemon records its facts at
        once when this differs, and every few seconds otherwise (a page's progress may be
        seconds old; a switch to the fallback engine or a vanished inbox may not, or
        `docinbox status` could show a state older than the documents it lists)."""
        return (
            self.worker.phase,
            self.worker.restarts,
            self.worker.switches,
            self.worker.failed_starts,
            self.worker.last_crash,
            self.engine.name,
            self.engine.loaded,
            self.fallback_reason,
            self.fatal,
            self.stopping,
            self.current.job_id if self.current else None,
            tuple((ib.path, ib.observer, ib.missing) for ib in self.inboxes),
            tuple((f.name, f.missing) for f in self.folders),
        )

    def to_runtime(self) -> dict[str, object]:
        """The row `docinbox status` reads from another process (keys kept stable: the
        runtime table outlives an upgrade)."""
        return {
            "pid": self.pid,
            "started_at": self.started_at,
            "updated_at": self.updated_at,
            "version": self.version,
            "configured_engine": self.configured_engine,
            "phase": self.worker.phase,
            "engine": self.engine.name,
            "engine_info": self.engine.to_json() if self.engine.loaded else {},
            "fallback_reason": self.fallback_reason,
            "fatal": self.fatal,
            "stopping": self.stopping,
            "worker_pid": self.worker.pid,
            "worker_rss": self.worker.rss,
            "worker_peak_rss": self.worker.peak_rss,
            "worker_restarts": self.worker.restarts,
            "worker_switches": self.worker.switches,
            "last_heartbeat_age": self.worker.last_heartbeat_age,
            "worker_failed_starts": self.worker.failed_starts,
            "worker_last_crash": self.worker.last_crash,
            "worker_next_start_in": self.worker.next_start_in,
            "current": self.current.to_json() if self.current else None,
            "inboxes": [ib.to_json() for ib in self.inboxes],
            "folders": [f.to_json() for f in self.folders],
        }

    @classmethod
    def from_runtime(cls, rt: Mapping[str, object]) -> Live:
        raw_inboxes = rt.get("inboxes")
        inboxes = [
            InboxFacts.from_json(e) for e in (raw_inboxes if isinstance(raw_inboxes, list) else [])
        ]
        raw_folders = rt.get("folders")
        folders = [
            FolderFacts.from_json(e) for e in (raw_folders if isinstance(raw_folders, list) else [])
        ]
        return cls(
            pid=_int(rt.get("pid")),
            started_at=_num(rt.get("started_at")),
            updated_at=_num(rt.get("updated_at")),
            version=_str(rt.get("version")),
            configured_engine=_str(rt.get("configured_engine")),
            engine=EngineFacts.from_json(rt.get("engine_info"), _str(rt.get("engine"))),
            fallback_reason=_str(rt.get("fallback_reason")),
            fatal=_str(rt.get("fatal")),
            stopping=rt.get("stopping") is True,
            worker=WorkerFacts(
                phase=_str(rt.get("phase")) or "stopped",
                pid=_int(rt.get("worker_pid")),
                rss=_int(rt.get("worker_rss")),
                peak_rss=_int(rt.get("worker_peak_rss")),
                restarts=_int(rt.get("worker_restarts")),
                switches=_int(rt.get("worker_switches")) or 0,
                last_heartbeat_age=_num(rt.get("last_heartbeat_age")),
                failed_starts=_int(rt.get("worker_failed_starts")) or 0,
                last_crash=_str(rt.get("worker_last_crash")),
                next_start_in=_num(rt.get("worker_next_start_in")),
            ),
            current=CurrentDoc.from_json(rt.get("current")),
            inboxes=tuple(ib for ib in inboxes if ib is not None),
            folders=tuple(f for f in folders if f is not None),
        )


# The daemon's accessor for its latest Live (called from the HTTP thread).
LiveFn = Callable[[], Live]
