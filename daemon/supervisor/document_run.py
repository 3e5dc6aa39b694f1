"""One document's run through the worker: its pages, its deadlines, and its outcome.

A run starts when the supervisor takes a job from the queue and ends in exactly one way:
done (its output written), waiting for its output (a full disk, a share gone), failed,
interrupted (it resumes at its first unfinished page), or crashed with the worker. Each
finished page is recorded in the store the moment it arrives, so a crash loses at most the
page in progress. The run never touches the worker process: the supervisor sends what the
run asks for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from daemon.common.display import safe_display
from daemon.common.errors import FailureKind
from daemon.common.live import CurrentDoc
from daemon.config.settings import Config, LimitsConfig, page_options_for, parse_page_range
from daemon.document.page import EngineInfo, PageOptions
from daemon.document.protocol import Inspect, PageDone, ParsePage, Progress
from daemon.document.record import PageRecord
from daemon.jobs.store import Job, NewEvent, Published, Store
from daemon.supervisor.output_retry import output_wait

log = logging.getLogger("docinbox.supervisor")


class Outcomes(Protocol):
    """What happens to a document once the worker is done with it (see daemon.output.publish)."""

    def complete(self, job: Job, engine: EngineInfo | None, seconds: float) -> Published:
        """Write the outbox folder, dispose of the original; return the output folder
        and the event to record with the outcome.

        Raises OSError when the outbox cannot be written (the job waits and retries).
        """
        ...

    def failed(self, job: Job, kind: str, message: str) -> NewEvent | None:
        """Move the original to failed/ with its error file (a disk problem is logged);
        return the event to record with the outcome."""
        ...


@dataclass(frozen=True)
class Records:
    """Where a run records what happens: the store, the document's fate, the wall clock."""

    store: Store
    outcomes: Outcomes
    wall: Callable[[], float]


def page_options(cfg: Config, job: Job) -> PageOptions:
    """The page options of a job's inbox, built once per document."""
    inbox = next((i for i in cfg.inboxes if str(i.path) == job.inbox), None)
    return page_options_for(cfg, inbox)


def resume_note(pending: Sequence[int], wanted: int, page_count: int) -> str:
    """What a run that found pages already stored says: the page it resumes at, or that
    none is left (a document whose output waited for its inbox or outbox comes back with
    every page done and is only published). `pending`: the page indexes still to do, in
    order; `wanted`: how many pages it converts (all, or its inbox's page range)."""
    if not pending:
        if wanted == 1:
            return "its one page already converted; publishing"
        return f"all {wanted} pages already converted; publishing"
    return f"resuming at page {min(pending) + 1} of {page_count}"


def _engine_name(engine: EngineInfo | None) -> str:
    return engine.name if engine else "?"


@dataclass
class DocumentRun:
    """The document in progress."""

    job: Job
    started: float
    options: PageOptions  # built once per document; sent with every page as it is
    records: Records
    page_count: int | None = None
    page_idx: int | None = None
    page_started: float = 0.0
    block: tuple[int, int] | None = None
    stage: str | None = None  # what the engine is doing on the page: "layout", "block", ...
    pages_in_flight: int = 1  # pages of the document the worker is parsing at once
    pending: list[int] = field(default_factory=list)
    # The pace of this run, for the document's ETA: when its first page was asked for, how
    # many pages are done since, and the estimate as of the last one.
    pages_from: float | None = None
    pages_done: int = 0
    eta_seconds: float | None = None

    @classmethod
    def take_next(
        cls, records: Records, cfg: Config, engine: EngineInfo | None, now: float,
        held_inboxes: frozenset[str] = frozenset(),
    ) -> DocumentRun | None:
        """Start the next queued job, or None when the queue is empty. Jobs of the
        `held_inboxes` (away) are not taken: they wait for their inbox."""
        store, wall = records.store, records.wall
        job = store.next_job(wall(), skip_inboxes=held_inboxes)
        if job is None:
            return None
        job = store.start_job(job.id, wall(), _engine_name(engine))
        log.info("job %s: started %s (attempt %d)", job.id, safe_display(job.source_path),
                 job.attempts)
        return cls(job=job, started=now, options=page_options(cfg, job), records=records)

    @staticmethod
    def queued(records: Records, held_inboxes: frozenset[str] = frozenset()) -> bool:
        """Whether a job may start now (what `take_next` would take), without taking it."""
        return records.store.next_job(records.wall(), skip_inboxes=held_inboxes) is not None

    # -- pages ------------------------------------------------------------------------

    def inspect(self) -> Inspect:
        return Inspect(self.job.id, self.job.read_path)

    def inspected(self, page_count: int) -> None:
        """The worker counted the pages: the ones still to do, in order."""
        store = self.records.store
        self.page_count = page_count
        store.set_page_count(self.job.id, page_count)
        done_pages = store.done_pages(self.job.id)
        wanted: Sequence[int] = range(page_count)
        if self.options.pages:
            wanted = parse_page_range(self.options.pages, page_count)  # validated in config
        self.pending = [i for i in wanted if i not in done_pages]
        if done_pages:
            log.info("job %s: %s", self.job.id, resume_note(self.pending, len(wanted),
                                                             page_count))

    def next_page(self, now: float, lookahead: int) -> ParsePage:
        """Ask for the next pending page, naming the `lookahead` pages that follow it."""
        self.page_idx = self.pending.pop(0)
        self.page_started = now
        if self.pages_from is None:
            self.pages_from = now
        self.block = None
        self.stage = None
        return ParsePage(
            self.job.id,
            self.job.read_path,
            self.page_idx,
            self.options,
            lookahead=tuple(self.pending[:lookahead]),
        )

    def deadline(self, now: float, limits: LimitsConfig) -> float:
        """When the page asked for now is overdue: its own limit, or the document's."""
        return min(
            now + limits.page_timeout_seconds, self.started + limits.document_timeout_seconds
        )

    def overdue(self, now: float, limits: LimitsConfig) -> str:
        """Why the deadline passed, in the words the failed document is marked with."""
        if now >= self.started + limits.document_timeout_seconds:
            return (
                f"the document took longer than limits.document_timeout_seconds "
                f"({limits.document_timeout_seconds:.0f} s)"
            )
        return (
            f"page {(self.page_idx or 0) + 1} took longer than "
            f"limits.page_timeout_seconds ({limits.page_timeout_seconds:.0f} s)"
        )

    def progress(self, msg: Progress) -> None:
        self.pages_in_flight = msg.pages_in_flight
        if msg.page_idx == self.page_idx:  # pages parsed ahead report too
            self.block = (msg.done, msg.total)
            self.stage = msg.what

    def save_page(self, now: float, msg: PageDone, engine: EngineInfo | None) -> None:
        record = PageRecord(
            msg.page_idx,
            msg.blocks,
            _engine_name(engine),
            msg.seconds,
            msg.info,
            crops=msg.crops,
            model_output=msg.model_output,
        )
        self.records.store.save_page(self.job.id, record, self.records.wall())
        log.info(
            "job %s: page %d/%s in %.1f s",
            self.job.id, msg.page_idx + 1, self.page_count, msg.seconds,
        )
        self.pages_done += 1
        # Wall time per page, not the engine's `seconds`: pages in flight overlap, and the
        # time between pages (rendering, recording) is part of what the user waits for.
        pace = (now - (self.pages_from or now)) / self.pages_done
        self.eta_seconds = pace * len(self.pending)

    def facts(self) -> CurrentDoc:
        return CurrentDoc(
            job_id=self.job.id,
            path=self.job.source_path,
            page=(self.page_idx + 1) if self.page_idx is not None else None,
            pages=self.page_count,
            block=self.block,
            stage=self.stage,
            pages_in_flight=self.pages_in_flight,
            eta_seconds=self.eta_seconds,
        )

    # -- outcomes ---------------------------------------------------------------------

    def complete(
        self, now: float, cfg: Config, engine: EngineInfo | None, peak_rss: int
    ) -> bool:
        """Every page is stored: write the output. False when it cannot be written yet
        (the job waits in the queue and retries). Idempotent, so a StoreBusy half-way
        lets the supervisor run it again."""
        store, wall = self.records.store, self.records.wall
        job = store.job(self.job.id) or self.job
        try:
            done = self.records.outcomes.complete(job, engine, now - self.started)
        except OSError as exc:
            # Disk full, outbox unwritable, NAS gone: not the document's fault.
            wait = output_wait(cfg, job.attempts, exc)
            log.warning("job %s: %s", job.id, wait.message)
            store.requeue(
                job.id,
                wall(),
                not_before=wall() + wait.delay,
                error_kind=FailureKind.OUTPUT.value,
                error=wait.message,
            )
            store.bump("output_errors_total")
            return False
        store.finish_job(job.id, wall(), done.folder, now - self.started, event=done.event)
        spp = done.page_seconds / max(1, done.pages)
        log.info(
            "job %s: done: %d page(s), %.1f s/page, %.1f s in all -> %s "
            "(worker peak RSS %d MiB, engine %s)",
            job.id, done.pages, spp, now - self.started, safe_display(done.folder),
            peak_rss >> 20,
            engine.name if engine else None,
        )
        return True

    def fail(self, kind: str, message: str) -> None:
        self._fail(self.records.store.job(self.job.id) or self.job, kind, message)

    def _fail(self, job: Job, kind: str, message: str) -> None:
        log.warning("job %s: failed (%s): %s", job.id, kind, message)
        event = self.records.outcomes.failed(job, kind, message)
        self.records.store.fail_job(job.id, self.records.wall(), kind, message, event=event)

    def interrupt(self, why: str) -> None:
        """Not the document's fault: back to the queue, to resume at its next page."""
        self.records.store.requeue(self.job.id, self.records.wall())
        log.info("job %s: interrupted (%s); will resume at the next page", self.job.id, why)

    def crashed(self, reason: str, max_attempts: int) -> None:
        """The worker died with this document: requeued, or failed after `max_attempts`."""
        job = self.records.store.requeue(
            self.job.id,
            self.records.wall(),
            crashed=True,
            error_kind=FailureKind.CRASHED.value,
            error=reason,
        )
        page = f" on page {self.page_idx + 1}" if self.page_idx is not None else ""
        log.error(
            "job %s: %s%s (crash %d of %d)", job.id, reason, page, job.crashes, max_attempts
        )
        if job.crashes >= max_attempts:
            self._fail(
                job,
                FailureKind.CRASHED.value,
                f"{reason}{page}, {job.crashes} times; giving up on this document",
            )
