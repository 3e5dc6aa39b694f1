"""Problems that are not the file's: said once, reminded per minute, retried in seconds.

Ticks with made-up times; the real store on a real full file system is in
tests/daemon/test_faults.py.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from daemon.config.settings import InboxConfig
from daemon.intake.ingest import IngestRetries
from daemon.jobs.store import StoreBusy, StoreFull, _unavailable
from daemon.service.reminder import Reminder

log = logging.getLogger("test.reminder")


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == log.name]


def test_a_lasting_problem_is_said_once_then_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=log.name)
    r = Reminder(log, every=60, settle=10)
    for t in range(0, 150, 2):  # every 2 s, as the status write retries
        r.problem(1000.0 + t, "the state disk is full")
    assert lines(caplog) == [
        "the state disk is full",
        "the state disk is full (still, for 60 s)",
        "the state disk is full (still, for 120 s)",
    ]


def test_the_end_is_said_once_after_it_kept_working(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=log.name)
    r = Reminder(log, every=60, settle=10)
    r.resolved(0.0, "fine")  # nothing was reported: nothing to say
    r.problem(100.0, "full")
    r.resolved(102.0, "fine")
    r.problem(104.0, "full")  # a write slipped through, then failed again: same problem
    r.resolved(106.0, "fine")
    r.resolved(115.0, "fine")
    assert r.active
    r.resolved(116.0, "fine")
    r.resolved(130.0, "fine")
    assert lines(caplog) == ["full", "fine (after 6 s)"]
    assert not r.active
    r.problem(200.0, "full")  # a new episode is new
    assert lines(caplog)[-1] == "full"


def test_files_turned_away_are_offered_again_with_a_short_backoff(tmp_path: Path) -> None:
    inbox = InboxConfig(path=tmp_path)
    a, b = tmp_path / "a.pdf", tmp_path / "b.pdf"
    q = IngestRetries(first=1, cap=8)
    q.add(inbox, a, 100.0)
    assert q.due(100.5) == []
    assert q.due(101.0) == [(inbox, a)]
    delays = []
    now = 101.0
    for _ in range(6):  # still failing: the delay doubles, capped
        q.add(inbox, a, now)
        due = min(t for t in (now + d / 2 for d in range(1, 40)) if q.due(t))
        delays.append(due - now)
        now = due
    assert delays == [2, 4, 8, 8, 8, 8]
    q.add(inbox, b, now)
    q.discard(a)  # recorded at last
    assert len(q) == 1 and q.due(now + 1) == [(inbox, b)]
    q.keep_inboxes([InboxConfig(path=tmp_path / "other")])  # its inbox was removed
    assert len(q) == 0


def test_a_full_disk_and_a_lock_are_told_apart() -> None:
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = sqlite3.SQLITE_FULL
    assert isinstance(_unavailable(full), StoreFull)
    locked = _unavailable(sqlite3.OperationalError("database is locked"))
    assert isinstance(locked, StoreBusy) and not isinstance(locked, StoreFull)
    assert _unavailable(sqlite3.OperationalError("no such table: jobs")) is None
