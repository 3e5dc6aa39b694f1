"""A finished document's original leaves its inbox only when it is there and unchanged.

The real publisher on a real store; the inbox is the real watcher's (real observers, the
real look at the folder), moved away with os.rename. A document whose inbox is away is
not published "without its original": publishing raises InboxAway before writing
anything, and the supervisor makes it wait like a full outbox (tests/daemon/
test_inbox_away.py drives the whole daemon through it).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from daemon.common.shares import Lane, Shares
from daemon.config.settings import Config, check_paths, load_config
from daemon.document.page import Block, EngineInfo
from daemon.document.record import PageRecord
from daemon.intake.ingest import Ingestor
from daemon.intake.presence import InboxAway
from daemon.intake.watch_settings import WatcherIO
from daemon.intake.watcher import Watcher
from daemon.jobs.store import Job, Store
from daemon.output.publish import Publisher
from daemon.output.rehash import OriginalNotReady
from tests.common.test_lanes import FakeTime, GatedLane
from tests.conftest import present, write_config

NOW = 1.7e9


@dataclass
class Desk:
    cfg: Config
    store: Store
    watcher: Watcher
    publisher: Publisher

    @property
    def inbox(self) -> Path:
        return self.cfg.inboxes[0].path

    def converted(self, name: str, content: bytes) -> Job:
        """`name` dropped, queued by the real ingest, its one page converted."""
        path = self.inbox / name
        path.write_bytes(content)
        arrived = present(Ingestor(self.cfg, self.store, lambda: NOW).ingest(
            self.cfg.inboxes[0], path))
        job_id = arrived.job.id
        self.store.start_job(job_id, NOW, "lite")
        self.store.set_page_count(job_id, 1)
        block = Block(type="text", bbox=(0.1, 0.1, 0.9, 0.2), text=f"{name} converted")
        self.store.save_page(job_id, PageRecord(0, (block,), "lite", 0.5), NOW)
        return present(self.store.job(job_id))

    def complete(self, job: Job) -> str:
        return self.publisher.complete(job, EngineInfo(name="lite"), 1.0).folder

    def outputs(self) -> list[Path]:
        return sorted(p.parent for p in self.cfg.outbox.rglob("*.meta.json"))

    def on_a_share(self, lane: Callable[[str, float], Lane], deadline: float = 10.0) -> Shares:
        """The inbox as a share of its own, whose lane is `lane`; the publisher reads
        originals through it, as the daemon's does through its Shares."""
        mounts = (f"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
                  f"2 1 0:50 / {self.inbox} rw - nfs4 nas:/scans rw\n")
        shares = Shares(deadline, mountinfo=lambda: mounts,
                        lane=lambda m, d: lane(m, d) if m == str(self.inbox) else Lane(m, d))
        self.publisher = Publisher(self.cfg, self.store, lambda: NOW, inboxes=self.watcher,
                                   call=shares.call)
        return shares

    def hashed(self, name: str) -> None:
        """Wait for the publisher's hash of `name` in the inbox to end (its own thread)."""
        done = present(self.publisher.rehashes.done(str(self.inbox / name)))
        assert done.wait(60.0), "the hash never ended"


@pytest.fixture
def desk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Desk]:
    overrides: dict[str, Any] = getattr(request, "param", {})
    cfg = load_config(write_config(tmp_path, **overrides))
    assert check_paths(cfg) == []
    store = Store(cfg.db_path)
    watcher = Watcher.from_config(cfg, WatcherIO(wall=lambda: NOW))
    watcher.start()
    watcher.tick(0.0)
    try:
        yield Desk(cfg, store, watcher, Publisher(cfg, store, lambda: NOW, inboxes=watcher))
    finally:
        watcher.stop()
        store.close()


def test_an_original_replaced_since_it_was_queued_is_not_archived_as_it(
    desk: Desk, caplog: pytest.LogCaptureFixture
) -> None:
    job = desk.converted("a.pdf", b"%PDF-1.7 the converted content")
    (desk.inbox / "a.pdf").write_bytes(b"%PDF-1.7 another document, same name")
    desk.complete(job)
    assert (desk.inbox / "a.pdf").read_bytes() == b"%PDF-1.7 another document, same name"
    assert list(desk.cfg.archive.rglob("*.pdf")) == []
    assert any("changed since it was queued" in r.getMessage() for r in caplog.records)
    # Its memo is gone: the watcher's next offer of the file is hashed and taken as new.
    st = (desk.inbox / "a.pdf").stat()
    assert not desk.store.known_source(str(desk.inbox / "a.pdf"), st.st_size, st.st_mtime_ns)


def test_an_original_only_touched_since_it_was_queued_is_archived(desk: Desk) -> None:
    job = desk.converted("a.pdf", b"%PDF-1.7 the converted content")
    os.utime(desk.inbox / "a.pdf", (1, 1))  # another mtime, the same bytes (by hash)
    try:
        desk.complete(job)  # hashed in its own thread: done at once, or ...
    except OriginalNotReady:
        assert desk.outputs() == []  # nothing written while it is not known
        desk.hashed("a.pdf")  # ... waited for (the tests below hold it on purpose)
        desk.complete(job)
    assert [p.name for p in desk.cfg.archive.rglob("*.pdf")] == ["a.pdf"]
    assert not (desk.inbox / "a.pdf").exists()


@pytest.mark.parametrize("desk", [{}, {"after_success": "delete"}], indirect=True,
                         ids=["archive", "delete"])
def test_a_document_whose_inbox_is_away_is_not_published_yet(
    desk: Desk, tmp_path: Path
) -> None:
    job = desk.converted("a.pdf", b"%PDF-1.7 the converted content")
    os.rename(desk.inbox, tmp_path / "away")  # the watcher has not looked since
    with pytest.raises(InboxAway, match="is gone"):
        desk.complete(job)
    assert desk.outputs() == []  # nothing written while its original cannot follow
    assert present(desk.store.job(job.id)).held_path is None
    os.rename(tmp_path / "away", desk.inbox)
    desk.watcher.tick(10.0)  # the next look: it is back
    folder = Path(desk.complete(job))
    assert desk.outputs() == [folder]
    assert not (desk.inbox / "a.pdf").exists()


@pytest.mark.parametrize("desk", [{"after_success": "keep"}], indirect=True)
def test_a_kept_original_does_not_wait_for_its_inbox(desk: Desk, tmp_path: Path) -> None:
    """`keep` moves nothing: the memo stops the file from being taken again anyway."""
    job = desk.converted("a.pdf", b"%PDF-1.7 the converted content")
    os.rename(desk.inbox, tmp_path / "away")
    desk.complete(job)
    assert len(desk.outputs()) == 1


def test_an_original_removed_from_an_inbox_that_is_there_is_said(
    desk: Desk, caplog: pytest.LogCaptureFixture
) -> None:
    job = desk.converted("a.pdf", b"%PDF-1.7 the converted content")
    (desk.inbox / "a.pdf").unlink()
    caplog.set_level(logging.WARNING)
    desk.complete(job)  # the output is kept: it is the only copy now
    assert len(desk.outputs()) == 1
    assert any("no longer in the inbox" in r.getMessage() for r in caplog.records)


def test_hashing_an_original_again_never_holds_up_the_caller(desk: Desk) -> None:
    """The hash runs in its own thread, each read through the share's lane. While the
    share holds a read (the test's gate), completing returns at once: the document waits,
    asked again it still waits on the same hash, and once the read returns it is
    published and its original archived."""
    gate = threading.Event()
    # The real clock: a deadline far beyond the few lines the gate is held for.
    shares = desk.on_a_share(lambda m, d: GatedLane(gate, m, d), deadline=600.0)
    job = desk.converted("a.pdf", b"%PDF-1.7 the converted content")
    os.utime(desk.inbox / "a.pdf", (1, 1))
    path = str(desk.inbox / "a.pdf")
    try:
        with pytest.raises(OriginalNotReady, match="is being hashed again"):
            desk.complete(job)  # the hash's first read is held by the share
        first = present(desk.publisher.rehashes.done(path))
        with pytest.raises(OriginalNotReady, match="is being hashed again"):
            desk.complete(job)  # a later try: the same hash, not a second one
        assert desk.publisher.rehashes.done(path) is first and not first.is_set()
        assert desk.outputs() == [] and (desk.inbox / "a.pdf").exists()
    finally:
        gate.set()
    desk.hashed("a.pdf")
    folder = Path(desk.complete(job))
    assert desk.outputs() == [folder]
    assert [p.name for p in desk.cfg.archive.rglob("*.pdf")] == ["a.pdf"]
    assert desk.publisher.rehashes.done(path) is None  # decided: not kept
    shares.close()


class HeldDeadline(FakeTime):
    """FakeTime whose deadline runs out only when the test says (`expire`): until then a
    call into the closed share is outstanding, as it is for the deadline's seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.expire = threading.Event()

    def wait(self, done: threading.Event, seconds: float) -> bool:
        if not self.gate.is_set():
            self.expire.wait()
        return super().wait(done, seconds)


def test_an_original_on_a_share_that_does_not_answer_waits_and_marks_it(desk: Desk) -> None:
    """The hash's read does not return within the share's deadline (a fake clock): the
    lane marks the share not answering, the document waits saying so (nothing written,
    the original where it is), and once the share answers the hash is taken again."""
    t = HeldDeadline()
    shares = desk.on_a_share(t.lane)
    job = desk.converted("a.pdf", b"%PDF-1.7 the converted content")
    os.utime(desk.inbox / "a.pdf", (1, 1))
    t.gate.clear()  # the share stops answering
    try:
        with pytest.raises(OriginalNotReady, match="is being hashed again"):
            desk.complete(job)  # the hash's first read is outstanding
        t.expire.set()  # ... past the share's deadline
        desk.hashed("a.pdf")
        assert [h.mount for h in shares.hung()] == [str(desk.inbox)]
        with pytest.raises(OriginalNotReady, match="could not be hashed again: not answering"):
            desk.complete(job)
        assert desk.outputs() == [] and (desk.inbox / "a.pdf").exists()
    finally:
        t.expire.set()
        t.gate.set()  # it answers again
    try:
        desk.complete(job)  # a new hash (the failed one is not kept), done at once or ...
    except OriginalNotReady:
        desk.hashed("a.pdf")  # ... waited for
        desk.complete(job)
    assert [p.name for p in desk.cfg.archive.rglob("*.pdf")] == ["a.pdf"]
    assert shares.hung() == []
    shares.close()
