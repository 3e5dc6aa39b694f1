"""One inbox as the watcher keeps it, and how its folders are listed.

`InboxState` is what the watcher knows about one inbox: its observer, its stability
tracker, whether the folder is there (`FolderPresence`), its last scan. `walk` lists it
the way a rescan does: os.scandir, symlinks never followed, ignored and excluded folders
skipped, each folder listed (and its entries stat'ed) in ONE call through the share's
lane (daemon/common/shares.py), so a share that stops answering costs the main loop one
deadline, not a freeze.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path, PurePath

from daemon.common.display import safe_display
from daemon.common.shares import NotAnswering, ShareCall
from daemon.config.settings import InboxConfig
from daemon.intake.ignore import (
    absolute_path,
    is_candidate_name,
    is_ignored_dir_name,
    is_ignored_file_name,
)
from daemon.intake.mounts import ObserverKind
from daemon.intake.observers import ObserverLike
from daemon.intake.presence import FolderPresence
from daemon.intake.stability import FileStabilityTracker

# The watcher's logger: these lines are the watcher's, only their code moved here.
logger = logging.getLogger("daemon.intake.watcher")

@dataclass(eq=False)
class InboxState:
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
    # The mount point holding the inbox (its share), as the mount table says.
    share: str | None = None

    def key(self) -> tuple[Path, bool, str]:
        return (self.root, self.inbox.recursive, self.inbox.watch)


@dataclass(frozen=True)
class Listing:
    """One folder, listed: candidate files with their lstat, subfolders to enter, names
    that match no pattern."""

    files: tuple[tuple[Path, os.stat_result], ...]
    folders: tuple[tuple[Path, PurePath, tuple[int, int]], ...]
    ignored: tuple[PurePath, ...]


def refresh_roots(state: InboxState, exclude_dirs: tuple[Path, ...], call: ShareCall) -> None:
    """The inbox's real path and the excluded folders strictly inside it (resolving
    calls into the share: through its lane)."""
    real_root = call(state.root, state.root.resolve)
    excludes: list[Path] = []
    for directory in exclude_dirs:
        absolute = absolute_path(directory)
        resolved = call(absolute, absolute.resolve)
        # Only folders strictly inside the inbox: the state folder may well contain
        # the inbox, which must not exclude the inbox itself.
        if resolved != real_root and resolved.is_relative_to(real_root):
            excludes.append(resolved)
    state.real_root = real_root
    state.excludes = tuple(excludes)


def listed(state: InboxState, relative: PurePath) -> bool:
    """Whether a rescan would list a file at `relative` (a junk-free name, the top
    level of a non-recursive inbox, no ignored folder on the way)."""
    parts = relative.parts
    if not parts or (not state.inbox.recursive and len(parts) != 1):
        return False
    if any(is_ignored_dir_name(p) for p in parts[:-1]):
        return False
    return not is_ignored_file_name(parts[-1])


def excluded(state: InboxState, relative: PurePath) -> bool:
    if not state.excludes or state.real_root is None:
        return False
    target = state.real_root / relative
    return any(target == e or target.is_relative_to(e) for e in state.excludes)


def list_folder(state: InboxState, directory: Path, relative: PurePath) -> Listing:
    """One folder's entries (runs in the share's lane: every call here may hang)."""
    with os.scandir(directory) as iterator:
        entries = list(iterator)  # do not hold the handle while stat'ing
    files: list[tuple[Path, os.stat_result]] = []
    folders: list[tuple[Path, PurePath, tuple[int, int]]] = []
    ignored: list[PurePath] = []
    for entry in entries:
        entry_relative = relative / entry.name
        try:
            if entry.is_dir(follow_symlinks=False):
                if (
                    state.inbox.recursive
                    and not is_ignored_dir_name(entry.name)
                    and not excluded(state, entry_relative)
                ):
                    st = entry.stat(follow_symlinks=False)
                    folders.append((Path(entry.path), entry_relative, (st.st_dev, st.st_ino)))
            elif entry.is_file(follow_symlinks=False):
                if is_candidate_name(entry_relative, state.inbox):
                    files.append((Path(entry.path), entry.stat(follow_symlinks=False)))
                elif not is_ignored_file_name(entry.name):
                    ignored.append(entry_relative)
        except OSError:
            continue  # vanished between listing and stat
    return Listing(tuple(files), tuple(folders), tuple(ignored))


def walk(
    state: InboxState, start: Path, start_relative: PurePath, call: ShareCall
) -> Iterator[tuple[Path, os.stat_result]]:
    """Candidate files under `start`. An unreadable `start` raises, as does a share that
    does not answer (`NotAnswering`); unreadable subfolders are skipped."""
    stack: list[tuple[Path, PurePath]] = [(start, start_relative)]
    seen: set[tuple[int, int]] = set()  # bind mounts can make a folder its own child
    while stack:
        directory, relative = stack.pop()
        try:
            listing = call(directory, partial(list_folder, state, directory, relative))
        except NotAnswering:
            raise
        except OSError as exc:
            if directory == start:
                raise
            logger.debug("inbox %s: skipping %s: %s", state.root, directory, exc)
            continue
        for folder, folder_relative, identity in listing.folders:
            if identity not in seen:
                seen.add(identity)
                stack.append((folder, folder_relative))
        for ignored in listing.ignored:
            note_ignored(state, ignored)
        yield from listing.files


def note_ignored(state: InboxState, relative: PurePath) -> None:
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


def regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def inside_symlink(root: Path, directory: Path) -> bool:
    """Whether `directory` or a folder between it and `root` is a symlink."""
    probe = directory
    while probe != root:
        if probe.is_symlink():
            return True
        probe = probe.parent
    return False
