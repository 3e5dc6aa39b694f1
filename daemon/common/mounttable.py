"""The mount tables: what is mounted where now (/proc/self/mountinfo) and what is meant
to be (/etc/fstab).

Plain text in, plain values out, so that both the configuration check (is an inbox a
share that is not mounted?) and the watcher (poll or events? did the share go away?)
read them the same way, and tests feed them strings.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

MOUNTINFO_PATH = Path("/proc/self/mountinfo")
FSTAB_PATH = Path("/etc/fstab")


class MountEntry(NamedTuple):
    mount_point: str
    fstype: str
    source: str


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field_text: str) -> str:
    # The kernel (and fstab(5)) escape space, tab, newline and backslash as \040, \011,
    # \012, \134.
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
                mount_point=_unescape(fields[4]),
                fstype=fields[separator + 1],
                source=_unescape(fields[separator + 2]),
            )
        )
    return mounts


def parse_fstab(text: str) -> list[MountEntry]:
    """Parse fstab(5): `source mount-point fstype options [dump [pass]]`. Comments, blank
    and malformed lines and swap entries are skipped."""
    mounts: list[MountEntry] = []
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 3 or not fields[1].startswith("/"):
            continue  # swap's mount point is "none"
        mounts.append(MountEntry(_unescape(fields[1]).rstrip("/") or "/", fields[2],
                                 _unescape(fields[0])))
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


def read_mountinfo() -> str:
    return MOUNTINFO_PATH.read_text(encoding="utf-8", errors="surrogateescape")


def read_fstab() -> str:
    return FSTAB_PATH.read_text(encoding="utf-8", errors="surrogateescape")


def unmounted_share(path: str, fstab: str, mountinfo: str) -> MountEntry | None:
    """The fstab entry that should hold `path` (absolute, symlinks resolved) but is not
    mounted now, or None.

    A share that is not mounted leaves its mount point as a plain (usually empty) folder
    of the parent file system: it exists, so only the tables tell it from an empty inbox.
    Entries marked `noauto` count too: a user mounts them by hand, and until then the
    folder is not the share. `/` never counts (it is always mounted).
    """
    entry = find_mount(path, parse_fstab(fstab))
    if entry is None or entry.mount_point == "/":
        return None
    # Mounted when the mount holding `path` now is that entry's or one below it (a bind
    # mount of the inbox itself inside an unmounted share is still a mounted inbox).
    actual = find_mount(path, parse_mountinfo(mountinfo))
    if actual is not None and len(actual.mount_point.rstrip("/")) >= len(entry.mount_point):
        return None
    return entry
