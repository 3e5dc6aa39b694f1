"""A handle on the ONE worker process and its health: spawn, heartbeats, deadlines, kill,
recycle, restart backoff.

It knows the process, never the documents: when the worker dies or misses a deadline the
handle reaps it and says what happened (`Crashed`, `Overdue`); what that means for the
document in progress is the supervisor's to decide. Its state moves only through the table
in daemon/supervisor/states.py.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Protocol

import psutil

from daemon.common.live import PageEstimate, Phase, WorkerFacts
from daemon.config.settings import Config
from daemon.document.page import EngineInfo
from daemon.document.protocol import Reply, Request, Stop
from daemon.supervisor.states import WorkerState, check_transition

log = logging.getLogger("docinbox.supervisor")

_MiB = 1024 * 1024


class WorkerProcess(Protocol):
    """What the supervisor uses of the worker's process (multiprocessing's Process)."""

    @property
    def pid(self) -> int | None: ...

    @property
    def exitcode(self) -> int | None: ...

    def start(self) -> None: ...

    def is_alive(self) -> bool: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...

    def close(self) -> None: ...


class _ChildEnd(Protocol):
    def close(self) -> None: ...


class ProcessContext(Protocol):
    """Where worker processes come from: multiprocessing's spawn context; tests pass one
    that hands out a worker they answer for (tests/fakeworker.py)."""

    def Pipe(self, duplex: bool = True) -> tuple[Connection, _ChildEnd]: ...

    def Process(
        self, target: Callable[..., object], args: tuple[object, ...], name: str, daemon: bool
    ) -> WorkerProcess: ...


@dataclass(frozen=True)
class Crashed:
    """The worker died, hung, or did not load in time. It is reaped and its restart is
    scheduled; the document it held crashed with it."""

    reason: str


@dataclass(frozen=True)
class Overdue:
    """The page or document deadline passed: the worker was killed (state down). Whether
    a restart follows depends on why the document ran over (see Supervisor)."""


Trouble = Crashed | Overdue


@dataclass(frozen=True)
class Fatal:
    """Why the engine cannot run here, and what the user can do about it."""

    message: str
    hint: str


@dataclass(frozen=True)
class GiveUp:
    """When to stop restarting a worker that dies before its engine is loaded.

    The daemon never gives up (None): it backs off up to `restart_backoff_max_seconds` and
    status names the crash, since a server left alone may recover (a share with the weights
    comes back). `docinbox parse` has a person waiting: after `after` failed starts in a
    row it is fatal, with `see` saying where the worker's own last words are.
    """

    after: int
    see: str
    hint: str


# What a worker that is killed for taking too long to load did (see `_crashed`).
LOAD_TIMEOUT = "did not load the engine within startup_timeout_seconds"


def exit_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "stopped responding"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if -exitcode == signal.SIGKILL:
            return f"was killed ({name}; often the kernel's out-of-memory killer)"
        if -exitcode == signal.SIGSEGV:
            return f"crashed ({name})"
        return f"died on {name}"
    return f"exited with status {exitcode}"


def _worker_view(cfg: Config) -> tuple[object, ...]:
    """What a worker holds its own copy of: a change here needs a fresh worker."""
    return (cfg.engine, cfg.limits, cfg.passwords, cfg.worker.heartbeat_seconds)


class WorkerHandle:
    """The worker process, its pipe, its health, and when the next one may start."""

    def __init__(
        self, cfg: Config, context: ProcessContext, give_up: GiveUp | None = None
    ) -> None:
        self.cfg = cfg
        self.ctx = context
        self.state = WorkerState.DOWN
        self.proc: WorkerProcess | None = None
        self.conn: Connection | None = None
        self.deadline = 0.0  # of starting, of the page in progress, or of stopping
        self.restart_at = 0.0
        self.consecutive_failures = 0
        # Deaths in a row before the engine was loaded (no `Ready`); 0 after a Ready.
        self.failed_starts = 0
        self.last_crash: str | None = None  # why the last worker died unasked, for status
        self.give_up = give_up
        self.engine_name = ""  # what the last spawn was asked to load
        self.restarts = 0  # starts after a crash, a hang or an internal error
        self.last_heartbeat = 0.0
        self.started_at: float | None = None
        self.docs_done = 0  # documents this worker completed or failed
        self.rss = 0
        self.peak_rss = 0
        self.engine: EngineInfo | None = None  # what the last worker loaded
        self.estimate: PageEstimate | None = None  # its seconds per typical page here
        self.pages_in_flight = 1  # pages the worker's engine parses at once
        self.spawned_with: Config | None = None  # the config the worker holds a copy of
        self.fatal: Fatal | None = None
        self.idle_since = 0.0  # when the worker last became idle (ready, or a document ended)
        self.unloading = False  # the stop in progress is an idle unload: no worker after it

    @property
    def phase(self) -> Phase:
        return self.state.phase

    def _move(self, new: WorkerState) -> None:
        check_transition(self.state, new)
        self.state = new

    # -- life -----------------------------------------------------------------------

    def spawn(self, now: float, engine: str) -> None:
        from daemon.worker.worker import worker_main

        if self.state is WorkerState.RECOVERING:
            self.restarts += 1
        parent, child = self.ctx.Pipe(duplex=True)
        proc = self.ctx.Process(
            target=worker_main,
            args=(child, self.cfg, engine, os.getpid()),
            name=f"docinbox-worker[{engine}]",
            daemon=True,
        )
        proc.start()
        child.close()
        self.proc, self.conn = proc, parent
        self._move(WorkerState.STARTING)
        self.deadline = now + self.cfg.worker.startup_timeout_seconds
        self.last_heartbeat = now
        self.docs_done = 0
        self.started_at = now
        self.peak_rss = 0
        self.spawned_with = self.cfg
        self.engine_name = engine
        log.info("worker started (pid %s, engine %s)", proc.pid, engine)

    def ready(
        self, now: float, engine: EngineInfo, pages_in_flight: int,
        estimate: PageEstimate | None = None,
    ) -> None:
        self.engine = engine
        self.estimate = estimate
        self.failed_starts = 0
        self.idle_since = now
        self.pages_in_flight = pages_in_flight
        if self.state is WorkerState.STARTING:  # a stop sent while it loaded still stands
            self._move(WorkerState.IDLE)
        log.info("worker ready: engine %s (%s), page estimate: %s", engine.name,
                 engine.model_id or "no model", estimate.describe() if estimate else "none")
        warning = estimate.warning() if estimate else None
        if warning:  # said at every start: the daemon's log is the one users read
            log.warning("%s", warning)

    def busy(self, deadline: float) -> None:
        self._move(WorkerState.BUSY)
        self.deadline = deadline

    def idle(self, now: float) -> None:
        self._move(WorkerState.IDLE)
        self.idle_since = now

    def unload_due(self, now: float) -> bool:
        """Idle for `worker.idle_unload_seconds` (0: never): time to give the memory back."""
        after = self.cfg.worker.idle_unload_seconds
        return bool(after) and self.state is WorkerState.IDLE and now - self.idle_since >= after

    def unload(self, now: float) -> None:
        self.unloading = True
        self.ask_to_stop(now, reason=f"idle for {self.cfg.worker.idle_unload_seconds:.0f} s; "
                         "giving the model's memory back until the next document")

    def ask_to_stop(self, now: float, reason: str) -> None:
        assert self.proc is not None and self.conn is not None
        log.info("stopping worker (%s)", reason)
        with contextlib.suppress(OSError):
            self.conn.send(Stop())
        self._move(WorkerState.STOPPING)
        self.deadline = now + self.cfg.worker.shutdown_timeout_seconds

    def kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        self.reap()

    def reap(self) -> int | None:
        code: int | None = None
        if self.proc is not None:
            self.proc.join(timeout=5)
            code = self.proc.exitcode
            if code is not None:
                self.proc.close()
        if self.conn is not None:
            self.conn.close()
        self.proc, self.conn = None, None
        self._move(WorkerState.DOWN)
        self.rss = 0
        return code

    def recover(self, now: float) -> None:
        """The worker died or was killed for a fault: its successor is a restart, after a
        backoff that doubles with each consecutive failure."""
        self._move(WorkerState.RECOVERING)
        self.unloading = False  # a fault, not the planned unload: the next start is a restart
        base = self.cfg.worker.restart_backoff_seconds
        delay = min(
            base * (2 ** max(0, self.consecutive_failures - 1)),
            self.cfg.worker.restart_backoff_max_seconds,
        )
        self.restart_at = now + (delay if self.consecutive_failures else 0.0)
        if delay and self.consecutive_failures:
            log.warning("restarting the worker in %.0f s", delay)

    def cannot_run(self, message: str, hint: str) -> None:
        """The engine cannot run and nothing stands in: the daemon gives up."""
        self._move(WorkerState.FATAL)
        self.fatal = Fatal(message, hint)
        log.error("%s%s", message, f" (to fix: {hint})" if hint else "")

    def recycle_due(self) -> bool:
        """Replace the worker at this document boundary: it did its share of documents,
        grew too big, or holds a config that changed since (SIGHUP)."""
        held = self.spawned_with
        if held is not None and _worker_view(held) != _worker_view(self.cfg):
            return True
        if self.docs_done >= self.cfg.worker.recycle_after_documents:
            return True
        # Only a worker that has done something: one over the limit from its start (a model
        # bigger than max_rss_mb) would otherwise be replaced forever without taking a job.
        return self.docs_done > 0 and self.over_memory()

    def over_memory(self) -> bool:
        return self.rss > self.cfg.worker.max_rss_mb * _MiB

    # -- the pipe ---------------------------------------------------------------------

    def send(self, msg: Request) -> None:
        assert self.conn is not None
        # A dead worker makes this raise; check() sees the death on this tick.
        with contextlib.suppress(OSError):
            self.conn.send(msg)

    def receive(self, now: float) -> Reply | None:
        """The next message the worker sent, or None when none waits (or it is gone)."""
        if self.conn is None:
            return None
        try:
            if not self.conn.poll():
                return None
            msg: Reply = self.conn.recv()
        except (EOFError, OSError):
            return None  # the process is gone; check() sees the exit
        self.last_heartbeat = now
        return msg

    def wait(self, timeout: float) -> None:
        """Sleep until the worker sends something or `timeout` seconds pass."""
        conn = self.conn
        if conn is None:
            time.sleep(timeout)
            return
        try:
            # Also wakes at the pipe's end-of-file: the worker is exiting, and the next
            # tick reaps it.
            multiprocessing.connection.wait([conn], timeout)
        except (OSError, ValueError):  # closed under us: the next tick sees the exit
            time.sleep(timeout)

    # -- health -----------------------------------------------------------------------

    def check(self, now: float) -> Trouble | None:
        """Look at the worker once per tick: its memory, whether it lives, its deadlines
        and heartbeats. A worker in trouble is gone when this returns."""
        assert self.proc is not None
        try:
            self.rss = psutil.Process(self.proc.pid).memory_info().rss if self.proc.pid else 0
            self.peak_rss = max(self.peak_rss, self.rss)
        except psutil.Error:
            self.rss = 0
        state = self.state
        if not self.proc.is_alive():
            code = self.reap()
            if state is WorkerState.STOPPING:
                log.info("worker stopped")
                self._stopped(now)
                return None
            return self._crashed(now, exit_reason(code), on_start=state is WorkerState.STARTING)
        overdue = now > self.deadline
        if state is WorkerState.STOPPING and overdue:
            log.warning("worker did not stop in time; killing it")
            self.kill()
            self._stopped(now)
            return None
        if state is WorkerState.STARTING and overdue:
            self.kill()
            return self._crashed(now, LOAD_TIMEOUT, on_start=True)
        if state is WorkerState.BUSY and overdue:
            self.kill()
            return Overdue()
        silent = now - self.last_heartbeat > self.cfg.worker.heartbeat_timeout_seconds
        if state in (WorkerState.IDLE, WorkerState.BUSY) and silent:
            self.kill()
            return self._crashed(now, "stopped sending heartbeats", on_start=False)
        return None

    def _stopped(self, now: float) -> None:
        """A worker asked to exit is gone: the next one starts at once, or, after an idle
        unload, when a document is queued."""
        self.restart_at = now
        if self.unloading:
            self.unloading = False
            self._move(WorkerState.UNLOADED)
            log.info("worker unloaded; the next document starts it again")

    def _crashed(self, now: float, what: str, *, on_start: bool) -> Crashed:
        """The worker died unasked (`what` it did: "crashed (SIGSEGV)"); it is reaped.
        Its successor is a restart after a backoff, unless `give_up` says it is fatal."""
        reason = f"the worker {what}"
        self.consecutive_failures += 1
        self.failed_starts = self.failed_starts + 1 if on_start else 0
        loading = on_start and what != LOAD_TIMEOUT  # which says so itself
        self.last_crash = f"{reason} before its engine was loaded" if loading else reason
        give_up = self.give_up
        if give_up is not None and self.failed_starts >= give_up.after:
            self.cannot_run(
                f"the worker failed to start {self.failed_starts} times in a row (engine "
                f"{self.engine_name!r}; the last time it {what}); see {give_up.see}",
                give_up.hint,
            )
        else:
            self.recover(now)
        return Crashed(reason)

    def next_start_in(self, now: float) -> float | None:
        """Seconds until a restart after a fault may start a worker; None when none waits."""
        if self.state is not WorkerState.RECOVERING:
            return None
        return max(0.0, self.restart_at - now)

    def facts(self, switches: int) -> WorkerFacts:
        return WorkerFacts(
            phase=self.phase.value,
            pid=self.proc.pid if self.proc is not None else None,
            rss=self.rss,
            peak_rss=self.peak_rss,
            restarts=self.restarts,
            switches=switches,
            failed_starts=self.failed_starts,
            last_crash=self.last_crash,
        )
