"""Which observer an inbox gets: inotify events on a local disk, polling on a share.

inotify only reports changes made through this kernel. On a network or FUSE file system,
files written by the NAS itself, another host or a remote backend never produce an
event, so those inboxes are polled. The mount holding an inbox is read from
/proc/self/mountinfo (`watch: auto`); `watch: events|poll` overrides it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal, NamedTuple

from daemon.common.mounttable import MOUNTINFO_PATH as MOUNTINFO_PATH
from daemon.common.mounttable import MountEntry as MountEntry
from daemon.common.mounttable import find_mount as find_mount
from daemon.common.mounttable import parse_mountinfo as parse_mountinfo
from daemon.common.mounttable import read_mountinfo as read_mountinfo
from daemon.config.settings import WatchMode

logger = logging.getLogger(__name__)

ObserverKind = Literal["events", "poll"]

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


class ObserverChoice(NamedTuple):
    kind: ObserverKind
    reason: str


def is_network_fstype(fstype: str) -> bool:
    """Network, cluster and FUSE file systems, where inotify misses other writers.

    `fuseblk` (ntfs-3g, exfat-fuse on a local disk) is not included: every write goes
    through this kernel, so inotify sees it. `overlay` (containers) is local too.
    """
    lower = fstype.lower()
    return lower in NETWORK_FS_TYPES or lower.startswith("fuse.")


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
            mountinfo = read_mountinfo()
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
