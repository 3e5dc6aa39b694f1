"""`/metrics`: a `Status` and its `Health` in the Prometheus text format.

Each scrape renders the one Status collected for that request through a registry of its
own (never the global REGISTRY: tests start several servers in one process, and the
daemon has no other metrics), so /metrics, /healthz and the page agree.

Counters come from the database's `counters` table, so they survive daemon restarts;
worker restarts are counted in memory and restart at 0 with the daemon (Prometheus
handles counter resets).

Seconds per page: two views, on purpose.
- `docinbox_page_seconds_total` / `docinbox_pages_processed_total` are lifetime counters
  (persisted, monotonic), so `rate(a[1h]) / rate(b[1h])` is the mean page time, the usual
  Prometheus way.
- `docinbox_recent_page_seconds` is the distribution of the last RECENT_PAGES pages. A
  window is not monotonic, so it is exposed as a *gauge histogram* (OpenMetrics type;
  Prometheus text format shows it as `histogram` with `_gsum`/`_gcount` gauges): use
  `histogram_quantile(0.9, docinbox_recent_page_seconds_bucket)` WITHOUT rate(). On a home
  server that is idle for days, a rate()-based histogram shows nothing at all; the window
  still answers "how long does a page take on this box". A true cumulative histogram
  would need per-bucket counters bumped in `Store.save_page` (same transaction as
  pages_total); they do not exist, and re-reading the whole pages table on every scrape
  would grow without bound.
"""

from __future__ import annotations

from collections.abc import Iterable

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
from daemon.common.live import Phase
from daemon.jobs.states import JobState
from daemon.service.health import Health, Verdict
from daemon.service.status import RECENT_PAGES, Queue, Status

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Seconds per page: the lite engine takes about a second, MinerU on a CPU 10 s to minutes;
# the top bucket sits at the default limits.page_timeout_seconds.
PAGE_BUCKETS: tuple[float, ...] = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 900)

# store counter name -> (metric name without _total, help). Unknown names are not
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
    "hook_deliveries_total": (
        "docinbox_hook_deliveries",
        "Events delivered to a hook (webhook or command), all receivers.",
    ),
    "hook_attempts_failed_total": (
        "docinbox_hook_attempts_failed",
        "Delivery attempts that failed (each is retried with backoff until max age).",
    ),
    "hook_deliveries_dead_total": (
        "docinbox_hook_deliveries_dead",
        "Deliveries given up (too old, or their receiver was removed or is gone).",
    ),
}


def render(status: Status, health: Health) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(status, health))
    return bytes(generate_latest(registry))


class _Collector:
    def __init__(self, status: Status, health: Health) -> None:
        self.status = status
        self.health = health

    def describe(self) -> list[Metric]:
        # Without this the registry would call collect() once at registration; names never
        # clash in a registry of our own.
        return []

    def collect(self) -> Iterable[Metric]:
        return metric_families(self.status, self.health)


def metric_families(st: Status, h: Health) -> Iterable[Metric]:
    live = st.live
    yield from _health_metrics(st, h)

    info = InfoMetricFamily("docinbox_build", "docinbox version.")
    info.add_metric([], {"version": __version__})
    yield info

    phase_now = live.worker.phase if live and not st.live_error else None
    phase = GaugeMetricFamily(
        "docinbox_worker_phase", "1 for the supervisor's current phase.", labels=["phase"]
    )
    for p in Phase:
        phase.add_metric([p.value], 1.0 if phase_now == p.value else 0.0)
    yield phase

    worker = live.worker if live else None
    yield GaugeMetricFamily(
        "docinbox_worker_rss_bytes",
        "Resident memory of the worker process.",
        value=float(worker.rss or 0) if worker else 0.0,
    )
    yield GaugeMetricFamily(
        "docinbox_worker_peak_rss_bytes",
        "Peak resident memory of the current worker.",
        value=float(worker.peak_rss or 0) if worker else 0.0,
    )
    yield CounterMetricFamily(
        "docinbox_worker_restarts",
        "Worker restarts after a crash, hang or internal error since the daemon started "
        "(resets with the daemon; recycles and engine switches are not counted).",
        value=float(worker.restarts or 0) if worker else 0.0,
    )
    yield CounterMetricFamily(
        "docinbox_engine_switches",
        "Planned switches to the fallback engine and back since the daemon started.",
        value=float(worker.switches) if worker else 0.0,
    )
    current = st.current
    if current is not None and current.eta_seconds is not None:
        yield GaugeMetricFamily(
            "docinbox_document_eta_seconds",
            "Seconds left for the document in progress, at the pace of its pages so far.",
            value=current.eta_seconds,
        )
    if h.last_heartbeat_age is not None:
        yield GaugeMetricFamily(
            "docinbox_worker_heartbeat_age_seconds",
            "Seconds since the worker was last heard from.",
            value=h.last_heartbeat_age,
        )
    if st.loop_age is not None:
        yield GaugeMetricFamily(
            "docinbox_main_loop_age_seconds",
            "Seconds since the main loop last ticked.",
            value=st.loop_age,
        )

    yield from _engine_metrics(st)
    if st.queue is None:
        return  # database unreadable: docinbox_store_readable 0 says so
    yield from _queue_metrics(st, st.queue)
    yield from _hook_metrics(st)


def _engine_metrics(st: Status) -> Iterable[Metric]:
    engine = st.engine
    einfo = InfoMetricFamily(
        "docinbox_engine",
        "The engine the worker loaded; fallback=true when the configured one could not.",
    )
    einfo.add_metric(
        [],
        {
            "engine": engine.name or st.configured_engine,
            "model": engine.model_id or "",
            "precision": engine.precision or "",
            # engine.runtime and, for `http`, the server that generates (no credentials).
            "runtime": str(engine.details.get("runtime") or ""),
            "server": str(engine.details.get("server") or ""),
            "fallback": "true" if st.fallback_reason else "false",
        },
    )
    yield einfo
    estimate = engine.estimate
    if estimate is not None and estimate.seconds is not None:
        gauge = GaugeMetricFamily(
            "docinbox_estimated_page_seconds",
            "Seconds per typical page the loaded engine is estimated at on this machine, "
            "timed at the worker's first start (the realistic bench's page).",
            labels=["engine"],
        )
        gauge.add_metric([estimate.engine or engine.name or st.configured_engine],
                         estimate.seconds)
        yield gauge


def _queue_metrics(st: Status, q: Queue) -> Iterable[Metric]:
    docs = GaugeMetricFamily("docinbox_documents", "Jobs by state.", labels=["state"])
    for s in JobState:
        docs.add_metric([s.value], float(q.counts.get(s.value, 0)))
    yield docs
    for key, (name, help_text) in COUNTERS.items():
        yield CounterMetricFamily(name, help_text, value=float(q.counters.get(key, 0.0)))
    yield GaugeMetricFamily(
        "docinbox_queue_age_seconds",
        "Age of the oldest queued job (0 when the queue is empty).",
        value=st.queue_age_seconds or 0.0,
    )
    yield _recent_histogram(q.recent_page_seconds)


def _hook_metrics(st: Status) -> Iterable[Metric]:
    d = st.queue.deliveries if st.queue else None
    receivers = d.receivers if d else ()
    pending = GaugeMetricFamily(
        "docinbox_hook_pending", "Events waiting to be delivered, per hook.", labels=["hook"]
    )
    dead = GaugeMetricFamily(
        "docinbox_hook_dead",
        "Events given up and not re-queued, per hook (`docinbox hooks retry --dead`).",
        labels=["hook"],
    )
    for r in receivers:
        pending.add_metric([r.name], float(r.pending))
        dead.add_metric([r.name], float(r.dead))
    yield pending
    yield dead
    yield GaugeMetricFamily(
        "docinbox_hook_oldest_pending_age_seconds",
        "Age of the oldest event not yet delivered (0 when none waits).",
        value=st.hooks_oldest_pending_age or 0.0,
    )


def _health_metrics(st: Status, h: Health) -> Iterable[Metric]:
    status = GaugeMetricFamily(
        "docinbox_health_status", "1 for the current /healthz status.", labels=["status"]
    )
    for v in Verdict:
        status.add_metric([v.value], 1.0 if h.verdict == v else 0.0)
    yield status
    yield GaugeMetricFamily(
        "docinbox_worker_up",
        "1 when the worker process is alive.",
        value=1.0 if h.worker_alive else 0.0,
    )
    yield GaugeMetricFamily(
        "docinbox_store_readable",
        "1 when the database could be read.",
        value=0.0 if st.queue is None else 1.0,
    )
    disk = GaugeMetricFamily(
        "docinbox_disk_free_bytes",
        "Free bytes on the filesystem holding each folder.",
        labels=["folder"],
    )
    for d in st.disks:
        if d.free is not None:
            disk.add_metric([d.name], float(d.free))
    yield disk
    inboxes = st.inboxes if not st.live_error else ()
    yield GaugeMetricFamily(
        "docinbox_inboxes_watched", "Inbox folders being watched.", value=float(len(inboxes))
    )
    ignored = GaugeMetricFamily(
        "docinbox_inbox_ignored_files",
        "Files in an inbox that match no pattern and are not junk (left in place).",
        labels=["inbox"],
    )
    for ib in inboxes:
        ignored.add_metric([ib.path], float(ib.ignored))
    yield ignored
    present = GaugeMetricFamily(
        "docinbox_inbox_present",
        "1 while the inbox folder is there and watched; 0 while it is gone or unmounted.",
        labels=["inbox"],
    )
    for ib in inboxes:
        present.add_metric([ib.path], 0.0 if ib.missing is not None else 1.0)
    yield present
    folders = GaugeMetricFamily(
        "docinbox_folder_present",
        "1 while an output folder is there; 0 while it is gone or unmounted (documents "
        "wait).",
        labels=["folder"],
    )
    for f in st.live.folders if st.live and st.running and not st.live_error else ():
        folders.add_metric([f.name], 0.0 if f.missing is not None else 1.0)
    yield folders
    shares = GaugeMetricFamily(
        "docinbox_share_answering",
        "1 while calls into a share (the mount holding an inbox or output folder) return; "
        "0 while one has not returned within the deadline (a hung NFS mount).",
        labels=["share"],
    )
    for share in st.shares if not st.live_error else ():
        shares.add_metric([share.mount], 1.0 if share.answering else 0.0)
    yield shares


def _recent_histogram(seconds: tuple[float, ...]) -> Metric:
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
