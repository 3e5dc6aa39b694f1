"""Hooks without the daemon: events recorded with their outcome, lanes stepped with a
ticking clock against a real HTTP receiver on 127.0.0.1, command hooks as real processes.

Signatures are verified with the `standardwebhooks` package (the reference library of
the specification), not with docinbox's own code.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from daemon.cli.main import systemd_paths_dropin
from daemon.cli.status_view import render_status
from daemon.common.errors import hint_for
from daemon.config.settings import Config, ConfigError, load_config, redacted_dict
from daemon.jobs.store import IngestResult, Job, Outcome, StaleEvent, Store
from daemon.service.health import assess
from daemon.service.hooks import (
    CommandSender,
    HookService,
    Lane,
    WebhookSender,
    backoff,
    retry_after_seconds,
)
from daemon.service.metrics import render
from daemon.service.status import collect
from daemon.service.web import status_page
from tests.conftest import wait_for, write_config
from tests.hookreceiver import Receiver

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


class Clock:
    """Wall time that moves only when a test says so."""

    def __init__(self) -> None:
        self.t = time.time()  # near real time: receivers check the signature's timestamp

    def __call__(self) -> float:
        return self.t

    def tick(self, seconds: float) -> float:
        self.t += seconds
        return self.t


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def config(tmp_path: Path, hooks: dict[str, Any]) -> Config:
    path = write_config(tmp_path, hooks=hooks)
    return load_config(path)


def webhook_config(tmp_path: Path, url: str, **extra: Any) -> Config:
    secret = tmp_path / "hook.secret"
    secret.write_text(SECRET + "\n")
    hook = {"url": url, "name": "rx", "secret_file": str(secret), **extra}
    return config(tmp_path, {"webhooks": [hook], "retry_backoff_seconds": 10,
                             "retry_backoff_max_seconds": 80, "max_age_seconds": 1000})


class HookedStore(Store):
    """The store, and the hooks that build the events the publisher and the ingestor
    hand it with each outcome."""

    def __init__(self, path: Path, service: HookService) -> None:
        super().__init__(path)
        self.service = service


def arrive(store: HookedStore, cfg: Config, name: str, sha: str, now: float,
           mtime_ns: int = 1) -> IngestResult | None:
    """An arrival as the ingestor records it: a duplicate's event built first."""
    where = {"path": str(cfg.inboxes[0].path / name), "inbox": str(cfg.inboxes[0].path),
             "subdir": ""}
    dup = store.arrival_outcome(**where, sha256=sha, now=now)
    event = store.service.event_for(dup) if dup is not None else None
    return store.record_arrival(**where, size=10, mtime_ns=mtime_ns, sha256=sha, now=now,
                                event=event)


def record_done(store: HookedStore, job_id: int, now: float, out: Path, seconds: float) -> Job:
    """The outcome the supervisor records after publishing (files listed from `out`)."""
    before = store.job(job_id)
    assert before is not None
    event = store.service.event_for(Outcome.done(before, now, str(out), seconds))
    return store.finish_job(job_id, now, str(out), seconds, event=event)


def finish(store: HookedStore, cfg: Config, name: str, now: float, *,
           fail: bool = False) -> Job:
    """One document through the store: arrival, start, done (with a real output folder)
    or failed."""
    sha = hashlib.sha256(name.encode()).hexdigest()
    r = arrive(store, cfg, name, sha, now)
    assert r is not None
    job = store.start_job(r.job.id, now, "lite")
    if fail:
        kind, why = "encrypted", "no configured password opens it"
        event = store.service.event_for(Outcome.failed(job, now, kind, why))
        return store.fail_job(r.job.id, now, kind, why, event=event)
    out = cfg.outbox / Path(name).stem
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / f"{out.name}.md").write_text("# hello")
    (out / f"{out.name}_content_list.json").write_text("[]")
    (out / "images" / "page_0_image_1.jpg").write_bytes(b"jpeg")
    return record_done(store, r.job.id, now, out, 1.5)


def open_store(cfg: Config, service: HookService) -> HookedStore:
    store = HookedStore(cfg.db_path, service)
    service.subscriptions = {s.name: s.events for s in service.make_senders(cfg)}
    return store


def lane_for(cfg: Config, store: Store, clock: Clock, rand: float = 0.5) -> Lane:
    hook = cfg.hooks.webhooks[0]
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    return Lane(WebhookSender(hook, key, wall=clock), lambda: store, cfg.hooks, wall=clock,
                rand=lambda: rand)


# -- timing, pure ---------------------------------------------------------------------------


def test_backoff_doubles_from_the_first_wait_up_to_the_cap_with_jitter() -> None:
    assert backoff(1, 5, 3600, None, 0.0) == 2.5
    assert backoff(1, 5, 3600, None, 0.999) == pytest.approx(4.9975)
    assert backoff(3, 5, 3600, None, 1.0) == 20
    assert backoff(30, 5, 3600, None, 1.0) == 3600
    assert backoff(30, 5, 3600, None, 0.0) == 1800  # half of the cap is fixed
    # Retry-After is a floor, also above the cap
    assert backoff(1, 5, 3600, 120, 0.0) == 120
    assert backoff(1, 5, 60, 7200, 0.0) == 7200


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = 1_700_000_000.0
    assert retry_after_seconds("30", now) == 30
    assert retry_after_seconds("Tue, 14 Nov 2023 22:15:00 GMT", now) == 100
    assert retry_after_seconds("Tue, 14 Nov 2023 22:00:00 GMT", now) == 0  # in the past
    assert retry_after_seconds("soon", now) is None
    assert retry_after_seconds(None, now) is None


# -- the transactional outbox ---------------------------------------------------------------


def test_the_event_is_written_in_the_outcome_transaction_or_not_at_all(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"commands": [
        {"command": ["/bin/true"], "name": "all"},
        {"command": ["/bin/true"], "name": "failures", "events": ["document.failed"]},
    ]})
    service = HookService(cfg)
    store = open_store(cfg, service)
    now = time.time()
    r = arrive(store, cfg, "a.pdf", "a" * 64, now)
    assert r is not None
    job = store.start_job(r.job.id, now, "lite")
    out = str(cfg.outbox / "a")
    event = service.event_for(Outcome.done(job, now, out, 1.0))
    assert event is not None
    # An event that cannot be recorded (built for another job) takes its outcome with it.
    with pytest.raises(ValueError, match="not of job"):
        store.finish_job(job.id, now, out, 1.0, event=dataclasses.replace(event, job_id=99))
    job = store.jobs()[0]
    assert job.state.value == "running"  # the outcome rolled back with its event
    assert store.deliveries(("pending", "delivered", "dead")) == []

    finished = store.finish_job(job.id, now, out, 1.0, event=event)
    assert finished.state.value == "done"
    rows = store.deliveries(("pending",))
    assert [(d.receiver, d.type, d.job_id) for d in rows] == [("all", "document.done", job.id)]
    failed = finish(store, cfg, "b.pdf", now, fail=True)
    rows = store.deliveries(("pending",))
    assert {(d.receiver, d.type) for d in rows if d.job_id == failed.id} == {
        ("all", "document.failed"), ("failures", "document.failed")}
    store.close()


def test_done_reprocessed_failed_and_duplicate_bodies(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"commands": [{"command": ["/bin/true"], "name": "x"}]})
    service = HookService(cfg)
    store = open_store(cfg, service)
    now = time.time()
    job = finish(store, cfg, "scan.pdf", now)
    # the same content again: a duplicate pointing at the first
    dup = arrive(store, cfg, "again.pdf", job.sha256, now, mtime_ns=2)
    assert dup is not None and dup.duplicate
    store.reprocess(job.id, now)
    store.start_job(job.id, now, "lite")
    record_done(store, job.id, now, cfg.outbox / "scan", 2.0)
    failed = finish(store, cfg, "bad.pdf", now, fail=True)

    bodies = [json.loads(d.body) for d in store.deliveries(("pending",))]
    assert [b["type"] for b in bodies] == [
        "document.done", "document.duplicate", "document.reprocessed", "document.failed"]
    assert len({b["id"] for b in bodies}) == 4
    done = bodies[0]["data"]
    assert done["job_id"] == job.id and done["source"]["sha256"] == job.sha256
    assert done["source"]["name"] == "scan.pdf"
    assert done["output"]["folder"] == "scan"
    assert done["output"]["path"] == str(cfg.outbox / "scan")
    assert done["output"]["markdown"] == "scan/scan.md"
    assert done["output"]["content_list"] == "scan/scan_content_list.json"
    assert done["output"]["files"] == [
        "scan/scan.md", "scan/scan_content_list.json", "scan/images/page_0_image_1.jpg"]
    assert done["engine"] == "lite" and done["seconds"] == 1.5 and done["error"] is None
    assert bodies[1]["data"]["duplicate_of"] == job.id
    assert bodies[1]["data"]["output"]["folder"] == "scan"  # where the content already is
    err = bodies[3]["data"]["error"]
    assert err["kind"] == "encrypted" and err["reason"] == "no configured password opens it"
    # the hint failed/<name>.error.json and `docinbox status` give, retry command included
    assert err["hint"] == hint_for("encrypted", failed.id)
    assert f"docinbox retry {failed.id}" in err["hint"]
    store.close()


# -- webhooks, stepped ----------------------------------------------------------------------


def test_a_webhook_is_signed_so_the_standard_library_verifies_it(
    tmp_path: Path, receiver: Receiver
) -> None:
    cfg = webhook_config(tmp_path, receiver.url, headers={"Authorization": "Bearer abc"})
    clock = Clock()
    store = open_store(cfg, HookService(cfg, wall=clock))
    job = finish(store, cfg, "a.pdf", clock())
    lane = lane_for(cfg, store, clock)
    assert lane.step(clock()) == 0  # delivered: look again at once
    (got,) = receiver.received()
    payload = Webhook(SECRET).verify(got.body, got.headers)
    assert payload["type"] == "document.done" and payload["data"]["job_id"] == job.id
    assert got.headers["authorization"] == "Bearer abc"
    assert got.headers["content-type"] == "application/json"
    # the signature covers the body: a changed byte fails verification
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(got.body.replace(b"a.pdf", b"b.pdf"), got.headers)
    assert store.deliveries(("pending",)) == []
    assert store.counters()["hook_deliveries_total"] == 1
    store.close()


def test_a_failing_receiver_is_retried_after_backoff_and_later_events_wait_in_order(
    tmp_path: Path, receiver: Receiver
) -> None:
    cfg = webhook_config(tmp_path, receiver.url)
    clock = Clock()
    store = open_store(cfg, HookService(cfg, wall=clock))
    finish(store, cfg, "first.pdf", clock())
    finish(store, cfg, "second.pdf", clock())
    lane = lane_for(cfg, store, clock, rand=0.0)
    receiver.mode = "500"
    assert lane.step(clock()) == 5  # 10 s first wait, half of it fixed, rand 0
    assert lane.step(clock.tick(4)) == pytest.approx(1)  # not due yet: nothing sent
    assert len(receiver.received()) == 1
    assert lane.step(clock.tick(1)) == 10  # second failure: doubled
    head = store.next_delivery("rx")
    assert head is not None and head.attempts == 2 and head.last_error is not None
    assert "HTTP 500" in head.last_error
    receiver.mode = "ok"
    clock.tick(10)
    assert lane.step(clock()) == 0
    assert lane.step(clock()) == 0
    names = [json.loads(r.body)["data"]["source"]["name"] for r in receiver.received()]
    assert names == ["first.pdf", "first.pdf", "first.pdf", "second.pdf"]
    # the same event each time: same id, so a receiver can deduplicate
    assert len({r.event_id for r in receiver.received()[:3]}) == 1
    assert store.counters()["hook_attempts_failed_total"] == 2
    store.close()


def two_waiting(tmp_path: Path, receiver: Receiver) -> tuple[Config, Clock, HookedStore]:
    """A webhook to `receiver` with two events waiting for it: a.pdf's and b.pdf's."""
    cfg = webhook_config(tmp_path, receiver.url)
    clock = Clock()
    store = open_store(cfg, HookService(cfg, wall=clock))
    finish(store, cfg, "a.pdf", clock())
    finish(store, cfg, "b.pdf", clock())
    return cfg, clock, store


def test_retry_after_is_honoured_and_410_gone_disables_the_receiver(
    tmp_path: Path, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    cfg, clock, store = two_waiting(tmp_path, receiver)
    lane = lane_for(cfg, store, clock, rand=0.0)
    receiver.mode, receiver.retry_after = "429", "60"
    assert lane.step(clock()) == 60
    receiver.mode = "410"
    clock.tick(60)
    with caplog.at_level(logging.WARNING, logger="docinbox.hooks"):
        lane.step(clock())
    assert lane.disabled is not None and "410" in lane.disabled
    assert any("disabled" in r.getMessage() for r in caplog.records)
    lane.step(clock.tick(1000))
    assert len(receiver.received()) == 2  # nothing more sent while disabled
    dead = store.deliveries(("dead",))
    pending = store.deliveries(("pending",))
    assert [json.loads(d.body)["data"]["source"]["name"] for d in dead] == ["a.pdf"]
    assert [json.loads(d.body)["data"]["source"]["name"] for d in pending] == ["b.pdf"]
    store.close()


def test_a_410_disabled_receiver_stays_disabled_after_a_restart_until_hooks_retry(
    tmp_path: Path, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    cfg, clock, store = two_waiting(tmp_path, receiver)
    receiver.mode = "410"
    lane_for(cfg, store, clock).step(clock())
    store.close()
    receiver.mode = "ok"  # it would take events again, but it said it does not want them
    store = open_store(cfg, HookService(cfg, wall=clock))  # a restart
    lane = lane_for(cfg, store, clock)
    with caplog.at_level(logging.WARNING, logger="docinbox.hooks"):
        lane.step(clock.tick(10))
    assert lane.disabled is not None and "410" in lane.disabled
    assert any("stays disabled" in r.getMessage() for r in caplog.records)
    assert len(receiver.received()) == 1  # only the 410 before the restart
    # the same configuration again (a reload, another lane): still disabled
    assert lane_for(cfg, store, clock).step(clock.tick(10)) > 0
    assert len(receiver.received()) == 1
    # `docinbox hooks retry` enables it: the lane sees it at its next look
    assert store.enable_receivers() == ["rx"]
    assert lane.step(clock.tick(60)) == 0
    assert lane.disabled is None
    assert [json.loads(r.body)["data"]["source"]["name"] for r in receiver.received()] == [
        "a.pdf", "b.pdf"]
    # a change of the receiver's configuration enables it too
    receiver.mode = "410"
    finish(store, cfg, "c.pdf", clock())
    lane.step(clock.tick(1))
    assert lane.disabled is not None
    changed = webhook_config(tmp_path, receiver.url, timeout_seconds=5)
    receiver.mode = "ok"
    finish(store, cfg, "d.pdf", clock())
    assert lane_for(changed, store, clock).step(clock.tick(1)) == 0
    assert json.loads(receiver.received()[-1].body)["data"]["source"]["name"] == "d.pdf"
    store.close()


def test_an_event_older_than_max_age_is_dead_then_retry_queues_it_again(
    tmp_path: Path
) -> None:
    down = Receiver()  # never started: connection refused
    cfg = webhook_config(tmp_path, down.url)
    clock = Clock()
    store = open_store(cfg, HookService(cfg, wall=clock))
    finish(store, cfg, "a.pdf", clock())
    lane = lane_for(cfg, store, clock, rand=1.0)
    while store.deliveries(("pending",)):
        wait = lane.step(clock())
        clock.tick(max(wait, 0.001))
    (dead,) = store.deliveries(("dead",))
    assert dead.last_error is not None and "not delivered within 1000 s" in dead.last_error
    assert "refused" in dead.last_error
    # tried until the max age, then given up after that last try
    assert 1000 <= clock() - dead.created_at < 1000 + 80
    assert store.counters()["hook_deliveries_dead_total"] == 1
    assert store.requeue_deliveries(clock()) == 1
    assert store.deliveries(("pending",))[0].event_id == dead.event_id
    store.close()


def test_a_failing_receiver_warns_once_a_minute_not_per_attempt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config(tmp_path, {"webhooks": [{"url": Receiver().url, "name": "rx"}],
                            "retry_backoff_seconds": 1, "retry_backoff_max_seconds": 1})
    clock = Clock()
    store = open_store(cfg, HookService(cfg, wall=clock))
    finish(store, cfg, "a.pdf", clock())
    lane = Lane(WebhookSender(cfg.hooks.webhooks[0], None, wall=clock), lambda: store,
                cfg.hooks, wall=clock, rand=lambda: 1.0)
    with caplog.at_level(logging.WARNING, logger="docinbox.hooks"):
        for _ in range(100):  # 100 attempts, one a second: 100 s
            clock.tick(lane.step(clock()))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # the first, and one reminder after a minute
    assert "still" in warnings[1].getMessage()
    store.close()


# -- command hooks ----------------------------------------------------------------------------


def test_a_command_gets_the_event_on_stdin_and_in_its_environment(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    script = tmp_path / "hook.py"
    seen = tmp_path / "seen.json"
    script.write_text(
        "import json, os, sys\n"
        f"out = {{'stdin': json.load(sys.stdin), 'env': {{k: v for k, v in os.environ.items()"
        f" if k.startswith('DOCINBOX_')}}}}\n"
        f"open({str(seen)!r}, 'w').write(json.dumps(out))\n"
        "print('indexed ok')\nprint('x' * 10000)\n"
    )
    cfg = config(tmp_path, {"commands": [{"command": [sys.executable, str(script)],
                                          "name": "idx"}]})
    clock = Clock()
    store = open_store(cfg, HookService(cfg, wall=clock))
    job = finish(store, cfg, "a.pdf", clock())
    lane = Lane(CommandSender(cfg.hooks.commands[0], cfg.outbox), lambda: store, cfg.hooks,
                wall=clock)
    with caplog.at_level(logging.INFO, logger="docinbox.hooks"):
        assert lane.step(clock()) == 0
    got = json.loads(seen.read_text())
    assert got["stdin"]["type"] == "document.done"
    env = got["env"]
    assert env["DOCINBOX_EVENT"] == "document.done"
    assert env["DOCINBOX_JOB_ID"] == str(job.id)
    assert env["DOCINBOX_EVENT_ID"] == got["stdin"]["id"]
    assert env["DOCINBOX_SOURCE"] == str(cfg.inboxes[0].path / "a.pdf")
    assert env["DOCINBOX_OUTPUT_DIR"] == str(cfg.outbox / "a")
    assert env["DOCINBOX_MARKDOWN"] == str(cfg.outbox / "a" / "a.md")
    assert Path(env["DOCINBOX_MARKDOWN"]).read_text() == "# hello"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "indexed ok" in logged
    assert "more bytes of output not logged" in logged  # 10 kB of output, bounded
    assert len(logged) < 8000
    store.close()


def test_a_hanging_command_is_killed_with_everything_it_started(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = tmp_path / "hang.sh"
    # a child in the background and the script itself, both hanging
    script.write_text(f"#!/bin/sh\nsleep 300 &\necho $$ $! > {pids}\nwait\n")
    script.chmod(0o755)
    cfg = config(tmp_path, {"commands": [{"command": [str(script)], "name": "hang",
                                          "timeout_seconds": 1}]})
    clock = Clock()
    store = open_store(cfg, HookService(cfg, wall=clock))
    finish(store, cfg, "a.pdf", clock())
    lane = Lane(CommandSender(cfg.hooks.commands[0], cfg.outbox), lambda: store, cfg.hooks,
                wall=clock, rand=lambda: 0.0)
    assert lane.step(clock()) > 0  # failed: retried later
    (d,) = store.deliveries(("pending",))
    assert d.last_error is not None and "killed" in d.last_error
    for pid in map(int, pids.read_text().split()):
        wait_for(lambda pid=pid: not _alive(pid), 10, f"process {pid} to be gone")  # type: ignore[misc]
    store.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_missing_program_is_a_failed_attempt_with_the_reason(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"commands": [{"command": [str(tmp_path / "nope")]}]})
    attempt = CommandSender(cfg.hooks.commands[0], cfg.outbox).send("msg_1", "{}")
    assert not attempt.ok and "cannot run" in attempt.message


# -- configuration ----------------------------------------------------------------------------


def problems(tmp_path: Path, hooks: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        config(tmp_path, hooks)
    return [str(p) for p in exc.value.problems]


def test_plain_http_to_a_network_address_needs_https_or_allow_http(tmp_path: Path) -> None:
    found = problems(tmp_path, {"webhooks": [{"url": "http://192.168.1.20:5678/hook"}]})
    assert any("hooks.webhooks[0].url" in p and "https" in p for p in found)
    found = problems(tmp_path, {"webhooks": [{"url": "http://n8n.lan/hook"}]})
    assert any("unencrypted" in p for p in found)
    ok = config(tmp_path, {"webhooks": [
        {"url": "http://192.168.1.20:5678/hook", "allow_http": True},
        {"url": "http://127.0.0.1:9/hook"}, {"url": "http://localhost:9/x", "name": "local"},
        {"url": "https://n8n.example.org/hook"},
    ]})
    assert [h.receiver for h in ok.hooks.webhooks] == [
        "192.168.1.20:5678", "127.0.0.1:9", "local", "n8n.example.org"]


def test_hook_mistakes_are_named_with_their_key(tmp_path: Path) -> None:
    short = tmp_path / "short.secret"
    short.write_text("whsec_" + base64.b64encode(b"tiny").decode())
    found = problems(tmp_path, {
        "webhooks": [
            {"url": "https://a.example/x", "secret_file": str(short)},
            {"url": "https://a.example/y", "events": ["document.finished"]},
            {"url": "ftp://a.example/"},
        ],
        "commands": [{"command": "/usr/local/bin/x --flag"}, {"command": []}],
    })
    text = "\n".join(found)
    assert "hooks.webhooks[0].secret_file" in text and "shorter than 24 bytes" in text
    assert "hooks.webhooks[1].events[0]: 'document.finished' is not an event" in text
    assert "hooks.webhooks[2].url" in text
    assert "hooks.commands[0].command" in text and "no shell" in text
    assert "hooks.commands[1].command" in text
    found = problems(tmp_path, {"webhooks": [{"url": "https://a.example/x"},
                                             {"url": "https://a.example/y"}]})
    assert any("hooks.webhooks[1].name" in p and "a.example" in p for p in found)


def test_check_config_show_masks_header_values_and_never_reads_out_the_secret(
    tmp_path: Path
) -> None:
    cfg = webhook_config(tmp_path, "https://x.example/h", headers={"Authorization": "Token s3"})
    shown = yaml.safe_dump(redacted_dict(cfg))
    assert "s3" not in shown and "Authorization: '***'" in shown
    assert SECRET.removeprefix("whsec_") not in shown and SECRET not in repr(cfg)


# -- what a person sees ------------------------------------------------------------------------


def test_status_metrics_and_the_page_show_what_waits_and_why(tmp_path: Path) -> None:
    cfg = webhook_config(tmp_path, Receiver().url)  # nobody listens
    clock = Clock()
    store = open_store(cfg, HookService(cfg, wall=clock))
    finish(store, cfg, "a.pdf", clock())
    finish(store, cfg, "b.pdf", clock())
    lane_for(cfg, store, clock).step(clock())
    st = collect(cfg, now=clock.tick(30), store=store)
    assert st.queue is not None and st.queue.deliveries is not None
    assert st.queue.deliveries.pending == 2 and st.hooks_oldest_pending_age == 30
    text = render_status(st)
    assert "hooks:   2 waiting" in text and "1 failed attempts" in text
    assert "rx: 2 waiting, 0 given up; last error: connection refused" in text
    metrics = render(st, assess(st)).decode()
    assert 'docinbox_hook_pending{hook="rx"} 2.0' in metrics
    assert "docinbox_hook_oldest_pending_age_seconds 30.0" in metrics
    assert "docinbox_hook_attempts_failed_total 1.0" in metrics
    page = status_page(st, assess(st))
    assert 'id="hooks"' in page and "connection refused" in page
    assert st.to_json()["hooks"]["pending"] == 2  # type: ignore[index]
    store.close()


def test_removing_a_hook_gives_up_its_pending_events_and_a_broken_body_still_goes_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = config(tmp_path, {"commands": [{"command": ["/bin/true"], "name": "old"}]})
    service = HookService(old)
    store = open_store(old, service)
    finish(store, old, "a.pdf", time.time())
    (tmp_path / "config.yaml").unlink()
    new = config(tmp_path, {"commands": [{"command": ["/bin/false"], "name": "new"}]})
    with caplog.at_level(logging.WARNING, logger="docinbox.hooks"):
        service.reload(new, store)
    try:
        (dead,) = store.deliveries(("dead",))
        assert dead.receiver == "old" and dead.last_error is not None
        assert "no longer in the configuration" in dead.last_error
        assert any("no longer configured" in r.getMessage() for r in caplog.records)
        # an outcome whose body cannot be built still records its outcome and its event
        broken = dataclasses.replace(new, outbox=None)  # type: ignore[arg-type]
        service.cfg = broken
        job = finish(store, new, "b.pdf", time.time())
        assert job.state.value == "done"
        rows = [d for d in store.deliveries(("pending",)) if d.job_id == job.id]
        assert [json.loads(d.body)["data"] for d in rows] == [
            {"job_id": job.id, "incomplete": True}]
    finally:
        service.stop()
        store.close()


def test_the_systemd_drop_in_lets_webhooks_on_other_machines_through(tmp_path: Path) -> None:
    cfg = config(tmp_path, {
        "webhooks": [{"url": "https://192.168.1.20/hook"}, {"url": "http://127.0.0.1:9/x"},
                     {"url": "https://n8n.example.org/hook", "name": "n8n"}],
        "commands": [{"command": ["/bin/true"]}],
    })
    dropin = systemd_paths_dropin(cfg)
    assert "IPAddressAllow=192.168.1.20\n" in dropin
    assert "127.0.0.1" not in dropin  # loopback is allowed by the unit already
    assert "hooks.webhooks[2] (n8n): systemd allows addresses, not names" in dropin
    assert "hooks.commands run inside this unit" in dropin


def command_hook(tmp_path: Path) -> tuple[Config, HookService, HookedStore]:
    """One command hook that takes every event, and the store its events go to."""
    cfg = config(tmp_path, {"commands": [{"command": ["/bin/true"], "name": "x"}]})
    service = HookService(cfg)
    return cfg, service, open_store(cfg, service)


def test_the_outcome_transaction_reads_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event is built before the transaction that records it (the publisher knows the
    files it wrote; a duplicate's original folder is listed first): recording the outcome
    holds the database's write lock without a look at a folder, which may be on a share."""
    cfg, service, store = command_hook(tmp_path)
    now = time.time()
    r = arrive(store, cfg, "scan.pdf", "b" * 64, now)
    assert r is not None
    job = store.start_job(r.job.id, now, "lite")
    out = cfg.outbox / "scan"
    written = ["scan.md", "images/page_0_image_1.jpg", "scan_content_list.json", "a/z.json"]
    for name in written:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("x")
    outcome = Outcome.done(job, now, str(out), 1.0)
    told = service.event_for(outcome, files=written)
    listed = service.event_for(outcome)
    assert told is not None and listed is not None
    # the files the publisher names come in the order a listing of the folder gives
    assert json.loads(told.body)["data"]["output"] == json.loads(listed.body)["data"]["output"]

    def no_listing(*args: object, **kwargs: object) -> Iterator[Any]:
        raise AssertionError("a folder was listed while the outcome was recorded")

    monkeypatch.setattr(os, "walk", no_listing)
    monkeypatch.setattr(os.path, "lexists", no_listing)
    store.finish_job(job.id, now, str(out), 1.0, event=told)
    monkeypatch.undo()
    dup = store.arrival_outcome(path=str(cfg.inboxes[0].path / "again.pdf"),
                                inbox=str(cfg.inboxes[0].path), subdir="", sha256="b" * 64,
                                now=now)
    assert dup is not None and dup.original is not None and dup.original.id == job.id
    dup_event = service.event_for(dup)
    assert dup_event is not None
    monkeypatch.setattr(os, "walk", no_listing)
    res = store.record_arrival(path=dup.job.source_path, inbox=dup.job.inbox, subdir="",
                               size=10, mtime_ns=3, sha256="b" * 64, now=now, event=dup_event)
    monkeypatch.undo()
    assert res is not None and res.duplicate and res.job == dup.job  # as it was foretold
    bodies = [json.loads(d.body) for d in store.deliveries(("pending",))]
    assert [(b["type"], b["data"]["job_id"]) for b in bodies] == [
        ("document.done", job.id), ("document.duplicate", res.job.id)]
    store.close()


def test_a_duplicate_event_built_for_another_arrival_is_refused(tmp_path: Path) -> None:
    """Between building a duplicate's event and recording it another job came in (another
    process): the arrival is refused as busy, nothing is recorded, and it is tried again."""
    cfg, service, store = command_hook(tmp_path)
    now = time.time()
    first = arrive(store, cfg, "a.pdf", "c" * 64, now)
    assert first is not None
    where = {"path": str(cfg.inboxes[0].path / "a2.pdf"), "inbox": str(cfg.inboxes[0].path),
             "subdir": ""}
    dup = store.arrival_outcome(**where, sha256="c" * 64, now=now)
    assert dup is not None
    event = service.event_for(dup)
    arrive(store, cfg, "other.pdf", "d" * 64, now)  # takes the id the event was built for
    with pytest.raises(StaleEvent):
        store.record_arrival(**where, size=10, mtime_ns=1, sha256="c" * 64, now=now,
                             event=event)
    assert len(store.jobs()) == 2 and store.deliveries(("pending",)) == []
    again = arrive(store, cfg, "a2.pdf", "c" * 64, now)  # built again: recorded
    assert again is not None and again.duplicate
    assert [d.job_id for d in store.deliveries(("pending",))] == [again.job.id]
    store.close()
