"""Inbox watching: which files are ready to ingest.

Events are hints, the folder is the truth (the paperless-ngx / huey approach):

- watchdog observers (inotify on local disks, polling where inotify cannot see other
  hosts' writes) only *hint* that a path may have changed. Their handlers run on
  watchdog's threads and do nothing but put the path on a bounded, thread-safe queue.
- The daemon's main loop calls `Watcher.tick(now)` about twice a second with a
  monotonic time. `tick` drains the queue into one `FileStabilityTracker` per inbox,
  walks every inbox on the first tick and every `rescan_seconds` after that (this is what
  catches lost events, a full inotify queue, files that arrived while the daemon was down,
  a NAS that was remounted), and returns the files that have stopped changing.
- A file is ready when it stopped changing for `stability_seconds` (daemon/intake/stability.py;
  files still open for writing and empty files wait longer). The caller still
  de-duplicates by content.

The parts: which names count (daemon/intake/ignore.py), which observer an inbox gets
(daemon/intake/mounts.py), the stability tracker (daemon/intake/stability.py), the
observers and their event handler (daemon/intake/observers.py), starting and stopping
each inbox's observer (daemon/intake/observing.py), one inbox's state and
how its folders are listed (daemon/intake/scan.py), what a watcher is built from
(daemon/intake/watch_settings.py). This module ties them together per inbox.

Every call into an inbox goes through the lane of its share (daemon/common/shares.py): a
share that stops answering (a dead hard NFS mount) costs the main loop one deadline, is
reported like a vanished share, and is rescanned when it answers again.

Nothing here hashes files or touches the database, and nothing sleeps: time is passed in.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, TypeVar

from daemon.common.display import safe_display
from daemon.common.live import InboxFacts
from daemon.common.mounttable import read_mountinfo
from daemon.common.shares import NotAnswering, Shares
from daemon.config.settings import InboxConfig
from daemon.intake.ignore import (
    absolute_path,
    is_candidate,
    is_candidate_name,
    is_ignored_dir_name,
)
from daemon.intake.observers import (
    HintKind,
    OverflowHook,
    observer_healthy,
)
from daemon.intake.observing import InboxObservers
from daemon.intake.presence import (
    FolderPresence,
    mount_points,
    probe_through,
)
from daemon.intake.scan import (
    InboxState,
    excluded,
    inside_symlink,
    listed,
    note_ignored,
    refresh_roots,
    regular_file,
    walk,
)
from daemon.intake.stability import (
    FileStabilityTracker,
    StatSignature,
)
from daemon.intake.watch_settings import WatcherIO, WatcherSettings

if TYPE_CHECKING:
    from daemon.config.settings import Config

T = TypeVar("T")

logger = logging.getLogger(__name__)


class Watcher:
    """Watches every inbox; `tick(now)` returns the (inbox, path) pairs ready to ingest.

    Threading: `start`, `stop`, `tick`, `rescan_now`, `replace_inboxes`, `forget` and
    `describe` belong to the main loop's thread; only the event handlers (and
    `rescan_now`, which may be called from a signal handler) touch shared state, through
    a queue and events.
    """

    def __init__(
        self,
        inboxes: Sequence[InboxConfig],
        settings: WatcherSettings,
        io: WatcherIO | None = None,
    ) -> None:
        self._settings = settings
        self._io = io = io or WatcherIO()
        # Every call into an inbox's folder goes through its share's lane: a share that
        # stops answering costs the main loop one deadline, then nothing.
        self._shares = io.shares or Shares(mountinfo=io.mountinfo_reader or read_mountinfo)
        self._queue: queue.Queue[tuple[InboxState, HintKind, str]] = queue.Queue(
            maxsize=settings.max_queued_hints
        )
        self._hints_ready = threading.Event()
        self._overflowed = threading.Event()
        self._rescan_requested = threading.Event()
        # Starting and stopping each inbox's observer (daemon/intake/observing.py).
        self._observers = InboxObservers(settings, io, self._call, self._enqueue)
        self._overflow_hook = OverflowHook(self._overflowed, self._hints_ready)
        self._states: list[InboxState] = [self._new_state(inbox) for inbox in inboxes]
        # The last tick's time: what a look between ticks (`look_at_inbox`) schedules from;
        # None before the first tick, when such a look reads the clock instead.
        self._now: float | None = None

    @classmethod
    def from_config(cls, config: Config, io: WatcherIO | None = None) -> Watcher:
        """The production wiring: the output and state folders are never scanned."""
        return cls(config.inboxes, WatcherSettings.from_config(config), io)

    # -- lifecycle ----------------------------------------------------------------------

    def _new_state(self, inbox: InboxConfig) -> InboxState:
        settings = self._settings
        raw_stat = self._io.stat

        def stat(path: Path) -> os.stat_result:
            return self._call(path, lambda: raw_stat(path))

        tracker = FileStabilityTracker(
            settings.stability_seconds,
            empty_stability_seconds=settings.empty_stability_seconds,
            open_write_cap_seconds=settings.open_write_cap_seconds,
            stat=stat,
        )
        root = absolute_path(inbox.path)
        return InboxState(
            inbox=inbox,
            root=root,
            tracker=tracker,
            presence=FolderPresence(f"inbox {root}"),
        )

    def _call(self, path: Path, fn: Callable[[], T]) -> T:
        return self._shares.call(path, fn)

    def start(self) -> None:
        """Start one observer per inbox. Failures are logged, never raised: the periodic
        rescan still finds files, and a missing inbox is retried at each rescan."""
        logging.getLogger(OverflowHook.LOGGER).addHandler(self._overflow_hook)
        self._observers.begin()
        for state in self._states:
            self._first_look(state)
            self._observers.start(state)

    def _first_look(self, state: InboxState) -> None:
        # -inf: the first tick looks again, whatever its clock reads.
        state.share = self._shares.mount_of(state.root)
        probe = probe_through(self._call, state.root, self._mount_points(), self._io.probe)
        state.presence.start(probe, -math.inf, self._io.wall())
        self._observers.watch_root(state)

    def _mount_points(self) -> frozenset[str] | None:
        reader = self._io.mountinfo_reader
        if reader is None:
            return mount_points()
        try:
            return mount_points(reader())
        except OSError:
            return None

    def stop(self) -> None:
        """Stop every observer and wait for their threads (bounded by join_timeout)."""
        logging.getLogger(OverflowHook.LOGGER).removeHandler(self._overflow_hook)
        self._observers.end(self._states)

    def replace_inboxes(self, inboxes: Sequence[InboxConfig]) -> None:
        """Apply a reloaded configuration (SIGHUP). Inboxes with the same path, recursion
        and watch mode keep their observer and pending files; other settings (patterns,
        output subfolder, engine options) take effect at once, and a pattern change
        triggers a rescan of that inbox. Removed inboxes' observers are stopped."""
        remaining = list(self._states)
        new_states: list[InboxState] = []
        for inbox in inboxes:
            candidate = self._new_state(inbox)
            match = next((s for s in remaining if s.key() == candidate.key()), None)
            if match is None:
                new_states.append(candidate)
                if self._observers.started:
                    self._first_look(candidate)
                    self._observers.start(candidate)
                continue
            remaining.remove(match)
            if match.inbox.patterns != inbox.patterns:
                match.next_scan = None
            match.inbox = inbox
            new_states.append(match)
            match.presence.check_soon()
        for state in remaining:
            logger.info("inbox %s: no longer configured; stopping its observer", state.root)
            self._observers.stop(state)
        self._states = new_states

    # -- hints from watchdog threads ----------------------------------------------------

    def _enqueue(self, state: InboxState, kind: HintKind, path: str) -> None:
        try:
            self._queue.put_nowait((state, kind, path))
        except queue.Full:
            # The main loop is far behind (a huge copy). Dropping hints is safe because the
            # folder is the truth: a full rescan at the next tick finds everything.
            if not self._overflowed.is_set():
                self._overflowed.set()
        self._hints_ready.set()

    def wait_for_hints(self, timeout: float) -> bool:
        """Block up to `timeout` seconds for an event hint (or a rescan request).

        The main loop may use this instead of a fixed sleep between ticks to react to
        new files sooner; returns whether something arrived.
        """
        return self._hints_ready.wait(timeout)

    def rescan_now(self) -> None:
        """Rescan every inbox at the next tick (after SIGHUP). Safe from any thread."""
        self._rescan_requested.set()
        self._hints_ready.set()

    def forget(self, path: Path) -> None:
        """Forget `path` so that the next event or rescan offers it again even if it is
        unchanged (for example after a transient ingest error the caller wants retried)."""
        absolute = absolute_path(path)
        for state in self._states:
            state.tracker.forget(absolute)

    # -- the main loop's tick -----------------------------------------------------------

    def tick(self, now: float) -> list[tuple[InboxConfig, Path]]:
        """Drain hints, look at the inbox folders, rescan when due, and return the files
        that became stable."""
        self._drain(now)
        self._look(now)
        force = self._rescan_requested.is_set() or self._overflowed.is_set()
        if force:
            self._rescan_requested.clear()
            if self._overflowed.is_set():
                self._overflowed.clear()
                # Lost events may include closes: holding until the cap would delay
                # those files by an hour, so every hold falls back to size/mtime.
                released = sum(s.tracker.clear_open_for_write() for s in self._states)
                logger.warning(
                    "file events were lost; rescanning every inbox%s",
                    f" and no longer holding {released} file(s) open for writing"
                    if released
                    else "",
                )
        for state in self._states:
            if not state.presence.present:
                continue  # gone, or a bare mount point: not an empty inbox
            if force or state.next_scan is None or now >= state.next_scan:
                self._rescan(state, now)
        ready: list[tuple[InboxConfig, Path]] = []
        for state in self._states:
            if not state.presence.present:
                continue  # a file written into an unmounted share's mount point
            stable = state.tracker.tick(now)
            if state.tracker.not_answering is not None:
                state.presence.check_soon()  # the next look says so
            for path in stable:
                # Patterns may have changed since the path was queued (SIGHUP).
                relative = path.relative_to(state.root)
                if is_candidate_name(relative, state.inbox) and not excluded(state, relative):
                    ready.append((state.inbox, path))
        return ready

    def _drain(self, now: float) -> None:
        self._hints_ready.clear()
        # Collapse the burst of events one copy produces into one hint per path.
        files: dict[tuple[int, Path], InboxState] = {}
        # The last word of the burst on being open for writing: a write holds, a close or
        # a new file at that name releases (in the order the events happened).
        writing: dict[tuple[int, Path], bool] = {}
        dirs: dict[tuple[int, Path], InboxState] = {}
        current = {id(s) for s in self._states}
        # Bounded: hints arriving while we drain wait for the next tick.
        for _ in range(self._queue.qsize()):
            try:
                state, kind, raw = self._queue.get_nowait()
            except queue.Empty:
                break
            if id(state) not in current:
                continue  # from an observer of an inbox that was removed or replaced
            if kind == "root":
                state.presence.check_soon()
                continue
            if not state.presence.present:
                continue  # an old observer's last words, or the bare mount point
            key = (id(state), absolute_path(Path(raw)))
            if kind == "gone":
                files.pop(key, None)
                writing.pop(key, None)
                state.tracker.forget(key[1])
                with contextlib.suppress(ValueError):
                    state.ignored.discard(key[1].relative_to(state.root))
            elif kind == "dir":
                dirs[key] = state
            else:
                files[key] = state
                writing[key] = kind == "write"
        for key, state in files.items():
            try:
                self._hinted_file(state, key[1], writing.get(key), now)
            except NotAnswering:
                state.presence.check_soon()  # the rest of its hints: the rescan on return
        for (_, path), state in dirs.items():
            self._scan_subtree(state, path, now)

    def _hinted_file(
        self, state: InboxState, path: Path, open_for_write: bool | None, now: float
    ) -> None:
        if not state.presence.present:
            return  # its share stopped answering on an earlier hint of this drain
        try:
            relative = path.relative_to(state.root)
        except ValueError:
            return
        if excluded(state, relative):
            return
        if self._call(path, lambda: is_candidate(path, state.inbox)):
            state.tracker.observe(path, now, open_for_write=open_for_write)
        elif listed(state, relative) and self._call(path, lambda: regular_file(path)):
            # The same decision a rescan takes, at once: left alone, said once.
            note_ignored(state, relative)

    # -- is each inbox still there? -----------------------------------------------------

    def _look(self, now: float) -> None:
        """stat each inbox every few seconds (at once after a root event): a folder that
        vanished, was replaced, unmounted or hangs leaves a dead (or stuck) observer
        behind and nothing would say so."""
        fired = self._observers.fired()  # moved, deleted, unmounted: look now
        for state in self._states:
            if state.root in fired:
                state.presence.check_soon()
        self._now = now
        due = [state for state in self._states if state.presence.due(now)]
        if due:
            self._look_at(due, now)

    def _look_at(self, states: Sequence[InboxState], now: float) -> None:
        points = self._mount_points()  # read once for all of them
        self._shares.refresh()
        for state in states:
            state.share = self._shares.mount_of(state.root)
            presence = state.presence
            probe = probe_through(self._call, state.root, points, self._io.probe)
            change = presence.update(probe, now, self._io.wall())
            if change is None:
                continue
            if change.kind == "hung":
                # Its observer is stuck in the share, not dead: stopping it would wait
                # for it. Nothing of it is scanned or taken until the share answers.
                state.reason = f"inbox {presence.missing}: watching for it to answer"
                continue
            # Whatever watched the old folder is dead or watches the wrong one.
            self._observers.stop(state)
            state.kind = None
            if change.kind in ("gone", "unmounted"):
                state.reason = f"inbox {presence.missing}: watching for it to return"
                continue
            # Back, or a new folder: choose events or polling again (a remount may bring
            # another file system) and scan it on this tick, so files that arrived
            # meanwhile are taken now, not at the next periodic rescan. Files reported
            # before keep their signatures: the same file is not offered twice.
            if self._observers.started:
                self._observers.watch_root(state)
                self._observers.start(state)
            state.next_scan = None

    def missing_inboxes(self) -> dict[str, str]:
        """The inboxes away as of the last look: inbox (as jobs name it) -> why. Their
        queued documents wait (the supervisor takes none of them)."""
        return {
            str(state.inbox.path): state.presence.missing
            for state in self._states
            if state.presence.missing is not None
        }

    def look_at_inbox(self, inbox: str) -> str | None:
        """Look at `inbox` now (through its share's lane, like every look): a document
        of it could not be read or its original is not where it was, and the next look
        may be seconds away. Why it is away, or None (there, or not watched)."""
        state = next((s for s in self._states if str(s.inbox.path) == inbox), None)
        if state is None:
            return None
        # Before the first tick there is no tick's time to schedule from: a made-up one
        # (-inf) would make the next look due at once and the inbox away since forever.
        now = self._io.clock() if self._now is None else self._now
        self._look_at([state], now)
        return state.presence.missing

    # -- scanning -------------------------------------------------------------------------

    def _rescan(self, state: InboxState, now: float) -> None:
        rescan_seconds = self._settings.rescan_seconds
        state.next_scan = now + rescan_seconds if rescan_seconds > 0 else math.inf
        self._observers.restart_if_dead(state)
        present: set[Path] = set()
        offered = 0
        began = self._io.wall()
        state.ignored_this_scan = set()
        try:
            refresh_roots(state, self._settings.exclude_dirs, self._call)
            for path, st in walk(state, state.root, PurePath(), self._call):
                present.add(path)
                offered += state.tracker.offer(path, StatSignature.of(st), now)
            # Forget ignored files that are gone, so one dropped again is logged again.
            state.ignored = state.ignored_this_scan
        except NotAnswering:
            # The share hangs: the next look says so; the scan is redone when it answers.
            state.ignored_this_scan = None
            state.next_scan = None
            state.presence.check_soon()
            return
        except OSError as exc:
            # The root itself is unreadable (share unmounted, folder deleted). Keep the
            # reported signatures: a NAS that comes back must not re-offer every file.
            if state.scan_error is None:
                logger.warning("inbox %s: cannot scan: %s", state.root, exc)
            state.scan_error = str(exc)
            state.ignored_this_scan = None
            return
        if state.scan_error is not None:
            logger.info("inbox %s: readable again", state.root)
        state.scan_error = None
        state.ignored_this_scan = None
        state.scanned_at = began
        state.tracker.retain_reported(present)
        logger.debug("inbox %s: scan found %d files, %d new", state.root, len(present), offered)

    def _scan_subtree(self, state: InboxState, directory: Path, now: float) -> None:
        if not state.presence.present:
            return
        try:
            relative = directory.relative_to(state.root)
        except ValueError:
            return
        if not relative.parts or any(is_ignored_dir_name(p) for p in relative.parts):
            return
        try:
            if state.real_root is None:
                refresh_roots(state, self._settings.exclude_dirs, self._call)
            if excluded(state, relative):
                return
            # Never enter a symlinked folder, nor one below a symlinked folder.
            if self._call(directory, lambda: inside_symlink(state.root, directory)):
                return
            for path, st in walk(state, directory, relative, self._call):
                state.tracker.offer(path, StatSignature.of(st), now)
        except NotAnswering:
            state.presence.check_soon()
        except OSError as exc:
            logger.debug("inbox %s: cannot scan %s: %s", state.root, directory, exc)

    # -- status ---------------------------------------------------------------------------

    def describe(self) -> tuple[InboxFacts, ...]:
        """Per inbox, for `docinbox status`, the health endpoint and the metrics."""
        return tuple(
            InboxFacts(
                path=str(state.root),
                recursive=state.inbox.recursive,
                watch=state.inbox.watch,
                observer=state.kind if state.observer is not None else "none",
                observer_alive=state.observer is not None and observer_healthy(state.observer),
                reason=state.reason,
                pending=len(state.tracker),
                open_for_write=state.tracker.open_for_write_count,
                scan_error=state.scan_error,
                ignored=len(state.ignored),
                ignored_names=tuple(sorted(safe_display(str(p)) for p in state.ignored)[:5]),
                missing=state.presence.missing,
                missing_since=state.presence.missing_since_wall,
                share=state.share,
                answering=not state.presence.hung,
                scanned_at=state.scanned_at,
            )
            for state in self._states
        )
