"""Is a folder still there, and still the same folder? Shares come and go.

A NAS is rebooted and its share remounted, an automount times out, a USB disk is
replugged, someone renames the folder: from the daemon's side the folder it watches
vanishes, or is replaced by another one at the same path (a new inode, maybe on another
file system), or becomes the bare mount point on the parent file system. An inotify watch
on the old folder is then dead and says nothing, and a polling observer watches a folder
that no longer exists.

`FolderPresence` follows one folder: the main loop stats it every few seconds (`due`),
and at once when an event says its root changed (`check_soon`: watchdog's deleted event
for the inbox itself, or `RootWatch`, an inotify watch on the folder that hears it moved,
deleted or unmounted), and feeds the result (`probe`) to `update`, which says what
changed. It logs the change once, a reminder at
most once a minute while the folder stays away, and its return. Pure apart from that
log: the clock is passed in, so tests tick it.

"A mount point in the config's eyes": the folder was on another device than its parent
when first seen (or at any later check). Once it is on its parent's device again, the
share is unmounted and what is there is the bare mount point, not the inbox: it is
reported as missing, not scanned, and files written into it are not taken.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from daemon.common.display import safe_display
from daemon.common.mounttable import parse_mountinfo, read_mountinfo
from daemon.common.shares import NotAnswering, ShareCall

logger = logging.getLogger(__name__)

CHECK_SECONDS = 2.0  # a stat of the folder and of its parent: cheap, also over NFS
REMIND_SECONDS = 60.0

Identity = tuple[int, int]  # (st_dev, st_ino)
ChangeKind = Literal["gone", "unmounted", "hung", "back", "replaced"]


@dataclass(frozen=True)
class Probe:
    """One look at a folder: its identity and its parent's device, or why it cannot be
    seen (gone, a dead FUSE mount's "Transport endpoint is not connected", a stale NFS
    handle, a file now at that name)."""

    identity: Identity | None
    parent_dev: int | None = None
    error: str | None = None  # why it cannot be seen, beyond "no such folder"
    listed: bool = False  # a mount point in the mount table
    # The look did not return in time: the share hangs (a dead hard NFS mount). Whatever
    # watches it is stuck in it, not dead: it is left alone until the share answers.
    hung: bool = False

    @property
    def mount_point(self) -> bool:
        """Something is mounted on it: on another device than its parent, or listed."""
        if self.identity is None:
            return False
        return self.listed or (
            self.parent_dev is not None and self.identity[0] != self.parent_dev
        )


# How a folder is looked at (tests pass fakes): its path and the mount table's points.
ProbeFn = Callable[[Path, "frozenset[str] | None"], "Probe"]


def mount_points(mountinfo: str | None = None) -> frozenset[str] | None:
    """Every mount point now (None: the table cannot be read). `mountinfo`: its text;
    None reads /proc/self/mountinfo."""
    try:
        text = mountinfo if mountinfo is not None else read_mountinfo()
    except OSError:
        return None
    return frozenset(m.mount_point for m in parse_mountinfo(text))


def probe_folder(path: Path, points: frozenset[str] | None = None) -> Probe:
    """stat `path` (following a symlinked inbox, as the observer does) and `path/..`.

    `..` of a mount's root is the folder it is mounted on, on the parent file system, so
    comparing the two devices tells most mount points. A bind mount of a folder of the
    same file system keeps the device: `points` (the mount table's mount points) tells
    those.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return Probe(None)  # plainly gone: no detail worth showing
    except OSError as exc:
        return Probe(None, error=exc.strerror or str(exc))
    if not os.path.isdir(path):
        return Probe(None, error="not a folder any more")
    try:
        parent_dev: int | None = os.stat(os.path.join(path, "..")).st_dev
    except OSError:
        parent_dev = None
    listed = points is not None and os.path.realpath(path) in points
    return Probe((st.st_dev, st.st_ino), parent_dev, listed=listed)


def probe_through(
    call: ShareCall,
    path: Path,
    points: frozenset[str] | None,
    probe: ProbeFn = probe_folder,
) -> Probe:
    """`probe(path, points)` in the lane of the share holding `path`: a share that does
    not answer in time is a look that says so (`hung`), not a frozen caller."""
    try:
        return call(path, lambda: probe(path, points))
    except NotAnswering as exc:
        return Probe(None, error=exc.strerror or str(exc), hung=True)


def _gone(probe: Probe) -> str:
    if probe.hung:
        return probe.error or "not answering"
    return f"gone (unmounted? {probe.error})" if probe.error else "gone (unmounted?)"


@dataclass(frozen=True)
class Change:
    kind: ChangeKind
    message: str


class FolderPresence:
    """One folder's presence, as of the last `update`.

    `label` names it in the log ("inbox /srv/scans", "the outbox (/srv/out)").
    """

    def __init__(
        self,
        label: str,
        *,
        check_seconds: float = CHECK_SECONDS,
        remind_seconds: float = REMIND_SECONDS,
        waiting: str = "watching for it to return",
        log: logging.Logger = logger,
    ) -> None:
        self.label = label
        self.check_seconds = check_seconds
        self.remind_seconds = remind_seconds
        self.waiting = waiting
        self.log = log
        self.identity: Identity | None = None
        self.mount_point = False  # sticky: once a mount point, unmounted when it is not
        self.missing: str | None = None  # why, while it is away
        self.hung = False  # away because it does not answer (a hung share)
        self.missing_since: float | None = None  # monotonic
        self.missing_since_wall: float | None = None
        self.next_check = 0.0
        self.next_reminder = 0.0
        self.started = False

    @property
    def present(self) -> bool:
        return self.missing is None

    def due(self, now: float) -> bool:
        return now >= self.next_check

    def check_soon(self) -> None:
        """An event says the folder itself changed: look at the next tick."""
        self.next_check = 0.0

    def start(self, probe: Probe, now: float, wall: float) -> None:
        """The first look, when watching begins: no change is reported for it, but a
        folder already missing is (as one that went away)."""
        self.started = True
        self.identity = probe.identity
        self.mount_point = probe.mount_point
        self.next_check = now + self.check_seconds
        if probe.identity is None:
            self.hung = probe.hung
            self._went_away(_gone(probe), now, wall)

    def update(self, probe: Probe, now: float, wall: float) -> Change | None:
        """What this look says changed since the last one (None: nothing)."""
        if not self.started:
            self.start(probe, now, wall)
            return None
        self.next_check = now + self.check_seconds
        if probe.identity is None:
            return self._away(_gone(probe), "hung" if probe.hung else "gone", now, wall)
        if self.mount_point and not probe.mount_point:
            return self._away(
                "not mounted (what is there is the empty mount point on the parent file "
                "system)",
                "unmounted",
                now,
                wall,
            )
        if probe.mount_point:
            self.mount_point = True
        if self.missing is not None:
            away = now - (self.missing_since or now)
            self.log.info("%s is back after %.0f s: watching it again",
                          self._name(), away)
            self.missing = self.missing_since = self.missing_since_wall = None
            self.hung = False
            self.identity = probe.identity
            return Change("back", f"back after {away:.0f} s")
        if probe.identity != self.identity:
            self.identity = probe.identity
            self.log.warning(
                "%s was replaced by another folder (new inode; remounted?): watching the "
                "new one", self._name()
            )
            return Change("replaced", "replaced by another folder")
        return None

    def _away(self, why: str, kind: ChangeKind, now: float, wall: float) -> Change | None:
        self.hung = kind == "hung"
        if self.missing is None:
            self._went_away(why, now, wall)
            return Change(kind, why)
        if why != self.missing:
            # From gone to an empty mount point (the share's folder came back without the
            # share): say what it is now, as a new first report.
            self.missing = why
            self.log.warning("%s is %s: %s", self._name(), why, self.waiting)
            self.next_reminder = now + self.remind_seconds
            return Change(kind, why)
        if now >= self.next_reminder:
            self.log.warning(
                "%s is still %s (for %.0f s): %s",
                self._name(), why, now - (self.missing_since or now), self.waiting,
            )
            self.next_reminder = now + self.remind_seconds
        return None

    def _went_away(self, why: str, now: float, wall: float) -> None:
        self.missing = why
        self.missing_since = now
        self.missing_since_wall = wall
        self.next_reminder = now + self.remind_seconds
        self.log.warning("%s is %s: %s", self._name(), why, self.waiting)

    def _name(self) -> str:
        return safe_display(self.label)


class InboxLooks(Protocol):
    """The inboxes' presence as the supervisor and the publisher see it (the watcher):
    a document whose inbox is away waits in the queue, it does not fail. Inboxes are
    named as jobs name them (`str(InboxConfig.path)`)."""

    def missing_inboxes(self) -> Mapping[str, str]:
        """The inboxes away as of the last look (no call into any folder): inbox -> why
        (gone, not mounted, not answering)."""
        ...

    def look_at_inbox(self, inbox: str) -> str | None:
        """Look at `inbox` now, not at the last look's result (a document of it could
        not be read, or its original is not where it was): why it is away, or None when
        it is there or is no inbox watched."""
        ...


class NoInboxLooks:
    """No watcher (`docinbox parse`, benchmarks): every inbox counts as there."""

    def missing_inboxes(self) -> Mapping[str, str]:
        return {}

    def look_at_inbox(self, inbox: str) -> str | None:
        return None


class InboxAway(OSError):
    """A finished document's original cannot be archived or deleted now: it is not at its
    path because its inbox is away. Not the document's fault: its output waits and is
    tried again (as for a full outbox), and is published when the inbox is back."""

    def __init__(self, inbox: str, why: str) -> None:
        super().__init__(errno.ENOENT, f"its inbox {safe_display(inbox)} is {why}", inbox)


# inotify(7): the folder itself moved or deleted; the kernel always adds IN_UNMOUNT (its
# file system was unmounted) and IN_IGNORED (the watch is gone) without being asked.
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_ONLYDIR = 0x01000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then `len` bytes of name)


class RootWatch:
    """One inotify instance watching the inbox folders themselves, read without blocking
    on every tick of the main loop: a folder moved away, deleted or unmounted is looked
    at on the next tick instead of at the next look (watchdog reports only the deletion).

    Best effort and Linux only: `create` returns None where inotify is missing or its
    limits are reached, and the looks every few seconds find the same changes.
    """

    def __init__(self, fd: int, libc: ctypes.CDLL) -> None:
        self._fd = fd
        self._libc = libc
        self._paths: dict[int, Path] = {}  # watch descriptor -> the folder's path

    @classmethod
    def create(cls) -> RootWatch | None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            logger.info("no inotify instance for the inbox folders (%s); looking at them "
                        "every few seconds only", os.strerror(ctypes.get_errno()))
            return None
        return cls(fd, libc)

    def watch(self, path: Path) -> None:
        """Watch the folder now at `path` (again after it came back: a new inode)."""
        if self._fd < 0:
            return
        for wd in [wd for wd, p in self._paths.items() if p == path]:
            del self._paths[wd]
            self._libc.inotify_rm_watch(self._fd, wd)  # EINVAL when already gone: fine
        wd = self._libc.inotify_add_watch(
            self._fd, os.fsencode(path), _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR
        )
        if wd >= 0:
            self._paths[wd] = path

    def fired(self) -> set[Path]:
        """The folders something happened to since the last call."""
        found: set[Path] = set()
        while self._fd >= 0:
            try:
                data = os.read(self._fd, 64 * 1024)
            except (BlockingIOError, InterruptedError):
                return found
            except OSError:
                return found
            if not data:
                return found
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, _mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                path = self._paths.get(wd)
                if path is not None:
                    found.add(path)
        return found

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        self._paths.clear()

    def __del__(self) -> None:
        # A watcher dropped without stop() (tests, a failed start) must not keep its
        # inotify instance: they are few per user (fs.inotify.max_user_instances).
        self.close()
