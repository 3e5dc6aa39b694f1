"""The share lanes (daemon/common/shares.py): a call into a hung share costs one deadline,
then nothing; the hung thread is never waited for again nor multiplied.

A fake clock and events, never a sleep: a call "hangs" on an event the test holds, and
the fake wait advances the clock by the time it was asked to wait.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from daemon.common.shares import Lane, NotAnswering, Shares

T = TypeVar("T")

MOUNTS = (
    "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
    "2 1 0:50 / /mnt/nas rw - nfs4 nas:/scans rw\n"
)


class FakeTime:
    """The clock and the wait a lane is given. A call whose gate is open returns at once,
    so waiting for it is waiting for a thread that is already done; a closed gate is a
    hung share, and waiting for it only moves the clock."""

    def __init__(self) -> None:
        self.now = 100.0
        self.gate = threading.Event()
        self.gate.set()
        self.waited: list[float] = []

    def clock(self) -> float:
        return self.now

    def wait(self, done: threading.Event, seconds: float) -> bool:
        self.waited.append(seconds)
        if done.wait(30.0 if self.gate.is_set() else 0.0):
            return True
        self.now += seconds
        return False

    def lane(self, mount: str = "/mnt/nas", deadline: float = 10.0) -> Lane:
        return GatedLane(self.gate, mount, deadline, clock=self.clock, wall=lambda: 5000.0,
                         wait=self.wait)


class GatedLane(Lane):
    """A lane into a share that hangs while the gate is closed: every call into it
    blocks, as every call into a dead hard NFS mount does."""

    def __init__(self, gate: threading.Event, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = gate

    def call(self, fn: Callable[[], T], *, patience: float | None = None) -> T:
        def gated() -> T:
            self.gate.wait()
            return fn()

        return super().call(gated, patience=patience)


class Share:
    """A share's calls: counts them, and blocks them on the test's gate."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate
        self.calls = 0
        self.finished = threading.Event()

    def stat(self) -> str:
        self.calls += 1
        self.gate.wait()
        self.finished.set()
        return "stat result"


def lane_threads(mount: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name == f"share {mount}")


def test_a_call_that_answers_returns_its_value_or_its_error() -> None:
    t = FakeTime()
    lane = t.lane()

    def missing() -> None:
        raise FileNotFoundError(errno.ENOENT, "gone")

    assert lane.call(lambda: 42) == 42
    with pytest.raises(FileNotFoundError):
        lane.call(missing)  # the caller's own error, not NotAnswering
    assert lane.hung is None and lane.answering
    assert t.now == 100.0  # no deadline ran out
    lane.close()


def test_a_hung_call_costs_one_deadline_then_every_call_fails_at_once() -> None:
    t = FakeTime()
    lane = t.lane()
    share = Share(t.gate)
    t.gate.clear()  # the share stops answering

    with pytest.raises(NotAnswering) as first:
        lane.call(share.stat)
    assert first.value.errno == errno.ETIMEDOUT and isinstance(first.value, OSError)
    assert "the share at /mnt/nas hangs" in str(first.value)
    assert t.now == 110.0  # the deadline, once
    assert lane.hung is not None and lane.hung.since == 110.0 and lane.hung.since_wall == 5000.0
    assert not lane.answering

    for _ in range(5):
        with pytest.raises(NotAnswering):
            lane.call(share.stat)
    assert t.now == 110.0  # no further wait: the hung call is not waited for again
    assert lane_threads("/mnt/nas") == 1

    t.gate.set()  # the server is back: the stuck call returns
    assert share.finished.wait(30.0)
    assert share.calls == 1  # ... and it was not multiplied: the later calls never ran
    # The next call waits for the stuck one to be done (it is), then runs.
    assert lane.call(lambda: "again") == "again"
    assert lane.hung is None and lane.answering
    assert lane_threads("/mnt/nas") == 1
    lane.close()


def test_an_impatient_caller_does_not_mark_the_share_but_the_deadline_does() -> None:
    t = FakeTime()
    lane = t.lane()
    share = Share(t.gate)
    t.gate.clear()

    with pytest.raises(NotAnswering):
        lane.call(share.stat, patience=1.0)  # the status page: gives up after a second
    assert t.now == 101.0 and lane.hung is None  # a slow share is not a hung one yet
    # The next caller gives the outstanding call the rest of its deadline, not a new one.
    with pytest.raises(NotAnswering):
        lane.call(share.stat)
    assert t.waited[-1] == 9.0 and t.now == 110.0
    assert lane.hung is not None
    t.gate.set()
    assert share.finished.wait(30.0)
    assert lane.call(lambda: "back") == "back" and share.calls == 1
    lane.close()


def test_shares_give_each_mount_its_own_lane() -> None:
    t = FakeTime()
    shares = Shares(10.0, mountinfo=lambda: MOUNTS, lane=lambda m, d: t.lane(m, d))
    assert shares.mount_of(Path("/mnt/nas/scans/in")) == "/mnt/nas"
    assert shares.mount_of("/mnt/nasty") == "/"  # a whole-component prefix only
    assert shares.lane("/mnt/nas/a") is shares.lane(Path("/mnt/nas/b"))
    share = Share(t.gate)
    t.gate.clear()
    with pytest.raises(NotAnswering):
        shares.call("/mnt/nas/scans", share.stat)
    assert [h.mount for h in shares.hung()] == ["/mnt/nas"]
    # A call on the local disk is not held up by the hung share.
    t.gate.set()
    assert shares.call("/srv/inbox", lambda: "local") == "local"
    assert share.finished.wait(30.0)
    assert shares.call("/mnt/nas/scans", lambda: "back") == "back"
    assert shares.hung() == []
    shares.close()


def test_a_document_finished_while_its_outbox_hangs_is_not_written_but_waits(
    tmp_path: Path,
) -> None:
    """The supervisor turns an OSError from `complete` into "wait and retry"; the guard
    raises one (NotAnswering) instead of letting the publisher write into a hung share."""
    import logging

    from daemon.document.page import EngineInfo
    from daemon.intake.presence import FolderPresence, probe_folder
    from daemon.jobs.store import Job, NewEvent, Published, Store
    from daemon.service.folders import GuardedOutcomes, OutputFolders

    class Publisher:
        def __init__(self) -> None:
            self.written: list[int] = []
            self.events: list[str] = []

        def complete(self, job: Job, engine: EngineInfo | None, seconds: float) -> Published:
            self.written.append(job.id)
            return Published("out", None, 0, 0.0)

        def failed(self, job: Job, kind: str, message: str) -> NewEvent | None:
            self.written.append(job.id)
            return None

        def failure_event(self, job: Job, kind: str, message: str) -> NewEvent | None:
            self.events.append(kind)
            return None

    t = FakeTime()
    outbox = tmp_path / "out"
    outbox.mkdir()
    mounts = f"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 0:50 / {outbox} rw - nfs4 n:/o rw\n"
    shares = Shares(10.0, mountinfo=lambda: mounts, lane=lambda m, d: t.lane(m, d))
    folders = OutputFolders(shares, wall=lambda: 5000.0, log=logging.getLogger("test"))
    presence = FolderPresence(f"the outbox ({outbox})")
    presence.start(probe_folder(outbox), 0.0, 5000.0)
    folders.folders = {"outbox": (outbox, presence)}
    publisher = Publisher()
    guarded = GuardedOutcomes(publisher, folders)
    store = Store(tmp_path / "state.sqlite3")
    arrived = store.record_arrival(path=str(tmp_path / "a.pdf"), inbox=str(tmp_path),
                                   subdir="", size=1, mtime_ns=1, sha256="a", now=0.0)
    assert arrived is not None
    job = arrived.job

    assert guarded.complete(job, None, 1.0).folder == "out"  # answering: written
    t.gate.clear()
    with pytest.raises(NotAnswering):
        guarded.complete(job, None, 1.0)
    assert t.now == 110.0 and presence.due(0.0)  # one deadline; looked at on the next tick
    assert publisher.written == [job.id]  # not written into the hung share
    assert folders.look(1.0) is not None and presence.hung  # holds new documents
    assert [f.answering for f in folders.facts()] == [False]
    # A failure is recorded with its event, its original left where it is: at once now,
    # no second deadline, nothing written into the hung share.
    guarded.failed(job, "corrupt", "x")
    assert t.now == 110.0 and publisher.written == [job.id]
    assert publisher.events == ["corrupt"]
    t.gate.set()
    shares.close()
    store.close()


def nas_config(tmp_path: Path, *, outbox_on_nas: bool) -> tuple[Any, Path]:
    """A config whose first inbox (or outbox) is on a share mounted at tmp_path/nas."""
    from daemon.config.settings import Config, InboxConfig

    nas = tmp_path / "nas"
    folders = {n: tmp_path / n for n in ("inbox", "outbox", "archive", "failed", "duplicates",
                                         "state")}
    for f in (nas, *folders.values()):
        f.mkdir()
    inboxes: tuple[InboxConfig, ...] = (InboxConfig(path=folders["inbox"]),)
    if not outbox_on_nas:
        inboxes = (InboxConfig(path=nas), *inboxes)
    cfg = Config(
        inboxes=inboxes,
        outbox=nas if outbox_on_nas else folders["outbox"],
        archive=folders["archive"],
        failed=folders["failed"],
        duplicates=folders["duplicates"],
        state_dir=folders["state"],
    )
    return cfg, nas


def nas_shares(t: FakeTime, nas: Path) -> Shares:
    """Lanes where only the share at `nas` hangs while the test's gate is closed."""
    mounts = f"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 0:50 / {nas} rw - nfs4 n:/s rw\n"
    return Shares(
        10.0,
        mountinfo=lambda: mounts,
        lane=lambda m, d: t.lane(m, d) if m == str(nas) else Lane(m, d),
    )


@pytest.mark.parametrize("outbox_on_nas", [False, True])
def test_a_reload_check_reports_a_hung_folder_as_not_answering_after_one_deadline(
    tmp_path: Path, outbox_on_nas: bool
) -> None:
    """SIGHUP's folder checks go through the lanes: a hung inbox or outbox is a problem
    (the reload is refused, as for a folder that vanished), not a frozen main loop."""
    from daemon.config.settings import check_paths

    t = FakeTime()
    cfg, nas = nas_config(tmp_path, outbox_on_nas=outbox_on_nas)
    shares = nas_shares(t, nas)
    assert check_paths(cfg, call=shares.call) == []  # answering: nothing to say

    t.gate.clear()
    problems = check_paths(cfg, call=shares.call)
    key = "outbox" if outbox_on_nas else "inboxes[0].path"
    assert [(p.key, "is not answering" in p.message) for p in problems] == [(key, True)]
    assert str(nas) in problems[0].message
    assert t.now == 110.0  # one deadline for the whole check, the other folders checked
    assert [h.mount for h in shares.hung()] == [str(nas)]
    t.gate.set()
    shares.close()


def test_the_status_page_asks_a_hung_outbox_for_free_space_for_a_second_only(
    tmp_path: Path,
) -> None:
    """The HTTP thread asks for the outbox's free space through its lane with a short
    patience: a share that hangs before the daemon has marked it costs a request a
    second, and the request does not mark it (the main loop's deadline does)."""
    from daemon.service.status import SHARE_PATIENCE_SECONDS, collect

    t = FakeTime()
    cfg, nas = nas_config(tmp_path, outbox_on_nas=True)
    shares = nas_shares(t, nas)
    free = {d.name: d.free for d in collect(cfg, now=5000.0, shares=shares).disks}
    assert free["outbox"] is not None and free["state_dir"] is not None

    t.gate.clear()
    st = collect(cfg, now=5000.0, shares=shares)
    free = {d.name: d.free for d in st.disks}
    assert free["outbox"] is None and free["state_dir"] is not None
    assert t.now == 100.0 + SHARE_PATIENCE_SECONDS < 102.0
    assert shares.hung() == []  # a slow answer to the page is not a hung share yet
    t.gate.set()
    shares.close()
