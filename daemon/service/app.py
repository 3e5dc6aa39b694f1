"""The daemon: one main loop wiring watcher -> ingest -> store -> supervisor -> outbox.

`Daemon.loop(now)` is one tick (huey's pattern): tests call it directly with made-up
times; `run()` only adds the real clock, signals and a short sleep between ticks.
The main process never loads the model: it watches, hashes, queues and supervises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import signal
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from daemon import __version__
from daemon.common.display import safe_display
from daemon.common.errors import ExitCode
from daemon.common.live import Live, Phase
from daemon.common.shares import Shares
from daemon.config.settings import (
    Config,
    ConfigError,
    check_paths,
    http_token,
    load_config,
)
from daemon.intake.ingest import Ingestor, IngestRetries
from daemon.intake.watch_settings import WatcherIO
from daemon.intake.watcher import Watcher
from daemon.jobs.store import SchemaError, Store, StoreBusy, StoreFull
from daemon.jobs.upkeep import Upkeep
from daemon.output import outbox
from daemon.output.publish import Publisher
from daemon.service.folders import GuardedOutcomes, OutputFolders
from daemon.service.hooks import HookService
from daemon.service.httpserver import HttpServer, start_http_server
from daemon.service.notify import Notifier
from daemon.service.reminder import Reminder
from daemon.supervisor.supervisor import Supervisor

log = logging.getLogger("docinbox")

TICK_SECONDS = 0.25
RUNTIME_EVERY = 2.0  # how often status facts are written for `docinbox status`


class AlreadyRunning(Exception):
    pass


class StateLock:
    """One daemon per state folder: two would both think they own the queue."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "docinbox.lock"
        self.fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise AlreadyRunning(
                f"another docinbox is already running on {self.path.parent}"
            ) from exc
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def tighten_state_dir(folder: Path) -> None:
    """The state folder holds the database (every file name ever seen) and the lock:
    make it the service user's alone, also when it was created by hand (an install
    guide's `install -m 0750`, a restored backup)."""
    try:
        mode = stat.S_IMODE(folder.stat().st_mode)
        if mode & 0o077:
            folder.chmod(0o700)
            log.warning(
                "state folder %s was open to others (mode %o); it is now 0700",
                safe_display(folder),
                mode,
            )
    except OSError as exc:
        log.warning(
            "state folder %s: cannot make it private to this user (%s)",
            safe_display(folder),
            exc.strerror or exc,
        )


class Daemon:
    def __init__(
        self,
        cfg: Config,
        *,
        wall: Callable[[], float] = time.time,
        notifier: Notifier | None = None,
    ) -> None:
        self.cfg = cfg
        self.wall = wall
        self.notifier = notifier or Notifier()
        self.lock = StateLock(cfg.state_dir)
        self.store: Store | None = None
        self.watcher: Watcher | None = None
        self.supervisor: Supervisor | None = None
        self.ingestor: Ingestor | None = None
        self.publisher: Publisher | None = None
        self.http: HttpServer | None = None
        self.hooks: HookService | None = None
        self.upkeep: Upkeep | None = None
        # In-process facts for the HTTP thread. A frozen value rebound once per tick, so
        # the HTTP thread always reads a complete one without a lock.
        self.live: Live | None = None
        self.ready_sent = False
        self.next_runtime = 0.0
        self.last_headline: tuple[object, ...] | None = None
        # Every call into an inbox or output folder the main loop makes goes through
        # the lane of its share, with a deadline: a hung share cannot freeze the loop.
        self.shares = Shares(cfg.limits.share_deadline_seconds)
        # The output folders, looked at every few seconds like the inboxes: a share that
        # went away or hangs makes documents wait, not fail.
        self.folders = OutputFolders(self.shares, wall, log)
        self.stop_requested = False
        self.reload_requested = False
        self.retries = IngestRetries()
        # Lasting problems are logged once, then once a minute, not on every tick.
        self.state_disk = Reminder(log)
        self.db_busy = Reminder(log)
        self.status_unrecorded = Reminder(log)
        self.started_wall = 0.0

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, now: float) -> None:
        self.lock.acquire()
        tighten_state_dir(self.cfg.state_dir)
        self.store = Store.of(self.cfg)
        recovered = self.store.recover_running(self.wall())
        if recovered:
            log.warning(
                "recovered %d job(s) left running by an earlier stop: %s",
                len(recovered),
                ", ".join(map(str, recovered)),
            )
        # Hooks: every outcome recorded from now on carries its event (built by the publisher
        # and the ingestor just before, recorded in the same transaction);
        # what an earlier run left pending is delivered by the lanes started here.
        self.hooks = HookService(self.cfg, wall=self.wall)
        self.hooks.start(self.store)
        self.upkeep = Upkeep(self.store, self.cfg.hooks.retention_days * 86400.0)
        removed = outbox.cleanup_orphans(self.cfg.outbox)
        if removed:
            log.info("removed %d unfinished output folder(s) from an earlier stop", removed)
        self.watcher = Watcher.from_config(
            self.cfg, WatcherIO(wall=self.wall, shares=self.shares)
        )
        # Both ask the watcher whether an inbox is away: its documents wait, never fail.
        self.publisher = Publisher(self.cfg, self.store, self.wall, self.hooks,
                                   inboxes=self.watcher, call=self.shares.call)
        self.folders.watch(self.cfg, now)
        self.ingestor = Ingestor(
            self.cfg, self.store, self.wall, self.watcher.forget, self.hooks,
            call=self.shares.call,
        )
        self.supervisor = Supervisor(
            self.cfg, self.store, GuardedOutcomes(self.publisher, self.folders), wall=self.wall,
            inboxes=self.watcher,
        )
        self.watcher.start()
        self._note_inboxes()
        self.started_wall = self.wall()
        self.live = self.take_live(now)  # the HTTP thread may ask before the first tick
        if self.cfg.http.enabled:
            try:
                self.http = start_http_server(
                    self.cfg, self.current_live, token=http_token(self.cfg.http),
                    shares=self.shares,
                )
            except OSError as exc:
                # A port clash must not stop document processing; say so and go on.
                log.error(
                    "http server (status page, /healthz, /metrics) not started on %s:%d: %s",
                    self.cfg.http.host,
                    self.cfg.http.port,
                    exc,
                )
        for w in self.watcher.describe():
            log.info("watching %s (%s: %s)", safe_display(w.path), w.observer, w.reason or "")
        log.info(
            "docinbox %s started; engine %s%s",
            __version__,
            self.cfg.engine.name,
            f" (fallback {self.cfg.engine.fallback_engine})"
            if self.cfg.engine.fallback_engine
            else "",
        )

    def _note_inboxes(self) -> None:
        """The inboxes there now are remembered: missing at a later start, each is
        waited for as a share away, not refused as a typo (daemon.cli.main)."""
        assert self.store and self.watcher
        away = self.watcher.missing_inboxes()
        self.store.note_inboxes(
            [str(i.path) for i in self.cfg.inboxes if str(i.path) not in away])

    def close(self) -> None:
        if self.http is not None:
            self.http.stop()
        if self.hooks is not None:
            # Deliveries in flight are abandoned and stay pending for the next start.
            self.hooks.stop()
        if self.watcher is not None:
            self.watcher.stop()
        if self.store is not None:
            with contextlib.suppress(sqlite3.Error, StoreBusy):
                self.store.set_runtime({"pid": None, "phase": "stopped", "stopped_at": self.wall(),
                                        "hooks_disabled": {}})
            self.store.close()
        self.shares.close()
        self.lock.release()
        self.notifier.close()

    # -- one tick -----------------------------------------------------------------------

    def loop(self, now: float) -> None:
        assert self.watcher and self.supervisor and self.ingestor and self.store
        if self.stop_requested:
            self.stop_requested = False
            self.notifier.stopping()
            self.supervisor.request_stop(now)
        if self.reload_requested:
            self.reload_requested = False
            try:
                self.reload(now)
            except Exception:
                # A reload must never take a running daemon down (a bug, an inbox that
                # cannot be watched): keep what is running and say why.
                log.exception("reload failed; the running configuration stays in force")
                self.notifier.ready(self.status_line())
        # The document in progress may still finish its pages; its output then waits
        # (retried like a full disk), and no new document starts.
        missing = self.folders.look(now)
        if missing:
            self.supervisor.hold_new_documents(missing)
        else:
            self.supervisor.take_new_documents()
        try:
            if not self.supervisor.stopping:
                self._ingest(now)
            self.supervisor.tick(now)
        except StoreFull as exc:
            self._state_full(now, exc)
        except (StoreBusy, sqlite3.OperationalError) as exc:
            # Another process held the database longer than the busy timeout: wait, retry.
            self.db_busy.problem(now, f"database busy ({exc}); will retry")
        except Exception as exc:
            # A bug of ours must not take the daemon down: under systemd it would restart,
            # resume the same document, hit the same bug, forever. The document in
            # progress is failed with the reason instead, and the daemon goes on.
            log.exception("internal error while handling documents")
            self.supervisor.internal_error(now, exc)
        else:
            self.db_busy.resolved(now, "the database takes writes again")
            if not self.retries:  # each file turned away was recorded after all
                self.state_disk.resolved(now, "the state disk has space again; new files "
                                         "are recorded")
        if self.hooks is not None:
            self.hooks.wake_if_new()
        self._upkeep(now)
        self._report(now)

    def _upkeep(self, now: float) -> None:
        """The state database kept small: pruned, vacuumed and checkpointed (jobs.upkeep),
        a bounded batch a tick, busy or idle."""
        if self.upkeep is None:
            return
        try:
            self.upkeep.tick(self.wall())
        except StoreFull as exc:  # a checkpoint on a full disk: not "busy"
            self._state_full(now, exc)
        except (StoreBusy, sqlite3.OperationalError) as exc:
            self.db_busy.problem(now, f"database busy ({exc}); will retry")
        except Exception:
            # Housekeeping must never take the daemon down; it is tried again when due.
            log.exception("internal error while keeping the state database small")

    def _ingest(self, now: float) -> None:
        assert self.watcher and self.ingestor
        # Files a full disk or a locked database turned away first, then the new ones.
        batch = {path: inbox for inbox, path in self.retries.due(now)}
        batch.update((path, inbox) for inbox, path in self.watcher.tick(now))
        ready = [(inbox, path) for path, inbox in batch.items()]
        for i, (inbox, path) in enumerate(ready):
            try:
                self.ingestor.ingest(inbox, path)
            except (StoreBusy, sqlite3.OperationalError) as exc:
                # Not the file's fault: it and the rest of the batch are offered again
                # in seconds (the watcher would only report them again on a rescan).
                for item in ready[i:]:
                    self.retries.add(*item, now)
                    # Each attempt, at DEBUG: the problem itself is said once (a Reminder).
                    log.debug("%s not recorded (%s); offered again soon",
                              safe_display(item[1]), exc)
                if not isinstance(exc, StoreFull):
                    # A lock already cost this tick the busy timeout (60 s): do not spend
                    # another on the supervisor's writes before the watchdog's next ping.
                    raise
                self._state_full(now, exc)  # fails at once; the supervisor goes on
                return
            except Exception:
                # One odd file must never stop the daemon; the next rescan retries.
                log.exception("could not ingest %s", safe_display(path))
                self.watcher.forget(path)
            self.retries.discard(path)

    def _state_full(self, now: float, exc: StoreFull) -> None:
        self.state_disk.problem(
            now,
            f"the state disk is full ({safe_display(self.cfg.state_dir)}: {exc}): cannot "
            f"record new files; freeing space resumes them"
            + (f" ({len(self.retries)} waiting)" if self.retries else ""),
            logging.ERROR,
        )

    def _report(self, now: float) -> None:
        assert self.supervisor and self.store and self.watcher
        sup = self.supervisor
        if not self.ready_sent and sup.phase in (Phase.IDLE, Phase.BUSY):
            self.ready_sent = True
            self.notifier.ready(self.status_line())
        self.notifier.watchdog(now)
        self.live = live = self.take_live(now)
        headline = live.headline()
        # At once when what a reader must see changed (the engine fell back, an inbox
        # vanished, a document started): `docinbox status` reads this row, and a row
        # older than the jobs it sits beside would contradict them.
        if now < self.next_runtime and headline == self.last_headline:
            return
        self.next_runtime = now + RUNTIME_EVERY
        try:
            self.store.set_runtime({
                **live.to_runtime(),
                "hooks_disabled": self.hooks.disabled() if self.hooks else {},
            })
        except (StoreBusy, sqlite3.OperationalError) as exc:
            self.status_unrecorded.problem(now, f"could not record status ({exc})")
        else:
            self.last_headline = headline
            self.status_unrecorded.resolved(now, "status recorded again")
        if self.ready_sent:
            self.notifier.status(self.status_line())

    def take_live(self, now: float) -> Live:
        """What only this process knows, for the HTTP thread and `docinbox status`."""
        assert self.supervisor and self.watcher
        sup = self.supervisor
        snap = sup.snapshot()
        return Live(
            pid=os.getpid(),
            started_at=self.started_wall,
            updated_at=self.wall(),
            version=__version__,
            configured_engine=self.cfg.engine.name,
            engine=snap.engine,
            fallback_reason=snap.fallback_reason,
            fatal=snap.fatal,
            stopping=sup.stopping,
            worker=dataclasses.replace(
                snap.worker,
                last_heartbeat_age=(now - sup.worker.last_heartbeat)
                if sup.worker.proc is not None else None,
                next_start_in=sup.worker.next_start_in(now),
            ),
            current=snap.current,
            inboxes=self.watcher.describe(),
            folders=self.folders.facts(),
            taken_at=now,
        )

    def current_live(self) -> Live:
        live = self.live
        if live is None:
            raise RuntimeError("the main loop has not ticked yet")
        return live

    def status_line(self) -> str:
        assert self.supervisor and self.store
        counts = self.store.counts()
        snap = self.supervisor.snapshot()
        cur = snap.current
        doing = ""
        if cur:
            # safe_display: a newline in a file name would start a new notify field
            # (e.g. WATCHDOG=trigger) in the datagram to systemd.
            doing = f"; working on {safe_display(Path(cur.path).name)}"
            if cur.page:
                doing += f" page {cur.page}/{cur.pages}"
        engine = snap.engine.name or self.cfg.engine.name
        if snap.fallback_reason:
            engine += " (FALLBACK)"
        return (
            f"{counts['queued']} queued, {counts['done']} done, {counts['failed']} failed; "
            f"engine {engine}{doing}"
        )

    def reload(self, now: float) -> None:
        """SIGHUP: re-read the config; inboxes and most settings apply at once."""
        assert self.watcher and self.ingestor and self.supervisor
        if self.cfg.source is None:
            return
        self.notifier.reloading()
        try:
            new = load_config(self.cfg.source)
            problems = check_paths(new, create=True, call=self.shares.call)
            if problems:
                raise ConfigError(problems)
        except ConfigError as exc:
            log.error("reload refused, keeping the running configuration:\n%s", exc)
            self.notifier.ready(self.status_line())
            return
        if new.state_dir != self.cfg.state_dir or new.http != self.cfg.http:
            log.warning("state_dir and http changes take effect after a restart")
        self.cfg = new
        self.ingestor.cfg = new
        if self.publisher is not None:
            self.publisher.cfg = new
        if self.http is not None:
            self.http.cfg = new
        # passwords, limits and engine settings live in the worker: it is recycled at the
        # next document boundary to pick them up
        self.supervisor.update_config(new)
        if self.hooks is not None and self.store is not None:
            self.hooks.reload(new, self.store)
        if self.upkeep is not None:
            self.upkeep.retention_seconds = new.hooks.retention_days * 86400.0
        self.shares.set_deadline(new.limits.share_deadline_seconds)
        self.watcher.replace_inboxes(new.inboxes)
        with contextlib.suppress(StoreBusy):  # noted at the next start or reload then
            self._note_inboxes()
        self.folders.watch(new, now)
        self.retries.keep_inboxes(new.inboxes)
        self.watcher.rescan_now()
        log.info("configuration reloaded from %s", safe_display(new.source or ""))
        self.notifier.ready(self.status_line())

    # -- the real loop --------------------------------------------------------------------

    def install_signals(self) -> None:
        def on_stop(signum: int, frame: FrameType | None) -> None:
            log.info(
                "received %s: finishing the current page, then stopping",
                signal.Signals(signum).name,
            )
            self.stop_requested = True

        def on_hup(signum: int, frame: FrameType | None) -> None:
            self.reload_requested = True

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)

    def run(self) -> int:
        """Blocks until stopped. Returns the process exit code."""
        self.install_signals()
        try:
            self.start(time.monotonic())
        except AlreadyRunning as exc:
            log.error("%s", exc)
            return ExitCode.ALREADY_RUNNING
        except StoreBusy as exc:
            # A full state disk (or a lock held past the busy timeout) when the database is
            # opened: nothing can be recorded yet, so say why and exit; systemd starts it
            # again RestartSec later, when space may be back (StoreFull is a StoreBusy).
            what = "the state disk is full" if isinstance(exc, StoreFull) else "the state " \
                "database is busy"
            log.error("%s (%s: %s): cannot open the state database; exiting, to be started "
                      "again (free space in the state folder)", what, self.cfg.state_dir, exc)
            self.close()
            return ExitCode.STATE_UNAVAILABLE
        except SchemaError as exc:
            # Not a crash to restart from: the state folder needs a person (exit 78, which
            # the unit does not restart).
            log.error("%s", exc)
            self.close()
            return ExitCode.CONFIG
        assert self.supervisor is not None
        try:
            while not self.supervisor.stopped:
                self.loop(time.monotonic())
                if self.supervisor.phase == Phase.FATAL:
                    log.error("cannot continue: %s", self.supervisor.fatal_message)
                    if self.supervisor.fatal_hint:
                        log.error("fix: %s", self.supervisor.fatal_hint)
                    return ExitCode.ENGINE_UNAVAILABLE
                # Wakes early when the worker answers: a finished page is recorded and
                # the next one asked for at once, not at the next tick (the engine waits).
                self.supervisor.wait(TICK_SECONDS)
            log.info("stopped cleanly")
            return ExitCode.OK
        finally:
            self.close()

