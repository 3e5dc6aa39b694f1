"""The worker process: loads the engine ONCE, then parses pages it is sent.

It runs in a child started with the `spawn` method, so it begins with a fresh interpreter:
no inherited threads or locks from the daemon (watchdog observers, SQLite), and torch is
only ever imported here. It never touches the database or the outbox; it answers over a
pipe and the supervisor records everything. If it dies (segfault, OOM kill, deadline kill)
nothing is lost but the page in progress.

The messages it exchanges with the supervisor are in daemon/document/protocol.py.
"""

from __future__ import annotations

import faulthandler
import functools
import logging
import os
import resource
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

from daemon.common.errors import DocumentError, EngineUnavailable, FailureKind
from daemon.config.settings import Config
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

if TYPE_CHECKING:  # the engine, sniffing and the pipeline are loaded in the worker only
    from daemon.common.live import PageEstimate
    from daemon.document.page import Engine
    from daemon.input.sniff import DocumentInfo
    from daemon.worker.pipeline import PagePipeline

log = logging.getLogger("docinbox.worker")

# Progress messages are rate-limited: a page can have hundreds of blocks.
PROGRESS_INTERVAL = 0.5


def peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux: the true peak, which sampling from outside can miss.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class _Channel:
    """The pipe is shared by the main thread and the heartbeat thread: serialise sends."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, msg: Reply) -> None:
        with self.lock:
            self.conn.send(msg)


def _heartbeat(chan: _Channel, interval: float, stop: threading.Event) -> None:
    # A thread, so heartbeats continue while the main thread is deep inside generate().
    # A hung engine still heartbeats: per-page deadlines catch that case.
    while not stop.wait(interval):
        try:
            chan.send(Heartbeat(peak_rss_bytes()))
        except (BrokenPipeError, OSError):
            return


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL us when the daemon dies, however it dies.

    Without this, a kill -9 of the daemon (or the OOM killer choosing it) leaves a
    multi-GB orphan finishing a page nobody will record.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return  # not Linux: the pipe's EOF still ends us after the current page


def worker_main(conn: Connection, cfg: Config, engine_name: str, parent_pid: int = 0) -> None:
    """Entry point of the child process."""
    _die_with_parent()
    if parent_pid and os.getppid() != parent_pid:
        return  # the daemon died before prctl took effect
    # The daemon handles SIGINT/SIGTERM and tells us to stop between pages; a Ctrl-C in
    # the terminal must not kill us mid-page.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    logging.basicConfig(
        level=cfg.logging.level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s worker[%(process)d] %(message)s",
    )
    # `kill -USR1 <worker pid>` prints every thread's stack: how to see where a stuck
    # page is stuck without a debugger on a headless server.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # A SIGSEGV or abort (in torch, a native kernel, an engine's import) prints the Python
    # stack of every thread to stderr before the process dies: the "last words" that
    # `parse` and `status` point to when the worker keeps dying.
    faulthandler.enable(all_threads=True)
    chan = _Channel(conn)
    stop = threading.Event()
    hb = threading.Thread(
        target=_heartbeat, args=(chan, cfg.worker.heartbeat_seconds, stop), daemon=True
    )
    hb.start()
    try:
        _serve(chan, conn, cfg, engine_name)
    finally:
        stop.set()


def _serve(chan: _Channel, conn: Connection, cfg: Config, engine_name: str) -> None:
    loaded = _load_engine(chan, cfg, engine_name)
    if loaded is None:
        return
    engine, slot = loaded, _Slot(loaded, cfg, _Progress(chan))
    while True:
        try:
            msg: Request = conn.recv()
        except (EOFError, OSError):
            return  # the daemon is gone: nothing to report to
        if isinstance(msg, Stop):
            slot.close()
            engine.close()
            return
        try:
            match msg:
                case Inspect():
                    chan.send(slot.inspect(msg))
                case ParsePage():
                    chan.send(slot.parse(msg))
                case _:
                    log.error("unknown request %r", msg)
        except Exception as exc:
            if not _report(chan, msg, exc):
                engine.close()
                return


def _load_engine(chan: _Channel, cfg: Config, engine_name: str) -> Engine | None:
    """Load the engine and say `Ready`; None (having said `Unavailable`) when it cannot."""
    from daemon.document.page import pages_in_flight
    from daemon.engines.registry import create_engine

    try:
        engine = create_engine(engine_name, cfg.engine)
        info = engine.load()
    except EngineUnavailable as exc:
        chan.send(Unavailable(exc.message, exc.hint))
        return None
    except Exception as exc:  # a broken install must be reported, not crash-looped silently
        # One sentence in the log (the supervisor repeats it with the fallback it takes);
        # the traceback only with logging.level DEBUG, for a bug report.
        log.error("engine %s failed to load: %s: %s", engine_name, type(exc).__name__, exc)
        log.debug("engine %s load traceback", engine_name, exc_info=True)
        chan.send(
            Unavailable(
                f"{type(exc).__name__}: {exc}",
                "reinstall docinbox (bash scripts/setup.sh); set logging.level: DEBUG to see "
                "the traceback",
            )
        )
        return None
    chan.send(Ready(info, pages_in_flight(engine), _estimate(engine, cfg, engine_name)))
    return engine


def _estimate(engine: Engine, cfg: Config, engine_name: str) -> PageEstimate | None:
    """Seconds per typical page for the loaded engine: cached in the state folder, else
    timed now on the model (seconds; once per machine, precision and settings). A failed
    timing costs the figure, never the worker."""
    import dataclasses

    from daemon.common.estimate import EstimateCache, resolve

    settings = dataclasses.replace(cfg.engine, name=engine_name)
    timer = getattr(engine, "time_passes", None)
    try:
        estimate = resolve(
            settings, EstimateCache.in_state_dir(cfg), timer if callable(timer) else None,
            time.time,
        )
    except Exception as exc:
        log.warning("could not time the page estimate: %s: %s", type(exc).__name__, exc)
        return None
    return estimate  # the supervisor logs it, with its warning, in the daemon's log


class _Slot:
    """The one document the worker holds: what inspecting it found, and its page pipeline."""

    def __init__(self, engine: Engine, cfg: Config, progress: _Progress) -> None:
        self.engine = engine
        self.cfg = cfg
        self.progress = progress
        self.docs: dict[int, DocumentInfo] = {}
        self.pipeline: PagePipeline | None = None

    def inspect(self, msg: Inspect) -> Inspected:
        # One document at a time: forget the previous one's password and whatever was
        # prepared for it.
        self.docs.clear()
        self.close()
        doc = _inspect(Path(msg.path), self.cfg)
        self.docs[msg.job_id] = doc
        return Inspected(msg.job_id, doc.kind, doc.format, doc.page_count)

    def parse(self, msg: ParsePage) -> PageDone:
        from daemon.worker.pipeline import PagePipeline

        if self.pipeline is None or not self.pipeline.serves(msg):
            self.close()
            doc = self.docs.get(msg.job_id) or _inspect(Path(msg.path), self.cfg)
            self.docs.clear()
            self.docs[msg.job_id] = doc
            self.pipeline = PagePipeline(
                self.engine, self.cfg, msg.job_id, Path(msg.path), doc, msg.options,
                functools.partial(self.progress, msg.job_id),
            )
        return self.pipeline.run(msg)

    def close(self) -> None:
        if self.pipeline is not None:
            self.pipeline.close()
            self.pipeline = None


def _report(chan: _Channel, msg: Inspect | ParsePage, exc: Exception) -> bool:
    """Tell the supervisor why a request failed; False when this worker is done."""
    if isinstance(exc, DocumentError):
        chan.send(DocError(msg.job_id, exc.kind.value, exc.message))
    elif isinstance(exc, EngineUnavailable):
        # The engine's runtime went away mid-document (a MinerU server that stayed
        # down through every retry): not this document's fault. The supervisor hands
        # the document back to the queue and takes its fallback; this worker is done.
        log.error("engine unavailable on job %s: %s", msg.job_id, exc.message)
        chan.send(Unavailable(exc.message, exc.hint))
        return False
    elif isinstance(exc, FileNotFoundError):
        chan.send(
            DocError(
                msg.job_id,
                FailureKind.VANISHED.value,
                "the file disappeared from the inbox before it was processed",
            )
        )
    elif isinstance(exc, MemoryError):
        chan.send(
            DocError(
                msg.job_id,
                FailureKind.ENGINE.value,
                "ran out of memory on this page; lower engine.dpi or limits.max_image_pixels",
            )
        )
    else:
        # An engine bug on one page must not take the worker down: report it as this
        # document's failure with the last frame, which is what a bug report needs.
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else ""
        log.exception("engine error on job %s", msg.job_id, exc_info=exc)
        chan.send(
            DocError(msg.job_id, FailureKind.ENGINE.value, f"{type(exc).__name__}: {exc}{where}")
        )
    return True


class _Progress:
    """Rate-limited progress reports, per page (several may be in flight)."""

    def __init__(self, chan: _Channel) -> None:
        self.chan = chan
        self.last: dict[tuple[int, int], float] = {}

    def __call__(
        self, job_id: int, page_idx: int, done: int, total: int, what: str, in_flight: int
    ) -> None:
        t = time.monotonic()
        key = (job_id, page_idx)
        if t - self.last.get(key, 0.0) >= PROGRESS_INTERVAL or done == total:
            self.last[key] = t
            self.chan.send(Progress(job_id, page_idx, done, total, what, in_flight))


def _inspect(path: Path, cfg: Config) -> DocumentInfo:
    from daemon.input import sniff  # PDFium and Pillow: loaded in the worker only

    return sniff.inspect(path, passwords=cfg.passwords, limits=cfg.limits)
