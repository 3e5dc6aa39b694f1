"""A folder that goes away and comes back (daemon/intake/presence.py, the watcher's use of
it, the mount tables of daemon/common/mounttable.py and the start-time check).

The detection logic is ticked with a made-up clock and fed made-up looks (`Probe`); the
watcher runs on real folders that are moved, replaced and recreated under it, with the
clock still ticked by hand. The daemon-level proofs on real mounts are in
tests/daemon/test_shares.py.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from watchdog.events import DirDeletedEvent, FileCreatedEvent, FileDeletedEvent

from daemon.cli.status_view import inbox_lines
from daemon.common.mounttable import MountEntry, parse_fstab, unmounted_share
from daemon.common.shares import Lane, Shares
from daemon.config.folders import check_folders
from daemon.config.settings import InboxConfig
from daemon.intake.presence import (
    CHECK_SECONDS,
    FolderPresence,
    Probe,
    mount_points,
    probe_folder,
)
from daemon.intake.watch_settings import WatcherIO, WatcherSettings
from daemon.intake.watcher import Watcher
from tests.common.test_lanes import FakeTime
from tests.conftest import require_mounting
from tests.intake.test_watcher import STABLE, FakeFactory, local_mounts, ticks, write

LOG = "daemon.intake.presence"
HERE = Probe((1, 100), parent_dev=1)
WALL = 1_700_000_000.0


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG]


# -- FolderPresence, one look at a time --------------------------------------------------


def test_gone_is_said_once_reminded_each_minute_and_its_return_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    p = FolderPresence("inbox /nas/scans")
    p.start(HERE, 0.0, WALL)
    assert p.update(HERE, 2.0, WALL + 2) is None
    change = p.update(Probe(None), 4.0, WALL + 4)
    assert change is not None and change.kind == "gone"
    assert messages(caplog) == [
        "inbox /nas/scans is gone (unmounted?): watching for it to return"
    ]
    assert (p.missing, p.missing_since_wall) == ("gone (unmounted?)", WALL + 4)
    now = 4.0
    while now < 62.0:  # one look every 2 s for a minute: no second line
        now += 2.0
        assert p.update(Probe(None), now, WALL + now) is None
    assert len(messages(caplog)) == 1
    p.update(Probe(None), 64.0, WALL + 64)
    assert messages(caplog)[-1] == (
        "inbox /nas/scans is still gone (unmounted?) (for 60 s): watching for it to return"
    )
    back = p.update(Probe((1, 200), parent_dev=1), 70.0, WALL + 70)
    assert back is not None and back.kind == "back"
    assert messages(caplog)[-1] == "inbox /nas/scans is back after 66 s: watching it again"
    assert p.present and p.missing_since_wall is None
    assert p.update(Probe((1, 200), parent_dev=1), 72.0, WALL + 72) is None  # the new inode


def test_a_new_inode_at_the_same_path_is_a_replaced_folder(
    caplog: pytest.LogCaptureFixture,
) -> None:
    p = FolderPresence("inbox /in")
    p.start(HERE, 0.0, WALL)
    change = p.update(Probe((1, 101), parent_dev=1), 2.0, WALL)
    assert change is not None and change.kind == "replaced"
    assert p.present
    assert "inbox /in was replaced by another folder" in messages(caplog)[0]


def test_an_unreachable_share_says_why() -> None:
    p = FolderPresence("inbox /mnt/fuse")
    p.start(HERE, 0.0, WALL)
    p.update(Probe(None, error="Transport endpoint is not connected"), 2.0, WALL)
    assert p.missing == "gone (unmounted? Transport endpoint is not connected)"


def test_a_mount_point_on_its_parents_device_again_is_an_unmounted_share(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    mounted = Probe((7, 1), parent_dev=1)  # the share's root: another device
    bare = Probe((1, 555), parent_dev=1)  # the empty folder under it
    p = FolderPresence("inbox /mnt/nas")
    p.start(mounted, 0.0, WALL)
    assert p.mount_point
    change = p.update(bare, 2.0, WALL)
    assert change is not None and change.kind == "unmounted"
    assert p.missing is not None and p.missing.startswith("not mounted")
    assert p.update(bare, 4.0, WALL) is None  # the bare folder stays missing
    back = p.update(Probe((8, 1), parent_dev=1), 6.0, WALL)  # remounted: a new device
    assert back is not None and back.kind == "back"
    assert [m.split(":")[0] for m in messages(caplog)] == [
        "inbox /mnt/nas is not mounted (what is there is the empty mount point on the "
        "parent file system)",
        "inbox /mnt/nas is back after 4 s",
    ]


def test_a_bind_mount_of_the_same_file_system_is_known_by_the_mount_table() -> None:
    p = FolderPresence("inbox /srv/in")
    p.start(Probe((1, 50), parent_dev=1, listed=True), 0.0, WALL)
    change = p.update(Probe((1, 51), parent_dev=1), 2.0, WALL)
    assert change is not None and change.kind == "unmounted"


def test_gone_then_a_bare_mount_point_is_said_again_as_what_it_is() -> None:
    p = FolderPresence("inbox /mnt/nas")
    p.start(Probe((7, 1), parent_dev=1), 0.0, WALL)
    assert p.update(Probe(None, error="Stale file handle"), 2.0, WALL) is not None
    change = p.update(Probe((1, 9), parent_dev=1), 4.0, WALL)
    assert change is not None and change.kind == "unmounted"
    assert p.missing_since_wall == WALL  # still away since the first look


def test_looks_are_due_every_few_seconds_or_at_once_after_an_event() -> None:
    p = FolderPresence("inbox /in", check_seconds=2.0)
    p.start(HERE, 10.0, WALL)
    assert not p.due(11.9) and p.due(12.0)
    p.check_soon()
    assert p.due(10.1)


def test_probe_of_real_folders(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    st = folder.stat()
    assert probe_folder(folder) == Probe((st.st_dev, st.st_ino), tmp_path.stat().st_dev)
    assert not probe_folder(folder).mount_point
    assert probe_folder(folder, frozenset({str(folder)})).mount_point
    assert probe_folder(tmp_path / "nope") == Probe(None)
    (tmp_path / "file").write_text("x")
    assert probe_folder(tmp_path / "file").identity is None
    points = mount_points()
    assert points is not None and "/" in points
    table = "1 0 8:1 / /srv/a\\040b rw - ext4 /dev/sda1 rw\n"
    assert mount_points(table) == frozenset({"/srv/a b"})


# -- the mount tables and the start-time check -------------------------------------------

FSTAB = """\
# <file system> <mount point> <type> <options> <dump> <pass>
UUID=abc / ext4 defaults 0 1
//nas/scans /mnt/nas\\040scans cifs credentials=/etc/nas,noauto 0 0
nas:/export /srv/nfs/ nfs defaults 0 0
/swapfile none swap sw 0 0
"""
ROOT_ONLY = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"


def test_parse_fstab_skips_comments_and_swap_and_unescapes() -> None:
    assert parse_fstab(FSTAB) == [
        MountEntry("/", "ext4", "UUID=abc"),
        MountEntry("/mnt/nas scans", "cifs", "//nas/scans"),
        MountEntry("/srv/nfs", "nfs", "nas:/export"),
    ]


@pytest.mark.parametrize(
    ("path", "mountinfo", "unmounted"),
    [
        ("/mnt/nas scans/inbox", ROOT_ONLY, "/mnt/nas scans"),
        ("/mnt/nas scans", ROOT_ONLY, "/mnt/nas scans"),
        ("/srv/nfs/in", ROOT_ONLY, "/srv/nfs"),
        ("/home/me/inbox", ROOT_ONLY, None),  # on /, which is always mounted
        ("/srv/nfs/in", ROOT_ONLY + "30 22 0:40 / /srv/nfs rw - nfs4 nas:/export rw\n", None),
        # The inbox itself bind-mounted from elsewhere inside the unmounted share.
        ("/srv/nfs/in", ROOT_ONLY + "31 22 8:1 /x /srv/nfs/in rw - ext4 /dev/sda1 rw\n", None),
    ],
)
def test_unmounted_share(path: str, mountinfo: str, unmounted: str | None) -> None:
    entry = unmounted_share(path, FSTAB, mountinfo)
    assert (entry.mount_point if entry else None) == unmounted


def test_an_inbox_on_an_unmounted_share_is_refused_like_a_missing_one(tmp_path: Path) -> None:
    inbox = tmp_path / "nas"
    inbox.mkdir()  # the bare mount point exists, empty
    fstab = f"//nas/scans {inbox} cifs defaults 0 0\n"
    outputs = [("outbox", tmp_path / "out")]
    problems = check_folders([inbox], outputs, create=True, fstab=fstab, mountinfo=ROOT_ONLY)
    assert [(p.key, p.message.split(":")[0]) for p in problems] == [
        ("inboxes[0].path", f"inbox {inbox} is not mounted")
    ]
    assert f"RequiresMountsFor={inbox}" in problems[0].hint
    mounted = ROOT_ONLY + f"40 22 0:50 / {inbox} rw - cifs //nas/scans rw\n"
    assert check_folders([inbox], outputs, create=True, fstab=fstab, mountinfo=mounted) == []


# -- the watcher on real folders, with a ticked clock --------------------------------------


def watcher_on(
    inbox: Path,
    factory: FakeFactory | None = None,
    probe: Callable[[Path, frozenset[str] | None], Probe] = probe_folder,
    clock: Callable[[], float] = lambda: 0.0,  # read only by a look before the first tick
) -> Watcher:
    w = Watcher(
        [InboxConfig(path=inbox)],
        # 300 s: the shipped default: nothing below waits for a rescan
        WatcherSettings(stability_seconds=STABLE, rescan_seconds=300.0),
        WatcherIO(
            mountinfo_reader=local_mounts,
            wall=lambda: WALL,
            clock=clock,
            probe=probe,
            observer_factory=factory or FakeFactory(),
        ),
    )
    if factory is not None:
        w.start()
    return w


def test_inbox_moved_away_and_back_is_rescanned_at_once_and_nothing_is_taken_twice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    inbox = tmp_path / "inbox"
    throughout = write(inbox / "throughout.pdf")
    factory = FakeFactory()
    watcher = watcher_on(inbox, factory)
    assert ticks(watcher, 0.0, 10.0) == [throughout]
    os.rename(inbox, tmp_path / "away")
    assert ticks(watcher, 10.5, 12.0) == []
    facts = watcher.describe()[0]
    assert facts.missing == "gone (unmounted?)" and facts.missing_since == WALL
    assert facts.observer == "none" and factory.created[0].stopped
    write(tmp_path / "away" / "meanwhile.pdf")
    os.rename(tmp_path / "away", inbox)
    # Seen within one look (2 s), scanned on that tick: not at the rescan 300 s on.
    assert ticks(watcher, 12.5, 14.0 + STABLE) == [inbox / "meanwhile.pdf"]
    assert watcher.describe()[0].missing is None
    assert len(factory.created) == 2 and factory.created[1].alive  # a fresh observer
    assert ticks(watcher, 20.0, 320.0, step=5.0) == []  # throughout.pdf never again
    assert any("is back after" in m for m in messages(caplog))


def test_inbox_replaced_by_a_new_folder_gets_a_new_observer_and_a_scan(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    factory = FakeFactory()
    watcher = watcher_on(inbox, factory)
    assert ticks(watcher, 0.0, 2.0) == []
    os.rename(inbox, tmp_path / "old")
    inbox.mkdir()
    new = write(inbox / "new.pdf")
    assert ticks(watcher, 2.5, 4.0 + STABLE) == [new]
    assert "was replaced by another folder" in messages(caplog)[0]
    assert factory.created[0].stopped and factory.created[1].alive


def test_the_observers_root_event_is_looked_at_on_the_next_tick(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    looks: list[Path] = []

    def probe(path: Path, points: frozenset[str] | None) -> Probe:
        looks.append(path)
        return probe_folder(path, points)

    factory = FakeFactory()
    watcher = watcher_on(inbox, factory, probe=probe)
    try:
        watcher.tick(0.0)
        before = len(looks)
        watcher.tick(0.5)
        assert len(looks) == before  # no look due before 2.0
        factory.created[0].send(DirDeletedEvent(str(inbox)))  # watchdog's IN_DELETE_SELF
        watcher.tick(0.75)
        assert len(looks) == before + 1
    finally:
        watcher.stop()


def test_a_look_asked_for_before_the_first_tick_is_scheduled_from_the_clock(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The supervisor or the publisher may ask for a look at an inbox between the watcher's
    ticks, also before its first one. That look happens at the watcher's clock: the next
    one is due CHECK_SECONDS after it (not at once), and an inbox found away is away
    since then (not since forever)."""
    caplog.set_level(logging.INFO, logger=LOG)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    watcher = watcher_on(inbox, clock=lambda: 100.0)  # no tick yet
    os.rename(inbox, tmp_path / "away")
    assert watcher.look_at_inbox(str(inbox)) == "gone (unmounted?)"
    os.rename(tmp_path / "away", inbox)
    watcher.tick(100.0 + CHECK_SECONDS - 0.5)  # the next look is not due yet
    assert watcher.missing_inboxes() == {str(inbox): "gone (unmounted?)"}
    watcher.tick(100.0 + CHECK_SECONDS)
    assert watcher.missing_inboxes() == {}
    back = [m for m in messages(caplog) if "is back after" in m]
    assert back == [f"inbox {inbox} is back after {CHECK_SECONDS:.0f} s: watching it again"]


def test_files_written_into_an_unmounted_shares_mount_point_are_not_taken(
    tmp_path: Path,
) -> None:
    inbox = tmp_path / "mnt"
    inbox.mkdir()
    mounted = {"now": True}
    st = inbox.stat()

    def probe(path: Path, points: frozenset[str] | None) -> Probe:
        # The share's root on device 99 while mounted; the real folder when not.
        if mounted["now"]:
            return Probe((99, 1), parent_dev=st.st_dev)
        return probe_folder(path, points)

    watcher = watcher_on(inbox, probe=probe)
    assert ticks(watcher, 0.0, 2.0) == []
    mounted["now"] = False
    watcher.tick(2.5)
    stray = write(inbox / "stray.pdf")  # a scanner writing while the share is away
    assert ticks(watcher, 3.0, 30.0) == []
    facts = watcher.describe()[0]
    assert facts.missing is not None
    assert facts.missing.startswith("not mounted")
    line = inbox_lines(facts, WALL + 90)[0]
    assert "(MISSING since " in line and "(1m)" in line and "not mounted" in line
    mounted["now"] = True  # the share is back (the stat says its root again)
    assert ticks(watcher, 30.5, 32.0 + STABLE) == [stray]


def test_files_of_no_document_type_are_noted_on_events_not_only_at_rescans(
    tmp_path: Path,
) -> None:
    factory = FakeFactory()
    watcher = watcher_on(tmp_path, factory)
    watcher.tick(0.0)
    docx = write(tmp_path / "archive.zip", b"PK\x03\x04")
    factory.created[0].send(FileCreatedEvent(str(docx)))
    watcher.tick(0.5)
    assert watcher.describe()[0].ignored_names == ("archive.zip",)
    docx.unlink()
    factory.created[0].send(FileDeletedEvent(str(docx)))
    watcher.tick(1.0)
    assert watcher.describe()[0].ignored == 0


def test_a_folder_moved_away_is_looked_at_on_the_next_tick_not_the_next_look(
    tmp_path: Path,
) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    watcher = watcher_on(inbox, FakeFactory())
    try:
        watcher.tick(0.0)
        os.rename(inbox, tmp_path / "away")  # inotify's IN_MOVE_SELF on the folder
        watcher.tick(0.25)  # the next look is due at 2.0
        assert watcher.describe()[0].missing == "gone (unmounted?)"
        os.rename(tmp_path / "away", inbox)
        watcher.tick(2.25)
        assert watcher.describe()[0].missing is None
        os.rename(inbox, tmp_path / "away")  # heard again: the folder is watched again
        watcher.tick(2.5)
        assert watcher.describe()[0].missing == "gone (unmounted?)"
    finally:
        watcher.stop()


def test_an_unmount_is_heard_on_the_next_tick(tmp_path: Path) -> None:
    """IN_UNMOUNT, which the kernel sends to every watch on the file system unmounted."""
    import subprocess

    inbox = tmp_path / "mnt"
    require_mounting(inbox)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(inbox)], check=True)
    watcher = Watcher([InboxConfig(path=inbox)],
                      WatcherSettings(stability_seconds=STABLE, rescan_seconds=300.0),
                      WatcherIO(observer_factory=FakeFactory(), wall=lambda: WALL))
    try:
        watcher.start()
        watcher.tick(0.0)
        subprocess.run(["umount", str(inbox)], check=True)
        watcher.tick(0.25)
        missing = watcher.describe()[0].missing
        assert isinstance(missing, str) and missing.startswith("not mounted"), missing
    finally:
        watcher.stop()
        subprocess.run(["umount", "-l", str(inbox)], capture_output=True, check=False)


# -- a share that hangs instead of vanishing ---------------------------------------------


def test_a_hung_share_holds_its_inbox_only_and_is_rescanned_when_it_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every call into the share goes through its lane; the lane's clock is fake and a
    closed gate is a dead NFS server (tests/common/test_lanes.py). The other inbox goes on."""
    caplog.set_level(logging.INFO, logger=LOG)
    local, nas = tmp_path / "local", tmp_path / "nas"
    local.mkdir()
    nas.mkdir()
    mounts = ROOT_ONLY + f"40 22 0:50 / {nas} rw - nfs4 nas:/scans rw\n"
    t = FakeTime()

    def lane(mount: str, deadline: float) -> Lane:
        return t.lane(mount, deadline) if mount == str(nas) else Lane(mount, deadline)

    def probe(path: Path, points: frozenset[str] | None) -> Probe:
        if path == nas:
            t.gate.wait()  # a stat of a dead hard mount: blocks until the server is back
        return probe_folder(path, points)

    shares = Shares(mountinfo=lambda: mounts, lane=lane)
    watcher = Watcher(
        [InboxConfig(path=local), InboxConfig(path=nas)],
        WatcherSettings(stability_seconds=STABLE, rescan_seconds=5.0),
        WatcherIO(mountinfo_reader=lambda: mounts, probe=probe, wall=lambda: WALL,
                  observer_factory=FakeFactory(), shares=shares),
    )
    watcher.start()
    before = [write(local / "a.pdf"), write(nas / "b.pdf")]
    assert sorted(ticks(watcher, 0.0, 10.0)) == sorted(before)

    t.gate.clear()  # the NAS stops answering
    meanwhile = write(local / "c.pdf")
    late = write(nas / "d.pdf")  # written on the server: seen once it answers
    assert ticks(watcher, 10.5, 25.0) == [meanwhile]  # the local inbox goes on
    local_facts, nas_facts = watcher.describe()
    assert local_facts.answering and local_facts.missing is None
    assert not nas_facts.answering and nas_facts.share == str(nas)
    assert nas_facts.missing == f"not answering (the share at {nas} hangs)"
    assert nas_facts.missing_since == WALL
    assert t.now == 110.0  # one deadline was waited for, once
    warned = [m for m in messages(caplog) if "not answering" in m]
    assert warned == [f"inbox {nas} is not answering (the share at {nas} hangs): watching "
                      "for it to return"]

    t.gate.set()  # the server is back: the stuck call returns, the next look sees it
    assert ticks(watcher, 25.5, 40.0) == [late]  # rescanned at once, b.pdf not again
    assert watcher.describe()[1].answering and watcher.describe()[1].missing is None
    assert any("is back after" in m for m in messages(caplog))
    watcher.stop()
    shares.close()
