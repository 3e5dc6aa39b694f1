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
observers and their event handler (daemon/intake/observers.py). This module ties them
together per inbox.

Nothing here hashes files or touches the database, and nothing sleeps: time is passed in.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import queue
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

from daemon.common.display import safe_display
from daemon.config.settings import InboxConfig
from daemon.intake.ignore import (
    absolute_path,
    is_candidate,
    is_candidate_name,
    is_ignored_dir_name,
    is_ignored_file_name,
)
from daemon.intake.mounts import ObserverChoice, ObserverKind, choose_observer_kind
from daemon.intake.observers import (
    EVENT_FILTER,
    EventHandler,
    HintKind,
    ObserverFactory,
    ObserverLike,
    OverflowHook,
    default_observer_factory,
    observer_healthy,
    reports_close_write,
)
from daemon.intake.presence import (
    FolderPresence,
    Probe,
    RootWatch,
    mount_points,
    probe_folder,
)
from daemon.intake.stability import (
    DEFAULT_OPEN_WRITE_CAP_SECONDS,
    FileStabilityTracker,
    StatFn,
    StatSignature,
)

if TYPE_CHECKING:
    from daemon.config.settings import Config

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _InboxState:
    inbox: InboxConfig
    root: Path  # absolute, as given to the observer
    tracker: FileStabilityTracker
    observer: ObserverLike | None = None
    kind: ObserverKind | None = None
    reason: str = "not started"
    next_scan: float | None = None  # None: scan at the next tick
    scan_error: str | None = None
    excludes: tuple[Path, ...] = field(default=())  # resolved, strictly inside the root
    real_root: Path | None = None
    # Files that match no pattern and are not junk: left where they are, logged once and
    # shown in `status` so a user learns why a dropped .docx or .zip never comes out.
    ignored: set[PurePath] = field(default_factory=set)  # relative to the root
    ignored_this_scan: set[PurePath] | None = None  # filled during a full rescan
    # Is the folder there, and the same one? (daemon/intake/presence.py) While it is not,
    # it has no observer, is not scanned and nothing in it is taken.
    presence: FolderPresence = field(default_factory=lambda: FolderPresence("inbox"))
    # Wall time at which the last complete scan began: whatever was in the folder then has
    # been offered, so a reader can tell the inbox was looked at after a given moment.
    scanned_at: float | None = None

    def key(self) -> tuple[Path, bool, str]:
        return (self.root, self.inbox.recursive, self.inbox.watch)


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
        *,
        stability_seconds: float,
        rescan_seconds: float,
        empty_stability_seconds: float = 60.0,
        poll_interval: float = 5.0,
        exclude_dirs: Iterable[Path] = (),
        stat: StatFn = os.lstat,
        mountinfo_reader: Callable[[], str] | None = None,
        observer_factory: ObserverFactory = default_observer_factory,
        join_timeout: float = 5.0,
        max_queued_hints: int = 100_000,
        open_write_cap_seconds: float = DEFAULT_OPEN_WRITE_CAP_SECONDS,
        probe: Callable[[Path, frozenset[str] | None], Probe] = probe_folder,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """`exclude_dirs`: folders never scanned even when inside an inbox (pass the
        outbox, archive, failed, duplicates and state folders so a misconfiguration
        cannot loop). `poll_interval`: seconds between a polling observer's snapshots;
        each one lists and stats the whole inbox tree over the network.
        `open_write_cap_seconds`: how long after its last write event a file still open
        for writing is held at most (in case its close event was lost). `probe`: how an
        inbox folder is looked at every few seconds (stat); `wall`: the clock for the
        "missing since" shown in status."""
        self._stability_seconds = stability_seconds
        self._rescan_seconds = rescan_seconds
        self._empty_stability_seconds = empty_stability_seconds
        self._open_write_cap_seconds = open_write_cap_seconds
        self._poll_interval = poll_interval
        self._exclude_dirs = tuple(exclude_dirs)
        self._stat = stat
        self._mountinfo_reader = mountinfo_reader
        self._observer_factory = observer_factory
        self._probe = probe
        self._wall = wall
        self._join_timeout = join_timeout
        self._queue: queue.Queue[tuple[_InboxState, HintKind, str]] = queue.Queue(
            maxsize=max_queued_hints
        )
        self._hints_ready = threading.Event()
        self._overflowed = threading.Event()
        self._rescan_requested = threading.Event()
        self._started = False
        self._roots: RootWatch | None = None  # inotify on the inbox folders themselves
        self._overflow_hook = OverflowHook(self._overflowed, self._hints_ready)
        self._states: list[_InboxState] = [self._new_state(inbox) for inbox in inboxes]

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        observer_factory: ObserverFactory = default_observer_factory,
        poll_interval: float = 5.0,
        wall: Callable[[], float] = time.time,
    ) -> Watcher:
        """The production wiring: the output and state folders are never scanned."""
        return cls(
            config.inboxes,
            stability_seconds=config.stability_seconds,
            rescan_seconds=config.rescan_seconds,
            poll_interval=poll_interval,
            exclude_dirs=(
                config.outbox,
                config.archive,
                config.failed,
                config.duplicates,
                config.state_dir,
            ),
            observer_factory=observer_factory,
            wall=wall,
        )

    # -- lifecycle ----------------------------------------------------------------------

    def _new_state(self, inbox: InboxConfig) -> _InboxState:
        tracker = FileStabilityTracker(
            self._stability_seconds,
            empty_stability_seconds=self._empty_stability_seconds,
            open_write_cap_seconds=self._open_write_cap_seconds,
            stat=self._stat,
        )
        root = absolute_path(inbox.path)
        return _InboxState(
            inbox=inbox,
            root=root,
            tracker=tracker,
            presence=FolderPresence(f"inbox {root}"),
        )

    def start(self) -> None:
        """Start one observer per inbox. Failures are logged, never raised: the periodic
        rescan still finds files, and a missing inbox is retried at each rescan."""
        self._started = True
        logging.getLogger(OverflowHook.LOGGER).addHandler(self._overflow_hook)
        self._roots = RootWatch.create()
        for state in self._states:
            self._first_look(state)
            self._start_observer(state)

    def _first_look(self, state: _InboxState) -> None:
        # -inf: the first tick looks again, whatever its clock reads.
        state.presence.start(
            self._probe(state.root, self._mount_points()), -math.inf, self._wall()
        )
        self._watch_root(state)

    def _watch_root(self, state: _InboxState) -> None:
        if self._roots is not None and state.presence.present:
            self._roots.watch(state.root)

    def _mount_points(self) -> frozenset[str] | None:
        if self._mountinfo_reader is None:
            return mount_points()
        try:
            return mount_points(self._mountinfo_reader())
        except OSError:
            return None

    def stop(self) -> None:
        """Stop every observer and wait for their threads (bounded by join_timeout)."""
        self._started = False
        logging.getLogger(OverflowHook.LOGGER).removeHandler(self._overflow_hook)
        if self._roots is not None:
            self._roots.close()
            self._roots = None
        observers = [s.observer for s in self._states if s.observer is not None]
        for state in self._states:
            state.observer = None
            state.reason = "stopped"
        for observer in observers:
            observer.stop()
        for observer in observers:
            self._join(observer)

    def _join(self, observer: ObserverLike) -> None:
        observer.join(self._join_timeout)
        if observer.is_alive():
            # Daemon threads: they cannot keep the process alive, only leak until exit.
            logger.warning("a file observer did not stop within %.0f s", self._join_timeout)

    def _choose(self, state: _InboxState) -> ObserverChoice:
        mountinfo: str | None = None
        if state.inbox.watch == "auto" and self._mountinfo_reader is not None:
            try:
                mountinfo = self._mountinfo_reader()
            except OSError as exc:
                return ObserverChoice(
                    "events", f"cannot read mount table ({exc}); assuming a local disk"
                )
        return choose_observer_kind(state.root, state.inbox.watch, mountinfo)

    def _start_observer(self, state: _InboxState) -> None:
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
        choice = self._choose(state)
        kind, reason = choice.kind, choice.reason
        try:
            state.observer = self._schedule(state, kind)
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

    def _observer_failed(self, state: _InboxState, exc: OSError) -> None:
        state.observer = None
        state.kind = None
        previous = state.reason
        if isinstance(exc, FileNotFoundError | NotADirectoryError):
            state.reason = "inbox folder is missing; retried at each rescan"
        else:
            state.reason = f"cannot watch ({exc}); rescans only, retried at each rescan"
        if state.reason != previous:  # once, not at every rescan while the NAS is away
            logger.warning("inbox %s: %s", state.root, state.reason)

    def _schedule(self, state: _InboxState, kind: ObserverKind) -> ObserverLike:
        observer = self._observer_factory(kind, self._poll_interval)
        observer.schedule(
            EventHandler(
                state,
                self._enqueue,
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

    def _stop_observer(self, state: _InboxState) -> None:
        observer, state.observer = state.observer, None
        if observer is not None:
            observer.stop()
            self._join(observer)

    def replace_inboxes(self, inboxes: Sequence[InboxConfig]) -> None:
        """Apply a reloaded configuration (SIGHUP). Inboxes with the same path, recursion
        and watch mode keep their observer and pending files; other settings (patterns,
        output subfolder, engine options) take effect at once, and a pattern change
        triggers a rescan of that inbox. Removed inboxes' observers are stopped."""
        remaining = list(self._states)
        new_states: list[_InboxState] = []
        for inbox in inboxes:
            candidate = self._new_state(inbox)
            match = next((s for s in remaining if s.key() == candidate.key()), None)
            if match is None:
                new_states.append(candidate)
                if self._started:
                    self._first_look(candidate)
                    self._start_observer(candidate)
                continue
            remaining.remove(match)
            if match.inbox.patterns != inbox.patterns:
                match.next_scan = None
            match.inbox = inbox
            new_states.append(match)
            match.presence.check_soon()
        for state in remaining:
            logger.info("inbox %s: no longer configured; stopping its observer", state.root)
            self._stop_observer(state)
        self._states = new_states

    # -- hints from watchdog threads ----------------------------------------------------

    def _enqueue(self, state: _InboxState, kind: HintKind, path: str) -> None:
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
            for path in state.tracker.tick(now):
                # Patterns may have changed since the path was queued (SIGHUP).
                relative = path.relative_to(state.root)
                if is_candidate_name(relative, state.inbox) and not self._excluded(state, relative):
                    ready.append((state.inbox, path))
        return ready

    def _drain(self, now: float) -> None:
        self._hints_ready.clear()
        # Collapse the burst of events one copy produces into one hint per path.
        files: dict[tuple[int, Path], _InboxState] = {}
        # The last word of the burst on being open for writing: a write holds, a close or
        # a new file at that name releases (in the order the events happened).
        writing: dict[tuple[int, Path], bool] = {}
        dirs: dict[tuple[int, Path], _InboxState] = {}
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
            path = key[1]
            try:
                relative = path.relative_to(state.root)
            except ValueError:
                continue
            if self._excluded(state, relative):
                continue
            if is_candidate(path, state.inbox):
                state.tracker.observe(path, now, open_for_write=writing.get(key))
            elif self._listed(state, relative) and _regular_file(path):
                # The same decision a rescan takes, at once: left alone, said once.
                self._note_ignored(state, relative)
        for (_, path), state in dirs.items():
            self._scan_subtree(state, path, now)

    # -- is each inbox still there? -----------------------------------------------------

    def _look(self, now: float) -> None:
        """stat each inbox every few seconds (at once after a root event): a folder that
        vanished, was replaced or unmounted leaves a dead observer behind and nothing
        would say so."""
        if self._roots is not None:
            fired = self._roots.fired()  # moved, deleted, unmounted: look now
            for state in self._states:
                if state.root in fired:
                    state.presence.check_soon()
        due = [state for state in self._states if state.presence.due(now)]
        points = self._mount_points() if due else None  # read once for all of them
        for state in due:
            presence = state.presence
            change = presence.update(self._probe(state.root, points), now, self._wall())
            if change is None:
                continue
            # Whatever watched the old folder is dead or watches the wrong one.
            self._stop_observer(state)
            state.kind = None
            if change.kind in ("gone", "unmounted"):
                state.reason = f"inbox {presence.missing}: watching for it to return"
                continue
            # Back, or a new folder: choose events or polling again (a remount may bring
            # another file system) and scan it on this tick, so files that arrived
            # meanwhile are taken now, not at the next periodic rescan. Files reported
            # before keep their signatures: the same file is not offered twice.
            if self._started:
                self._watch_root(state)
                self._start_observer(state)
            state.next_scan = None

    # -- scanning -------------------------------------------------------------------------

    def _refresh_roots(self, state: _InboxState) -> None:
        real_root = state.root.resolve()
        state.real_root = real_root
        excludes: list[Path] = []
        for directory in self._exclude_dirs:
            resolved = absolute_path(directory).resolve()
            # Only folders strictly inside the inbox: the state folder may well contain
            # the inbox, which must not exclude the inbox itself.
            if resolved != real_root and resolved.is_relative_to(real_root):
                excludes.append(resolved)
        state.excludes = tuple(excludes)

    def _listed(self, state: _InboxState, relative: PurePath) -> bool:
        """Whether a rescan would list a file at `relative` (a junk-free name, the top
        level of a non-recursive inbox, no ignored folder on the way)."""
        parts = relative.parts
        if not parts or (not state.inbox.recursive and len(parts) != 1):
            return False
        if any(is_ignored_dir_name(p) for p in parts[:-1]):
            return False
        return not is_ignored_file_name(parts[-1])

    def _excluded(self, state: _InboxState, relative: PurePath) -> bool:
        if not state.excludes or state.real_root is None:
            return False
        target = state.real_root / relative
        return any(target == e or target.is_relative_to(e) for e in state.excludes)

    def _rescan(self, state: _InboxState, now: float) -> None:
        state.next_scan = now + self._rescan_seconds if self._rescan_seconds > 0 else math.inf
        if self._started and (state.observer is None or not observer_healthy(state.observer)):
            if state.observer is not None:
                logger.warning("inbox %s: file observer stopped; restarting it", state.root)
                self._stop_observer(state)
            self._start_observer(state)
        self._refresh_roots(state)
        present: set[Path] = set()
        offered = 0
        began = self._wall()
        state.ignored_this_scan = set()
        try:
            for path, st in self._walk(state, state.root, PurePath()):
                present.add(path)
                offered += state.tracker.offer(path, StatSignature.of(st), now)
            # Forget ignored files that are gone, so one dropped again is logged again.
            state.ignored = state.ignored_this_scan
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

    def _scan_subtree(self, state: _InboxState, directory: Path, now: float) -> None:
        try:
            relative = directory.relative_to(state.root)
        except ValueError:
            return
        if not relative.parts or any(is_ignored_dir_name(p) for p in relative.parts):
            return
        if state.real_root is None:
            self._refresh_roots(state)
        if self._excluded(state, relative):
            return
        # Never enter a symlinked folder, nor one below a symlinked folder.
        probe = directory
        while probe != state.root:
            if probe.is_symlink():
                return
            probe = probe.parent
        try:
            for path, st in self._walk(state, directory, relative):
                state.tracker.offer(path, StatSignature.of(st), now)
        except OSError as exc:
            logger.debug("inbox %s: cannot scan %s: %s", state.root, directory, exc)

    def _walk(
        self, state: _InboxState, start: Path, start_relative: PurePath
    ) -> Iterator[tuple[Path, os.stat_result]]:
        """Candidate files under `start`: os.scandir, symlinks never followed, ignored and
        excluded folders skipped. An unreadable `start` raises; unreadable subfolders are
        skipped."""
        stack: list[tuple[Path, PurePath]] = [(start, start_relative)]
        seen: set[tuple[int, int]] = set()  # bind mounts can make a folder its own child
        while stack:
            directory, relative = stack.pop()
            try:
                with os.scandir(directory) as iterator:
                    entries = list(iterator)  # do not hold the handle while yielding
            except OSError as exc:
                if directory == start:
                    raise
                logger.debug("inbox %s: skipping %s: %s", state.root, directory, exc)
                continue
            for entry in entries:
                entry_relative = relative / entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if (
                            state.inbox.recursive
                            and not is_ignored_dir_name(entry.name)
                            and not self._excluded(state, entry_relative)
                        ):
                            st = entry.stat(follow_symlinks=False)
                            identity = (st.st_dev, st.st_ino)
                            if identity not in seen:
                                seen.add(identity)
                                stack.append((Path(entry.path), entry_relative))
                    elif entry.is_file(follow_symlinks=False):
                        if is_candidate_name(entry_relative, state.inbox):
                            yield Path(entry.path), entry.stat(follow_symlinks=False)
                        elif not is_ignored_file_name(entry.name):
                            self._note_ignored(state, entry_relative)
                except OSError:
                    continue  # vanished between listing and stat

    def _note_ignored(self, state: _InboxState, relative: PurePath) -> None:
        if state.ignored_this_scan is not None:
            state.ignored_this_scan.add(relative)
        if relative not in state.ignored:
            state.ignored.add(relative)
            logger.info(
                "inbox %s: leaving %s alone: not a document type (patterns: %s)",
                safe_display(state.root),
                safe_display(str(relative)),
                ", ".join(state.inbox.patterns),
            )

    # -- status ---------------------------------------------------------------------------

    def describe(self) -> list[dict[str, object]]:
        """Per inbox, for `docinbox status` and the health endpoint."""
        return [
            {
                "path": str(state.root),
                "recursive": state.inbox.recursive,
                "watch": state.inbox.watch,
                "observer": state.kind if state.observer is not None else "none",
                "missing": state.presence.missing,
                "missing_since": state.presence.missing_since_wall,
                "observer_alive": state.observer is not None and observer_healthy(state.observer),
                "reason": state.reason,
                "pending": len(state.tracker),
                "open_for_write": state.tracker.open_for_write_count,
                "scan_error": state.scan_error,
                "scanned_at": state.scanned_at,
                "ignored": len(state.ignored),
                "ignored_names": sorted(safe_display(str(p)) for p in state.ignored)[:5],
            }
            for state in self._states
        ]


def _regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
