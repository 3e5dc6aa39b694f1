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
- A file is ready when it had no event and the same (size, mtime_ns, inode) for
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

Nothing here hashes files or touches the database, and nothing sleeps: time is passed in.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import logging
import math
import os
import queue
import re
import stat as stat_module
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

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

from daemon.config import InboxConfig, WatchMode

if TYPE_CHECKING:
    from daemon.config import Config

logger = logging.getLogger(__name__)

ObserverKind = Literal["events", "poll"]
StatFn = Callable[[Path], os.stat_result]

MOUNTINFO_PATH = Path("/proc/self/mountinfo")

# ---------------------------------------------------------------------------------------
# Name rules. Everything is compared lower-cased: Samba and FTP clients from Windows and
# macOS do not agree on case, and `SCAN.PDF` from a scanner is still a PDF.
# ---------------------------------------------------------------------------------------

# Exact file names that are never documents (desktop metadata a client leaves behind).
IGNORED_FILE_NAMES: frozenset[str] = frozenset(
    {
        "thumbs.db",  # Windows thumbnail cache
        "ehthumbs.db",
        "ehthumbs_vista.db",
        "desktop.ini",  # Windows folder settings
        "icon\r",  # macOS custom folder icon
    }
)

# Suffixes of files that are still being written under a temporary name and will be
# renamed when complete; the rename (a moved event, or the next scan) brings the final
# name in. Matching them early would ingest half a file.
IGNORED_FILE_SUFFIXES: tuple[str, ...] = (
    ".part",  # Firefox, Transmission, many downloaders
    ".crdownload",  # Chrome / Edge
    ".opdownload",  # Opera
    ".download",  # Safari
    ".partial",  # rclone, old Firefox/IE
    ".filepart",  # WinSCP
    ".!ut",  # µTorrent
    ".!qb",  # qBittorrent
    ".crswap",  # Chrome File System Access API
    ".tmp",  # Office (~WRL0001.tmp), many Windows and Samba clients
    ".temp",
    ".swp",  # editor swap files
    "~",  # editor backups (name.pdf~)
)

# Prefixes of lock/owner files (`~$doc.docx` is Word's owner file, not a document).
IGNORED_FILE_PREFIXES: tuple[str, ...] = ("~$",)

# Directories that are never inboxes' content: NAS and OS metadata, recycle bins,
# snapshots. Their whole subtree is skipped (Synology's @eaDir holds thumbnails named like
# the originals, e.g. `@eaDir/scan.pdf/SYNOFILE_THUMB_M.jpg`).
IGNORED_DIR_NAMES: frozenset[str] = frozenset(
    {
        "@eadir",  # Synology thumbnails / extended attributes
        "#recycle",  # Synology recycle bin
        "#snapshot",  # Synology snapshots
        "@recycle",  # QNAP recycle bin
        "@recently-snapshot",  # QNAP snapshots
        "@__thumb",  # QNAP thumbnails
        "@tmp",
        "@sharebin",
        "~snapshot",  # NetApp snapshots over CIFS
        "__macosx",  # macOS resource forks unpacked from a zip
        "lost+found",  # fsck
        "$recycle.bin",  # Windows recycle bin on a share
        "recycler",
        "system volume information",
        "network trash folder",  # netatalk / old AFP
        "temporary items",
    }
)

# rsync writes `.<name>.<6 random chars>` next to the target and renames it when done
# (without --inplace). Hidden-file rules already skip it; the explicit rule documents it.
_RSYNC_TEMP = re.compile(r"^\..+\.[A-Za-z0-9]{6}$")
# macOS "safe save" temporaries written over SMB: `name.sb-1a2b3c4d-AbC123`.
_MAC_SAFE_SAVE = re.compile(r"\.sb-[0-9a-f]{8}-[a-z0-9]{6}$")


def is_rsync_temp_name(name: str) -> bool:
    """True for rsync's in-progress name `.<final name>.<6 random characters>`."""
    return _RSYNC_TEMP.match(name) is not None


def is_ignored_dir_name(name: str) -> bool:
    """True for a directory whose whole subtree is skipped (hidden, NAS/OS metadata)."""
    # Leading dot: hidden; covers .stfolder, .stversions, .Trashes, .Spotlight-V100,
    # .fseventsd, .snapshot, .zfs, .recycle (Samba vfs_recycle), .AppleDouble,
    # rsync's --partial-dir, Syncthing's .stversions and .~tmp~.
    return name.startswith(".") or name.lower() in IGNORED_DIR_NAMES


def is_ignored_file_name(name: str) -> bool:
    """True for a file name that is junk, a lock, or a temporary still being written.

    Leading dot covers: rsync temps, `.DS_Store`, AppleDouble `._*`, LibreOffice
    `.~lock.*#`, NFS silly-renames `.nfsXXXX`, Samba `.smbdelete*`, Pure-FTPd
    `.pureftpd-upload.*`, ProFTPD HiddenStores `.in.*`, Syncthing `.syncthing.*.tmp`,
    Nextcloud `.~*`, FUSE `.fuse_hidden*`.
    """
    if not name or name.startswith("."):
        return True
    lower = name.lower()
    if lower in IGNORED_FILE_NAMES:
        return True
    if lower.startswith(IGNORED_FILE_PREFIXES) or lower.endswith(IGNORED_FILE_SUFFIXES):
        return True
    # Emacs autosave `#name#`, also produced by some tools as in-progress markers.
    if len(lower) > 1 and lower.startswith("#") and lower.endswith("#"):
        return True
    return _MAC_SAFE_SAVE.search(lower) is not None


def matches_patterns(name: str, patterns: Iterable[str]) -> bool:
    """Case-insensitive glob match of a bare file name against any of `patterns`."""
    lower = name.lower()
    return any(fnmatch.fnmatchcase(lower, pattern.lower()) for pattern in patterns)


def is_candidate_name(relative: PurePath | str, inbox: InboxConfig) -> bool:
    """Name-level rules for a path relative to the inbox root; touches no file system.

    Non-recursive inboxes only take the top level; every directory on the way must not
    be ignored; the file name must not be junk/temporary and must match the patterns.
    """
    parts = PurePath(relative).parts
    if not parts or any(part in ("", ".", "..") or "/" in part for part in parts):
        return False
    if not inbox.recursive and len(parts) != 1:
        return False
    if any(is_ignored_dir_name(part) for part in parts[:-1]):
        return False
    name = parts[-1]
    return not is_ignored_file_name(name) and matches_patterns(name, inbox.patterns)


def _absolute(path: Path) -> Path:
    # Lexical normalisation only (no symlink resolution): watchdog reports paths under
    # the path it was given, and `..` must not escape the inbox.
    return Path(os.path.abspath(path))


def is_candidate(path: Path, inbox: InboxConfig) -> bool:
    """Whether `path` is, right now, a file this inbox should consider.

    Name rules (`is_candidate_name`) plus: it is a regular file and neither it nor any
    directory between it and the inbox root is a symlink (a symlink could point at
    anything on the machine, including the outbox; we never follow nor take one).
    """
    root = _absolute(inbox.path)
    target = _absolute(path)
    try:
        relative = target.relative_to(root)
    except ValueError:
        return False
    if not is_candidate_name(relative, inbox):
        return False
    try:
        st = os.lstat(target)
    except OSError:
        return False
    if not stat_module.S_ISREG(st.st_mode):
        return False
    parent = target.parent
    while parent != root:
        if os.path.islink(parent):
            return False
        parent = parent.parent
    return True


# ---------------------------------------------------------------------------------------
# Observer choice: inotify only reports changes made through this kernel. On a network or
# FUSE file system, files written by the NAS itself, another host or a remote backend
# never produce an event, so those inboxes are polled.
# ---------------------------------------------------------------------------------------

NETWORK_FS_TYPES: frozenset[str] = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",  # also WSL2's /mnt/c
        "virtiofs",
        "fuse",
        "ceph",
        "glusterfs",
        "afs",
        "davfs",
        "ncpfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ocfs2",  # cluster file systems: other nodes write the same disk
        "gfs2",
        "orangefs",
        "coda",
        "autofs",  # an automount point not mounted yet; it is nearly always a share
        "vboxsf",  # VirtualBox shared folders: the host's writes are invisible
        "drvfs",  # WSL1 Windows drives
    }
)


class MountEntry(NamedTuple):
    mount_point: str
    fstype: str
    source: str


class ObserverChoice(NamedTuple):
    kind: ObserverKind
    reason: str


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape_mountinfo(field_text: str) -> str:
    # The kernel escapes space, tab, newline and backslash as \040, \011, \012, \134.
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field_text)


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Parse /proc/self/mountinfo (proc(5)); malformed lines are skipped."""
    mounts: list[MountEntry] = []
    for line in text.splitlines():
        fields = line.split()
        # id parent major:minor root mount-point options [optional...] - fstype source ...
        try:
            separator = fields.index("-", 6)
        except ValueError:
            continue
        if len(fields) < separator + 3:
            continue
        mounts.append(
            MountEntry(
                mount_point=_unescape_mountinfo(fields[4]),
                fstype=fields[separator + 1],
                source=_unescape_mountinfo(fields[separator + 2]),
            )
        )
    return mounts


def find_mount(path: str, mounts: Sequence[MountEntry]) -> MountEntry | None:
    """The mount holding `path`: longest mount point that is a whole-component prefix.

    On a tie the later entry wins: mountinfo lists mounts in order, and a later mount on
    the same point hides the earlier one.
    """
    best: MountEntry | None = None
    for mount in mounts:
        point = mount.mount_point
        inside = point == "/" or path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best.mount_point)):
            best = mount
    return best


def is_network_fstype(fstype: str) -> bool:
    """Network, cluster and FUSE file systems, where inotify misses other writers.

    `fuseblk` (ntfs-3g, exfat-fuse on a local disk) is not included: every write goes
    through this kernel, so inotify sees it. `overlay` (containers) is local too.
    """
    lower = fstype.lower()
    return lower in NETWORK_FS_TYPES or lower.startswith("fuse.")


def _read_mountinfo() -> str:
    return MOUNTINFO_PATH.read_text(encoding="utf-8", errors="surrogateescape")


def choose_observer_kind(
    path: Path, mode: WatchMode, mountinfo: str | None = None
) -> ObserverChoice:
    """Pick inotify events or polling for an inbox, with a human-readable reason.

    `mountinfo` is the text of /proc/self/mountinfo; None reads it (tests inject it).
    """
    if mode == "poll":
        return ObserverChoice("poll", "watch: poll in the configuration")
    if mode == "events":
        return ObserverChoice("events", "watch: events in the configuration")
    if mode != "auto":
        raise ValueError(f"unknown watch mode {mode!r}")
    resolved = str(path.resolve())
    if mountinfo is None:
        try:
            mountinfo = _read_mountinfo()
        except OSError as exc:
            reason = f"cannot read {MOUNTINFO_PATH} ({exc}); assuming a local disk"
            logger.warning("inbox %s: %s", path, reason)
            return ObserverChoice("events", reason)
    mount = find_mount(resolved, parse_mountinfo(mountinfo))
    if mount is None:
        reason = f"no mount found for {resolved}; assuming a local disk"
        logger.warning("inbox %s: %s", path, reason)
        return ObserverChoice("events", reason)
    if is_network_fstype(mount.fstype):
        return ObserverChoice(
            "poll",
            f"{mount.fstype} at {mount.mount_point} is a network/FUSE file system: "
            "inotify does not see other hosts' writes",
        )
    return ObserverChoice("events", f"{mount.fstype} at {mount.mount_point} is local")


# ---------------------------------------------------------------------------------------
# Stability tracking.
# ---------------------------------------------------------------------------------------


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
        for path, entry in list(self._pending.items()):
            if entry.due > now:
                continue
            try:
                st = self._stat(path)
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


# ---------------------------------------------------------------------------------------
# The watcher for all inboxes.
# ---------------------------------------------------------------------------------------

# "file": a file appeared or changed (a new file at that name ends any hold); "write": it
# was written by a process that still has it open (from observers that report closes);
# "closed": that writer closed it; "dir": a folder appeared; "gone": deleted or moved out.
HintKind = Literal["file", "write", "closed", "dir", "gone"]

# Only what can make a file appear or change, and the close after writing that ends a
# hold. Opened/closed-without-write events are left out on purpose: ingest reading a file
# must not make it pending again. Directory modified events (one per file created in it)
# are noise.
_EVENT_FILTER: list[type[FileSystemEvent]] = [
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


def _observer_healthy(observer: ObserverLike) -> bool:
    if not observer.is_alive():
        return False
    # An emitter stops by itself when its folder disappears (unmount, rmdir); the
    # observer thread keeps running, so look at the emitters too.
    emitters: Iterable[threading.Thread] = getattr(observer, "emitters", ())
    return all(emitter.is_alive() for emitter in emitters)


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

    def key(self) -> tuple[Path, bool, str]:
        return (self.root, self.inbox.recursive, self.inbox.watch)


class _Handler(FileSystemEventHandler):
    """Runs on a watchdog thread: filters names and queues hints, nothing else."""

    def __init__(
        self,
        state: _InboxState,
        sink: Callable[[_InboxState, HintKind, str], None],
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
        name = os.path.basename(path)
        return not is_ignored_file_name(name) and matches_patterns(name, self._state.inbox.patterns)

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


class _OverflowHook(logging.Handler):
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
    ) -> None:
        """`exclude_dirs`: folders never scanned even when inside an inbox (pass the
        outbox, archive, failed, duplicates and state folders so a misconfiguration
        cannot loop). `poll_interval`: seconds between a polling observer's snapshots;
        each one lists and stats the whole inbox tree over the network.
        `open_write_cap_seconds`: how long after its last write event a file still open
        for writing is held at most (in case its close event was lost)."""
        self._stability_seconds = stability_seconds
        self._rescan_seconds = rescan_seconds
        self._empty_stability_seconds = empty_stability_seconds
        self._open_write_cap_seconds = open_write_cap_seconds
        self._poll_interval = poll_interval
        self._exclude_dirs = tuple(exclude_dirs)
        self._stat = stat
        self._mountinfo_reader = mountinfo_reader
        self._observer_factory = observer_factory
        self._join_timeout = join_timeout
        self._queue: queue.Queue[tuple[_InboxState, HintKind, str]] = queue.Queue(
            maxsize=max_queued_hints
        )
        self._hints_ready = threading.Event()
        self._overflowed = threading.Event()
        self._rescan_requested = threading.Event()
        self._started = False
        self._overflow_hook = _OverflowHook(self._overflowed, self._hints_ready)
        self._states: list[_InboxState] = [self._new_state(inbox) for inbox in inboxes]

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        observer_factory: ObserverFactory = default_observer_factory,
        poll_interval: float = 5.0,
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
        )

    # -- lifecycle ----------------------------------------------------------------------

    def _new_state(self, inbox: InboxConfig) -> _InboxState:
        tracker = FileStabilityTracker(
            self._stability_seconds,
            empty_stability_seconds=self._empty_stability_seconds,
            open_write_cap_seconds=self._open_write_cap_seconds,
            stat=self._stat,
        )
        return _InboxState(inbox=inbox, root=_absolute(inbox.path), tracker=tracker)

    def start(self) -> None:
        """Start one observer per inbox. Failures are logged, never raised: the periodic
        rescan still finds files, and a missing inbox is retried at each rescan."""
        self._started = True
        logging.getLogger(_OverflowHook.LOGGER).addHandler(self._overflow_hook)
        for state in self._states:
            self._start_observer(state)

    def stop(self) -> None:
        """Stop every observer and wait for their threads (bounded by join_timeout)."""
        self._started = False
        logging.getLogger(_OverflowHook.LOGGER).removeHandler(self._overflow_hook)
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
            _Handler(
                state,
                self._enqueue,
                reports_close_write=kind == "events" and reports_close_write(observer),
            ),
            str(state.root),
            recursive=state.inbox.recursive,
            event_filter=_EVENT_FILTER,
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
                    self._start_observer(candidate)
                continue
            remaining.remove(match)
            if match.inbox.patterns != inbox.patterns:
                match.next_scan = None
            match.inbox = inbox
            new_states.append(match)
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
        absolute = _absolute(path)
        for state in self._states:
            state.tracker.forget(absolute)

    # -- the main loop's tick -----------------------------------------------------------

    def tick(self, now: float) -> list[tuple[InboxConfig, Path]]:
        """Drain hints, rescan when due, and return the files that became stable."""
        self._drain(now)
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
            if force or state.next_scan is None or now >= state.next_scan:
                self._rescan(state, now)
        ready: list[tuple[InboxConfig, Path]] = []
        for state in self._states:
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
            key = (id(state), _absolute(Path(raw)))
            if kind == "gone":
                files.pop(key, None)
                writing.pop(key, None)
                state.tracker.forget(key[1])
            elif kind == "dir":
                dirs[key] = state
            else:
                files[key] = state
                writing[key] = kind == "write"
        for key, state in files.items():
            path = key[1]
            if is_candidate(path, state.inbox) and not self._excluded(
                state, path.relative_to(state.root)
            ):
                state.tracker.observe(path, now, open_for_write=writing.get(key))
        for (_, path), state in dirs.items():
            self._scan_subtree(state, path, now)

    # -- scanning -------------------------------------------------------------------------

    def _refresh_roots(self, state: _InboxState) -> None:
        real_root = state.root.resolve()
        state.real_root = real_root
        excludes: list[Path] = []
        for directory in self._exclude_dirs:
            resolved = _absolute(directory).resolve()
            # Only folders strictly inside the inbox: the state folder may well contain
            # the inbox, which must not exclude the inbox itself.
            if resolved != real_root and resolved.is_relative_to(real_root):
                excludes.append(resolved)
        state.excludes = tuple(excludes)

    def _excluded(self, state: _InboxState, relative: PurePath) -> bool:
        if not state.excludes or state.real_root is None:
            return False
        target = state.real_root / relative
        return any(target == e or target.is_relative_to(e) for e in state.excludes)

    def _rescan(self, state: _InboxState, now: float) -> None:
        state.next_scan = now + self._rescan_seconds if self._rescan_seconds > 0 else math.inf
        if self._started and (state.observer is None or not _observer_healthy(state.observer)):
            if state.observer is not None:
                logger.warning("inbox %s: file observer stopped; restarting it", state.root)
                self._stop_observer(state)
            self._start_observer(state)
        self._refresh_roots(state)
        present: set[Path] = set()
        offered = 0
        try:
            for path, st in self._walk(state, state.root, PurePath()):
                present.add(path)
                offered += state.tracker.offer(path, StatSignature.of(st), now)
        except OSError as exc:
            # The root itself is unreadable (share unmounted, folder deleted). Keep the
            # reported signatures: a NAS that comes back must not re-offer every file.
            if state.scan_error is None:
                logger.warning("inbox %s: cannot scan: %s", state.root, exc)
            state.scan_error = str(exc)
            return
        if state.scan_error is not None:
            logger.info("inbox %s: readable again", state.root)
        state.scan_error = None
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
                    elif entry.is_file(follow_symlinks=False) and is_candidate_name(
                        entry_relative, state.inbox
                    ):
                        yield Path(entry.path), entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # vanished between listing and stat

    # -- status ---------------------------------------------------------------------------

    def describe(self) -> list[dict[str, object]]:
        """Per inbox, for `docinbox status` and the health endpoint."""
        return [
            {
                "path": str(state.root),
                "recursive": state.inbox.recursive,
                "watch": state.inbox.watch,
                "observer": state.kind if state.observer is not None else "none",
                "observer_alive": state.observer is not None and _observer_healthy(state.observer),
                "reason": state.reason,
                "pending": len(state.tracker),
                "open_for_write": state.tracker.open_for_write_count,
                "scan_error": state.scan_error,
            }
            for state in self._states
        ]
