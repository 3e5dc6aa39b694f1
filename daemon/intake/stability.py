"""When a file has stopped changing: the stability tracker, one per inbox.

A file is ready when it had no event and the same (size, mtime_ns, inode) for
`stability_seconds`. A file is reported once per change: the tracker remembers the
signature it reported, so neither rescans nor stray events offer the same unchanged file
again while it sits in the inbox (for example during a long ingest, or with
`after_success: keep`). The caller still de-duplicates by content.

Files still open for writing: on an inotify-watched inbox a file that had a modified
event (IN_MODIFY, a write through this kernel) is held until its close-after-write event
(IN_CLOSE_WRITE) arrives, however long it stays unchanged in between; its quiet window
starts at the close. smbd, vsftpd and other servers write the final name in place, and on
a slow link one SMB2 WRITE of 8 MiB leaves the file unchanged for longer than any sensible
window. A writer that closes and reopens per chunk is held while it writes and its window
restarts at every close, as before. Created and moved events do not hold a file: watchdog
reports a file moved in from outside the watched tree as "created" (no close would
follow), and a newly created file is empty until its first write, which holds it. The
hold is capped (`open_write_cap_seconds` after the last write event) in case the close
event is lost; an inotify queue overflow or an observer restart releases every hold at
once. Polling observers (and any observer that does not report closes) never hold.

Zero-byte files: a file that is still empty is only reported after it stayed empty for
`empty_stability_seconds` (default 60 s, never less than `stability_seconds`). Browsers
(Firefox) and some FTP clients create the final name empty and fill or replace it later;
ingesting such a placeholder after 5 s would fail it, and moving it to failed/ could even
take the inode from under a writer that still has it open. A file that stays empty for a
minute is really empty, and ingest fails it as `FailureKind.EMPTY` so the user sees why.

Nothing here reads events or sleeps: the watcher feeds it hints and the time.
"""

from __future__ import annotations

import logging
import os
import stat as stat_module
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from daemon.common.shares import NotAnswering

logger = logging.getLogger(__name__)

StatFn = Callable[[Path], os.stat_result]


class StatSignature(NamedTuple):
    size: int
    mtime_ns: int
    inode: int

    @classmethod
    def of(cls, st: os.stat_result) -> StatSignature:
        return cls(st.st_size, st.st_mtime_ns, st.st_ino)


@dataclass
class _Pending:
    signature: StatSignature | None  # None: not stat'ed since it was first observed
    since: float  # last event or observed change
    due: float  # next time to stat it


DEFAULT_OPEN_WRITE_CAP_SECONDS = 3600.0


class FileStabilityTracker:
    """Decides when a file has stopped changing. Single-threaded: main loop only.

    A pending path is stat'ed when it is due, not on every tick: once right after an
    event (to take a baseline) and then when its quiet window would end. A drop of
    100 000 files therefore costs about two lstat calls per file, not one per file per
    tick, which matters on NFS. The price is that a file changed without any event (a
    polled share between two polls) is seen at the next due check, so it can take up to
    two windows after its last write: late, never early.

    Open for writing: `observe(path, now, open_for_write=True)` (a write event from an
    observer that also reports closes) holds the path however long it stays unchanged,
    until `observe(path, now, open_for_write=False)` (its close, or a new file moved onto
    the name) or until `open_write_cap_seconds` passed since the last write event; then
    the ordinary rule applies. A held path is stat'ed again only when an event arrives or
    the cap runs out.
    """

    def __init__(
        self,
        stability_seconds: float,
        *,
        empty_stability_seconds: float = 60.0,
        open_write_cap_seconds: float = DEFAULT_OPEN_WRITE_CAP_SECONDS,
        stat: StatFn = os.lstat,
    ) -> None:
        self._window = max(0.0, stability_seconds)
        self._empty_window = max(self._window, empty_stability_seconds)
        self._open_write_cap = max(0.0, open_write_cap_seconds)
        self._stat = stat
        self._pending: dict[Path, _Pending] = {}
        # path -> signature last returned by tick(); keeps unchanged files from being
        # offered again by rescans or stray events.
        self._reported: dict[Path, StatSignature] = {}
        # path -> time of its last write event, for pending paths still open for writing
        # (always a subset of _pending's keys).
        self._open_for_write: dict[Path, float] = {}
        # Set by the last tick when a stat did not return in time (a hung share).
        self.not_answering: NotAnswering | None = None

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def reported_count(self) -> int:
        return len(self._reported)

    @property
    def open_for_write_count(self) -> int:
        return len(self._open_for_write)

    def is_pending(self, path: Path) -> bool:
        return path in self._pending

    def is_open_for_write(self, path: Path) -> bool:
        return path in self._open_for_write

    def observe(self, path: Path, now: float, *, open_for_write: bool | None = None) -> None:
        """An event (or any hint) for `path`: track it and restart its quiet window.

        `open_for_write`: True for a write event from an observer that reports closes
        (hold the path until its close), False for its close-after-write or for a new file
        at that name (release it), None for a hint that says nothing about it (a scan, a
        polling observer) and leaves a hold as it is.
        """
        entry = self._pending.get(path)
        if entry is None:
            self._pending[path] = _Pending(None, now, now)
        else:
            entry.since = now
            entry.due = now  # re-take the baseline at the next tick
        if open_for_write:
            self._open_for_write[path] = now
        elif open_for_write is not None:
            self._open_for_write.pop(path, None)

    def clear_open_for_write(self) -> int:
        """Release every hold (close events may have been lost: an inotify queue overflow,
        an observer restart). Those paths fall back to the size/mtime rule, counted from
        their last event. Returns how many were held."""
        count = len(self._open_for_write)
        for path in self._open_for_write:
            # A held entry is next due when its cap runs out: check it at the next tick.
            self._pending[path].due = self._pending[path].since
        self._open_for_write.clear()
        return count

    def offer(self, path: Path, signature: StatSignature, now: float) -> bool:
        """A scan found `path` with `signature`; track it unless nothing is new.

        Already pending: left alone (a scan must not restart its window). Reported
        before with this very signature: ignored. Returns whether it is now tracked anew.
        """
        if path in self._pending or self._reported.get(path) == signature:
            return False
        self._pending[path] = _Pending(signature, now, now + self._window_for(signature))
        return True

    def forget(self, path: Path) -> None:
        """The path went away (deleted, moved out) or the caller wants it re-offered."""
        self._pending.pop(path, None)
        self._reported.pop(path, None)
        self._open_for_write.pop(path, None)

    def retain_reported(self, present: Collection[Path]) -> None:
        """After a complete scan: forget reported signatures of files no longer there."""
        for path in [p for p in self._reported if p not in present]:
            del self._reported[path]

    def _window_for(self, signature: StatSignature) -> float:
        return self._empty_window if signature.size == 0 else self._window

    def tick(self, now: float) -> list[Path]:
        """Stat the due paths; return (and stop tracking) those that are stable."""
        ready: list[Path] = []
        self.not_answering = None
        for path, entry in list(self._pending.items()):
            if entry.due > now:
                continue
            try:
                st = self._stat(path)
            except NotAnswering as exc:
                # The share hangs: every path of it stays pending as it is, and the
                # watcher, told here, stops looking into it until it answers.
                self.not_answering = exc
                break
            except (FileNotFoundError, NotADirectoryError):
                self.forget(path)
                continue
            except OSError as exc:
                # EACCES, EIO, ESTALE on a share: drop it rather than stat it forever;
                # the next rescan offers it again if it is still there.
                logger.warning("cannot stat %s, dropping it until the next rescan: %s", path, exc)
                self.forget(path)
                continue
            if not stat_module.S_ISREG(st.st_mode):
                # Replaced by a directory or a symlink meanwhile: never taken.
                self.forget(path)
                continue
            signature = StatSignature.of(st)
            window = self._window_for(signature)
            if entry.signature != signature:
                entry.signature = signature
                entry.since = now
                entry.due = now + window
            elif now - entry.since >= window:
                opened = self._open_for_write.get(path)
                if opened is not None:
                    if now - opened < self._open_write_cap:
                        # Unchanged but still open for writing: the next write or its
                        # close is an event (which makes it due); else the cap.
                        entry.due = opened + self._open_write_cap
                        continue
                    del self._open_for_write[path]
                    logger.warning(
                        "%s: still open for writing %.0f s after its last write event "
                        "(was its close event lost?); no longer waiting for its close",
                        path,
                        now - opened,
                    )
                del self._pending[path]
                if self._reported.get(path) != signature:
                    self._reported[path] = signature
                    ready.append(path)
            else:
                entry.due = entry.since + window
        return ready
