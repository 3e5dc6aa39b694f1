"""Supervise the ONE worker process and feed it the queue, one page at a time.

rq's worker/horse split: the daemon process never loads the model; it starts a child,
sends it one page at a time and records each finished page in the store at once, so a
crash loses at most the page in progress. The supervisor:

- starts the worker (spawn) and waits for `ready` within `startup_timeout_seconds`;
  switches to `engine.fallback_engine` when the configured engine cannot load;
- watches heartbeats, a per-page and a per-document deadline, and kills on expiry;
- restarts a dead worker with exponential backoff; a document that was in progress when
  the worker died `max_attempts` times is failed as `crashed`;
- recycles the worker after N documents or when its RSS passes `max_rss_mb`;
- on stop, lets the current page finish (bounded), requeues the document, stops the child.

Everything happens in `tick(now)` with `now` from a monotonic clock, so tests drive it
one step at a time. Wall-clock times for the records come from the injected `wall`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Protocol

import psutil

from daemon.common.display import safe_display
from daemon.common.errors import FailureKind
from daemon.common.live import (
    CurrentDoc,
    EngineFacts,
    Phase,
    SupervisorFacts,
    WorkerFacts,
    scalars,
)
from daemon.config.settings import Config, page_options_for, parse_page_range
from daemon.document.page import EngineInfo, PageOptions
from daemon.document.protocol import (
    DocError,
    Heartbeat,
    Inspect,
    Inspected,
    PageDone,
    ParsePage,
    Progress,
    Ready,
    Reply,
    Request,
    Stop,
    Unavailable,
)
from daemon.document.record import PageRecord
from daemon.jobs.store import Job, Store, StoreBusy
from daemon.supervisor.engine_choice import EngineChoice
from daemon.supervisor.output_retry import output_wait

log = logging.getLogger("docinbox.supervisor")


class Outcomes(Protocol):
    """What happens to a document once the worker is done with it (see daemon.output.publish)."""

    def complete(self, job: Job, engine: EngineInfo | None) -> str:
        """Write the outbox folder, dispose of the original; return the output folder.

        Raises OSError when the outbox cannot be written (the job waits and retries).
        """
        ...

    def failed(self, job: Job, kind: str, message: str) -> None:
        """Move the original to failed/ with its error file."""
        ...


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


@dataclass
class Current:
    """The document in progress."""

    job: Job
    started: float
    options: PageOptions  # built once per document; sent with every page as it is
    page_count: int | None = None
    page_idx: int | None = None
    page_started: float = 0.0
    block: tuple[int, int] | None = None
    stage: str | None = None  # what the engine is doing on the page: "layout", "block", ...
    pages_in_flight: int = 1  # pages of the document the worker is parsing at once
    pending: list[int] = field(default_factory=list)


def _engine_facts(info: EngineInfo | None, name: str) -> EngineFacts:
    """What status shows of the engine: the worker's EngineInfo once it is ready, else
    only the name it is starting."""
    if info is None:
        return EngineFacts(name=name)
    return EngineFacts(name=info.name or name, model_id=info.model_id, revision=info.revision,
                       precision=info.precision, details=scalars(info.details), loaded=True)


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


class Supervisor:
    # How many of the document's next pages each page request names (at least; more when
    # the engine parses more pages at once), so the worker can prepare them while the
    # current one is in the engine. 0 switches the pipeline off.
    LOOKAHEAD = 8

    def __init__(
        self,
        cfg: Config,
        store: Store,
        outcomes: Outcomes,
        *,
        wall: Callable[[], float],
        context: ProcessContext | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.outcomes = outcomes
        self.wall = wall
        self.ctx: ProcessContext = context or multiprocessing.get_context("spawn")
        self.choice = EngineChoice(cfg.engine)  # which engine the next worker loads
        self.engine_info: EngineInfo | None = None  # what the worker loaded
        self.engine_in_flight = 1  # pages the worker's engine parses at once
        self.phase = Phase.DOWN
        self.proc: WorkerProcess | None = None
        self.conn: Connection | None = None
        self.current: Current | None = None
        self.restart_at = 0.0
        self.consecutive_failures = 0
        self.phase_deadline = 0.0
        self.last_heartbeat = 0.0
        self.docs_this_worker = 0
        self.worker_started_at: float | None = None
        self.peak_rss = 0
        self.rss = 0
        self.restarts = 0  # starts after a crash, a hang or an internal error
        # The last worker died or was killed for a fault: its successor is a restart.
        # Recycles and engine switches are planned stops, not restarts.
        self.crashed = False
        # Why no new document may start now (an output folder is missing), or None.
        self.hold: str | None = None
        self.stopping = False
        self.recycle_requested = False
        self.fatal_message: str | None = None
        self.fatal_hint: str = ""
        self.pending: Callable[[float], None] | None = None

    # -- public ---------------------------------------------------------------------

    def tick(self, now: float) -> None:
        if self.phase == Phase.FATAL:
            return
        if self.proc is None:
            if not self.stopping and now >= self.restart_at:
                self._spawn(now)
            return
        self._drain(now)
        if self.proc is not None:
            self._check_health(now)
        server_back = self.choice.server_back(now)
        if self.stopping:
            self._stop_if_between_pages(now)
        elif self.phase == Phase.IDLE:
            if server_back:
                self._switch_back(now)
            elif self.recycle_requested or self._should_recycle():
                self._stop_worker(now, reason="recycle")
            else:
                self._take_next(now)

    def request_stop(self, now: float) -> None:
        """SIGTERM/SIGINT: stop taking work; the current page may finish (bounded)."""
        if self.stopping:
            return
        self.stopping = True
        if self.phase == Phase.BUSY:
            self.phase_deadline = min(
                self.phase_deadline, now + self.cfg.worker.shutdown_timeout_seconds
            )
            log.info(
                "stopping: letting the current page finish (at most %.0f s)",
                self.cfg.worker.shutdown_timeout_seconds,
            )
        self._stop_if_between_pages(now)

    def update_config(self, new: Config) -> None:
        """SIGHUP: the worker holds its own copy of the config (passwords, limits, engine),
        so a change it needs is applied by recycling it at the next document boundary."""
        old, self.cfg = self.cfg, new
        if new.engine != old.engine:
            self.choice.reconfigure(new.engine)
        worker_view = (old.engine, old.limits, old.passwords, old.worker.heartbeat_seconds)
        if worker_view != (new.engine, new.limits, new.passwords, new.worker.heartbeat_seconds):
            self.recycle_requested = True

    def internal_error(self, now: float, exc: BaseException) -> None:
        """An unexpected exception escaped `tick`: fail the document in progress, start a
        fresh worker, go on. Its state cannot be trusted half-way through a step."""
        cur, self.current = self.current, None
        self.pending = None
        if cur is not None:
            try:
                job = self.store.job(cur.job.id) or cur.job
                self._fail_job(
                    job,
                    FailureKind.ENGINE.value,
                    f"internal error in docinbox: {type(exc).__name__}: {exc} "
                    "(please report it with the log)",
                )
            except Exception:
                log.exception("job %s: could not record the internal error", cur.job.id)
        if self.proc is not None:
            self._kill()
        self._schedule_restart(now)

    def wait(self, timeout: float) -> None:
        """Sleep until the worker sends something or `timeout` seconds pass (the real main
        loop; tests tick instead)."""
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

    @property
    def stopped(self) -> bool:
        return self.stopping and self.proc is None

    def snapshot(self) -> SupervisorFacts:
        """Facts for status, health and metrics."""
        cur = self.current
        return SupervisorFacts(
            engine=_engine_facts(self.engine_info, self.choice.name),
            fallback_reason=self.choice.fallback_reason,
            fatal=self.fatal_message,
            worker=WorkerFacts(
                phase=self.phase.value,
                pid=self.proc.pid if self.proc is not None else None,
                rss=self.rss,
                peak_rss=self.peak_rss,
                restarts=self.restarts,
                switches=self.choice.switches,
            ),
            current=None
            if cur is None
            else CurrentDoc(
                job_id=cur.job.id,
                path=cur.job.source_path,
                page=(cur.page_idx + 1) if cur.page_idx is not None else None,
                pages=cur.page_count,
                block=cur.block,
                stage=cur.stage,
                pages_in_flight=cur.pages_in_flight,
            ),
        )

    # -- worker lifecycle -------------------------------------------------------------

    def _spawn(self, now: float) -> None:
        from daemon.worker.worker import worker_main

        if self.crashed:
            self.restarts += 1
            self.crashed = False
        parent, child = self.ctx.Pipe(duplex=True)
        proc = self.ctx.Process(
            target=worker_main,
            args=(child, self.cfg, self.choice.name, os.getpid()),
            name=f"docinbox-worker[{self.choice.name}]",
            daemon=True,
        )
        proc.start()
        child.close()
        self.proc, self.conn = proc, parent
        self.phase = Phase.STARTING
        self.phase_deadline = now + self.cfg.worker.startup_timeout_seconds
        self.last_heartbeat = now
        self.docs_this_worker = 0
        self.worker_started_at = now
        self.peak_rss = 0
        self.recycle_requested = False
        log.info("worker started (pid %s, engine %s)", proc.pid, self.choice.name)

    def _stop_if_between_pages(self, now: float) -> None:
        """While stopping, a worker that holds no request is told to exit, however it got
        there: a finished page, a failed, completed or vanished document, an output wait, a
        failure the supervisor recorded, or an engine still loading.

        This is checked on every tick rather than by each way a document can end: a new
        way to end one must not be able to leave the daemon waiting forever for a stop.
        """
        if self.proc is not None and self.phase in (Phase.IDLE, Phase.STARTING):
            self._stop_worker(now, reason="shutdown")

    def _stop_worker(self, now: float, reason: str) -> None:
        assert self.proc is not None and self.conn is not None
        log.info("stopping worker (%s)", reason)
        with contextlib.suppress(OSError):
            self.conn.send(Stop())
        self.phase = Phase.STOPPING
        self.phase_deadline = now + self.cfg.worker.shutdown_timeout_seconds

    def _kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        self._reap()

    def _reap(self) -> int | None:
        code: int | None = None
        if self.proc is not None:
            self.proc.join(timeout=5)
            code = self.proc.exitcode
            if code is not None:
                self.proc.close()
        if self.conn is not None:
            self.conn.close()
        self.proc, self.conn = None, None
        self.phase = Phase.DOWN
        self.rss = 0
        return code

    def _schedule_restart(self, now: float) -> None:
        # Every path here follows a worker that died or was killed for a fault.
        self.crashed = True
        base = self.cfg.worker.restart_backoff_seconds
        delay = min(
            base * (2 ** max(0, self.consecutive_failures - 1)),
            self.cfg.worker.restart_backoff_max_seconds,
        )
        self.restart_at = now + (delay if self.consecutive_failures else 0.0)
        if delay and self.consecutive_failures:
            log.warning("restarting the worker in %.0f s", delay)

    def _should_recycle(self) -> bool:
        w = self.cfg.worker
        if self.docs_this_worker >= w.recycle_after_documents:
            return True
        # Only a worker that has done something: one over the limit from its start (a model
        # bigger than max_rss_mb) would otherwise be replaced forever without taking a job.
        return self.docs_this_worker > 0 and self.rss > w.max_rss_mb * 1024 * 1024

    # -- messages ---------------------------------------------------------------------

    def _drain(self, now: float) -> None:
        assert self.conn is not None
        if self.pending is not None:
            # A step whose recording hit a locked database on an earlier tick goes first.
            step, self.pending = self.pending, None
            self._guarded(step, now)
        while self.conn is not None:
            try:
                if not self.conn.poll():
                    return
                msg = self.conn.recv()
            except (EOFError, OSError):
                return  # the process is gone; _check_health sees the exit
            self.last_heartbeat = now
            self._guarded(functools.partial(self._handle, msg=msg), now)

    def _guarded(self, step: Callable[[float], None], now: float) -> None:
        """Run `step`; if the database stays locked past the busy timeout, keep it for the
        next tick instead of losing it.

        A worker's answer is already off the pipe when it is handled: dropped, a finished
        page would be lost and its job would sit until the page deadline failed it. Every
        handler writes before it acts on what it wrote, so running it again is safe; a
        handler that gets further (a page saved, then the completion blocked) re-arms
        `pending` with only the part still to do.
        """
        try:
            step(now)
        except StoreBusy:
            if self.pending is None:
                self.pending = step
            raise

    def _handle(self, now: float, msg: Reply) -> None:
        match msg:
            case Heartbeat(peak_rss=peak):
                self.peak_rss = max(self.peak_rss, peak)
                return
            case Ready(engine=engine, pages_in_flight=in_flight):
                self.engine_info = engine
                self.engine_in_flight = in_flight
                if self.phase == Phase.STARTING:  # a stop sent while it loaded still stands
                    self.phase = Phase.IDLE
                log.info(
                    "worker ready: engine %s (%s)", engine.name, engine.model_id or "no model"
                )
                return
            case Unavailable(message=message, hint=hint):
                self._on_unavailable(now, message, hint)
                return
        cur = self.current
        if cur is None or msg.job_id != cur.job.id:
            return  # stale answer about a document we gave up on
        match msg:
            case Progress(page_idx=page_idx, done=done, total=total, what=what,
                          pages_in_flight=in_flight):
                cur.pages_in_flight = in_flight
                if page_idx == cur.page_idx:  # pages parsed ahead report too
                    cur.block = (done, total)
                    cur.stage = what
            case Inspected(page_count=page_count):
                cur.page_count = page_count
                self.store.set_page_count(cur.job.id, page_count)
                done_pages = self.store.done_pages(cur.job.id)
                wanted: Sequence[int] = range(page_count)
                pages = cur.options.pages
                if pages:
                    wanted = parse_page_range(pages, page_count)  # validated in config
                cur.pending = [i for i in wanted if i not in done_pages]
                if done_pages:
                    log.info(
                        "job %s: resuming at page %d of %d",
                        cur.job.id,
                        min(cur.pending, default=page_count) + 1,
                        page_count,
                    )
                self._next_page(now)
            case PageDone(page_idx=page_idx, blocks=blocks, info=info, seconds=seconds):
                self.store.save_page(
                    cur.job.id,
                    PageRecord(
                        page_idx,
                        blocks,
                        self.engine_info.name if self.engine_info else "?",
                        seconds,
                        info,
                        crops=msg.crops,
                        model_output=msg.model_output,
                    ),
                    self.wall(),
                )
                log.info(
                    "job %s: page %d/%s in %.1f s",
                    cur.job.id, page_idx + 1, cur.page_count, seconds,
                )
                if (
                    cur.pending
                    and not self.stopping
                    and self.rss > self.cfg.worker.max_rss_mb * 1024 * 1024
                ):
                    # Recycle at a page boundary: the document resumes on the fresh worker.
                    # Only after a page, so a worker that is big from the start advances.
                    self._interrupt_current(now, "worker recycled (memory)")
                    self._stop_worker(now, reason=f"RSS {self.rss >> 20} MiB over max_rss_mb")
                    return
                self._next_page(now)
            case DocError(kind=kind, message=message):
                self._fail_current(kind, message)
                self.phase = Phase.IDLE

    def _on_unavailable(self, now: float, message: str, hint: str) -> None:
        # Mid-document (the MinerU server went away for longer than the retries last):
        # not the document's fault; it resumes at its first unfinished page.
        self._interrupt_current(now, f"engine unavailable: {message}")
        self._reap()
        if self.choice.fall_back(now, message, hint):
            self.restart_at = now
            return
        self.phase = Phase.FATAL
        self.fatal_message = f"engine {self.choice.name!r} cannot run: {message}"
        self.fatal_hint = hint
        log.error("%s%s", self.fatal_message, f" (to fix: {hint})" if hint else "")

    def _switch_back(self, now: float) -> None:
        """The MinerU server answers again: replace the fallback worker at a document
        boundary (now: the worker is idle)."""
        primary = self.choice.switch_back()
        self._stop_worker(now, reason=f"switching back to engine {primary!r}")

    # -- documents --------------------------------------------------------------------

    def _take_next(self, now: float) -> None:
        if self.hold is not None:
            return  # documents wait in the queue (as for a full outbox), none fails
        job = self.store.next_job(self.wall())
        if job is None:
            return
        job = self.store.start_job(
            job.id, self.wall(), self.engine_info.name if self.engine_info else "?"
        )
        self.current = Current(job=job, started=now, options=self._page_options(job))
        self.phase = Phase.BUSY
        self.phase_deadline = now + self.cfg.limits.page_timeout_seconds
        log.info("job %s: started %s (attempt %d)", job.id, safe_display(job.source_path),
                 job.attempts)
        self._send(Inspect(job.id, job.read_path))

    def _next_page(self, now: float) -> None:
        cur = self.current
        assert cur is not None
        if not cur.pending:
            # Also when stopping: every page is stored, and finishing now (seconds) beats
            # leaving a complete document for the next start.
            self._complete_current(now)
            return
        if self.stopping:
            self._interrupt_current(now, "the daemon is stopping")
            self.phase = Phase.IDLE  # the tick stops the worker
            return
        cur.page_idx = cur.pending.pop(0)
        cur.page_started = now
        cur.block = None
        cur.stage = None
        self.phase_deadline = min(
            now + self.cfg.limits.page_timeout_seconds,
            cur.started + self.cfg.limits.document_timeout_seconds,
        )
        self._send(
            ParsePage(
                cur.job.id,
                cur.job.read_path,
                cur.page_idx,
                cur.options,
                lookahead=tuple(cur.pending[: self._lookahead()]),
            )
        )

    def _lookahead(self) -> int:
        if not self.LOOKAHEAD:
            return 0  # switched off (bench/bench_pipeline.py)
        return max(self.LOOKAHEAD, self.engine_in_flight - 1)

    def _page_options(self, job: Job) -> PageOptions:
        inbox = next((i for i in self.cfg.inboxes if str(i.path) == job.inbox), None)
        return page_options_for(self.cfg, inbox)

    def _send(self, msg: Request) -> None:
        assert self.conn is not None
        # A dead worker makes this raise; _check_health handles the death on this tick.
        with contextlib.suppress(OSError):
            self.conn.send(msg)

    def _complete_current(self, now: float) -> None:
        try:
            self._complete(now)
        except StoreBusy:
            # All pages are stored; only the completion is left to do again (it is
            # idempotent: the same-sha256 outbox folder is replaced, a moved original
            # is not moved twice).
            self.pending = self._complete
            raise

    def _complete(self, now: float) -> None:
        cur = self.current
        assert cur is not None
        job = self.store.job(cur.job.id) or cur.job
        try:
            out = self.outcomes.complete(job, self.engine_info)
        except OSError as exc:
            # Disk full, outbox unwritable, NAS gone: not the document's fault.
            wait = output_wait(self.cfg, job.attempts, exc)
            log.warning("job %s: %s", job.id, wait.message)
            self.store.requeue(
                job.id,
                self.wall(),
                not_before=self.wall() + wait.delay,
                error_kind=FailureKind.OUTPUT.value,
                error=wait.message,
            )
            self.store.bump("output_errors_total")
        else:
            self.store.finish_job(job.id, self.wall(), out, now - cur.started)
            self.docs_this_worker += 1
            self.consecutive_failures = 0
            pages = self.store.pages(job.id)
            spp = sum(p.seconds for p in pages) / max(1, len(pages))
            log.info(
                "job %s: done: %d page(s), %.1f s/page, %.1f s in all -> %s "
                "(worker peak RSS %d MiB, engine %s)",
                job.id, len(pages), spp, now - cur.started, safe_display(out),
                self.peak_rss >> 20,
                self.engine_info.name if self.engine_info else None,
            )
        self.current = None
        self.phase = Phase.IDLE

    def _fail_current(self, kind: str, message: str) -> None:
        cur = self.current
        assert cur is not None
        self._fail_job(self.store.job(cur.job.id) or cur.job, kind, message)
        self.docs_this_worker += 1
        self.current = None

    def _fail_job(self, job: Job, kind: str, message: str) -> None:
        log.warning("job %s: failed (%s): %s", job.id, kind, message)
        try:
            self.outcomes.failed(job, kind, message)
        except OSError as exc:
            # The record below still says failed and why; the original stays where it is.
            log.error("job %s: could not move the original to failed/: %s", job.id, exc)
        self.store.fail_job(job.id, self.wall(), kind, message)

    def _interrupt_current(self, now: float, why: str) -> None:
        cur = self.current
        if cur is None:
            return
        self.store.requeue(cur.job.id, self.wall())
        log.info("job %s: interrupted (%s); will resume at the next page", cur.job.id, why)
        self.current = None

    # -- health -----------------------------------------------------------------------

    def _check_health(self, now: float) -> None:
        assert self.proc is not None
        try:
            self.rss = psutil.Process(self.proc.pid).memory_info().rss if self.proc.pid else 0
            self.peak_rss = max(self.peak_rss, self.rss)
        except psutil.Error:
            self.rss = 0
        if not self.proc.is_alive():
            was = self.phase
            code = self._reap()
            if was == Phase.STOPPING:
                log.info("worker stopped")
                self.restart_at = now
                return
            self._on_crash(now, f"the worker {exit_reason(code)}")
            return
        if self.phase == Phase.STOPPING and now > self.phase_deadline:
            log.warning("worker did not stop in time; killing it")
            self._kill()
            self.restart_at = now
            return
        if self.phase == Phase.STARTING and now > self.phase_deadline:
            self._kill()
            self._on_crash(now, "the engine did not load within startup_timeout_seconds")
            return
        if self.phase == Phase.BUSY and now > self.phase_deadline:
            cur = self.current
            self._kill()
            if cur is not None and self.stopping:
                self._interrupt_current(now, "stop timeout")
                return
            if cur is not None:
                doc_over = now >= cur.started + self.cfg.limits.document_timeout_seconds
                what = (
                    f"the document took longer than limits.document_timeout_seconds "
                    f"({self.cfg.limits.document_timeout_seconds:.0f} s)"
                    if doc_over
                    else f"page {(cur.page_idx or 0) + 1} took longer than "
                    f"limits.page_timeout_seconds ({self.cfg.limits.page_timeout_seconds:.0f} s)"
                )
                self._fail_current(FailureKind.TIMEOUT.value, what)
            self._schedule_restart(now)
            return
        if (
            self.phase in (Phase.IDLE, Phase.BUSY)
            and now - self.last_heartbeat > self.cfg.worker.heartbeat_timeout_seconds
        ):
            self._kill()
            self._on_crash(now, "the worker stopped sending heartbeats")

    def _on_crash(self, now: float, reason: str) -> None:
        self.consecutive_failures += 1
        cur = self.current
        self.current = None
        if cur is not None:
            job = self.store.requeue(
                cur.job.id,
                self.wall(),
                crashed=True,
                error_kind=FailureKind.CRASHED.value,
                error=reason,
            )
            page = f" on page {cur.page_idx + 1}" if cur.page_idx is not None else ""
            log.error(
                "job %s: %s%s (crash %d of %d)",
                job.id,
                reason,
                page,
                job.crashes,
                self.cfg.worker.max_attempts,
            )
            if job.crashes >= self.cfg.worker.max_attempts:
                self._fail_job(
                    job,
                    FailureKind.CRASHED.value,
                    f"{reason}{page}, {job.crashes} times; giving up on this document",
                )
        else:
            log.error("%s", reason)
        self._schedule_restart(now)
