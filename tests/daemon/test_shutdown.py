"""SIGTERM on the real `docinbox run` while documents keep failing.

`systemctl stop` sends SIGTERM and waits `TimeoutStopSec` before a SIGKILL: a stop that
waits on a worker nobody tells to exit costs every restart that long. Broken files fail
at the first request, so a stream of them makes "the document ended while stopping"
the common case, not a race.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import DaemonProc, wait_for

pytestmark = pytest.mark.integration

FILES = 200
# Generous: the bug this guards against hung for the whole page deadline (15 min).
STOP_BOUND_SECONDS = 20


def test_sigterm_while_broken_files_fail_stops_at_once_and_the_queue_continues(
    tmp_path: Path, daemon_factory: Callable[..., DaemonProc]
) -> None:
    d = daemon_factory(rescan_seconds=300)
    inbox = tmp_path / "inbox"
    for i in range(FILES):  # random bytes named .pdf: each fails as soon as it is opened
        tmp = inbox / f".broken-{i:03d}.pdf.part"
        tmp.write_bytes(os.urandom(4096))
        os.rename(tmp, inbox / f"broken-{i:03d}.pdf")
    d.start()
    wait_for(lambda: any(j["state"] == "failed" for j in d.jobs()), 120,
             "the first broken file to fail", d.proc)
    assert d.proc is not None
    d.proc.send_signal(signal.SIGTERM)
    try:
        code = d.proc.wait(STOP_BOUND_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail("SIGTERM did not stop the daemon:\n" + d.output()[-3000:])
    d.logf.close()
    assert code == 0, d.output()[-3000:]
    assert "stopped cleanly" in d.output()
    states = [j["state"] for j in d.jobs()]
    assert "running" not in states  # nothing left half-way
    left = FILES - states.count("failed")
    assert left > 0, "every file was done before the stop: the test proved nothing"

    again = DaemonProc(tmp_path, d.config).start()
    try:
        jobs = again.wait_settled(FILES, timeout=240)
    finally:
        assert again.stop() == 0, again.output()[-3000:]
    assert len(jobs) == FILES
    for j in jobs:
        assert j["state"] == "failed" and j["error_kind"] == "unsupported", j
        name = Path(j["source_path"]).name
        assert (tmp_path / "failed" / f"{name}.error.json").exists(), name
    assert not list(inbox.glob("broken-*.pdf"))  # every one accounted for, none lost
