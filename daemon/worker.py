"""The worker process: loads the engine ONCE, then parses pages it is sent.

It runs in a child started with the `spawn` method, so it begins with a fresh interpreter:
no inherited threads or locks from the daemon (watchdog observers, SQLite), and torch is
only ever imported here. It never touches the database or the outbox; it answers over a
pipe and the supervisor records everything. If it dies (segfault, OOM kill, deadline kill)
nothing is lost but the page in progress.

Protocol (tuples over a multiprocessing Connection):

supervisor -> worker
    ("inspect", job_id, path)                   open/validate, count pages
    ("page", job_id, path, page_idx, options)   render + parse one page
    ("stop",)                                   exit cleanly

worker -> supervisor
    ("ready", EngineInfo-as-dict)
    ("unavailable", message, hint)              engine cannot load here; worker exits
    ("heartbeat", peak_rss_bytes)
    ("inspected", job_id, {"kind", "format", "page_count"})
    ("progress", job_id, page_idx, done, total, what)
    ("page_done", job_id, page_idx, [block dicts], info, seconds)
    ("doc_error", job_id, kind, message)
"""

from __future__ import annotations

import faulthandler
import logging
import os
import resource
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from daemon.config import Config
from daemon.errors import DocumentError, EngineUnavailable, FailureKind

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

    def send(self, msg: tuple[Any, ...]) -> None:
        with self.lock:
            self.conn.send(msg)


def _heartbeat(chan: _Channel, interval: float, stop: threading.Event) -> None:
    # A thread, so heartbeats continue while the main thread is deep inside generate().
    # A hung engine still heartbeats: per-page deadlines catch that case.
    while not stop.wait(interval):
        try:
            chan.send(("heartbeat", peak_rss_bytes()))
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
    from daemon import raster, sniff
    from daemon.engines import create_engine

    try:
        engine = create_engine(engine_name, cfg.engine)
        info = engine.load()
    except EngineUnavailable as exc:
        chan.send(("unavailable", exc.message, exc.hint))
        return
    except Exception as exc:  # a broken install must be reported, not crash-looped silently
        # One sentence in the log (the supervisor repeats it with the fallback it takes);
        # the traceback only with logging.level DEBUG, for a bug report.
        log.error("engine %s failed to load: %s: %s", engine_name, type(exc).__name__, exc)
        log.debug("engine %s load traceback", engine_name, exc_info=True)
        chan.send(
            (
                "unavailable",
                f"{type(exc).__name__}: {exc}",
                "reinstall docinbox (bash scripts/setup.sh); set logging.level: DEBUG to see "
                "the traceback",
            )
        )
        return
    chan.send(("ready", asdict(info)))

    docs: dict[int, sniff.DocumentInfo] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the daemon is gone: nothing to report to
        op = msg[0]
        if op == "stop":
            engine.close()
            return
        job_id = int(msg[1])
        path = Path(msg[2])
        try:
            if op == "inspect":
                docs.clear()  # one document at a time: forget the previous one's password
                doc = _inspect(sniff, path, cfg)
                docs[job_id] = doc
                chan.send(
                    (
                        "inspected",
                        job_id,
                        {"kind": doc.kind, "format": doc.format, "page_count": doc.page_count},
                    )
                )
            elif op == "page":
                doc = docs.get(job_id) or _inspect(sniff, path, cfg)
                docs[job_id] = doc
                _page(chan, engine, raster, cfg, job_id, path, doc, int(msg[3]), dict(msg[4]))
            else:
                log.error("unknown request %r", op)
        except DocumentError as exc:
            chan.send(("doc_error", job_id, exc.kind.value, exc.message))
        except FileNotFoundError:
            chan.send(
                (
                    "doc_error",
                    job_id,
                    FailureKind.VANISHED.value,
                    "the file disappeared from the inbox before it was processed",
                )
            )
        except MemoryError:
            chan.send(
                (
                    "doc_error",
                    job_id,
                    FailureKind.ENGINE.value,
                    "ran out of memory on this page; lower engine.dpi or limits.max_image_pixels",
                )
            )
        except Exception as exc:
            # An engine bug on one page must not take the worker down: report it as this
            # document's failure with the last frame, which is what a bug report needs.
            tb = traceback.extract_tb(exc.__traceback__)
            where = f" at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else ""
            log.exception("engine error on job %s", job_id)
            chan.send(
                (
                    "doc_error",
                    job_id,
                    FailureKind.ENGINE.value,
                    f"{type(exc).__name__}: {exc}{where}",
                )
            )


class _Progress:
    """Rate-limited progress reports for one page (block k of K)."""

    def __init__(self, chan: _Channel, job_id: int, page_idx: int) -> None:
        self.chan, self.job_id, self.page_idx = chan, job_id, page_idx
        self.last = 0.0

    def __call__(self, done: int, total: int, what: str) -> None:
        t = time.monotonic()
        if t - self.last >= PROGRESS_INTERVAL or done == total:
            self.last = t
            self.chan.send(("progress", self.job_id, self.page_idx, done, total, what))


def _page(
    chan: _Channel,
    engine: Any,
    raster: Any,
    cfg: Config,
    job_id: int,
    path: Path,
    doc: Any,
    page_idx: int,
    opts: dict[str, Any],
) -> None:
    from daemon.page import PageOptions

    t0 = time.monotonic()
    # The supervisor sends the complete options (config.page_options_for) as a dict.
    options = PageOptions(**opts)
    page = raster.render_page(
        path,
        doc,
        page_idx,
        dpi=options.dpi,
        max_long_side=options.max_long_side,
        max_image_pixels=cfg.limits.max_image_pixels,
    )
    result = engine.parse_page(page, options, _Progress(chan, job_id, page_idx))
    seconds = time.monotonic() - t0
    info = dict(result.info)
    info.setdefault("width", page.image.width)
    info.setdefault("height", page.image.height)
    info.setdefault("dpi", page.dpi)
    chan.send(("page_done", job_id, page_idx, [b.to_dict() for b in result.blocks], info, seconds))


def _inspect(sniff: Any, path: Path, cfg: Config) -> Any:
    return sniff.inspect(path, passwords=cfg.passwords, limits=cfg.limits)
