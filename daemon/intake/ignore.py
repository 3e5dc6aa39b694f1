"""Which names an inbox takes, and which it ignores.

Junk a NAS or desktop client leaves behind, lock files, and files still being written
under a temporary name (renamed when complete) are never candidates; nor is anything in
a NAS/OS metadata folder, a symlink, or a file below a symlinked folder. Everything is
compared lower-cased: Samba and FTP clients from Windows and macOS do not agree on
case, and `SCAN.PDF` from a scanner is still a PDF.

Name rules touch no file system (`is_candidate_name`); `is_candidate` adds the lstat
checks.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat as stat_module
from collections.abc import Iterable
from pathlib import Path, PurePath

from daemon.config.settings import InboxConfig

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


def absolute_path(path: Path) -> Path:
    # Lexical normalisation only (no symlink resolution): watchdog reports paths under
    # the path it was given, and `..` must not escape the inbox.
    return Path(os.path.abspath(path))


def is_candidate(path: Path, inbox: InboxConfig) -> bool:
    """Whether `path` is, right now, a file this inbox should consider.

    Name rules (`is_candidate_name`) plus: it is a regular file and neither it nor any
    directory between it and the inbox root is a symlink (a symlink could point at
    anything on the machine, including the outbox; we never follow nor take one).
    """
    root = absolute_path(inbox.path)
    target = absolute_path(path)
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
