"""Tests for inbox watching: name rules (daemon/intake/ignore.py), observer choice (mounts.py),
stability (stability.py), observers (observers.py) and scans (watcher.py).

Time is always injected (`tick(now)` with made-up monotonic seconds); nothing sleeps.
The one test that starts a real inotify observer waits for its hint with a timeout.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

import pytest
from watchdog.events import (
    DirCreatedEvent,
    DirModifiedEvent,
    FileClosedEvent,
    FileClosedNoWriteEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileOpenedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)

from daemon.config.settings import InboxConfig, WatchMode
from daemon.intake.ignore import (
    is_candidate,
    is_candidate_name,
    is_ignored_dir_name,
    is_ignored_file_name,
    is_rsync_temp_name,
    matches_patterns,
)
from daemon.intake.mounts import (
    MountEntry,
    ObserverKind,
    choose_observer_kind,
    find_mount,
    is_network_fstype,
    parse_mountinfo,
)
from daemon.intake.observers import ObserverLike, reports_close_write
from daemon.intake.stability import FileStabilityTracker, StatSignature
from daemon.intake.watch_settings import WatcherIO, WatcherSettings
from daemon.intake.watcher import Watcher

STABLE = 5.0

# ---------------------------------------------------------------------------------------
# Name rules
# ---------------------------------------------------------------------------------------

RECURSIVE = InboxConfig(path=Path("/inbox"))
FLAT = InboxConfig(path=Path("/inbox"), recursive=False)
PDF_ONLY = InboxConfig(path=Path("/inbox"), patterns=("*.pdf",))


@pytest.mark.parametrize(
    ("relative", "inbox", "expected"),
    [
        # Patterns, case-insensitively.
        ("scan.pdf", RECURSIVE, True),
        ("SCAN.PDF", RECURSIVE, True),
        ("Scan.Pdf", PDF_ONLY, True),
        ("photo.JPEG", RECURSIVE, True),
        ("page.TIFF", RECURSIVE, True),
        ("notes.txt", RECURSIVE, False),
        ("scan.pdf.txt", RECURSIVE, False),
        ("photo.jpg", PDF_ONLY, False),
        ("pdf", RECURSIVE, False),
        # Writers' temporaries.
        (".scan.pdf.AbC123", RECURSIVE, False),  # rsync
        ("scan.pdf.part", RECURSIVE, False),
        ("scan.pdf.crdownload", RECURSIVE, False),
        ("scan.pdf.tmp", RECURSIVE, False),
        ("scan.pdf.TMP", RECURSIVE, False),
        ("scan.pdf.partial", RECURSIVE, False),
        ("scan.pdf.filepart", RECURSIVE, False),
        ("scan.pdf.!ut", RECURSIVE, False),
        ("scan.pdf~", RECURSIVE, False),
        ("~$scan.pdf", RECURSIVE, False),
        (".~lock.scan.pdf#", RECURSIVE, False),
        ("#scan.pdf#", RECURSIVE, False),
        ("scan.pdf.sb-1a2b3c4d-AbC123", RECURSIVE, False),
        (".pureftpd-upload.5f3e.scan.pdf", RECURSIVE, False),
        (".in.scan.pdf.", RECURSIVE, False),
        (".nfs000000000123", RECURSIVE, False),
        # Junk and hidden files, even when the pattern matches.
        ("._scan.pdf", RECURSIVE, False),
        (".DS_Store", InboxConfig(path=Path("/inbox"), patterns=("*",)), False),
        ("Thumbs.db", InboxConfig(path=Path("/inbox"), patterns=("*",)), False),
        ("desktop.ini", InboxConfig(path=Path("/inbox"), patterns=("*",)), False),
        (".hidden.pdf", RECURSIVE, False),
        # Folders.
        ("sub/scan.pdf", RECURSIVE, True),
        ("a/b/c/scan.pdf", RECURSIVE, True),
        ("sub/scan.pdf", FLAT, False),
        ("scan.pdf", FLAT, True),
        ("@eaDir/scan.pdf", RECURSIVE, False),
        ("sub/@eaDir/scan.pdf/SYNOFILE_THUMB_M.jpg", RECURSIVE, False),
        ("@EADIR/scan.pdf", RECURSIVE, False),
        ("#recycle/scan.pdf", RECURSIVE, False),
        ("#snapshot/daily/scan.pdf", RECURSIVE, False),
        (".stfolder/scan.pdf", RECURSIVE, False),
        (".stversions/scan~20240101.pdf", RECURSIVE, False),
        (".Trashes/501/scan.pdf", RECURSIVE, False),
        (".Spotlight-V100/scan.pdf", RECURSIVE, False),
        (".fseventsd/scan.pdf", RECURSIVE, False),
        ("__MACOSX/scan.pdf", RECURSIVE, False),
        ("lost+found/scan.pdf", RECURSIVE, False),
        ("$RECYCLE.BIN/scan.pdf", RECURSIVE, False),
        (".hidden/scan.pdf", RECURSIVE, False),
        ("../scan.pdf", RECURSIVE, False),
        ("", RECURSIVE, False),
    ],
)
def test_candidate_name_rules(relative: str, inbox: InboxConfig, expected: bool) -> None:
    assert is_candidate_name(PurePath(relative), inbox) is expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (".scan.pdf.AbC123", True),
        (".x.pdf.a1B2c3", True),
        (".Scan 2024.pdf.zzzzzz", True),
        ("scan.pdf.AbC123", False),  # not hidden: rsync always adds the dot
        (".scan.pdf.AbC12", False),  # five characters
        (".scan.pdf.AbC1234", False),  # seven characters
        (".pdf", False),
    ],
)
def test_rsync_temp_names(name: str, expected: bool) -> None:
    assert is_rsync_temp_name(name) is expected
    if expected:
        assert is_ignored_file_name(name)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("@eaDir", True),
        ("#recycle", True),
        (".git", True),
        ("Invoices", False),
        ("2024", False),
        ("eaDir", False),
    ],
)
def test_ignored_dir_names(name: str, expected: bool) -> None:
    assert is_ignored_dir_name(name) is expected


def test_patterns_are_case_insensitive_both_ways() -> None:
    assert matches_patterns("scan.pdf", ("*.PDF",))
    assert matches_patterns("SCAN.PDF", ("*.pdf",))
    assert not matches_patterns("scan.pdf", ())


# ---------------------------------------------------------------------------------------
# Observer choice from mountinfo
# ---------------------------------------------------------------------------------------

MOUNTINFO = "\n".join(
    [
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro",
        "30 22 0:40 / /mnt/nas rw,relatime shared:20 - nfs4 nas:/volume1/scans rw,vers=4.2",
        "31 22 0:41 / /mnt/smb rw,relatime - cifs //nas/docs rw,vers=3.1.1",
        "32 22 0:42 / /mnt/remote rw,nosuid,nodev - fuse.sshfs user@host:/srv rw",
        "33 22 0:43 / /mnt/plainfuse rw - fuse /dev/fuse rw",
        r"34 22 8:2 / /mnt/My\040Disk rw,relatime - ext4 /dev/sdb1 rw",
        r"35 22 0:44 / /mnt/My\040Share rw,relatime - smb3 //nas/My\040Share rw",
        "36 30 8:3 /local /mnt/nas/local rw,relatime - xfs /dev/sdc1 rw",
        "37 22 0:45 / /var/lib/docker/overlay rw - overlay overlay rw,lowerdir=/a",
        "38 22 8:4 / /mnt/usb rw - fuseblk /dev/sdd1 rw",
        "garbage line without separator",
    ]
)


def test_parse_mountinfo_decodes_escapes_and_skips_garbage() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert len(mounts) == 10
    assert mounts[0] == MountEntry("/", "ext4", "/dev/sda1")
    assert MountEntry("/mnt/My Disk", "ext4", "/dev/sdb1") in mounts
    assert MountEntry("/mnt/My Share", "smb3", "//nas/My Share") in mounts


def test_parse_mountinfo_with_several_optional_fields() -> None:
    line = "40 22 0:50 / /data rw shared:5 master:3 propagate_from:2 - nfs srv:/x rw"
    assert parse_mountinfo(line) == [MountEntry("/data", "nfs", "srv:/x")]


@pytest.mark.parametrize(
    ("path", "kind", "mount_point"),
    [
        ("/home/me/inbox", "events", "/"),
        ("/mnt/nas/inbox", "poll", "/mnt/nas"),
        ("/mnt/nas", "poll", "/mnt/nas"),
        ("/mnt/nas2/inbox", "events", "/"),  # prefix must end on a path component
        ("/mnt/nas/local/inbox", "events", "/mnt/nas/local"),  # longest prefix wins
        ("/mnt/smb/scanner", "poll", "/mnt/smb"),
        ("/mnt/remote/in", "poll", "/mnt/remote"),
        ("/mnt/plainfuse/in", "poll", "/mnt/plainfuse"),
        ("/mnt/My Disk/inbox", "events", "/mnt/My Disk"),
        ("/mnt/My Share/inbox", "poll", "/mnt/My Share"),
        ("/var/lib/docker/overlay/x", "events", "/var/lib/docker/overlay"),
        ("/mnt/usb/inbox", "events", "/mnt/usb"),
    ],
)
def test_auto_mode_by_file_system(path: str, kind: ObserverKind, mount_point: str) -> None:
    choice = choose_observer_kind(Path(path), "auto", MOUNTINFO)
    assert choice.kind == kind
    assert mount_point in choice.reason


def test_later_mount_on_same_point_wins() -> None:
    mounts = [MountEntry("/mnt/x", "ext4", "a"), MountEntry("/mnt/x", "nfs", "b")]
    assert find_mount("/mnt/x/in", mounts) == mounts[1]


def test_explicit_modes_ignore_the_mount_table() -> None:
    assert choose_observer_kind(Path("/mnt/nas/in"), "events", MOUNTINFO).kind == "events"
    assert choose_observer_kind(Path("/home/in"), "poll", MOUNTINFO).kind == "poll"
    with pytest.raises(ValueError):
        choose_observer_kind(Path("/x"), "sometimes", MOUNTINFO)  # type: ignore[arg-type]


def test_unknown_mount_table_means_events() -> None:
    choice = choose_observer_kind(Path("/x/in"), "auto", "not a mount table\n")
    assert choice.kind == "events"
    assert "no mount" in choice.reason


@pytest.mark.parametrize(
    ("fstype", "network"),
    [
        ("nfs", True),
        ("nfs4", True),
        ("cifs", True),
        ("smb3", True),
        ("9p", True),
        ("virtiofs", True),
        ("fuse", True),
        ("fuse.sshfs", True),
        ("fuse.bindfs", True),
        ("ceph", True),
        ("glusterfs", True),
        ("ext4", False),
        ("xfs", False),
        ("btrfs", False),
        ("zfs", False),
        ("overlay", False),
        ("tmpfs", False),
        ("fuseblk", False),
    ],
)
def test_network_fstypes(fstype: str, network: bool) -> None:
    assert is_network_fstype(fstype) is network


def test_real_mount_table_is_readable_here(tmp_path: Path) -> None:
    # Whatever this machine is, auto mode must decide without raising.
    assert choose_observer_kind(tmp_path, "auto").kind in ("events", "poll")


# ---------------------------------------------------------------------------------------
# The stability tracker, with a fake clock and a fake stat
# ---------------------------------------------------------------------------------------


class FakeFiles:
    """A fake lstat: path -> (size, mtime_ns, inode), or a non-regular mode."""

    def __init__(self) -> None:
        self.files: dict[Path, tuple[int, int, int]] = {}
        self.modes: dict[Path, int] = {}
        self.errors: dict[Path, OSError] = {}
        self.calls = 0

    def set(self, path: Path, size: int, mtime_ns: int, inode: int = 1) -> None:
        self.files[path] = (size, mtime_ns, inode)

    def __call__(self, path: Path) -> os.stat_result:
        self.calls += 1
        if path in self.errors:
            raise self.errors[path]
        if path not in self.files:
            raise FileNotFoundError(errno.ENOENT, "gone", str(path))
        size, mtime_ns, inode = self.files[path]
        mode = self.modes.get(path, stat.S_IFREG | 0o644)
        mtime = mtime_ns / 1e9
        return os.stat_result(
            (mode, inode, 1, 1, 0, 0, size, 0, int(mtime), 0, 0.0, mtime, 0.0, 0, mtime_ns, 0)
        )


def run_ticks(
    tracker: FileStabilityTracker, start: float, end: float, step: float = 0.5
) -> list[tuple[float, Path]]:
    reported: list[tuple[float, Path]] = []
    now = start
    while now <= end:
        reported.extend((now, p) for p in tracker.tick(now))
        now += step
    return reported


P = Path("/inbox/scan.pdf")


def test_growing_file_is_reported_once_after_it_stops_changing() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    files.set(P, 100, 1)
    tracker.observe(P, 0.0)
    reported: list[tuple[float, Path]] = []
    # The file grows every second until t=8, without events (e.g. a polled share).
    for step in range(0, 60):
        now = step * 0.5
        if now <= 8.0 and now == int(now):
            files.set(P, 100 + int(now) * 10, 1 + int(now))
        reported.extend((now, p) for p in tracker.tick(now))
    assert [p for _, p in reported] == [P]
    when = reported[0][0]
    # Not before it was quiet for the window; at most two windows late.
    assert 8.0 + STABLE <= when <= 8.0 + 2 * STABLE + 0.5
    assert len(tracker) == 0


def test_events_restart_the_window_and_report_promptly() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    for second in range(5):  # an event with every write, as inotify delivers
        files.set(P, 100 * (second + 1), second)
        tracker.observe(P, float(second))
        assert tracker.tick(float(second)) == []
    assert run_ticks(tracker, 4.5, 8.5) == []
    assert run_ticks(tracker, 9.0, 30.0) == [(9.0, P)]


def test_a_new_mtime_makes_a_reported_file_pending_again() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    files.set(P, 100, 1)
    tracker.observe(P, 0.0)
    assert [p for _, p in run_ticks(tracker, 0.0, 20.0)] == [P]
    # Unchanged: neither an event nor a scan offer reports it again.
    tracker.observe(P, 21.0)
    assert not tracker.offer(P, StatSignature(100, 1, 1), 21.0)
    assert run_ticks(tracker, 21.0, 40.0) == []
    # Rewritten in place with a new mtime: reported again, once.
    files.set(P, 100, 2)
    assert tracker.offer(P, StatSignature(100, 2, 1), 41.0)
    assert [p for _, p in run_ticks(tracker, 41.0, 60.0)] == [P]


def test_same_size_and_mtime_but_new_inode_is_a_change() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    files.set(P, 100, 1, inode=7)
    tracker.observe(P, 0.0)
    assert len(run_ticks(tracker, 0.0, 20.0)) == 1
    assert tracker.offer(P, StatSignature(100, 1, 8), 21.0)  # e.g. `rsync -a` copy again


def test_vanished_file_is_dropped() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    files.set(P, 100, 1)
    tracker.observe(P, 0.0)
    tracker.tick(0.0)
    del files.files[P]
    assert run_ticks(tracker, 0.5, 30.0) == []
    assert len(tracker) == 0


def test_stat_error_drops_and_a_rescan_can_offer_again() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    files.set(P, 100, 1)
    files.errors[P] = OSError(errno.ESTALE, "Stale file handle")
    tracker.observe(P, 0.0)
    assert tracker.tick(0.0) == []
    assert len(tracker) == 0
    del files.errors[P]
    assert tracker.offer(P, StatSignature(100, 1, 1), 10.0)
    assert [p for _, p in run_ticks(tracker, 10.0, 30.0)] == [P]


def test_something_that_is_not_a_regular_file_is_dropped() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    files.set(P, 10, 1)
    files.modes[P] = stat.S_IFLNK | 0o777
    tracker.observe(P, 0.0)
    assert run_ticks(tracker, 0.0, 20.0) == []
    assert len(tracker) == 0


def test_a_scan_does_not_restart_a_pending_window() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    files.set(P, 100, 1)
    assert tracker.offer(P, StatSignature(100, 1, 1), 0.0)
    assert not tracker.offer(P, StatSignature(100, 1, 1), 4.0)
    assert run_ticks(tracker, 0.0, 10.0) == [(5.0, P)]


def test_quiet_file_costs_few_stats() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    files.set(P, 100, 1)
    tracker.observe(P, 0.0)
    run_ticks(tracker, 0.0, 30.0)
    assert files.calls == 2  # a baseline and the confirmation, not one per tick


def test_empty_file_waits_for_content_or_the_empty_window() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, empty_stability_seconds=60.0, stat=files)
    files.set(P, 0, 1)
    tracker.observe(P, 0.0)
    assert run_ticks(tracker, 0.0, 59.5) == []
    assert [p for _, p in run_ticks(tracker, 60.0, 70.0)] == [P]

    other = Path("/inbox/filled.pdf")
    files.set(other, 0, 1)
    tracker.observe(other, 100.0)
    assert run_ticks(tracker, 100.0, 110.0) == []
    files.set(other, 5000, 2)  # the scanner filled it
    tracker.observe(other, 110.0)
    assert run_ticks(tracker, 110.0, 130.0) == [(115.0, other)]


def test_retain_reported_forgets_vanished_signatures() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    files.set(P, 100, 1)
    tracker.observe(P, 0.0)
    run_ticks(tracker, 0.0, 10.0)
    assert tracker.reported_count == 1
    tracker.retain_reported(set())
    assert tracker.reported_count == 0
    assert tracker.offer(P, StatSignature(100, 1, 1), 20.0)


# ---------------------------------------------------------------------------------------
# Files held while open for writing (a write event, then its close event)
# ---------------------------------------------------------------------------------------

MB8 = 8 * 1024 * 1024


def test_file_open_for_writing_is_held_however_long_it_is_unchanged() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    # smbd wrote the first 8 MiB step; the next one takes longer than the window.
    files.set(P, MB8, 1)
    tracker.observe(P, 0.0, open_for_write=True)
    assert tracker.is_open_for_write(P)
    assert run_ticks(tracker, 0.0, 100.0) == []
    assert tracker.is_pending(P) and tracker.open_for_write_count == 1
    assert files.calls == 2  # a baseline and one check: held entries are not polled
    # The close event: reported once the window passed since the close, not before.
    tracker.observe(P, 100.0, open_for_write=False)
    assert not tracker.is_open_for_write(P)
    assert run_ticks(tracker, 100.0, 130.0) == [(100.0 + STABLE, P)]
    assert tracker.open_for_write_count == 0 and len(tracker) == 0


def test_each_write_holds_again_and_each_close_restarts_the_window() -> None:
    """A slow appender that reopens the file for every chunk."""
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    files.set(P, 100, 1)
    tracker.observe(P, 0.0, open_for_write=True)
    tracker.observe(P, 1.0, open_for_write=False)
    assert run_ticks(tracker, 1.0, 5.5) == []  # closed, but not quiet for the window yet
    files.set(P, 200, 2)
    tracker.observe(P, 5.5, open_for_write=True)  # reopened and appended
    assert run_ticks(tracker, 5.5, 50.0) == []
    tracker.observe(P, 50.0, open_for_write=False)
    assert run_ticks(tracker, 50.0, 70.0) == [(50.0 + STABLE, P)]


def test_a_write_and_its_close_in_one_burst_are_applied_in_order() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    files.set(P, 100, 1)
    tracker.observe(P, 0.0, open_for_write=True)
    tracker.observe(P, 0.0)  # a hint that says nothing about writing keeps the hold
    assert tracker.is_open_for_write(P)
    tracker.observe(P, 0.0, open_for_write=False)
    assert run_ticks(tracker, 0.0, 10.0) == [(STABLE, P)]


def test_the_cap_releases_a_file_whose_close_event_was_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, open_write_cap_seconds=60.0, stat=files)
    files.set(P, 100, 1)
    tracker.observe(P, 0.0, open_for_write=True)
    files.set(P, 200, 2)
    tracker.observe(P, 30.0, open_for_write=True)  # the cap counts from the last write
    assert run_ticks(tracker, 0.0, 89.5) == []
    with caplog.at_level(logging.WARNING, logger="daemon.intake.watcher"):
        assert run_ticks(tracker, 90.0, 100.0) == [(90.0, P)]
    assert "still open for writing" in caplog.text
    assert tracker.open_for_write_count == 0


def test_the_cap_still_needs_the_file_unchanged_for_the_window() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, open_write_cap_seconds=60.0, stat=files)
    files.set(P, 100, 1)
    tracker.observe(P, 0.0, open_for_write=True)
    assert run_ticks(tracker, 0.0, 58.0) == []
    files.set(P, 300, 3)  # changed without an event (e.g. through an mmap)
    assert run_ticks(tracker, 58.5, 64.5) == []  # seen at the cap, so a new window
    assert run_ticks(tracker, 65.0, 80.0) == [(65.0, P)]


def test_clearing_holds_falls_back_to_size_and_mtime_at_once() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    files.set(P, 100, 1)
    other = Path("/inbox/other.pdf")
    files.set(other, 100, 1)
    tracker.observe(P, 0.0, open_for_write=True)
    tracker.observe(other, 18.0, open_for_write=True)
    assert run_ticks(tracker, 0.0, 20.0) == []
    assert tracker.clear_open_for_write() == 2  # e.g. an inotify queue overflow
    assert tracker.open_for_write_count == 0
    assert run_ticks(tracker, 20.5, 30.0) == [(20.5, P), (23.0, other)]


def test_forget_drops_a_hold() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    files.set(P, 100, 1)
    tracker.observe(P, 0.0, open_for_write=True)
    tracker.forget(P)
    assert tracker.open_for_write_count == 0 and len(tracker) == 0
    tracker.observe(P, 10.0)
    assert run_ticks(tracker, 10.0, 20.0) == [(15.0, P)]


def test_scans_and_plain_hints_never_hold() -> None:
    files = FakeFiles()
    tracker = FileStabilityTracker(STABLE, stat=files)
    files.set(P, 100, 1)
    assert tracker.offer(P, StatSignature(100, 1, 1), 0.0)
    other = Path("/inbox/polled.pdf")
    files.set(other, 100, 1)
    tracker.observe(other, 0.0)  # what a polling observer's hint does
    assert tracker.open_for_write_count == 0
    assert sorted(run_ticks(tracker, 0.0, 10.0)) == [(STABLE, other), (STABLE, P)]


# ---------------------------------------------------------------------------------------
# The watcher against a real folder (no observers started, fake clock)
# ---------------------------------------------------------------------------------------


def make_watcher(
    *inboxes: InboxConfig,
    rescan: float = 300.0,
    io: WatcherIO | None = None,
    **settings: Any,
) -> Watcher:
    """`settings`: WatcherSettings fields other than the two timings."""
    return Watcher(
        inboxes, WatcherSettings(stability_seconds=STABLE, rescan_seconds=rescan, **settings), io
    )


def write(path: Path, data: bytes = b"%PDF-1.4 test") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def ticks(watcher: Watcher, start: float, end: float, step: float = 0.5) -> list[Path]:
    found: list[Path] = []
    now = start
    while now <= end:
        found.extend(path for _, path in watcher.tick(now))
        now += step
    return found


def test_startup_scan_finds_candidates_and_skips_junk(tmp_path: Path) -> None:
    inbox = InboxConfig(path=tmp_path)
    good = [
        write(tmp_path / "a.pdf"),
        write(tmp_path / "B.PDF"),
        write(tmp_path / "sub" / "deep" / "c.png"),
    ]
    for junk in [
        ".a.pdf.AbC123",
        "x.pdf.part",
        "~$x.pdf",
        "._a.pdf",
        ".DS_Store",
        "Thumbs.db",
        "notes.txt",
        "@eaDir/a.pdf/SYNOFILE_THUMB_M.jpg",
        "#recycle/old.pdf",
        ".stversions/v.pdf",
        "__MACOSX/a.pdf",
        ".hidden/h.pdf",
    ]:
        write(tmp_path / junk)
    watcher = make_watcher(inbox)
    assert watcher.tick(0.0) == []  # found, but not stable yet
    assert watcher.describe()[0].pending == 3
    found = ticks(watcher, 0.5, 20.0)
    assert sorted(found) == sorted(good)
    assert watcher.tick(21.0) == []


def test_non_recursive_inbox_only_takes_the_top_level(tmp_path: Path) -> None:
    top = write(tmp_path / "top.pdf")
    write(tmp_path / "sub" / "nested.pdf")
    watcher = make_watcher(InboxConfig(path=tmp_path, recursive=False))
    assert ticks(watcher, 0.0, 10.0) == [top]


def test_symlinks_are_never_followed_nor_taken(tmp_path: Path) -> None:
    inbox_dir = tmp_path / "inbox"
    outside = tmp_path / "outside"
    target = write(outside / "secret.pdf")
    write(outside / "dir" / "inner.pdf")
    inbox_dir.mkdir()
    (inbox_dir / "link.pdf").symlink_to(target)
    (inbox_dir / "linkdir").symlink_to(outside / "dir", target_is_directory=True)
    real = write(inbox_dir / "real.pdf")
    inbox = InboxConfig(path=inbox_dir)
    watcher = make_watcher(inbox)
    assert ticks(watcher, 0.0, 10.0) == [real]
    assert not is_candidate(inbox_dir / "link.pdf", inbox)
    assert not is_candidate(inbox_dir / "linkdir" / "inner.pdf", inbox)
    assert is_candidate(real, inbox)
    assert not is_candidate(target, inbox)  # outside the inbox


def test_rsync_like_rename_is_picked_up_by_the_scan(tmp_path: Path) -> None:
    watcher = make_watcher(InboxConfig(path=tmp_path), rescan=30.0)
    watcher.tick(0.0)
    temp = write(tmp_path / ".x.pdf.AbC123", b"%PDF half")
    assert ticks(watcher, 0.5, 29.5) == []
    final = tmp_path / "x.pdf"
    temp.rename(final)
    assert ticks(watcher, 30.0, 40.0) == [final]


def test_unchanged_files_are_not_reported_by_every_rescan(tmp_path: Path) -> None:
    path = write(tmp_path / "a.pdf")
    watcher = make_watcher(InboxConfig(path=tmp_path), rescan=10.0)
    assert ticks(watcher, 0.0, 9.5) == [path]
    assert ticks(watcher, 10.0, 100.0) == []  # nine rescans later
    # Modified: reported again after the next rescan sees it.
    path.write_bytes(b"%PDF-1.4 different and longer")
    assert ticks(watcher, 100.5, 120.0) == [path]
    # Ingested and archived, then the same name dropped again: reported again.
    path.unlink()
    assert ticks(watcher, 120.5, 130.0) == []
    write(path, b"%PDF-1.4 another")
    assert ticks(watcher, 130.5, 150.0) == [path]


def test_excluded_folders_inside_an_inbox_are_skipped(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    write(archive / "done.pdf")
    new = write(tmp_path / "new.pdf")
    watcher = make_watcher(InboxConfig(path=tmp_path), exclude_dirs=(archive, tmp_path.parent))
    assert ticks(watcher, 0.0, 10.0) == [new]


def test_rescan_now_forces_a_scan(tmp_path: Path) -> None:
    watcher = make_watcher(InboxConfig(path=tmp_path), rescan=1000.0)
    watcher.tick(0.0)
    path = write(tmp_path / "late.pdf")
    assert ticks(watcher, 0.5, 10.0) == []  # no observer, no rescan due
    watcher.rescan_now()
    assert watcher.wait_for_hints(0)
    assert ticks(watcher, 10.5, 20.0) == [path]


def test_missing_inbox_is_reported_and_recovers(tmp_path: Path) -> None:
    inbox_dir = tmp_path / "not-yet"
    watcher = make_watcher(InboxConfig(path=inbox_dir), rescan=300.0)
    assert watcher.tick(0.0) == []
    assert watcher.describe()[0].missing == "gone (unmounted?)"
    path = write(inbox_dir / "a.pdf")
    # Scanned as soon as it is seen again (a stat every 2 s), not at the next rescan.
    assert ticks(watcher, 0.5, 2.0 + STABLE) == [path]
    assert watcher.describe()[0].missing is None


# ---------------------------------------------------------------------------------------
# Hints from event handlers, observers (faked), reload
# ---------------------------------------------------------------------------------------


@dataclass
class FakeObserver:
    kind: ObserverKind
    fail_with: OSError | None = None
    scheduled: list[tuple[FileSystemEventHandler, str, bool]] = field(default_factory=list)
    alive: bool = False
    stopped: bool = False
    # What `reports_close_write()` looks at; None: undeclared (treated as not reporting).
    reports_close_write: bool | None = None

    def schedule(
        self,
        event_handler: FileSystemEventHandler,
        path: str,
        *,
        recursive: bool = False,
        event_filter: list[type[FileSystemEvent]] | None = None,
    ) -> object:
        self.scheduled.append((event_handler, path, recursive))
        return object()

    def start(self) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.alive = True

    def stop(self) -> None:
        self.alive = False
        self.stopped = True

    def join(self, timeout: float | None = None) -> None:
        pass

    def is_alive(self) -> bool:
        return self.alive

    def send(self, event: FileSystemEvent) -> None:
        for handler, _, _ in self.scheduled:
            handler.dispatch(event)


class FakeFactory:
    def __init__(self, *, reports_close_write: bool | None = None) -> None:
        self.created: list[FakeObserver] = []
        self.fail: dict[ObserverKind, OSError] = {}
        self.reports_close_write = reports_close_write

    def __call__(self, kind: ObserverKind, poll_interval: float) -> ObserverLike:
        observer = FakeObserver(kind, self.fail.pop(kind, None))
        observer.reports_close_write = self.reports_close_write
        self.created.append(observer)
        return observer


def local_mounts() -> str:
    return "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"


def started_watcher(*inboxes: InboxConfig, factory: FakeFactory, rescan: float = 1000.0) -> Watcher:
    watcher = make_watcher(
        *inboxes, rescan=rescan, io=WatcherIO(observer_factory=factory,
                                              mountinfo_reader=local_mounts)
    )
    watcher.start()
    return watcher


def test_events_feed_the_tracker_and_moves_use_the_destination(tmp_path: Path) -> None:
    factory = FakeFactory()
    watcher = started_watcher(InboxConfig(path=tmp_path), factory=factory)
    observer = factory.created[0]
    assert observer.kind == "events"
    assert observer.scheduled[0][1:] == (str(tmp_path), True)
    watcher.tick(0.0)  # startup scan: empty

    temp = write(tmp_path / ".x.pdf.AbC123")
    observer.send(FileCreatedEvent(str(temp)))
    assert not watcher.wait_for_hints(0)  # temporary names never reach the queue
    final = tmp_path / "x.pdf"
    temp.rename(final)
    observer.send(FileMovedEvent(str(temp), str(final)))
    # Reading the file (ingest) must not make it pending: those events are ignored.
    observer.send(FileOpenedEvent(str(final)))
    observer.send(FileClosedNoWriteEvent(str(final)))
    observer.send(DirModifiedEvent(str(tmp_path)))
    assert watcher.wait_for_hints(0)
    assert watcher.tick(1.0) == []
    assert watcher.describe()[0].pending == 1
    assert ticks(watcher, 1.5, 10.0) == [final]


def test_growing_real_file_waits_for_its_last_write(tmp_path: Path) -> None:
    factory = FakeFactory()
    path = write(tmp_path / "big.pdf", b"x")
    watcher = started_watcher(InboxConfig(path=tmp_path), factory=factory)
    watcher.tick(0.0)
    for second in range(1, 8):
        with path.open("ab") as handle:
            handle.write(b"more")
        os.utime(path, ns=(second * 10**9, second * 10**9))  # distinct mtimes, no sleep
        factory.created[0].send(FileModifiedEvent(str(path)))
        assert watcher.tick(float(second)) == []
    assert ticks(watcher, 7.5, 11.5) == []
    assert ticks(watcher, 12.0, 20.0) == [path]


def test_a_folder_moved_in_is_walked(tmp_path: Path) -> None:
    factory = FakeFactory()
    watcher = started_watcher(InboxConfig(path=tmp_path), factory=factory)
    watcher.tick(0.0)
    inner = write(tmp_path / "batch" / "one.pdf")
    factory.created[0].send(DirCreatedEvent(str(tmp_path / "batch")))
    assert ticks(watcher, 1.0, 10.0) == [inner]


def test_deleted_event_forgets_the_report(tmp_path: Path) -> None:
    factory = FakeFactory()
    path = write(tmp_path / "a.pdf")
    watcher = started_watcher(InboxConfig(path=tmp_path), factory=factory)
    assert ticks(watcher, 0.0, 10.0) == [path]
    assert watcher._states[0].tracker.reported_count == 1
    path.unlink()
    factory.created[0].send(FileDeletedEvent(str(path)))
    watcher.tick(11.0)
    assert watcher._states[0].tracker.reported_count == 0


def test_queue_overflow_falls_back_to_a_rescan(tmp_path: Path) -> None:
    factory = FakeFactory()
    watcher = make_watcher(
        InboxConfig(path=tmp_path),
        rescan=1000.0,
        io=WatcherIO(observer_factory=factory, mountinfo_reader=local_mounts),
        max_queued_hints=2,
    )
    watcher.start()
    watcher.tick(0.0)
    paths = [write(tmp_path / f"{i}.pdf") for i in range(5)]
    for path in paths:
        factory.created[0].send(FileCreatedEvent(str(path)))
    assert sorted(ticks(watcher, 1.0, 10.0)) == sorted(paths)


def test_auto_mode_polls_network_inboxes(tmp_path: Path) -> None:
    factory = FakeFactory()
    nfs = f"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 0:5 / {tmp_path.resolve()} rw - nfs4 n:/x rw\n"
    watcher = make_watcher(
        InboxConfig(path=tmp_path),
        io=WatcherIO(observer_factory=factory, mountinfo_reader=lambda: nfs),
    )
    watcher.start()
    assert factory.created[0].kind == "poll"
    description = watcher.describe()[0]
    assert description.observer == "poll"
    assert "nfs4" in str(description.reason)


def test_inotify_limit_falls_back_to_polling(tmp_path: Path) -> None:
    factory = FakeFactory()
    factory.fail["events"] = OSError(errno.ENOSPC, "No space left on device")
    watcher = started_watcher(InboxConfig(path=tmp_path), factory=factory)
    assert [o.kind for o in factory.created] == ["events", "poll"]
    assert watcher.describe()[0].observer == "poll"
    assert "inotify limit" in str(watcher.describe()[0].reason)


def test_dead_observer_is_restarted_at_the_next_rescan(tmp_path: Path) -> None:
    factory = FakeFactory()
    watcher = started_watcher(InboxConfig(path=tmp_path), factory=factory, rescan=10.0)
    watcher.tick(0.0)
    factory.created[0].alive = False  # e.g. the folder was unmounted
    assert watcher.describe()[0].observer_alive is False
    watcher.tick(10.0)
    assert len(factory.created) == 2
    assert factory.created[0].stopped
    assert watcher.describe()[0].observer_alive is True


def test_replace_inboxes_keeps_unchanged_and_restarts_changed(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder in (a, b, c):
        folder.mkdir()
    factory = FakeFactory()
    inbox_a = InboxConfig(path=a)
    inbox_b = InboxConfig(path=b)
    watcher = started_watcher(inbox_a, inbox_b, factory=factory)
    watcher.tick(0.0)
    observer_a, observer_b = factory.created

    late = write(a / "late.txt")
    new_a = InboxConfig(path=a, patterns=("*.pdf", "*.txt"), output_subfolder="x")
    inbox_c = InboxConfig(path=c, watch="poll")
    watcher.replace_inboxes([new_a, inbox_c])

    assert not observer_a.stopped  # same path/recursion/watch: kept
    assert observer_b.stopped  # removed
    assert factory.created[2].kind == "poll"
    assert [d.path for d in watcher.describe()] == [str(a), str(c)]
    # Hints from the removed inbox's observer are ignored.
    observer_b.send(FileCreatedEvent(str(write(b / "ignored.pdf"))))
    # The pattern change rescans inbox a: the .txt file now matches, and the config
    # returned with it is the new one.
    result: list[tuple[InboxConfig, Path]] = []
    now = 1.0
    while now <= 10.0:
        result.extend(watcher.tick(now))
        now += 0.5
    assert result == [(new_a, late)]


def test_inotify_overflow_warning_triggers_a_rescan(tmp_path: Path) -> None:
    factory = FakeFactory()
    watcher = started_watcher(InboxConfig(path=tmp_path), factory=factory)
    watcher.tick(0.0)
    path = write(tmp_path / "lost.pdf")  # its events were dropped by the kernel
    logging.getLogger("watchdog.observers.inotify_c").warning(
        "Inotify queue overflowed; filesystem events were lost"
    )
    assert watcher.wait_for_hints(0)
    assert ticks(watcher, 1.0, 10.0) == [path]
    watcher.stop()


def test_stop_stops_every_observer(tmp_path: Path) -> None:
    factory = FakeFactory()
    watcher = started_watcher(InboxConfig(path=tmp_path), factory=factory)
    watcher.stop()
    assert all(o.stopped for o in factory.created)
    assert watcher.describe()[0].observer == "none"


def test_missing_inbox_observer_is_retried(tmp_path: Path) -> None:
    factory = FakeFactory()
    factory.fail["events"] = FileNotFoundError(errno.ENOENT, "missing")
    # The folder vanishes between the look at it and the watch being added.
    (tmp_path / "nas").mkdir()
    watcher = started_watcher(InboxConfig(path=tmp_path / "nas"), factory=factory, rescan=10.0)
    assert "missing" in str(watcher.describe()[0].reason)
    watcher.tick(0.0)  # the startup scan retries (and succeeds with the fake)
    assert watcher.describe()[0].observer == "events"


# -- files held while open for writing, with observers that report closes ----------------


def test_observers_that_report_closes() -> None:
    from watchdog.observers import Observer
    from watchdog.observers.polling import PollingObserver

    assert reports_close_write(Observer())  # inotify on Linux
    assert not reports_close_write(PollingObserver())
    assert not reports_close_write(FakeObserver("events"))
    assert reports_close_write(FakeObserver("events", reports_close_write=True))


def test_a_file_written_in_place_is_held_until_its_close(tmp_path: Path) -> None:
    factory = FakeFactory(reports_close_write=True)
    watcher = started_watcher(InboxConfig(path=tmp_path), factory=factory)
    observer = factory.created[0]
    watcher.tick(0.0)
    # smbd: the final name is created, then written in 8 MiB steps far apart.
    path = write(tmp_path / "upload.pdf", b"%PDF-1.4 first 8 MiB")
    observer.send(FileCreatedEvent(str(path)))
    observer.send(FileOpenedEvent(str(path)))
    observer.send(FileModifiedEvent(str(path)))
    assert ticks(watcher, 1.0, 100.0) == []
    assert watcher.describe()[0].open_for_write == 1
    assert watcher.describe()[0].pending == 1
    # A rescan does not release it either.
    watcher.rescan_now()
    assert watcher.tick(100.5) == []
    observer.send(FileClosedEvent(str(path)))
    assert ticks(watcher, 101.0, 105.5) == []
    assert watcher.describe()[0].open_for_write == 0
    assert ticks(watcher, 106.0, 120.0) == [path]


def test_write_and_close_in_one_burst_release_at_once(tmp_path: Path) -> None:
    factory = FakeFactory(reports_close_write=True)
    watcher = started_watcher(InboxConfig(path=tmp_path), factory=factory)
    watcher.tick(0.0)
    path = write(tmp_path / "quick.pdf")
    for event in (FileCreatedEvent, FileModifiedEvent, FileClosedEvent):
        factory.created[0].send(event(str(path)))
    assert ticks(watcher, 1.0, 5.5) == []
    assert ticks(watcher, 6.0, 10.0) == [path]


def test_files_moved_into_place_are_not_held(tmp_path: Path) -> None:
    factory = FakeFactory(reports_close_write=True)
    watcher = started_watcher(InboxConfig(path=tmp_path), factory=factory)
    observer = factory.created[0]
    watcher.tick(0.0)
    # rsync: written and closed under a temporary name, renamed into place.
    temp = write(tmp_path / ".x.pdf.AbC123")
    for event in (FileCreatedEvent, FileModifiedEvent, FileClosedEvent):
        observer.send(event(str(temp)))
    final = tmp_path / "x.pdf"
    temp.rename(final)
    observer.send(FileMovedEvent(str(temp), str(final)))
    # Moved in from outside the watched tree: watchdog reports it as created.
    outside = write(tmp_path / "from-elsewhere.pdf")
    observer.send(FileCreatedEvent(str(outside)))
    assert watcher.describe()[0].open_for_write == 0
    assert sorted(ticks(watcher, 1.0, 10.0)) == sorted([final, outside])


def test_a_file_renamed_over_a_held_name_is_not_held(tmp_path: Path) -> None:
    factory = FakeFactory(reports_close_write=True)
    watcher = started_watcher(InboxConfig(path=tmp_path), factory=factory)
    observer = factory.created[0]
    watcher.tick(0.0)
    final = write(tmp_path / "x.pdf")
    observer.send(FileModifiedEvent(str(final)))
    watcher.tick(1.0)
    assert watcher.describe()[0].open_for_write == 1
    temp = write(tmp_path / ".x.pdf.AbC123", b"%PDF-1.4 the whole new file")
    temp.rename(final)  # a new inode under the name: its writer is done
    observer.send(FileMovedEvent(str(temp), str(final)))
    watcher.tick(2.0)
    assert watcher.describe()[0].open_for_write == 0
    assert ticks(watcher, 2.5, 10.0) == [final]


def test_polling_and_undeclared_observers_never_hold(tmp_path: Path) -> None:
    polled, plain = tmp_path / "polled", tmp_path / "plain"
    polled.mkdir()
    plain.mkdir()
    poll_factory = FakeFactory(reports_close_write=True)
    poll_watcher = started_watcher(InboxConfig(path=polled, watch="poll"), factory=poll_factory)
    plain_factory = FakeFactory()  # an events observer that does not report closes
    plain_watcher = started_watcher(InboxConfig(path=plain), factory=plain_factory)
    for watcher, factory, folder in (
        (poll_watcher, poll_factory, polled),
        (plain_watcher, plain_factory, plain),
    ):
        watcher.tick(0.0)
        path = write(folder / "a.pdf")
        factory.created[0].send(FileModifiedEvent(str(path)))
        assert watcher.tick(1.0) == []
        assert watcher.describe()[0].open_for_write == 0
        assert ticks(watcher, 1.5, 10.0) == [path]


def test_lost_events_release_every_hold(tmp_path: Path) -> None:
    factory = FakeFactory(reports_close_write=True)
    watcher = started_watcher(InboxConfig(path=tmp_path), factory=factory)
    watcher.tick(0.0)
    path = write(tmp_path / "closed-meanwhile.pdf")
    factory.created[0].send(FileModifiedEvent(str(path)))
    assert ticks(watcher, 1.0, 20.0) == []
    assert watcher.describe()[0].open_for_write == 1
    # Its close event was among those the kernel dropped.
    logging.getLogger("watchdog.observers.inotify_c").warning(
        "Inotify queue overflowed; filesystem events were lost"
    )
    assert watcher.tick(20.5) == [(InboxConfig(path=tmp_path), path)]
    assert watcher.describe()[0].open_for_write == 0
    watcher.stop()


def test_an_observer_restart_releases_its_holds(tmp_path: Path) -> None:
    factory = FakeFactory(reports_close_write=True)
    watcher = started_watcher(InboxConfig(path=tmp_path), factory=factory, rescan=30.0)
    watcher.tick(0.0)
    path = write(tmp_path / "a.pdf")
    factory.created[0].send(FileModifiedEvent(str(path)))
    assert ticks(watcher, 1.0, 20.0) == []
    factory.created[0].alive = False  # events (the close) were not watched for a while
    assert ticks(watcher, 20.5, 30.0) == [path]
    assert len(factory.created) == 2
    assert watcher.describe()[0].open_for_write == 0


def test_the_cap_applies_to_the_watcher(tmp_path: Path) -> None:
    factory = FakeFactory(reports_close_write=True)
    watcher = make_watcher(
        InboxConfig(path=tmp_path),
        rescan=1000.0,
        io=WatcherIO(observer_factory=factory, mountinfo_reader=local_mounts),
        open_write_cap_seconds=50.0,
    )
    watcher.start()
    watcher.tick(0.0)
    path = write(tmp_path / "a.pdf")
    factory.created[0].send(FileModifiedEvent(str(path)))
    assert ticks(watcher, 1.0, 50.5) == []
    assert ticks(watcher, 51.0, 60.0) == [path]


# ---------------------------------------------------------------------------------------
# The real inotify observer
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["events", "poll"])
def test_real_observer_delivers_rsync_rename(tmp_path: Path, mode: WatchMode) -> None:
    inbox = InboxConfig(path=tmp_path, watch=mode)
    watcher = make_watcher(inbox, rescan=10_000.0, poll_interval=0.05)
    watcher.start()
    try:
        assert watcher.describe()[0].observer == mode
        watcher.tick(0.0)  # startup scan: nothing there
        temp = write(tmp_path / ".x.pdf.AbC123")
        final = tmp_path / "x.pdf"
        temp.rename(final)
        # Only the rename's destination passes the handler's name filter, so the first
        # hint is the one we want. A generous timeout, not a timed assertion.
        assert watcher.wait_for_hints(timeout=10.0)
        assert watcher.tick(1.0) == []
        assert watcher.describe()[0].pending == 1
        assert ticks(watcher, 1.5, 10.0) == [final]
    finally:
        watcher.stop()


def test_real_inotify_holds_a_file_until_its_writer_closes_it(tmp_path: Path) -> None:
    tiny = 0.5
    watcher = Watcher(
        [InboxConfig(path=tmp_path, watch="events")],
        WatcherSettings(
            stability_seconds=tiny, empty_stability_seconds=tiny, rescan_seconds=10_000.0
        ),
    )

    def settle(now: float, open_for_write: int) -> None:
        """Tick at a fixed made-up time until the hints have turned the file's hold to
        `open_for_write`; bounded by a real-time deadline, not a sleep."""
        deadline = time.monotonic() + 10.0
        while True:
            assert watcher.tick(now) == []  # no time passes: nothing can be reported
            if watcher.describe()[0].open_for_write == open_for_write:
                return
            assert time.monotonic() < deadline, watcher.describe()
            watcher.wait_for_hints(timeout=0.2)

    watcher.start()
    try:
        assert watcher.describe()[0].observer == "events"
        watcher.tick(0.0)  # startup scan: nothing there
        path = tmp_path / "upload.pdf"
        with path.open("wb") as handle:
            handle.write(b"%PDF-1.4 the first step of a slow upload")
            handle.flush()
            settle(1.0, open_for_write=1)
            # Unchanged and still open far past the window: held.
            assert ticks(watcher, 1.5, 200.0, step=tiny) == []
            assert watcher.describe()[0].pending == 1
        settle(300.0, open_for_write=0)  # the close arrived
        assert ticks(watcher, 300.0, 300.0 + tiny / 2, step=tiny / 4) == []
        assert ticks(watcher, 300.0 + tiny, 310.0) == [path]
    finally:
        watcher.stop()


def test_files_of_no_document_type_are_logged_once_counted_and_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from daemon.cli.status_view import inbox_lines
    from daemon.common.live import InboxFacts

    write(tmp_path / "report.pdf")
    others = [write(tmp_path / n, b"PK\x03\x04") for n in ("a.docx", "b.zip", "notes.txt")]
    write(tmp_path / ".DS_Store", b"junk")  # junk is never reported
    write(tmp_path / "~$a.docx", b"lock")  # nor are Office lock files
    watcher = make_watcher(InboxConfig(path=tmp_path, patterns=("*.pdf",)), rescan=10.0)
    with caplog.at_level(logging.INFO, logger="daemon.intake.watcher"):
        assert ticks(watcher, 0.0, 10.0) == [tmp_path / "report.pdf"]
        watcher.tick(20.0)  # another full rescan: no second log line
    logged = [r.getMessage() for r in caplog.records if "not a document type" in r.getMessage()]
    assert len(logged) == 3 and all("patterns: *.pdf" in m for m in logged)
    description = watcher.describe()[0]
    assert description.ignored == 3
    assert description.ignored_names == ("a.docx", "b.zip", "notes.txt")
    assert all(p.exists() for p in others)  # the user decides what to do with them
    # What `docinbox status` reads back from the runtime row says the same.
    facts = InboxFacts.from_json(description.to_json())
    assert facts == description
    assert inbox_lines(facts)[-1].strip() == (
        "3 files ignored in inbox: not a document type: a.docx, b.zip, notes.txt"
    )
    # Gone from the inbox: forgotten at the next full rescan.
    others[0].unlink()
    watcher.tick(30.0)
    assert watcher.describe()[0].ignored == 2
