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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from daemon.config.settings import Config, check_paths, load_config
from daemon.document.page import Block, EngineInfo
from daemon.document.record import PageRecord
from daemon.intake.ingest import Ingestor
from daemon.intake.presence import InboxAway
from daemon.intake.watch_settings import WatcherIO
from daemon.intake.watcher import Watcher
from daemon.jobs.store import Job, Store
from daemon.output.publish import Publisher
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
