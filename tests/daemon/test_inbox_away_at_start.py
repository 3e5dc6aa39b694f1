"""An inbox away when the daemon starts: the NFS share that is not there at the wrong
moment (a reboot of the NAS, the service restarted by the watchdog or an upgrade).

It used to exit 78 ("inbox … does not exist"), which the systemd unit does not restart,
so the service stayed down for good although the running daemon would have waited for
the same share. An inbox the state database has seen before now starts as away (warned
once, shown in `docinbox status` and /healthz) and is taken when it appears; one never
seen (a typo in the config) is still refused with exit 78 and the hint.

`docinbox run` as a real child process, its real watcher and worker (`lite`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from daemon.common.errors import ExitCode
from tests.cli.test_cli import cli
from tests.conftest import DaemonFactory, DaemonProc, wait_for
from tests.daemon.test_shares import healthz
from tests.docgen import make_text_pdf
from tests.hookreceiver import free_port

pytestmark = pytest.mark.integration

GONE = "is gone (unmounted?): watching for it to return"


def start_idle(d: DaemonProc) -> DaemonProc:
    d.start()
    wait_for(lambda: d.runtime().get("phase") == "idle", 120, "the worker", d.proc)
    return d


def inbox_facts(d: DaemonProc) -> dict[str, Any]:
    facts: dict[str, Any] = d.runtime().get("inboxes", [{}])[0]
    return facts


def test_a_restart_while_a_known_inbox_is_away_starts_and_takes_it_when_it_returns(
    tmp_path: Path, daemon_factory: DaemonFactory,
) -> None:
    inbox, away = tmp_path / "inbox", tmp_path / "inbox-away"
    port = free_port()
    first = start_idle(daemon_factory(http={"enabled": True, "port": port}))
    assert first.stop() == 0  # it watched the inbox; not one document came from it

    # The same config, state and log (writing the config makes an inbox folder: it is
    # moved away after).
    d = daemon_factory(http={"enabled": True, "port": port})
    assert d.config == first.config
    os.rename(inbox, away)  # the share is away when the service starts again
    before = len(first.output())
    start_idle(d)
    wait_for(lambda: inbox_facts(d).get("missing"), 30, "status: the inbox away", d.proc)
    assert d.proc is not None and d.proc.poll() is None  # running, not exit 78
    body = healthz(port)
    assert body["status"] == "degraded" and body["inboxes_missing"] == [str(inbox)], body
    assert any(str(inbox) in r for r in body["reasons"]), body
    status = cli("status", "--config", str(d.config)).stdout
    assert "(MISSING since " in status, status
    said = d.output()[before:]
    assert said.count(GONE) == 1, said  # warned once (a reminder only after a minute)
    assert "configuration problems" not in said

    make_text_pdf(away / "a.pdf", [["Scanned while the share was away heron"]])
    os.rename(away, inbox)  # the share is back
    jobs = d.wait_settled(1)
    assert [(Path(j["source_path"]).name, j["state"]) for j in jobs] == [("a.pdf", "done")]
    wait_for(lambda: healthz(port)["status"] == "ok", 30, "/healthz ok again", d.proc)
    assert inbox_facts(d)["missing"] is None
    assert d.stop() == 0


def test_an_inbox_never_seen_is_still_refused_at_start_with_exit_78(
    tmp_path: Path, daemon_factory: DaemonFactory,
) -> None:
    # No state database yet: a missing inbox is refused, as before.
    fresh = daemon_factory(inboxes=[{"path": "scans"}]).start()
    assert fresh.proc is not None and fresh.proc.wait(60) == ExitCode.CONFIG
    assert "scans does not exist (hint: is the share mounted?" in fresh.output()

    seen = start_idle(daemon_factory())
    assert seen.stop() == 0  # the state database has seen "inbox" now
    # A typo beside it: "inbox" is there, "scnas" never was.
    typo = daemon_factory(inboxes=[{"path": "inbox"}, {"path": "scnas"}])
    before = len(seen.output())
    typo.start()
    assert typo.proc is not None and typo.proc.wait(60) == ExitCode.CONFIG
    said = typo.output()[before:]
    assert "scnas does not exist (hint: is the share mounted?" in said, said
