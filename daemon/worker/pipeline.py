"""The worker's page pipeline: keep the engine fed while the supervisor asks page by page.

The supervisor asks for one page at a time and commits each answer before it asks for the
next (resume, deadlines), naming the pages it will ask for next (`ParsePage.lookahead`).
Between two pages the engine would otherwise wait for the answer's round trip and for the
next page to be rendered (a second or more at 200 DPI). So, within one document:

- an engine that takes one page at a time (`max_pages_in_flight` 1, every in-process
  engine) parses in the worker's main thread while ONE background thread renders the next
  lookahead page and reads its PDF text layer: at most one page ahead, so memory holds two
  pages at most;
- an engine that declares `max_pages_in_flight` k > 1 (a remote inference server, whose
  batching wants many requests, or the `mineru` engine batching several pages' model steps
  together, engine.page_batch) gets up to k pages parsed at once, each in its own thread
  (render, then `parse_page`, inside the engine's `coming_page()` so a batch being formed
  waits for the page); its `parse_page` must be thread-safe.

Every page is prepared the same way, ahead or not: rendered, then its PDF text layer read
when the options let engines use it (`textlayer.with_text_layer`), and handed to the
engine on its `PageInput`.

Answers still go out strictly in page order and only when asked: a page prepared or parsed
ahead waits here until its request comes. A new document, a stop, or a request whose
lookahead no longer names a prepared page discards that work (a thread already running is
left to finish and its result dropped; nothing is sent for it). Errors of a page worked
on ahead are raised when that page is asked for, so a document fails on the page that
failed, in order.

PDFium may not be called from two threads at once; sniff/raster/textlayer serialise their
calls on `sniff.PDFIUM_LOCK`, so rendering ahead overlaps the engine, not PDFium itself.

Idle time: the engine is idle while no page of the document is being parsed. Each page's
info carries `idle_seconds` (how long the engine waited for this page after the previous
one finished; None for the first page the pipeline parsed in a document) and
`engine_seconds` (its time in `parse_page`), so "model busy %" is measured, not assumed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from daemon.config.settings import Config
from daemon.document.page import (
    Engine,
    PageInput,
    PageOptions,
    PageResult,
    ProgressFn,
    coming_page,
    pages_in_flight,
)
from daemon.document.protocol import PageDone, ParsePage

if TYPE_CHECKING:  # sniff loads PDFium and Pillow: the worker's business only
    from daemon.input.sniff import DocumentInfo

log = logging.getLogger("docinbox.worker")

# progress(page_idx, done, total, what, pages_in_flight)
PageProgress = Callable[[int, int, int, str, int], None]


@dataclass
class _Slot:
    """One page worked on ahead, in a thread of its own."""

    page_idx: int
    parse: bool  # False: render only (the engine parses it in the main thread)
    done: threading.Event = field(default_factory=threading.Event)
    page: PageInput | None = None
    result: PageResult | None = None
    engine_seconds: float = 0.0
    idle_seconds: float | None = None
    error: BaseException | None = None


class _Busy:
    """Counts pages inside the engine; measures the gaps when there are none."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.active = 0
        self.idle_since: float | None = None  # None until a first page finished

    def enter(self) -> float | None:
        with self.lock:
            idle = None
            if self.active == 0 and self.idle_since is not None:
                idle = max(0.0, self.clock() - self.idle_since)
            self.active += 1
            return idle

    def leave(self) -> None:
        with self.lock:
            self.active -= 1
            if self.active == 0:
                self.idle_since = self.clock()


class PagePipeline:
    """The pages of ONE document; built at its first page request, dropped at the next
    document or a stop."""

    def __init__(
        self,
        engine: Engine,
        cfg: Config,
        job_id: int,
        path: Path,
        doc: DocumentInfo,
        options: PageOptions,
        progress: PageProgress,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.cfg = cfg
        self.job_id = job_id
        self.path = path
        self.doc = doc
        self.options = options
        self.progress = progress
        self.clock = clock
        self.in_flight = pages_in_flight(engine)
        self.slots: dict[int, _Slot] = {}
        self.busy = _Busy(clock)
        self.closed = False
        # One render at a time: Pillow's bomb limit is a module global set per call, and
        # several renders would only compete for the same cores as the engine.
        self.render_lock = threading.Lock()

    def serves(self, req: ParsePage) -> bool:
        """Whether `req` continues this pipeline's document (same job, file and options)."""
        return (req.job_id, Path(req.path), req.options) == (
            self.job_id, self.path, self.options
        )

    def close(self) -> None:
        """Discard everything worked on ahead; running threads finish into nothing."""
        self.closed = True
        self.slots.clear()

    @property
    def ahead(self) -> list[int]:
        """Pages worked on ahead right now (for tests and the log)."""
        return sorted(self.slots)

    # -- one request ----------------------------------------------------------------------

    def run(self, req: ParsePage) -> PageDone:
        t0 = self.clock()
        wanted = [req.page_idx, *req.lookahead]
        for idx in [i for i in self.slots if i not in wanted]:
            del self.slots[idx]  # the supervisor's plan changed: drop it
        if self.in_flight > 1:
            return self._run_concurrent(req, wanted, t0)
        slot = self.slots.pop(req.page_idx, None)
        if slot is not None:
            slot.done.wait()
            if slot.error is not None:
                raise slot.error
            assert slot.page is not None
            page = slot.page
        else:
            page = self._render(req.page_idx)
        # The next page renders while this one is in the engine: one ahead, no more.
        for idx in req.lookahead[:1]:
            if idx not in self.slots:
                self._start(idx, parse=False)
        idle = self.busy.enter()
        try:
            started = self.clock()
            result = self.engine.parse_page(page, self.options, self._progress(req.page_idx))
            engine_seconds = self.clock() - started
        finally:
            self.busy.leave()
        return self._done(req.page_idx, page, result, engine_seconds, idle, t0)

    def _run_concurrent(self, req: ParsePage, wanted: list[int], t0: float) -> PageDone:
        for idx in wanted[: self.in_flight]:
            if idx not in self.slots:
                self._start(idx, parse=True)
        slot = self.slots.pop(req.page_idx)
        slot.done.wait()
        if slot.error is not None:
            raise slot.error
        assert slot.page is not None and slot.result is not None
        return self._done(
            req.page_idx, slot.page, slot.result, slot.engine_seconds, slot.idle_seconds, t0
        )

    def _done(
        self,
        page_idx: int,
        page: PageInput,
        result: PageResult,
        engine_seconds: float,
        idle: float | None,
        t0: float,
    ) -> PageDone:
        from daemon.worker.crops import finish_page

        result = finish_page(page, result)  # crops of figures/tables, cut while we hold pixels
        info: dict[str, Any] = dict(result.info)
        info.setdefault("width", page.image.width)
        info.setdefault("height", page.image.height)
        info.setdefault("dpi", page.dpi)
        info["engine_seconds"] = round(engine_seconds, 3)
        info["idle_seconds"] = None if idle is None else round(idle, 3)
        return PageDone(
            self.job_id,
            page_idx,
            tuple(result.blocks),
            info,
            self.clock() - t0,
            result.crops,
            result.model_output,
        )

    # -- work ahead -------------------------------------------------------------------------

    def _start(self, page_idx: int, *, parse: bool) -> None:
        if not 0 <= page_idx < self.doc.page_count:
            return  # a bad index fails when (if) it is asked for, not ahead of time
        slot = _Slot(page_idx, parse)
        self.slots[page_idx] = slot
        threading.Thread(
            target=self._work,
            args=(slot,),
            name=f"page-{page_idx + 1}",
            daemon=True,  # a stop must not wait for a page nobody will ask for
        ).start()

    def _work(self, slot: _Slot) -> None:
        with coming_page(self.engine) if slot.parse else nullcontext():
            self._work_on(slot)

    def _work_on(self, slot: _Slot) -> None:
        try:
            slot.page = self._render(slot.page_idx)
            if slot.parse and not self.closed:
                slot.idle_seconds = self.busy.enter()
                try:
                    started = self.clock()
                    slot.result = self.engine.parse_page(
                        slot.page, self.options, self._progress(slot.page_idx)
                    )
                    slot.engine_seconds = self.clock() - started
                finally:
                    self.busy.leave()
        except BaseException as exc:  # kept for the page's turn, raised there
            slot.error = exc
        finally:
            slot.done.set()

    def _render(self, page_idx: int) -> PageInput:
        """The page as the engine gets it: its pixels, and its text layer where used."""
        from daemon.input import raster, textlayer

        with self.render_lock:
            page = raster.render_page(
                self.path,
                self.doc,
                page_idx,
                dpi=self.options.dpi,
                max_long_side=self.options.max_long_side,
                max_image_pixels=self.cfg.limits.max_image_pixels,
            )
        return textlayer.with_text_layer(page, self.options)

    def _progress(self, page_idx: int) -> ProgressFn:
        def report(done: int, total: int, what: str) -> None:
            if not self.closed:
                self.progress(page_idx, done, total, what, max(1, self.busy.active))

        return report
