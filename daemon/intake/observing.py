"""One file observer per inbox: starting and stopping them, events or polling.

The watcher (daemon/intake/watcher.py) decides *when* an inbox needs an observer (at
start, after a folder came back, when a rescan finds it dead); this class does the
starting and stopping: which kind an inbox gets (daemon/intake/mounts.py), the fallback to
polling when inotify's limits are reached, and stopping an observer without waiting
forever for one stuck in a hung share. It also keeps the inotify watch on the inbox
folders themselves (`RootWatch`), which hears an inbox moved, deleted or unmounted.

Every call that touches an inbox's folder goes through the lane of its share (`call`).
Belongs to the main loop's thread.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from daemon.common.shares import NotAnswering, ShareCall
from daemon.intake.mounts import ObserverChoice, ObserverKind, choose_observer_kind
from daemon.intake.observers import (
    EVENT_FILTER,
    EventHandler,
    HintKind,
    ObserverLike,
    observer_healthy,
    reports_close_write,
)
from daemon.intake.presence import RootWatch
from daemon.intake.scan import InboxState
from daemon.intake.watch_settings import WatcherIO, WatcherSettings

# The watcher's logger: these lines are the watcher's, only their code moved here.
logger = logging.getLogger("daemon.intake.watcher")

HintSink = Callable[[InboxState, HintKind, str], None]


@dataclass(eq=False)
class InboxObservers:
    """Starts and stops the inboxes' observers; `started` while the watcher runs.
    `call`: into an inbox's share (its lane); `sink`: where the handlers put hints."""

    _settings: WatcherSettings
    _io: WatcherIO
    _call: ShareCall
    _sink: HintSink
    started: bool = field(default=False, init=False)
    roots: RootWatch | None = field(default=None, init=False)  # inotify on the inbox folders

    def begin(self) -> None:
        self.started = True
        self.roots = RootWatch.create()

    def end(self, states: Sequence[InboxState]) -> None:
        """Stop every observer and wait for their threads (bounded by join_timeout)."""
        self.started = False
        if self.roots is not None:
            self.roots.close()
            self.roots = None
        observers = [(s.root, s.observer) for s in states if s.observer is not None]
        for state in states:
            state.observer = None
            state.reason = "stopped"
        stopped = [observer for root, observer in observers if self._halt(root, observer)]
        for observer in stopped:
            self._join(observer)

    def fired(self) -> set[Path]:
        """The inbox folders moved, deleted or unmounted since the last call."""
        return self.roots.fired() if self.roots is not None else set()

    def watch_root(self, state: InboxState) -> None:
        roots = self.roots
        if roots is not None and state.presence.present:
            # Adding the watch looks the path up: it hangs with the share.
            with contextlib.suppress(NotAnswering):
                self._call(state.root, lambda: roots.watch(state.root))

    def restart_if_dead(self, state: InboxState) -> None:
        """Before a rescan: an inbox without a healthy observer gets a new one."""
        if self.started and (state.observer is None or not observer_healthy(state.observer)):
            if state.observer is not None:
                logger.warning("inbox %s: file observer stopped; restarting it", state.root)
                self.stop(state)
            self.start(state)

    def _halt(self, root: Path, observer: ObserverLike) -> bool:
        """Tell an observer to stop. watchdog waits (unbounded) for a polling emitter
        that is stuck in a hung share: through the share's lane, so that wait is bounded
        and an observer stuck there is left behind (a daemon thread)."""
        try:
            self._call(root, observer.stop)
        except NotAnswering:
            logger.warning("inbox %s: its file observer is stuck in the share; left behind",
                           root)
            return False
        return True

    def _join(self, observer: ObserverLike) -> None:
        timeout = self._settings.join_timeout
        observer.join(timeout)
        if observer.is_alive():
            # Daemon threads: they cannot keep the process alive, only leak until exit.
            logger.warning("a file observer did not stop within %.0f s", timeout)

    def _choose(self, state: InboxState) -> ObserverChoice:
        mountinfo: str | None = None
        reader = self._io.mountinfo_reader
        if state.inbox.watch == "auto" and reader is not None:
            try:
                mountinfo = reader()
            except OSError as exc:
                return ObserverChoice(
                    "events", f"cannot read mount table ({exc}); assuming a local disk"
                )
        # Resolving the inbox's path calls into its share.
        return self._call(
            state.root, lambda: choose_observer_kind(state.root, state.inbox.watch, mountinfo)
        )

    def start(self, state: InboxState) -> None:
        if not state.presence.present:
            state.reason = f"inbox {state.presence.missing}: watching for it to return"
            return
        # Close events that happened while no observer watched are lost: release holds.
        released = state.tracker.clear_open_for_write()
        if released:
            logger.info(
                "inbox %s: %d file(s) no longer held as open for writing (observer "
                "restarted)", state.root, released
            )
        try:
            choice = self._choose(state)
            kind, reason = choice.kind, choice.reason
            state.observer = self._schedule(state, kind)
        except NotAnswering as exc:
            self._observer_failed(state, exc)
            state.presence.check_soon()
            return
        except OSError as exc:
            if kind == "events" and exc.errno in (errno.ENOSPC, errno.EMFILE, errno.ENFILE):
                # ENOSPC here means fs.inotify.max_user_watches (one watch per folder of
                # a recursive inbox), EMFILE max_user_instances: polling still works.
                kind = "poll"
                reason = (
                    f"inotify limit reached ({exc.strerror}); polling instead "
                    "(raise fs.inotify.max_user_watches / max_user_instances)"
                )
                try:
                    state.observer = self._schedule(state, kind)
                except OSError as exc2:
                    self._observer_failed(state, exc2)
                    return
            else:
                self._observer_failed(state, exc)
                return
        state.kind = kind
        state.reason = reason
        logger.info("inbox %s: watching with %s (%s)", state.root, kind, reason)

    def _observer_failed(self, state: InboxState, exc: OSError) -> None:
        state.observer = None
        state.kind = None
        previous = state.reason
        if isinstance(exc, FileNotFoundError | NotADirectoryError):
            state.reason = "inbox folder is missing; retried at each rescan"
        else:
            state.reason = f"cannot watch ({exc}); rescans only, retried at each rescan"
        if state.reason != previous:  # once, not at every rescan while the NAS is away
            logger.warning("inbox %s: %s", state.root, state.reason)

    def _schedule(self, state: InboxState, kind: ObserverKind) -> ObserverLike:
        # Adding inotify watches walks the share: through its lane.
        return self._call(state.root, lambda: self._schedule_here(state, kind))

    def _schedule_here(self, state: InboxState, kind: ObserverKind) -> ObserverLike:
        observer = self._io.observer_factory(kind, self._settings.poll_interval)
        observer.schedule(
            EventHandler(
                state,
                self._sink,
                reports_close_write=kind == "events" and reports_close_write(observer),
            ),
            str(state.root),
            recursive=state.inbox.recursive,
            event_filter=EVENT_FILTER,
        )
        try:
            observer.start()  # adds the inotify watches / takes the first snapshot
        except BaseException:
            with contextlib.suppress(Exception):
                observer.stop()
            raise
        return observer

    def stop(self, state: InboxState) -> None:
        observer, state.observer = state.observer, None
        if observer is not None and self._halt(state.root, observer):
            self._join(observer)
