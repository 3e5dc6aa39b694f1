"""Hooks through the real daemon: documents converted by the lite engine, events delivered
to a real receiver on 127.0.0.1 (verified with `standardwebhooks`), a receiver that is
down and comes back, a SIGKILL between the outcome and its delivery, a command that hangs.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from tests.conftest import REPO, DaemonFactory, DaemonProc, wait_for
from tests.conftest import drop as drop_file
from tests.docgen import make_text_pdf
from tests.hookreceiver import Receiver, free_port

pytestmark = pytest.mark.integration

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def drop(tmp_path: Path, name: str, text: str) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    pdf = make_text_pdf(src / name, [[f"# {text}", "a line of body text"]])
    return drop_file(pdf, tmp_path / "inbox")


def webhook(tmp_path: Path, receiver: Receiver, **extra: Any) -> dict[str, Any]:
    secret = tmp_path / "hook.secret"
    secret.write_text(SECRET)
    return {"webhooks": [{"url": receiver.url, "name": "rx", "secret_file": str(secret),
                          **extra}],
            "retry_backoff_seconds": 0.5, "retry_backoff_max_seconds": 2}


def cli(d: DaemonProc, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "daemon", *args, "--config", str(d.config)],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )


def pending(d: DaemonProc) -> int:
    out = cli(d, "status", "--json")
    hooks = json.loads(out.stdout).get("hooks") if out.returncode == 0 else None
    return int(hooks["pending"]) if hooks else 0


def test_a_finished_document_is_posted_signed_and_a_duplicate_too(
    tmp_path: Path, daemon_factory: DaemonFactory, receiver: Receiver
) -> None:
    receiver.start()
    d = daemon_factory(hooks=webhook(tmp_path, receiver)).start()
    drop(tmp_path, "invoice.pdf", "Invoice 4711")
    wait_for(lambda: len(receiver.received()) >= 1, 120, "the done event", d.proc)
    drop(tmp_path, "copy.pdf", "Invoice 4711")  # same content: a duplicate
    wait_for(lambda: len(receiver.received()) >= 2, 120, "the duplicate event", d.proc)
    done, dup = (Webhook(SECRET).verify(r.body, r.headers) for r in receiver.received()[:2])
    assert done["type"] == "document.done"
    data = done["data"]
    md = Path(data["output"]["path"]) / Path(data["output"]["markdown"]).name
    assert md.read_text().count("Invoice 4711") >= 1
    assert data["source"]["name"] == "invoice.pdf" and data["engine"] == "lite"
    assert data["source"]["original"] == str(tmp_path / "archive" / "invoice.pdf")
    assert (tmp_path / "outbox" / data["output"]["markdown"]) == md
    assert dup["type"] == "document.duplicate"
    assert dup["data"]["duplicate_of"] == data["job_id"]
    assert cli(d, "hooks").stdout.strip() == "no events waiting or given up"
    assert d.stop() == 0
    # the shell script docs/hooks.md gives receivers agrees with the library
    script = tmp_path / "verify-webhook.sh"
    script.write_text(docs_script())
    got = receiver.received()[0]
    args = ["sh", str(script), str(tmp_path / "hook.secret"), got.headers["webhook-id"],
            got.headers["webhook-timestamp"], got.headers["webhook-signature"]]
    assert subprocess.run(args, input=got.body, check=False).returncode == 0
    forged = got.body.replace(b"invoice", b"invoicf")
    assert subprocess.run(args, input=forged, capture_output=True, check=False).returncode == 1


def docs_script() -> str:
    text = (REPO / "docs" / "hooks.md").read_text()
    block = text.split("<!-- verify-webhook.sh", 1)[1].split("```sh\n", 1)[1]
    return block.split("```", 1)[0]


def test_sighup_adds_a_hook_and_the_cli_lists_retries_and_tests_it(
    tmp_path: Path, daemon_factory: DaemonFactory, receiver: Receiver
) -> None:
    d = daemon_factory().start()
    drop(tmp_path, "before.pdf", "Before the hook")
    d.wait_settled(1)
    # a hook whose events are given up at once while its receiver is down
    hooks = webhook(tmp_path, receiver)
    hooks["max_age_seconds"] = 0.5
    d2 = daemon_factory(hooks=hooks)  # rewrites config.yaml under the running daemon
    assert d2.config == d.config
    assert d.proc is not None
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "hooks: rx" in d.output(), 60, "the reload", d.proc)
    drop(tmp_path, "after.pdf", "After the hook")
    d.wait_settled(2)
    wait_for(lambda: "given up" in cli(d, "status").stdout and " 1 given up" in
             cli(d, "status").stdout, 60, "the event to be given up", d.proc)
    listed = cli(d, "hooks").stdout
    assert "dead" in listed and "document.done" in listed and "after.pdf" not in listed
    assert "gave up on event" in d.output()
    receiver.start()
    tested = cli(d, "hooks", "test")
    assert tested.returncode == 0 and "rx: ok: HTTP 204" in tested.stdout
    probe = Webhook(SECRET).verify(receiver.received()[0].body, receiver.received()[0].headers)
    assert probe["type"] == "docinbox.test"
    retried = cli(d, "hooks", "retry", "--dead")
    assert retried.returncode == 0 and "1 delivery(ies) queued again" in retried.stdout
    wait_for(lambda: len(receiver.received()) >= 2, 60, "the retried event", d.proc)
    event = Webhook(SECRET).verify(receiver.received()[1].body, receiver.received()[1].headers)
    assert event["type"] == "document.done"
    assert event["data"]["source"]["name"] == "after.pdf"  # not the one before the hook
    assert d.stop() == 0


def test_a_receiver_that_is_down_gets_every_event_in_order_when_back(
    tmp_path: Path, daemon_factory: DaemonFactory, receiver: Receiver
) -> None:
    port = free_port()
    d = daemon_factory(
        hooks=webhook(tmp_path, receiver), http={"enabled": True, "port": port}
    ).start()
    names = ["one.pdf", "two.pdf", "three.pdf"]
    for i, name in enumerate(names):
        drop(tmp_path, name, f"Document number {i} {name}")
        # one at a time, so the order of events is the order of the names
        d.wait_settled(i + 1)
    wait_for(lambda: pending(d) == 3, 60, "3 events pending", d.proc)
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
    text = metrics.decode()
    assert 'docinbox_hook_pending{hook="rx"} 3.0' in text
    age = [ln for ln in text.splitlines()
           if ln.startswith("docinbox_hook_oldest_pending_age_seconds ")]
    assert age and float(age[0].split()[1]) > 0
    status = cli(d, "status").stdout
    assert "hooks:   3 waiting" in status and "rx: 3 waiting" in status
    assert "last error: " in status  # the receiver's fault, in words
    # a stop while they wait leaves them waiting for the next start
    assert d.stop() == 0
    listed = cli(d, "hooks").stdout
    assert listed.count("pending") == 3, listed
    receiver.start()
    d2 = daemon_factory(hooks=webhook(tmp_path, receiver)).start()
    wait_for(lambda: len(receiver.received()) >= 3, 60, "3 deliveries", d2.proc)
    got = [Webhook(SECRET).verify(r.body, r.headers) for r in receiver.received()]
    assert [g["data"]["source"]["name"] for g in got] == names
    wait_for(lambda: pending(d2) == 0, 30, "nothing pending", d2.proc)
    assert d2.stop() == 0


def test_sigkill_between_the_outcome_and_its_delivery_loses_nothing(
    tmp_path: Path, daemon_factory: DaemonFactory, receiver: Receiver
) -> None:
    receiver.mode = "hang"  # takes the request and never answers
    receiver.start()
    hooks = webhook(tmp_path, receiver, timeout_seconds=60)
    d = daemon_factory(hooks=hooks).start()
    drop(tmp_path, "contract.pdf", "Contract signed")
    wait_for(lambda: receiver.received(), 120, "the first attempt", d.proc)
    assert d.states() == {"contract.pdf": "done"}
    d.kill9()  # done is recorded; the delivery is not
    receiver.mode = "ok"
    receiver.release.set()
    d2 = daemon_factory(hooks=hooks).start()
    wait_for(lambda: len(receiver.received()) >= 2, 60, "the delivery after restart", d2.proc)
    first, second = receiver.received()[:2]
    assert first.event_id == second.event_id  # the same event: receivers deduplicate by id
    assert Webhook(SECRET).verify(second.body, second.headers)["type"] == "document.done"
    assert first.body == second.body
    assert len(d2.jobs()) == 1
    wait_for(lambda: pending(d2) == 0, 30, "nothing pending", d2.proc)
    assert d2.stop() == 0


def test_a_hanging_command_is_killed_and_the_next_document_is_not_delayed(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    calls = tmp_path / "calls"
    script = tmp_path / "hook.sh"
    # The first call hangs (with a child of its own); later calls return at once.
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$DOCINBOX_JOB_ID $$" >> {calls}\n'
        f"if [ ! -e {tmp_path}/hung ]; then touch {tmp_path}/hung; sleep 600 & wait; fi\n"
    )
    script.chmod(0o755)
    d = daemon_factory(hooks={
        "commands": [{"command": [str(script)], "name": "slow", "timeout_seconds": 45}],
        "retry_backoff_seconds": 0.5, "retry_backoff_max_seconds": 1,
    }).start()
    drop(tmp_path, "a.pdf", "First document")
    wait_for(lambda: calls.exists() and calls.read_text(), 120, "the hook to start", d.proc)
    hung_pid = int(calls.read_text().split()[1])
    drop(tmp_path, "b.pdf", "Second document")
    d.wait_settled(2)
    # b was converted while the hook for a still hung
    assert _alive(hung_pid), "the hook ended before the next document was done"
    wait_for(lambda: "killed" in d.output(), 90, "the hook to be killed", d.proc)
    wait_for(lambda: not _alive(hung_pid), 10, "the hook's process to be gone")
    wait_for(lambda: len(calls.read_text().splitlines()) >= 3, 30, "the retries", d.proc)
    jobs = [int(line.split()[0]) for line in calls.read_text().splitlines()]
    assert jobs[:3] == [jobs[0], jobs[0], jobs[0] + 1]  # a again, then b: in order
    assert "slow" in d.output() and "still running after 45 s: killed" in d.output()
    assert d.stop(signal.SIGTERM) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, OSError):
        return False
