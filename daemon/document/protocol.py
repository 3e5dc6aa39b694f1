"""The messages between the supervisor (daemon process) and the worker process.

One frozen dataclass per message, pickled over a `multiprocessing` pipe and taken apart
with `match` on both sides, so a field added here is seen by the type checker at every
reader; there is no positional tuple to miscount. A new message goes here, with a case
in `Supervisor._handle` (worker -> supervisor) or `worker._serve` (supervisor -> worker).

The conversation, one document at a time:

    supervisor                         worker
    ----------                         ------
                                 <-    Ready(engine, estimate) | Unavailable(message, hint)
    Inspect(job, path)           ->
                                 <-    Inspected(job, kind, format, page_count) | DocError
    ParsePage(job, path, page,   ->    (renders the lookahead pages in the background)
              options, lookahead)
                                 <-    Progress(...)*, then PageDone | DocError
    ... one ParsePage per page; the supervisor records each PageDone before the next ...
    Stop()                       ->    (read only between requests; the worker exits)
                                 <-    Heartbeat(peak_rss) every few seconds, from a thread

This module is imported by the daemon process: it must stay free of Pillow and torch
(daemon.document.page types the page image for the checker only).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from daemon.common.live import PageEstimate
from daemon.document.page import Block, Crop, EngineInfo, Json, PageOptions

# -- supervisor -> worker ---------------------------------------------------------------


@dataclass(frozen=True)
class Inspect:
    """Open and validate the document, count its pages. Starts a new document: whatever
    the worker prepared for the previous one (passwords, rendered pages) is dropped."""

    job_id: int
    path: str


@dataclass(frozen=True)
class ParsePage:
    """Render and parse one page.

    `lookahead` are the pages of the same document the supervisor will ask for next, in
    order: the worker may prepare them (render, text layer) or, for engines that take
    several pages at once, start parsing them while this one is in the engine. The answer
    is still about `page_idx` only; the supervisor commits page by page.
    """

    job_id: int
    path: str
    page_idx: int
    options: PageOptions
    lookahead: tuple[int, ...] = ()


@dataclass(frozen=True)
class Stop:
    """Exit cleanly (between requests: a page in progress is not interrupted)."""


Request = Inspect | ParsePage | Stop

# -- worker -> supervisor ---------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """The engine is loaded; requests may come."""

    engine: EngineInfo
    # How many pages the engine parses at once (its max_pages_in_flight): the supervisor
    # names at least that many pages ahead, so they can all be in flight.
    pages_in_flight: int = 1
    # Seconds per typical page on this machine (daemon/common/estimate.py), or why none.
    estimate: PageEstimate | None = None


@dataclass(frozen=True)
class Unavailable:
    """The engine cannot run here (weights missing, broken install); the worker exits."""

    message: str
    hint: str


@dataclass(frozen=True)
class Heartbeat:
    """Sent from a thread, so it keeps coming while a page is deep in the engine."""

    peak_rss: int  # bytes; the true peak, which sampling from outside can miss


@dataclass(frozen=True)
class Inspected:
    job_id: int
    kind: str  # "pdf" | "image"
    format: str
    page_count: int


@dataclass(frozen=True)
class Progress:
    """Rate-limited: where the engine is on the page (block `done` of `total`)."""

    job_id: int
    page_idx: int
    done: int
    total: int
    what: str  # "layout", "block", ...
    pages_in_flight: int = 1  # pages of this document the worker is working on now


@dataclass(frozen=True)
class PageDone:
    job_id: int
    page_idx: int
    blocks: tuple[Block, ...]
    info: dict[str, Json] = field(default_factory=dict)  # facts for meta.json
    seconds: float = 0.0  # from the request to the answer
    crops: tuple[Crop, ...] = ()  # JPEGs of the page's figures (daemon.worker.crops)
    model_output: dict[str, Json] | None = None  # the model's raw answers (<stem>_model.json)


@dataclass(frozen=True)
class DocError:
    """The document cannot be converted (corrupt, encrypted, vanished, engine error on one
    of its pages): the supervisor fails it with `kind` and `message`."""

    job_id: int
    kind: str  # an errors.FailureKind value
    message: str
    page_idx: int | None = None  # the page it failed on, when it was a page


Reply = Ready | Unavailable | Heartbeat | Inspected | Progress | PageDone | DocError
