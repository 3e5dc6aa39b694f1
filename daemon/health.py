"""Optional HTTP endpoint: `GET /healthz` (JSON) and `GET /metrics` (Prometheus text).

It runs in a daemon thread of the main process (stdlib `ThreadingHTTPServer`), bound to
`http.host` (127.0.0.1 by default: the numbers include file names' counts and engine
details, and nothing here is authenticated). The caller decides whether to start it
(`cfg.http.enabled`); a port already in use raises OSError from `start_health_server`,
which the daemon should log and carry on without: the endpoint is optional, the
documents are not.

Where the numbers come from
---------------------------
- The database, through `daemon.cli.status_facts`, exactly like `docinbox status`. Every
  request opens its OWN read-only `Store`: sqlite connections must not cross threads, and
  the main loop's connection is busy writing. WAL lets this reader run beside the writer.
- `live()`, a callable the daemon passes in. It is called from the HTTP thread, so it must
  be cheap, never block and never touch the main loop's Store. The intended wiring is a
  dict the main loop rebuilds every tick (or every `RUNTIME_EVERY`) and publishes by
  rebinding one attribute, which is atomic under the GIL; `live` then returns that
  reference. Keys (all optional; a missing key means "unknown" and never raises):

    taken_at            float  time.monotonic() in the main loop when the dict was built.
                               Its age is how long the main loop has not ticked.
    phase               str    Supervisor phase: down|starting|idle|busy|stopping|fatal
    worker_pid          int|None
    worker_rss          int    bytes, last sample
    worker_peak_rss     int    bytes
    worker_restarts     int    worker (re)starts since the daemon started
    last_heartbeat_age  float|None  seconds since the supervisor last heard from the
                               worker, as of `taken_at` (None: no worker process)
    inboxes             list   `Watcher.describe()` entries (path, observer_alive,
                               scan_error, ...) or plain path strings
    engine_info         dict   name, model_id, precision (from the worker's "ready")
    fallback_reason     str|None  set when running on the fallback engine
    fatal               str|None  the supervisor's fatal message
    stopping            bool   SIGTERM received; finishing the current page

  `Supervisor.snapshot()` already carries most of these; the daemon adds taken_at,
  last_heartbeat_age, inboxes, fatal and stopping.

Health (`/healthz`)
-------------------
HTTP 200 for `ok` and `degraded`, 503 for `failing`, so a plain HTTP check (uptime-kuma,
a load balancer, `curl -f`) alerts only when a human must act. Every reason is listed.

failing:  engine fatal (weights missing, no fallback); the worker not alive for longer
          than `restart_backoff_max_seconds + heartbeat_timeout_seconds` (the supervisor
          would have restarted it by then); the main loop has not ticked for
          `loop_dead_seconds`; free space under `disk_failing_bytes` (100 MiB) on the
          outbox or state_dir filesystem, or one of them unreadable (NAS unmounted); the
          database unreadable; `live()` raising.
degraded: worker down or restarting (within the grace above); running on the fallback
          engine; free space under `disk_low_bytes` (1 GiB); main loop slow (hashing a
          big file over a slow share, database busy); an inbox whose observer died or
          whose scan fails; stopping; status not recorded in the database lately.

Metrics (`/metrics`)
--------------------
A custom prometheus_client collector in a registry per server (never the global REGISTRY:
tests start several servers in one process, and the daemon has no other metrics).
Counters come from the database's `counters` table, so they survive daemon restarts;
worker restarts are counted in memory and restart at 0 with the daemon (Prometheus
handles counter resets).

Seconds per page: two views, on purpose.
- `docinbox_page_seconds_total` / `docinbox_pages_processed_total` are lifetime counters
  (persisted, monotonic), so `rate(a[1h]) / rate(b[1h])` is the mean page time, the usual
  Prometheus way.
- `docinbox_recent_page_seconds` is the distribution of the last RECENT_PAGES pages,
  built from `store.page_seconds(limit=RECENT_PAGES)`. A window is not monotonic, so it
  is exposed as a *gauge histogram* (OpenMetrics type; Prometheus text format shows it as
  `histogram` with `_gsum`/`_gcount` gauges): use `histogram_quantile(0.9,
  docinbox_recent_page_seconds_bucket)` WITHOUT rate(). On a home server that is idle
  for days, a rate()-based histogram shows nothing at all; the window still answers "how
  long does a page take on this box". A true cumulative histogram would need
  per-bucket counters bumped in `Store.save_page` (same transaction as pages_total);
  they do not exist, and re-reading the whole pages table on every scrape would grow
  without bound.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import CollectorRegistry

from daemon import __version__
from daemon.cli import status_facts
from daemon.config import Config
from daemon.states import JobState
from daemon.store import Store, StoreBusy
from daemon.supervisor import Phase

log = logging.getLogger("docinbox.health")

LiveFn = Callable[[], Mapping[str, Any]]

OK, DEGRADED, FAILING = "ok", "degraded", "failing"
STATUSES = (OK, DEGRADED, FAILING)

RECENT_PAGES = 500
# Seconds per page: the lite engine takes about a second, MinerU on a CPU 10 s to minutes;
# the top bucket sits at the default limits.page_timeout_seconds.
PAGE_BUCKETS: tuple[float, ...] = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 900)

# status_facts counter name -> (metric name without _total, help). Unknown names are not
# exported: a metric name is an interface, renaming one breaks somebody's dashboard.
COUNTERS: dict[str, tuple[str, str]] = {
    "pages_total": ("docinbox_pages_processed", "Pages converted (all engines)."),
    "page_seconds_total": ("docinbox_page_seconds", "Seconds spent converting pages."),
    "documents_queued_total": ("docinbox_documents_queued", "New documents queued."),
    "documents_done_total": ("docinbox_documents_done", "Documents converted."),
    "documents_failed_total": ("docinbox_documents_failed", "Documents that failed."),
    "duplicates_total": (
        "docinbox_duplicates_skipped",
        "Arrivals skipped because the same content was already queued or done.",
    ),
    "worker_crashes_total": (
        "docinbox_worker_crashes",
        "Worker deaths while working on a document (crash, OOM kill, hang).",
    ),
    "output_errors_total": (
        "docinbox_output_errors",
        "Failures writing results into the outbox (each is retried with backoff).",
    ),
    "jobs_recovered_total": (
        "docinbox_jobs_recovered",
        "Jobs found running at start (daemon killed) and queued again.",
    ),
}


@dataclass(frozen=True)
class Thresholds:
    disk_failing_bytes: int = 100 * 2**20
    disk_low_bytes: int = 2**30
    # The main loop ticks every 0.25 s. Hashing a 512 MiB file over a slow share, or waiting
    # out the database's 60 s busy timeout, can stall it for a while without anything
    # being wrong; only a long stall (systemd's watchdog is the backstop) is failing.
    loop_slow_seconds: float = 30.0
    loop_dead_seconds: float = 150.0
    # Extra grace for the worker on top of restart_backoff_max + heartbeat_timeout.
    worker_grace_seconds: float = 30.0


@dataclass
class Snapshot:
    """Everything one request knows, read once so /healthz and /metrics agree."""

    wall: float
    live: dict[str, Any] = field(default_factory=dict)
    live_error: str | None = None
    loop_age: float | None = None
    facts: dict[str, Any] | None = None
    store_error: str | None = None
    oldest_queued_at: float | None = None
    recent_page_seconds: list[float] = field(default_factory=list)
    disk_free: dict[str, int | None] = field(default_factory=dict)
    disk_errors: dict[str, str] = field(default_factory=dict)


@dataclass
class Health:
    status: str
    reasons: list[str]
    worker_alive: bool
    last_heartbeat_age: float | None


def _num(value: Any) -> float | None:
    # live() and the runtime table are loosely typed JSON-ish dicts: never trust a type.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def inbox_paths(entries: Iterable[Any]) -> list[str]:
    out: list[str] = []
    for e in entries:
        if isinstance(e, Mapping):
            if e.get("path") is not None:
                out.append(str(e["path"]))
        elif e is not None:
            out.append(str(e))
    return out


class HealthView:
    """Reads one Snapshot per request and derives health and metrics from it."""

    def __init__(
        self,
        cfg: Config,
        live: LiveFn,
        *,
        thresholds: Thresholds | None = None,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        # Rebind on SIGHUP (`server.cfg = new`): folders may move with a reload.
        self.cfg = cfg
        self.live = live
        self.thresholds = thresholds or Thresholds()
        self.wall = wall
        self.monotonic = monotonic

    # -- reading ----------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        cfg = self.cfg
        snap = Snapshot(wall=self.wall())
        try:
            snap.live = dict(self.live())
        except Exception as exc:  # a bug in the daemon's live() must show up as failing
            snap.live_error = f"{type(exc).__name__}: {exc}"
        taken = _num(snap.live.get("taken_at"))
        if taken is not None:
            snap.loop_age = max(0.0, self.monotonic() - taken)
        try:
            store = Store(cfg.db_path, readonly=True)
        except sqlite3.Error as exc:
            snap.store_error = f"cannot open {cfg.db_path}: {exc}"
        else:
            try:
                snap.facts = status_facts(cfg, store, snap.wall)
                snap.oldest_queued_at = store.oldest_queued_at()
                snap.recent_page_seconds = store.page_seconds(limit=RECENT_PAGES)
            except (sqlite3.Error, StoreBusy, ValueError) as exc:
                snap.facts = None
                snap.store_error = f"cannot read {cfg.db_path}: {exc}"
            finally:
                store.close()
        for name, folder in (("outbox", cfg.outbox), ("state_dir", cfg.state_dir)):
            snap.disk_free[name] = self._free(Path(folder), name, snap)
        return snap

    @staticmethod
    def _free(folder: Path, name: str, snap: Snapshot) -> int | None:
        try:
            # shutil.disk_usage().free is f_bavail: what an unprivileged user can still
            # write, not counting the blocks reserved for root.
            return int(shutil.disk_usage(folder).free)
        except OSError as exc:
            snap.disk_errors[name] = f"{folder}: {exc.strerror or exc}"
            return None

    # -- health -----------------------------------------------------------------------

    def assess(self, snap: Snapshot) -> Health:
        th, w = self.thresholds, self.cfg.worker
        live, facts = snap.live, snap.facts or {}
        failing: list[str] = []
        degraded: list[str] = []

        if snap.live_error:
            failing.append(f"supervisor snapshot unavailable: {snap.live_error}")
        phase = live.get("phase")
        fatal = live.get("fatal") or facts.get("fatal")
        if phase == Phase.FATAL.value or fatal:
            failing.append(f"engine cannot run: {fatal or 'fatal'}")

        loop_age = snap.loop_age or 0.0
        if loop_age > th.loop_dead_seconds:
            failing.append(f"main loop has not ticked for {loop_age:.0f} s")
        elif loop_age > th.loop_slow_seconds:
            degraded.append(f"main loop busy for {loop_age:.0f} s")

        # The heartbeat age was measured when the main loop last ticked; it kept growing.
        hb = _num(live.get("last_heartbeat_age"))
        if hb is not None:
            hb += loop_age
        pid = live.get("worker_pid")
        worker_alive = (
            pid is not None
            and phase not in (Phase.DOWN.value, Phase.FATAL.value, None)
            and (hb is None or hb <= w.heartbeat_timeout_seconds)
        )
        if not worker_alive and not snap.live_error and phase != Phase.FATAL.value:
            grace = (
                w.restart_backoff_max_seconds
                + w.heartbeat_timeout_seconds
                + th.worker_grace_seconds
            )
            if hb is not None and hb > grace:
                failing.append(f"worker not alive for {hb:.0f} s (phase {phase})")
            else:
                degraded.append(f"worker not running (phase {phase})")

        if live.get("fallback_reason") or facts.get("fallback_reason"):
            reason = live.get("fallback_reason") or facts.get("fallback_reason")
            degraded.append(f"running on the fallback engine: {reason}")
        if live.get("stopping"):
            degraded.append("stopping")

        for name, err in snap.disk_errors.items():
            failing.append(f"{name} not accessible: {err}")
        for name, free in snap.disk_free.items():
            if free is None:
                continue
            if free < th.disk_failing_bytes:
                failing.append(f"{name} filesystem nearly full ({free >> 20} MiB free)")
            elif free < th.disk_low_bytes:
                degraded.append(f"{name} filesystem low on space ({free >> 20} MiB free)")

        if snap.store_error:
            failing.append(f"database unreadable: {snap.store_error}")
        elif not facts.get("running") and not snap.live_error:
            # status_facts: no runtime row written by a live pid in the last 60 s.
            degraded.append("daemon status not recorded in the database lately")

        for ib in live.get("inboxes") or []:
            if not isinstance(ib, Mapping):
                continue
            if ib.get("scan_error"):
                degraded.append(f"inbox {ib.get('path')}: {ib['scan_error']}")
            elif ib.get("observer") not in (None, "none", "poll") and not ib.get(
                "observer_alive", True
            ):
                degraded.append(f"inbox {ib.get('path')}: file watcher stopped")

        status = FAILING if failing else DEGRADED if degraded else OK
        return Health(status, failing + degraded, bool(worker_alive), hb)

    def healthz(self) -> tuple[int, dict[str, Any]]:
        snap = self.snapshot()
        h = self.assess(snap)
        live, facts = snap.live, snap.facts or {}
        info = live.get("engine_info") or facts.get("engine") or {}
        body: dict[str, Any] = {
            "status": h.status,
            "reasons": h.reasons,
            "version": __version__,
            "phase": live.get("phase"),
            "worker_alive": h.worker_alive,
            "worker_pid": live.get("worker_pid"),
            "worker_rss_bytes": live.get("worker_rss"),
            "last_heartbeat_age": None
            if h.last_heartbeat_age is None
            else round(h.last_heartbeat_age, 3),
            "loop_age": None if snap.loop_age is None else round(snap.loop_age, 3),
            "inboxes_watched": inbox_paths(live.get("inboxes") or facts.get("inboxes") or []),
            "disk_free_bytes": snap.disk_free,
            "counts": facts.get("counts"),
            "queue_age_seconds": self._queue_age(snap),
            "engine": info.get("name") if isinstance(info, Mapping) else None,
            "fallback_reason": live.get("fallback_reason") or facts.get("fallback_reason"),
            "fatal": live.get("fatal") or facts.get("fatal"),
        }
        return (503 if h.status == FAILING else 200), body

    @staticmethod
    def _queue_age(snap: Snapshot) -> float:
        # Includes jobs waiting out a retry backoff: they are queued, and waiting.
        if snap.oldest_queued_at is None:
            return 0.0
        return max(0.0, snap.wall - snap.oldest_queued_at)

    # -- metrics ----------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        snap = self.snapshot()
        h = self.assess(snap)
        live, facts = snap.live, snap.facts
        yield from self._health_metrics(snap, h)

        info = InfoMetricFamily("docinbox_build", "docinbox version.")
        info.add_metric([], {"version": __version__})
        yield info

        phase = GaugeMetricFamily(
            "docinbox_worker_phase", "1 for the supervisor's current phase.", labels=["phase"]
        )
        for p in Phase:
            phase.add_metric([p.value], 1.0 if live.get("phase") == p.value else 0.0)
        yield phase

        worker = facts["worker"] if facts else {}
        rss = _num(live.get("worker_rss"))
        if rss is None:
            rss = _num(worker.get("rss"))
        yield GaugeMetricFamily(
            "docinbox_worker_rss_bytes", "Resident memory of the worker process.", value=rss or 0.0
        )
        peak = _num(live.get("worker_peak_rss"))
        if peak is None:
            peak = _num(worker.get("peak_rss"))
        yield GaugeMetricFamily(
            "docinbox_worker_peak_rss_bytes",
            "Peak resident memory of the current worker.",
            value=peak or 0.0,
        )
        restarts = _num(live.get("worker_restarts"))
        if restarts is None:
            restarts = _num(worker.get("restarts"))
        yield CounterMetricFamily(
            "docinbox_worker_restarts",
            "Worker (re)starts since the daemon started (resets with the daemon).",
            value=restarts or 0.0,
        )
        if h.last_heartbeat_age is not None:
            yield GaugeMetricFamily(
                "docinbox_worker_heartbeat_age_seconds",
                "Seconds since the worker was last heard from.",
                value=h.last_heartbeat_age,
            )
        if snap.loop_age is not None:
            yield GaugeMetricFamily(
                "docinbox_main_loop_age_seconds",
                "Seconds since the main loop last ticked.",
                value=snap.loop_age,
            )

        engine = live.get("engine_info") or (facts or {}).get("engine") or {}
        if not isinstance(engine, Mapping):
            engine = {}
        fallback = bool(live.get("fallback_reason") or (facts or {}).get("fallback_reason"))
        einfo = InfoMetricFamily(
            "docinbox_engine",
            "The engine the worker loaded; fallback=true when the configured one could not.",
        )
        einfo.add_metric(
            [],
            {
                "engine": str(engine.get("name") or self.cfg.engine.name),
                "model": str(engine.get("model_id") or ""),
                "precision": str(engine.get("precision") or ""),
                "fallback": "true" if fallback else "false",
            },
        )
        yield einfo

        if facts is None:
            return  # database unreadable: docinbox_store_readable 0 says so
        docs = GaugeMetricFamily("docinbox_documents", "Jobs by state.", labels=["state"])
        counts = facts.get("counts") or {}
        for s in JobState:
            docs.add_metric([s.value], float(counts.get(s.value, 0)))
        yield docs
        counters = facts.get("counters") or {}
        for key, (name, help_text) in COUNTERS.items():
            yield CounterMetricFamily(name, help_text, value=float(counters.get(key, 0.0)))
        yield GaugeMetricFamily(
            "docinbox_queue_age_seconds",
            "Age of the oldest queued job (0 when the queue is empty).",
            value=self._queue_age(snap),
        )
        yield self._recent_histogram(snap.recent_page_seconds)

    def _health_metrics(self, snap: Snapshot, h: Health) -> Iterable[Metric]:
        status = GaugeMetricFamily(
            "docinbox_health_status", "1 for the current /healthz status.", labels=["status"]
        )
        for s in STATUSES:
            status.add_metric([s], 1.0 if h.status == s else 0.0)
        yield status
        yield GaugeMetricFamily(
            "docinbox_worker_up",
            "1 when the worker process is alive.",
            value=1.0 if h.worker_alive else 0.0,
        )
        yield GaugeMetricFamily(
            "docinbox_store_readable",
            "1 when the database could be read.",
            value=0.0 if snap.facts is None else 1.0,
        )
        disk = GaugeMetricFamily(
            "docinbox_disk_free_bytes",
            "Free bytes on the filesystem holding each folder.",
            labels=["folder"],
        )
        for name, free in snap.disk_free.items():
            if free is not None:
                disk.add_metric([name], float(free))
        yield disk
        inboxes = inbox_paths(snap.live.get("inboxes") or [])
        yield GaugeMetricFamily(
            "docinbox_inboxes_watched", "Inbox folders being watched.", value=float(len(inboxes))
        )

    @staticmethod
    def _recent_histogram(seconds: list[float]) -> Metric:
        buckets: list[tuple[str, float]] = []
        for bound in PAGE_BUCKETS:
            buckets.append((_le(bound), float(sum(1 for s in seconds if s <= bound))))
        buckets.append(("+Inf", float(len(seconds))))
        return GaugeHistogramMetricFamily(
            "docinbox_recent_page_seconds",
            f"Seconds per page over the last {RECENT_PAGES} pages (a window: use "
            "histogram_quantile on the buckets directly, not on rate()).",
            buckets=buckets,
            gsum_value=float(sum(seconds)),
        )


def _le(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


class _Collector:
    def __init__(self, view: HealthView) -> None:
        self.view = view

    def describe(self) -> list[Metric]:
        # Without this the registry would call collect() (and read the database) once at
        # registration; names never clash in a registry of our own.
        return []

    def collect(self) -> Iterable[Metric]:
        return self.view.collect()


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a hung client must never keep the daemon from exiting
    view: HealthView
    registry: CollectorRegistry


class _Server6(_Server):
    address_family = socket.AF_INET6  # http.host: "::1"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "docinbox"
    sys_version = ""
    # A client that connects and says nothing would otherwise hold its thread forever.
    timeout = 10

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        try:
            if path == "/healthz":
                code, body = self.server.view.healthz()
                self._send(
                    code, "application/json", (json.dumps(body, default=str) + "\n").encode()
                )
            elif path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(self.server.registry))
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")
        except Exception:
            # Never let one odd request (or a bug here) kill the thread quietly.
            log.exception("health endpoint: %s failed", path)
            self._send(500, "text/plain; charset=utf-8", b"internal error\n")

    def do_HEAD(self) -> None:
        self._send(405, "text/plain; charset=utf-8", b"", allow=True)

    def do_POST(self) -> None:
        self._send(405, "text/plain; charset=utf-8", b"GET only\n", allow=True)

    do_PUT = do_DELETE = do_PATCH = do_POST

    def _send(self, code: int, ctype: str, body: bytes, allow: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if allow:
            self.send_header("Allow", "GET")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # A scrape every 15 s would bury the journal: request lines only at DEBUG.
        log.debug("health endpoint: %s - %s", self.address_string(), format % args)


class HealthServer:
    def __init__(self, server: _Server, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def cfg(self) -> Config:
        return self._server.view.cfg

    @cfg.setter
    def cfg(self, new: Config) -> None:
        self._server.view.cfg = new

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_health_server(
    cfg: Config,
    live: LiveFn,
    *,
    thresholds: Thresholds | None = None,
    wall: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    poll_interval: float = 0.5,
) -> HealthServer:
    """Serve /healthz and /metrics on cfg.http.host:cfg.http.port (0: any free port).

    `poll_interval` bounds how long `stop()` waits for the serving thread to notice.
    """
    view = HealthView(cfg, live, thresholds=thresholds, wall=wall, monotonic=monotonic)
    cls = _Server6 if ":" in cfg.http.host else _Server
    server = cls((cfg.http.host, cfg.http.port), _Handler)
    server.view = view
    server.registry = CollectorRegistry(auto_describe=False)
    server.registry.register(_Collector(view))
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": poll_interval},
        name="docinbox-health",
        daemon=True,
    )
    thread.start()
    log.info(
        "health endpoint on http://%s:%d/healthz and /metrics",
        cfg.http.host if ":" not in cfg.http.host else f"[{cfg.http.host}]",
        server.server_address[1],
    )
    return HealthServer(server, thread)
