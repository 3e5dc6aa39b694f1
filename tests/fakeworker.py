"""A worker the test answers for: the supervisor's unit tests tick against it.

The supervisor's decisions (deadlines, stop, crash, resume) depend on WHEN the worker's
answers arrive relative to its own ticks. A real worker answers when its engine is done, so
a test can only race it; this one answers when the test says, over the same real pipe, in
the same messages. It replaces `multiprocessing`'s context (`Pipe`, `Process`) and nothing
else: the store, the publisher and the supervisor under test are the shipped ones. The real
worker process is covered by the integration tests (marked `integration`).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from daemon.document.page import Block, EngineInfo
from daemon.document.protocol import (
    DocError,
    Inspect,
    Inspected,
    PageDone,
    ParsePage,
    Ready,
    Request,
    Stop,
    Unavailable,
)


class FakeWorker:
    """Quacks like the `BaseProcess` the supervisor holds; the test plays its other end."""

    def __init__(self, conn: Connection, pages: Callable[[int], int], engine: str = "fake",
                 unavailable: bool = False) -> None:
        self.conn = conn
        self.pages = pages  # job id -> page count its document has
        self.engine = engine
        self.unavailable = unavailable  # the engine "cannot load": Unavailable, then exit
        self.pages_in_flight = 1  # what Ready says the engine parses at once
        self.pid: int | None = None  # no real process: nothing for psutil to measure
        self.exitcode: int | None = None
        self.alive = False
        # Requests this says yes to stay unanswered in `held`, for the test to answer.
        self.hold: Callable[[Request], bool] = lambda msg: False
        self.held: list[Request] = []
        self.seen: list[Request] = []

    # -- the Process API the supervisor uses ------------------------------------------

    def start(self) -> None:
        self.alive = True
        if self.unavailable:
            self.send(Unavailable("test engine says its weights are missing", "make weights"))
            self.exit(0)
        else:
            self.send(Ready(EngineInfo(name=self.engine), self.pages_in_flight))

    def is_alive(self) -> bool:
        return self.alive

    def kill(self) -> None:
        self.exit(-9)

    def join(self, timeout: float | None = None) -> None:
        return None

    def close(self) -> None:
        return None

    # -- the test's side ----------------------------------------------------------------

    def send(self, msg: Any) -> None:
        self.conn.send(msg)

    def exit(self, code: int) -> None:
        """The process ends (status `code`, or -signal)."""
        if self.alive:
            self.alive = False
            self.exitcode = code
            self.conn.close()

    def serve(self) -> None:
        """Read what the supervisor sent; answer it unless holding. `Stop` ends us, as it
        ends the real worker: it is only ever read between requests."""
        while self.alive and self.conn.poll():
            msg = self.conn.recv()
            self.seen.append(msg)
            if isinstance(msg, Stop):
                self.exit(0)
                return
            if self.hold(msg):
                self.held.append(msg)
            else:
                self.answer(msg)

    def answer(self, msg: Request) -> None:
        """What a healthy worker answers."""
        match msg:
            case Inspect(job_id=job_id):
                self.send(Inspected(job_id, kind="pdf", format="pdf",
                                    page_count=self.pages(job_id)))
            case ParsePage(job_id=job_id, page_idx=idx):
                block = Block(type="text", bbox=(0.1, 0.1, 0.9, 0.2), text=f"page {idx + 1}")
                self.send(PageDone(job_id, idx, (block,), {"width": 100}, 0.5))
            case _:
                raise AssertionError(f"unexpected request {msg!r}")

    def fail(self, msg: Request, kind: str, message: str) -> None:
        assert not isinstance(msg, Stop), "a stop carries no document to fail"
        self.send(DocError(msg.job_id, kind, message))

    def take(self) -> Request:
        assert self.held, f"the worker holds no request; it saw {self.seen}"
        return self.held.pop(0)

    def page_requests(self, job_id: int) -> list[int]:
        return [m.page_idx for m in self.seen if isinstance(m, ParsePage) and m.job_id == job_id]


class _ChildEnd:
    """The worker's end of the pipe. The supervisor closes its copy after `start()`, as
    it must with a real child (which holds its own); here that copy is the worker's."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def close(self) -> None:
        return None


class FakeContext:
    """Stands in for `multiprocessing.get_context("spawn")` in `Supervisor(context=...)`."""

    def __init__(self, pages: Callable[[int], int] = lambda job_id: 1,
                 hold: Callable[[Request], bool] = lambda msg: False,
                 unavailable: frozenset[str] = frozenset()) -> None:
        self.pages = pages
        self.hold = hold
        self.unavailable = unavailable  # engine names whose worker cannot load them
        # The pid the supervisor measures (psutil) for every worker; None: nothing to measure.
        self.pid: int | None = None
        self.pages_in_flight = 1  # what every worker's Ready says
        self.workers: list[FakeWorker] = []

    def Pipe(self, duplex: bool = True) -> tuple[Connection, _ChildEnd]:
        parent, child = multiprocessing.Pipe(duplex)
        return parent, _ChildEnd(child)

    def Process(self, target: Any, args: tuple[Any, ...], name: str,
                daemon: bool) -> FakeWorker:
        conn, _cfg, engine = args[:3]
        worker = FakeWorker(conn.conn, self.pages, engine, engine in self.unavailable)
        worker.hold = lambda msg: self.hold(msg)  # the context's rule, as it is now
        worker.pid = self.pid
        worker.pages_in_flight = self.pages_in_flight
        self.workers.append(worker)
        return worker

    @property
    def worker(self) -> FakeWorker:
        return self.workers[-1]
