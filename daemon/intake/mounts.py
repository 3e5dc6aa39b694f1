"""Which observer an inbox gets: inotify events on a local disk, polling on a share.

inotify only reports changes made through this kernel. On a network or FUSE file system,
files written by the NAS itself, another host or a remote backend never produce an
event, so those inboxes are polled. The mount holding an inbox is read from
/proc/self/mountinfo (`watch: auto`); `watch: events|poll` overrides it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, NamedTuple

from daemon.config.settings import WatchMode

logger = logging.getLogger(__name__)

ObserverKind = Literal["events", "poll"]

MOUNTINFO_PATH = Path("/proc/self/mountinfo")

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
