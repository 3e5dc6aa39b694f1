"""watchdog observers and their event handler: events become hints on a queue.

The handler runs on watchdog's threads and does nothing but filter names and hand a
hint to the watcher's thread-safe sink; everything else happens on the main loop.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Generic, Literal, Protocol, TypeVar

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)

from daemon.config.settings import InboxConfig
from daemon.intake.ignore import is_ignored_file_name
from daemon.intake.mounts import ObserverKind

logger = logging.getLogger(__name__)

# "file": a file appeared or changed (a new file at that name ends any hold); "write": it
# was written by a process that still has it open (from observers that report closes);
# "closed": that writer closed it; "dir": a folder appeared; "gone": deleted or moved out;
# "root": the inbox folder itself was deleted or moved away (look at it now).
HintKind = Literal["file", "write", "closed", "dir", "gone", "root"]

# Only what can make a file appear or change, and the close after writing that ends a
# hold. Opened/closed-without-write events are left out on purpose: ingest reading a file
# must not make it pending again. Directory modified events (one per file created in it)
# are noise.
EVENT_FILTER: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileClosedEvent,
    FileDeletedEvent,
    DirCreatedEvent,
    DirMovedEvent,
    DirDeletedEvent,
]


class ObserverLike(Protocol):
    """What the watcher needs of a watchdog observer (tests inject fakes)."""

    def schedule(
        self,
        event_handler: FileSystemEventHandler,
        path: str,
        *,
        recursive: bool = ...,
        event_filter: list[type[FileSystemEvent]] | None = ...,
    ) -> object: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def join(self, timeout: float | None = ...) -> None: ...

    def is_alive(self) -> bool: ...


ObserverFactory = Callable[[ObserverKind, float], ObserverLike]


def reports_close_write(observer: ObserverLike) -> bool:
    """Whether `observer` reports a close after writing (IN_CLOSE_WRITE) for every file
    it reported written: only then may a write event hold a file until its close.

    An observer may say so itself with a boolean `reports_close_write` attribute (test
    fakes do); otherwise only watchdog's inotify observer does. FSEvents, kqueue, Windows
    and polling observers never report closes, and `Observer` falls back to polling where
    inotify is unavailable.
    """
    declared = getattr(observer, "reports_close_write", None)
    if isinstance(declared, bool):
        return declared
    try:
        from watchdog.observers.inotify import InotifyObserver
    except Exception:  # not Linux, or a libc without inotify
        return False
    return isinstance(observer, InotifyObserver)


def default_observer_factory(kind: ObserverKind, poll_interval: float) -> ObserverLike:
    # Imported here: picking the platform observer loads inotify bindings.
    if kind == "poll":
        from watchdog.observers.polling import PollingObserver

        return PollingObserver(timeout=poll_interval)
    from watchdog.observers import Observer

    return Observer()


def observer_healthy(observer: ObserverLike) -> bool:
    if not observer.is_alive():
        return False
    # An emitter stops by itself when its folder disappears (unmount, rmdir); the
    # observer thread keeps running, so look at the emitters too.
    emitters: Iterable[threading.Thread] = getattr(observer, "emitters", ())
    return all(emitter.is_alive() for emitter in emitters)


class WatchedInbox(Protocol):
    """What a handler reads of the watcher's per-inbox state, at event time (a reload
    may replace the inbox's settings under a running observer)."""

    @property
    def inbox(self) -> InboxConfig: ...

    @property
    def root(self) -> Path: ...


S = TypeVar("S", bound=WatchedInbox)


class EventHandler(FileSystemEventHandler, Generic[S]):
    """Runs on a watchdog thread: filters names and queues hints, nothing else."""

    def __init__(
        self,
        state: S,
        sink: Callable[[S, HintKind, str], None],
        *,
        reports_close_write: bool = False,
    ) -> None:
        super().__init__()
        self._state = state
        self._sink = sink
        # Only then is a write event followed by a close event: otherwise nothing would
        # ever end the hold, so writes are plain hints.
        self._reports_close_write = reports_close_write

    def dispatch(self, event: FileSystemEvent) -> None:
        try:
            self._dispatch(event)
        except Exception:
            # An exception here would kill the observer thread and silently stop events.
            logger.exception("inbox %s: error handling %r", self._state.root, event)

    def _wanted(self, path: str) -> bool:
        # Not junk: documents, and also files of no document type, which the watcher
        # notes as left alone at once (as a rescan would), not minutes later.
        return not is_ignored_file_name(os.path.basename(path))

    def _hint(self, path: str, is_directory: bool) -> None:
        if is_directory:
            # A folder moved or copied in: its files may come without events of their own.
            if self._state.inbox.recursive:
                self._sink(self._state, "dir", path)
        elif self._wanted(path):
            self._sink(self._state, "file", path)

    def _dispatch(self, event: FileSystemEvent) -> None:
        src = os.fsdecode(event.src_path)
        kind = event.event_type
        if kind in ("deleted", "moved") and event.is_directory and src == str(self._state.root):
            # inotify's IN_DELETE_SELF (watchdog then stops watching it) or the inbox moved
            # away: the watch is dead, the watcher must look at the folder now.
            self._sink(self._state, "root", src)
            return
        if kind == "moved":
            # rsync's `.x.pdf.AbC123` -> `x.pdf` arrives here: the destination is the file.
            if src and not event.is_directory and self._wanted(src):
                self._sink(self._state, "gone", src)
            dest = os.fsdecode(event.dest_path)
            if dest:
                self._hint(dest, event.is_directory)
        elif kind == "created":
            self._hint(src, event.is_directory)
        elif kind in ("modified", "closed") and not event.is_directory:
            # A folder's own modified event only says its listing changed; the files in it
            # bring their own events.
            if not self._reports_close_write:
                self._hint(src, False)
            elif self._wanted(src):
                self._sink(self._state, "write" if kind == "modified" else "closed", src)
        elif kind == "deleted" and not event.is_directory and self._wanted(src):
            self._sink(self._state, "gone", src)


class OverflowHook(logging.Handler):
    """Turns watchdog's "inotify queue overflowed" warning into an immediate rescan.

    The kernel drops events when its inotify queue (fs.inotify.max_queued_events) fills
    during a big copy; watchdog only logs it. Matching its log text is best effort: if a
    later watchdog words it differently, the periodic rescan still finds the files.
    """

    LOGGER = "watchdog.observers.inotify_c"

    def __init__(self, flag: threading.Event, ready: threading.Event) -> None:
        super().__init__(logging.WARNING)
        self._flag = flag
        self._ready = ready

    def emit(self, record: logging.LogRecord) -> None:
        if "overflow" in record.getMessage().lower():
            self._flag.set()
            self._ready.set()
