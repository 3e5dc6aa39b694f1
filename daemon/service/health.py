"""Judging a `Status`: ok, degraded or failing, and why. Pure: no I/O, no clock.

`/healthz` answers HTTP 200 for `ok` and `degraded`, 503 for `failing`, so a plain HTTP
check (uptime-kuma, a load balancer, `curl -f`) alerts only when a human must act. Every
reason is listed.

failing:  engine fatal (weights missing, no fallback); the worker not alive for longer
          than `restart_backoff_max_seconds + heartbeat_timeout_seconds` (the supervisor
          would have restarted it by then); the main loop has not ticked for
          `loop_dead_seconds`; free space under `disk_failing_bytes` (100 MiB) on the
          outbox or state_dir filesystem, or one of them unreadable (NAS unmounted); the
          database unreadable; the daemon's in-memory facts raising.
ok:       also the worker unloaded after `worker.idle_unload_seconds` (no process, on purpose).
degraded: worker down or restarting (within the grace above); running on the fallback
          engine; free space under `disk_low_bytes` (1 GiB); main loop slow (hashing a
          big file over a slow share, database busy); an inbox whose observer died or
          whose scan fails; an inbox or output folder that is gone, unmounted or whose
          share does not answer (a share away or hung: documents wait for it); stopping;
          status not recorded in the database lately.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from daemon import __version__
from daemon.common.live import Phase
from daemon.common.units import age
from daemon.service.status import Status


class Verdict(str, enum.Enum):
    OK = "ok"
    DEGRADED = "degraded"
    FAILING = "failing"


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


@dataclass(frozen=True)
class Health:
    verdict: Verdict
    reasons: tuple[str, ...]
    worker_alive: bool
    # Seconds since the worker was last heard from, as of now (the heartbeat age the main
    # loop measured plus the time since it ticked).
    last_heartbeat_age: float | None


def assess(status: Status, thresholds: Thresholds | None = None) -> Health:
    th = thresholds or Thresholds()
    live = status.live
    failing: list[str] = []
    degraded: list[str] = []

    if status.live_error:
        failing.append(f"supervisor snapshot unavailable: {status.live_error}")
    phase = live.worker.phase if live and not status.live_error else None
    fatal = status.fatal
    if phase == Phase.FATAL.value or fatal:
        failing.append(f"engine cannot run: {fatal or 'fatal'}")

    loop_age = status.loop_age or 0.0
    if loop_age > th.loop_dead_seconds:
        failing.append(f"main loop has not ticked for {loop_age:.0f} s")
    elif loop_age > th.loop_slow_seconds:
        degraded.append(f"main loop busy for {loop_age:.0f} s")

    hb = None
    worker_alive = False
    if live is not None and not status.live_error:
        hb = live.worker.last_heartbeat_age
        if hb is not None:
            hb += loop_age  # measured when the main loop last ticked; it kept growing
        worker_alive = (
            live.worker.pid is not None
            and phase not in (Phase.DOWN.value, Phase.FATAL.value, None)
            and (hb is None or hb <= status.limits.heartbeat_timeout_seconds)
        )
    # Unloaded after worker.idle_unload_seconds: no worker on purpose, the next document
    # starts one. Nothing for anyone to do.
    resting = phase == Phase.UNLOADED.value
    if not worker_alive and not status.live_error and phase != Phase.FATAL.value and not resting:
        grace = (
            status.limits.restart_backoff_max_seconds
            + status.limits.heartbeat_timeout_seconds
            + th.worker_grace_seconds
        )
        if hb is not None and hb > grace:
            failing.append(f"worker not alive for {hb:.0f} s (phase {phase})")
        elif live is not None and live.worker.failed_starts:
            # Named, or "down" alone would look like any restart in progress.
            degraded.append(f"worker not running (phase {phase}): {live.worker.last_crash}, "
                            f"{live.worker.failed_starts} time(s) in a row")
        else:
            degraded.append(f"worker not running (phase {phase})")

    if status.fallback_reason:
        degraded.append(f"running on the fallback engine: {status.fallback_reason}")
    if live is not None and live.stopping:
        degraded.append("stopping")

    for d in status.disks:
        if d.error is not None:
            failing.append(f"{d.name} not accessible: {d.error}")
        elif d.free is not None and d.free < th.disk_failing_bytes:
            failing.append(f"{d.name} filesystem nearly full ({d.free >> 20} MiB free)")
        elif d.free is not None and d.free < th.disk_low_bytes:
            degraded.append(f"{d.name} filesystem low on space ({d.free >> 20} MiB free)")

    if status.store_error:
        failing.append(f"database unreadable: {status.store_error}")
    elif not status.recorded and not status.live_error:
        # no runtime row written by a live pid in the last RUNNING_WITHIN_SECONDS
        degraded.append("daemon status not recorded in the database lately")

    degraded.extend(_inbox_reasons(status))
    for f in status.missing_folders:
        degraded.append(f"{f.name} {f.path} is {f.missing}: documents wait until it returns")

    verdict = Verdict.FAILING if failing else Verdict.DEGRADED if degraded else Verdict.OK
    return Health(verdict, tuple(failing + degraded), worker_alive, hb)


def _inbox_reasons(status: Status) -> list[str]:
    """Why each inbox that is not being watched as it should is not (degraded reasons)."""
    reasons: list[str] = []
    for ib in status.inboxes:
        if ib.missing is not None:
            when = (
                f" for {age(status.now - ib.missing_since)}"
                if ib.missing_since is not None
                else ""
            )
            waiting = "watching for it to return" if ib.answering else "waiting for it to answer"
            reasons.append(f"inbox {ib.path} is {ib.missing}{when}: {waiting}")
        elif ib.scan_error:
            reasons.append(f"inbox {ib.path}: {ib.scan_error}")
        elif ib.observer not in (None, "none", "poll") and not ib.observer_alive:
            reasons.append(f"inbox {ib.path}: file watcher stopped")
    return reasons


def healthz_body(status: Status, health: Health) -> dict[str, object]:
    """The `/healthz` JSON document (its keys are an interface: monitors parse them)."""
    live = status.live if not status.live_error else None
    q = status.queue
    return {
        "status": health.verdict.value,
        "reasons": list(health.reasons),
        "version": __version__,
        "phase": live.worker.phase if live else None,
        "worker_alive": health.worker_alive,
        "worker_pid": live.worker.pid if live else None,
        "worker_rss_bytes": live.worker.rss if live else None,
        "last_heartbeat_age": None
        if health.last_heartbeat_age is None
        else round(health.last_heartbeat_age, 3),
        "loop_age": None if status.loop_age is None else round(status.loop_age, 3),
        "inboxes_watched": [ib.path for ib in status.inboxes],
        "inboxes_missing": [ib.path for ib in status.inboxes if ib.missing is not None],
        "shares_not_answering": [s.mount for s in status.shares if not s.answering],
        "disk_free_bytes": status.disk_free,
        "counts": dict(q.counts) if q else None,
        "queue_age_seconds": status.queue_age_seconds or 0.0,
        "engine": status.engine.name,
        "fallback_reason": status.fallback_reason,
        "fatal": status.fatal,
    }
