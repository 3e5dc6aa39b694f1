"""Supervise the ONE worker process and feed it the queue, one page at a time.

rq's worker/horse split: the daemon process never loads the model; it starts a child,
sends it one page at a time and records each finished page in the store at once, so a
crash loses at most the page in progress. Three parts, tied together here:

- `WorkerHandle` (worker_handle.py): the process and its health. It starts the worker
  (spawn) and waits for `ready` within `startup_timeout_seconds`; watches heartbeats and
  the deadlines, and kills on expiry; restarts a dead worker with exponential backoff;
  recycles it after N documents, past `max_rss_mb`, or when its config changed. Its states
  and their one transition table are in states.py.
- `DocumentRun` (document_run.py): the document in progress, its pages, its deadlines and
  its outcome; a document that was in progress when the worker died `max_attempts` times
  is failed as `crashed`.
- `EngineChoice` (engine_choice.py): `engine.fallback_engine` when the configured engine
  cannot load, and back when its server answers again.

On stop, the current page may finish (bounded), the document is requeued, the child
stopped. Everything happens in `tick(now)` with `now` from a monotonic clock, so tests
drive it one step at a time. Wall-clock times for the records come from the injected `wall`.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
from collections.abc import Callable

from daemon.common.errors import FailureKind
from daemon.common.live import EngineFacts, PageEstimate, Phase, SupervisorFacts, scalars
from daemon.config.settings import Config
from daemon.document.page import EngineInfo
from daemon.document.protocol import (
    DocError,
    Heartbeat,
    Inspected,
    PageDone,
    Progress,
    Ready,
    Reply,
    Unavailable,
)
from daemon.intake.presence import InboxLooks, NoInboxLooks
from daemon.jobs.store import Store, StoreBusy
from daemon.supervisor.document_run import DocumentRun, Outcomes, Records
from daemon.supervisor.engine_choice import EngineChoice
from daemon.supervisor.states import WorkerState
from daemon.supervisor.worker_handle import (
    Crashed,
    GiveUp,
    Overdue,
    ProcessContext,
    WorkerHandle,
)

log = logging.getLogger("docinbox.supervisor")


def _engine_facts(
    info: EngineInfo | None, name: str, estimate: PageEstimate | None = None
) -> EngineFacts:
    """What status shows of the engine: the worker's EngineInfo (and its page estimate)
    once it is ready, else only the name it is starting."""
    if info is None:
        return EngineFacts(name=name)
    return EngineFacts(name=info.name or name, model_id=info.model_id, revision=info.revision,
                       precision=info.precision, details=scalars(info.details), loaded=True,
                       estimate=estimate)


class Supervisor:
    """Ties the worker (`WorkerHandle`), the document in progress (`DocumentRun`) and the
    engine choice (`EngineChoice`) together, one `tick(now)` at a time."""

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
        give_up: GiveUp | None = None,
        inboxes: InboxLooks | None = None,
    ) -> None:
        self.cfg = cfg
        # Which inboxes are away (the watcher): their documents wait in the queue.
        self.inboxes: InboxLooks = inboxes or NoInboxLooks()
        self.records = Records(store, outcomes, wall)
        self.choice = EngineChoice(cfg.engine)  # which engine the next worker loads
        # give_up: when a worker dying before its engine loads is fatal (`docinbox parse`);
        # None: restart it with backoff for ever (the daemon), status names the crash.
        self.worker = WorkerHandle(
            cfg, context or multiprocessing.get_context("spawn"), give_up
        )
        self.current: DocumentRun | None = None
        # One way: set by request_stop, never cleared. The worker finishes its page first.
        self.stopping = False
        # Why no new document may start now (an output folder is missing), or None. The
        # documents of an inbox that is away wait as well, the others go on: those are
        # asked of `inboxes` whenever a document is to start.
        self.held_because: str | None = None
        # A step whose recording hit a locked database, to run again first (see _guarded).
        self.pending: Callable[[float], None] | None = None

    # -- public ---------------------------------------------------------------------

    def tick(self, now: float) -> None:
        worker = self.worker
        if worker.state is WorkerState.FATAL:
            return
        if worker.proc is None:
            if not self.stopping and now >= worker.restart_at and self._worker_wanted():
                worker.spawn(now, self.choice.name)
            return
        self._drain(now)
        if worker.proc is not None:
            self._check_health(now)
        server_back = self.choice.server_back(now)
        if self.stopping:
            self._stop_if_between_pages(now)
        elif worker.state is WorkerState.IDLE:
            if server_back:
                self._switch_back(now)
            elif worker.recycle_due():
                worker.ask_to_stop(now, reason="recycle")
            else:
                self._take_next(now)
                if worker.unload_due(now):
                    worker.unload(now)

    def request_stop(self, now: float) -> None:
        """SIGTERM/SIGINT: stop taking work; the current page may finish (bounded)."""
        if self.stopping:
            return
        self.stopping = True
        worker = self.worker
        if worker.state is WorkerState.BUSY:
            grace = self.cfg.worker.shutdown_timeout_seconds
            worker.deadline = min(worker.deadline, now + grace)
            log.info("stopping: letting the current page finish (at most %.0f s)", grace)
        self._stop_if_between_pages(now)

    def hold_new_documents(self, reason: str) -> None:
        """Start no new document until `take_new_documents`: they wait in the queue (as
        for a full outbox), none fails. The one in progress may finish its pages."""
        self.held_because = reason

    def take_new_documents(self) -> None:
        self.held_because = None

    def update_config(self, new: Config) -> None:
        """SIGHUP: the worker holds its own copy of the config (passwords, limits, engine),
        so a change it needs is applied by recycling it at the next document boundary."""
        old, self.cfg = self.cfg, new
        self.worker.cfg = new
        if new.engine != old.engine:
            self.choice.reconfigure(new.engine)

    def internal_error(self, now: float, exc: BaseException) -> None:
        """An unexpected exception escaped `tick`: fail the document in progress, start a
        fresh worker, go on. Its state cannot be trusted half-way through a step."""
        run, self.current = self.current, None
        self.pending = None
        if run is not None:
            try:
                run.fail(
                    FailureKind.ENGINE.value,
                    f"internal error in docinbox: {type(exc).__name__}: {exc} "
                    "(please report it with the log)",
                )
            except Exception:
                log.exception("job %s: could not record the internal error", run.job.id)
        if self.worker.proc is not None:
            self.worker.kill()
        self.worker.recover(now)

    def wait(self, timeout: float) -> None:
        """Sleep until the worker sends something or `timeout` seconds pass (the real main
        loop; tests tick instead)."""
        self.worker.wait(timeout)

    @property
    def stopped(self) -> bool:
        return self.stopping and self.worker.proc is None

    @property
    def phase(self) -> Phase:
        return self.worker.phase

    @property
    def fatal_message(self) -> str | None:
        return self.worker.fatal.message if self.worker.fatal else None

    @property
    def fatal_hint(self) -> str:
        return self.worker.fatal.hint if self.worker.fatal else ""

    def snapshot(self) -> SupervisorFacts:
        """Facts for status, health and metrics."""
        run = self.current
        return SupervisorFacts(
            engine=_engine_facts(self.worker.engine, self.choice.name, self.worker.estimate),
            fallback_reason=self.choice.fallback_reason,
            fatal=self.fatal_message,
            worker=self.worker.facts(self.choice.switches),
            current=None if run is None else run.facts(),
        )

    # -- the worker -------------------------------------------------------------------

    def _worker_wanted(self) -> bool:
        """Whether to start a worker now. After an idle unload only a document that may
        start does: held documents wait in the queue anyway, and a worker started for
        nothing would be unloaded again."""
        if self.worker.state is not WorkerState.UNLOADED:
            return True
        return self.held_because is None and DocumentRun.queued(
            self.records, self._held_inboxes()
        )

    def _held_inboxes(self) -> frozenset[str]:
        return frozenset(self.inboxes.missing_inboxes())

    def _stop_if_between_pages(self, now: float) -> None:
        """While stopping, a worker that holds no request is told to exit, however it got
        there: a finished page, a failed, completed or vanished document, an output wait, a
        failure the supervisor recorded, or an engine still loading.

        This is checked on every tick rather than by each way a document can end: a new
        way to end one must not be able to leave the daemon waiting forever for a stop.
        """
        worker = self.worker
        if worker.proc is not None and worker.state in (WorkerState.IDLE, WorkerState.STARTING):
            worker.ask_to_stop(now, reason="shutdown")

    def _check_health(self, now: float) -> None:
        match self.worker.check(now):
            case Crashed(reason=reason):
                run, self.current = self.current, None
                if run is None and self.worker.state is not WorkerState.FATAL:
                    log.error("%s", self.worker.last_crash or reason)
                elif run is not None:
                    run.crashed(reason, self.cfg.worker.max_attempts)
            case Overdue():
                run = self.current
                if run is not None and self.stopping:
                    self._interrupt_current("stop timeout")
                    return  # no restart: the daemon is stopping
                if run is not None:
                    self._fail_current(FailureKind.TIMEOUT.value, run.overdue(now, self.cfg.limits))
                self.worker.recover(now)

    def _on_unavailable(self, now: float, message: str, hint: str) -> None:
        # Mid-document (the MinerU server went away for longer than the retries last):
        # not the document's fault; it resumes at its first unfinished page.
        self._interrupt_current(f"engine unavailable: {message}")
        self.worker.reap()
        if self.choice.fall_back(now, message, hint):
            self.worker.restart_at = now
            return
        self.worker.cannot_run(f"engine {self.choice.name!r} cannot run: {message}", hint)

    def _switch_back(self, now: float) -> None:
        """The MinerU server answers again: replace the fallback worker at a document
        boundary (now: the worker is idle)."""
        primary = self.choice.switch_back()
        self.worker.ask_to_stop(now, reason=f"switching back to engine {primary!r}")

    # -- messages ---------------------------------------------------------------------

    def _drain(self, now: float) -> None:
        if self.pending is not None:
            # A step whose recording hit a locked database on an earlier tick goes first.
            step, self.pending = self.pending, None
            self._guarded(step, now)
        while (msg := self.worker.receive(now)) is not None:
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
        worker = self.worker
        match msg:
            case Heartbeat(peak_rss=peak):
                worker.peak_rss = max(worker.peak_rss, peak)
                return
            case Ready(engine=engine, pages_in_flight=in_flight, estimate=estimate):
                worker.ready(now, engine, in_flight, estimate)
                return
            case Unavailable(message=message, hint=hint):
                self._on_unavailable(now, message, hint)
                return
        run = self.current
        if run is None or msg.job_id != run.job.id:
            return  # stale answer about a document we gave up on
        match msg:
            case Progress():
                run.progress(msg)
            case Inspected(page_count=page_count):
                run.inspected(page_count)
                self._next_page(now)
            case PageDone():
                run.save_page(now, msg, worker.engine)
                if run.pending and not self.stopping and worker.over_memory():
                    # Recycle at a page boundary: the document resumes on the fresh worker.
                    # Only after a page, so a worker that is big from the start advances.
                    self._interrupt_current("worker recycled (memory)")
                    worker.ask_to_stop(now, reason=f"RSS {worker.rss >> 20} MiB over max_rss_mb")
                    return
                self._next_page(now)
            case DocError(kind=kind, message=message):
                away = self.inboxes.look_at_inbox(run.job.inbox)
                if away is None:
                    self._fail_current(kind, message)
                else:
                    # The file could not be read because its inbox is away (moved, not
                    # mounted), not because it is broken: it waits with the rest of its
                    # inbox and resumes, as the same job, when the inbox is back.
                    self._interrupt_current(f"its inbox is {away}")
                worker.idle(now)

    # -- documents --------------------------------------------------------------------

    def _take_next(self, now: float) -> None:
        if self.held_because is not None:
            return  # documents wait in the queue (as for a full outbox), none fails
        run = DocumentRun.take_next(
            self.records, self.cfg, self.worker.engine, now, self._held_inboxes()
        )
        if run is None:
            return
        self.current = run
        self.worker.busy(now + self.cfg.limits.page_timeout_seconds)
        self.worker.send(run.inspect())

    def _next_page(self, now: float) -> None:
        run = self.current
        assert run is not None
        if not run.pending:
            # Also when stopping: every page is stored, and finishing now (seconds) beats
            # leaving a complete document for the next start.
            self._complete_current(now)
            return
        if self.stopping:
            self._interrupt_current("the daemon is stopping")
            self.worker.idle(now)  # the tick stops the worker
            return
        request = run.next_page(now, self._lookahead())
        self.worker.deadline = run.deadline(now, self.cfg.limits)
        self.worker.send(request)

    def _lookahead(self) -> int:
        if not self.LOOKAHEAD:
            return 0  # switched off (bench/bench_pipeline.py)
        return max(self.LOOKAHEAD, self.worker.pages_in_flight - 1)

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
        run = self.current
        assert run is not None
        worker = self.worker
        if run.complete(now, self.cfg, worker.engine, worker.peak_rss):
            worker.docs_done += 1
            worker.consecutive_failures = 0
        self.current = None
        worker.idle(now)

    def _fail_current(self, kind: str, message: str) -> None:
        run = self.current
        assert run is not None
        run.fail(kind, message)
        self.worker.docs_done += 1
        self.current = None

    def _interrupt_current(self, why: str) -> None:
        run = self.current
        if run is not None:
            run.interrupt(why)  # first: a locked database leaves the run to try again
            self.current = None
