"""The health endpoint: a real server on an ephemeral port over a real Store in tmp_path."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon.common.live import Live
from daemon.config.settings import Config, HttpConfig, InboxConfig
from daemon.document.record import PageRecord
from daemon.jobs.store import Store
from daemon.service.health import Thresholds
from daemon.service.httpserver import HttpServer, start_http_server

NOW = 1_700_000_000.0  # wall clock the server and the store agree on
MONO = 5_000.0  # monotonic clock of the fake main loop


@pytest.fixture()
def cfg(tmp_path: Path) -> Config:
    folders = {n: tmp_path / n for n in ("inbox", "outbox", "archive", "failed", "duplicates",
                                         "state")}
    for f in folders.values():
        f.mkdir()
    return Config(
        inboxes=(InboxConfig(path=folders["inbox"]),),
        outbox=folders["outbox"],
        archive=folders["archive"],
        failed=folders["failed"],
        duplicates=folders["duplicates"],
        state_dir=folders["state"],
        http=HttpConfig(enabled=True, host="127.0.0.1", port=0),
    )


def arrive(store: Store, name: str, sha: str, now: float) -> int:
    res = store.record_arrival(path=f"/in/{name}", inbox="/in", subdir="", size=10,
                               mtime_ns=int(now * 1e9), sha256=sha * 64, now=now)
    assert res is not None
    return res.job.id


@pytest.fixture()
def store(cfg: Config) -> Iterator[Store]:
    """A day in the life: 1 done (3 pages), 1 duplicate, 1 failed, 2 queued (one crashed)."""
    s = Store(cfg.db_path)
    done = arrive(s, "a.pdf", "a", NOW - 600)
    arrive(s, "a-copy.pdf", "a", NOW - 590)  # same content: duplicate
    failed = arrive(s, "b.pdf", "b", NOW - 500)
    crashed = arrive(s, "c.pdf", "c", NOW - 120)  # the oldest queued job at the end
    arrive(s, "d.pdf", "d", NOW - 60)
    s.start_job(done, NOW - 400, "mineru")
    for i, secs in enumerate((1.5, 4.0, 40.0)):
        s.save_page(done, PageRecord(i, (), "mineru", secs), NOW - 300 + i)
    s.finish_job(done, NOW - 290, "/out/a", 45.5)
    s.start_job(failed, NOW - 280, "mineru")
    s.fail_job(failed, NOW - 270, "corrupt", "truncated")
    s.start_job(crashed, NOW - 100, "mineru")
    s.requeue(crashed, NOW - 90, crashed=True, error_kind="crashed", error="killed")
    s.bump("output_errors_total")
    s.set_runtime({"pid": os.getpid(), "updated_at": NOW - 1, "started_at": NOW - 3600,
                   "phase": "idle", "engine": "mineru", "version": "test"})
    yield s
    s.close()


def live_ok(cfg: Config, **over: Any) -> Live:
    """The daemon's in-memory facts, written as the runtime row's keys for brevity."""
    snap: dict[str, Any] = {
        "taken_at": MONO - 0.2,
        "phase": "idle",
        "worker_pid": 4242,
        "worker_rss": 3 * 2**30,
        "worker_peak_rss": 4 * 2**30,
        "worker_restarts": 2,
        "last_heartbeat_age": 1.0,
        "inboxes": [{"path": str(cfg.inboxes[0].path), "observer": "inotify",
                     "observer_alive": True, "scan_error": None}],
        "engine_info": {"name": "mineru", "model_id": "opendatalab/MinerU2.5-2509-1.2B",
                        "precision": "bf16"},
        "fallback_reason": None,
        "fatal": None,
        "stopping": False,
    }
    snap.update(over)
    return dataclasses.replace(Live.from_runtime(snap), taken_at=snap["taken_at"])


Start = Callable[..., HttpServer]


@pytest.fixture()
def start(cfg: Config) -> Iterator[Start]:
    servers: list[HttpServer] = []

    def _start(live: Callable[[], Live] | None = None, *,
               config: Config | None = None, thresholds: Thresholds | None = None,
               mono: float = MONO) -> HttpServer:
        c = config or cfg
        srv = start_http_server(c, live or (lambda: live_ok(c)), thresholds=thresholds,
                                  wall=lambda: NOW, monotonic=lambda: mono,
                                  poll_interval=0.01)
        servers.append(srv)
        return srv

    yield _start
    for srv in servers:
        srv.stop()


def get(srv: HttpServer, path: str, method: str = "GET") -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{srv.port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metrics(srv: HttpServer) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """sample name -> {sorted labels: value}"""
    code, text = get(srv, "/metrics")
    assert code == 200
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def one(m: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, **labels: str) -> float:
    return m[name][tuple(sorted(labels.items()))]


# -- /metrics ---------------------------------------------------------------------------


def test_metrics_reflect_the_store_and_the_supervisor(store: Store, start: Start) -> None:
    m = metrics(start())
    assert {s: one(m, "docinbox_documents", state=s)
            for s in ("queued", "running", "done", "failed", "duplicate")} == {
        "queued": 2, "running": 0, "done": 1, "failed": 1, "duplicate": 1}
    assert one(m, "docinbox_pages_processed_total") == 3
    assert one(m, "docinbox_page_seconds_total") == pytest.approx(45.5)
    assert one(m, "docinbox_duplicates_skipped_total") == 1
    assert one(m, "docinbox_worker_crashes_total") == 1
    assert one(m, "docinbox_output_errors_total") == 1
    assert one(m, "docinbox_documents_done_total") == 1
    assert one(m, "docinbox_documents_failed_total") == 1
    assert one(m, "docinbox_worker_restarts_total") == 2
    assert one(m, "docinbox_worker_rss_bytes") == 3 * 2**30
    assert one(m, "docinbox_queue_age_seconds") == pytest.approx(120)
    assert one(m, "docinbox_worker_up") == 1
    assert one(m, "docinbox_store_readable") == 1
    assert one(m, "docinbox_health_status", status="ok") == 1
    assert one(m, "docinbox_health_status", status="failing") == 0
    assert one(m, "docinbox_worker_phase", phase="idle") == 1
    assert one(m, "docinbox_inboxes_watched") == 1
    assert one(m, "docinbox_disk_free_bytes", folder="outbox") > 0
    assert one(m, "docinbox_engine_info", engine="mineru",
               model="opendatalab/MinerU2.5-2509-1.2B", precision="bf16", runtime="", server="",
               fallback="false") == 1


def test_recent_page_seconds_is_a_cumulative_window_histogram(store: Store, start: Start) -> None:
    m = metrics(start())
    buckets = {dict(k)["le"]: v for k, v in m["docinbox_recent_page_seconds_bucket"].items()}
    # pages took 1.5, 4 and 40 s
    assert buckets["1"] == 0
    assert buckets["2"] == 1
    assert buckets["5"] == 2
    assert buckets["30"] == 2
    assert buckets["60"] == 3
    assert buckets["+Inf"] == 3
    assert one(m, "docinbox_recent_page_seconds_gsum") == pytest.approx(45.5)
    assert one(m, "docinbox_recent_page_seconds_gcount") == 3


def test_fallback_engine_shows_in_engine_info_and_degrades(store: Store, start: Start,
                                                          cfg: Config) -> None:
    srv = start(lambda: live_ok(cfg, engine_info={"name": "lite", "precision": "fp32"},
                                fallback_reason="MinerU weights missing"))
    m = metrics(srv)
    assert one(m, "docinbox_engine_info", engine="lite", model="", precision="fp32",
               runtime="", server="", fallback="true") == 1
    code, body = get(srv, "/healthz")
    assert code == 200
    assert json.loads(body)["status"] == "degraded"


def test_engine_info_names_the_runtime_and_server(store: Store, start: Start,
                                                  cfg: Config) -> None:
    info = {"name": "mineru", "model_id": "served-name",
            "details": {"runtime": "http", "server": "http://gpu:8000", "model": "served-name"}}
    m = metrics(start(lambda: live_ok(cfg, engine_info=info)))
    assert one(m, "docinbox_engine_info", engine="mineru", model="served-name", precision="",
               runtime="http", server="http://gpu:8000", fallback="false") == 1


def test_metrics_still_served_when_the_database_is_missing(cfg: Config, start: Start) -> None:
    srv = start()  # no store fixture: no database file at all
    m = metrics(srv)
    assert one(m, "docinbox_store_readable") == 0
    assert one(m, "docinbox_health_status", status="failing") == 1
    assert "docinbox_documents" not in m
    code, body = get(srv, "/healthz")
    assert code == 503
    assert any("database unreadable" in r for r in json.loads(body)["reasons"])


def test_a_writer_holding_the_lock_does_not_block_a_scrape(store: Store, start: Start) -> None:
    srv = start()
    # The main loop in the middle of a write transaction: WAL readers go on reading.
    store.conn.execute("BEGIN IMMEDIATE")
    try:
        m = metrics(srv)
    finally:
        store.conn.execute("ROLLBACK")
    assert one(m, "docinbox_pages_processed_total") == 3


# -- /healthz ---------------------------------------------------------------------------


def test_healthz_ok(store: Store, start: Start, cfg: Config) -> None:
    code, body = get(start(), "/healthz")
    h = json.loads(body)
    assert code == 200
    assert h["status"] == "ok", h["reasons"]
    assert h["reasons"] == []
    assert h["worker_alive"] is True
    assert h["last_heartbeat_age"] == pytest.approx(1.2)  # 1.0 + 0.2 s since the tick
    assert h["inboxes_watched"] == [str(cfg.inboxes[0].path)]
    assert set(h["disk_free_bytes"]) == {"outbox", "state_dir"}
    assert all(isinstance(v, int) and v > 0 for v in h["disk_free_bytes"].values())
    assert h["counts"]["queued"] == 2
    assert h["queue_age_seconds"] == pytest.approx(120)


def test_healthz_failing_when_the_engine_is_fatal(store: Store, start: Start, cfg: Config) -> None:
    srv = start(lambda: live_ok(cfg, phase="fatal", worker_pid=None, last_heartbeat_age=None,
                                fatal="MinerU weights are not in the cache"))
    code, body = get(srv, "/healthz")
    h = json.loads(body)
    assert code == 503
    assert h["status"] == "failing"
    assert h["worker_alive"] is False
    assert any("weights" in r for r in h["reasons"])


def test_healthz_failing_when_the_disk_is_nearly_full(store: Store, start: Start) -> None:
    # No real full disk in a test: raise the threshold above any real free space.
    code, body = get(start(thresholds=Thresholds(disk_failing_bytes=2**62)), "/healthz")
    assert code == 503
    assert any("nearly full" in r for r in json.loads(body)["reasons"])


def test_healthz_failing_when_a_folder_is_gone(store: Store, start: Start, cfg: Config,
                                               tmp_path: Path) -> None:
    gone = dataclasses.replace(cfg, outbox=tmp_path / "unmounted-share" / "outbox")
    code, body = get(start(config=gone), "/healthz")
    h = json.loads(body)
    assert code == 503
    assert h["disk_free_bytes"]["outbox"] is None
    assert any(r.startswith("outbox not accessible") for r in h["reasons"])


def test_worker_down_is_degraded_at_first_and_failing_after_the_grace(
    store: Store, start: Start, cfg: Config
) -> None:
    # Default grace: restart_backoff_max 300 + heartbeat_timeout 120 + 30 = 450 s.
    restarting = start(lambda: live_ok(cfg, phase="down", worker_pid=None,
                                       last_heartbeat_age=20.0))
    code, body = get(restarting, "/healthz")
    assert (code, json.loads(body)["status"]) == (200, "degraded")
    dead = start(lambda: live_ok(cfg, phase="down", worker_pid=None, last_heartbeat_age=600.0))
    code, body = get(dead, "/healthz")
    assert (code, json.loads(body)["status"]) == (503, "failing")


def test_a_worker_unloaded_while_idle_is_ok(store: Store, start: Start, cfg: Config) -> None:
    # worker.idle_unload_seconds: no worker on purpose, for as long as nothing comes.
    srv = start(lambda: live_ok(cfg, phase="unloaded (idle)", worker_pid=None,
                                last_heartbeat_age=None))
    code, body = get(srv, "/healthz")
    h = json.loads(body)
    assert (code, h["status"], h["worker_alive"]) == (200, "ok", False), h
    _, metrics = get(srv, "/metrics")
    assert 'docinbox_worker_phase{phase="unloaded (idle)"} 1.0' in metrics


def test_the_document_eta_shows_everywhere(store: Store, start: Start, cfg: Config) -> None:
    from daemon.cli.status_view import render_status
    from daemon.service.status import collect

    live = live_ok(cfg, phase="busy", current={"job_id": 7, "path": "/in/a.pdf", "page": 3,
                                               "pages": 10, "eta_seconds": 840.0})
    srv = start(lambda: live)
    assert one(metrics(srv), "docinbox_document_eta_seconds") == 840.0
    code, page = get(srv, "/")
    assert code == 200 and "~14m" in page
    st = collect(cfg, now=NOW, store=store, live=lambda: live, monotonic=MONO)
    assert "page 3/10, about 14m left" in render_status(st)


def test_silent_worker_is_not_alive(store: Store, start: Start, cfg: Config) -> None:
    srv = start(lambda: live_ok(cfg, phase="busy", last_heartbeat_age=200.0))
    code, body = get(srv, "/healthz")
    h = json.loads(body)
    assert h["worker_alive"] is False
    assert (code, h["status"]) == (200, "degraded")


def test_stalled_main_loop_is_failing(store: Store, start: Start) -> None:
    # The last snapshot was taken 1000 s ago: the main loop is stuck.
    code, body = get(start(mono=MONO + 1000), "/healthz")
    h = json.loads(body)
    assert code == 503
    assert any("main loop" in r for r in h["reasons"])


def test_live_raising_is_failing_not_a_crash(store: Store, start: Start) -> None:
    def broken() -> Live:
        raise RuntimeError("boom")

    srv = start(broken)
    code, body = get(srv, "/healthz")
    assert code == 503
    assert any("boom" in r for r in json.loads(body)["reasons"])
    assert get(srv, "/metrics")[0] == 200


def test_dead_inbox_observer_is_degraded(store: Store, start: Start, cfg: Config) -> None:
    srv = start(lambda: live_ok(cfg, inboxes=[{"path": "/srv/scans", "observer": "inotify",
                                               "observer_alive": False, "scan_error": None}]))
    code, body = get(srv, "/healthz")
    h = json.loads(body)
    assert (code, h["status"]) == (200, "degraded")
    assert h["inboxes_watched"] == ["/srv/scans"]


# -- HTTP plumbing ----------------------------------------------------------------------


def test_other_paths_are_404_and_other_methods_405(store: Store, start: Start) -> None:
    srv = start()
    assert get(srv, "/index.html")[0] == 404  # "/" is the status page (test_statuspage.py)
    assert get(srv, "/healthz/extra")[0] == 404
    assert get(srv, "/metrics?name[]=x")[0] == 200  # Prometheus may add query strings
    assert get(srv, "/healthz", method="POST")[0] == 405


def test_requests_are_not_logged_at_info(store: Store, start: Start,
                                         caplog: pytest.LogCaptureFixture) -> None:
    srv = start()
    with caplog.at_level(logging.INFO):
        get(srv, "/healthz")
        get(srv, "/metrics")
        get(srv, "/nope")
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []


def test_bound_to_loopback_and_stop_releases_the_port(store: Store, cfg: Config) -> None:
    srv = start_http_server(cfg, lambda: live_ok(cfg), poll_interval=0.01)
    assert srv.host == "127.0.0.1"
    port = srv.port
    assert port > 0
    srv.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)


def test_cfg_can_be_swapped_on_reload(store: Store, start: Start, cfg: Config,
                                      tmp_path: Path) -> None:
    srv = start()
    assert get(srv, "/healthz")[0] == 200
    srv.cfg = dataclasses.replace(cfg, outbox=tmp_path / "moved-away")
    assert get(srv, "/healthz")[0] == 503


def test_metrics_count_files_an_inbox_ignores(cfg: Config, start: Start) -> None:
    inbox = str(cfg.inboxes[0].path)
    live = live_ok(cfg, inboxes=[{"path": inbox, "observer": "inotify", "ignored": 3,
                                  "ignored_names": ["a.docx", "b.zip", "c.txt"]}])
    m = metrics(start(lambda: live))
    assert one(m, "docinbox_inbox_ignored_files", inbox=inbox) == 3


def test_a_missing_inbox_and_outbox_degrade_and_show_everywhere(
    store: Store, start: Start, cfg: Config
) -> None:
    """A share away: /healthz degraded naming it, a gauge per inbox and folder, the page
    and `docinbox status` saying since when."""
    from daemon.cli.status_view import render_status
    from daemon.service.status import collect

    inbox = str(cfg.inboxes[0].path)
    live = live_ok(
        cfg,
        inboxes=[{"path": inbox, "observer": "none", "missing": "gone (unmounted?)",
                  "missing_since": NOW - 125},
                 {"path": "/srv/other", "observer": "inotify"}],
        folders=[{"name": "outbox", "path": "/srv/nas/out", "missing": "not mounted (...)",
                  "missing_since": NOW - 30},
                 {"name": "failed", "path": "/srv/failed"}],
        worker_restarts=0,
        worker_switches=1,
    )
    srv = start(lambda: live)
    code, body = get(srv, "/healthz")
    h = json.loads(body)
    assert (code, h["status"]) == (200, "degraded")
    assert f"inbox {inbox} is gone (unmounted?) for 2m: watching for it to return" in h["reasons"]
    assert any(r.startswith("outbox /srv/nas/out is not mounted") for r in h["reasons"])
    assert h["inboxes_missing"] == [inbox]
    m = metrics(srv)
    assert one(m, "docinbox_inbox_present", inbox=inbox) == 0
    assert one(m, "docinbox_inbox_present", inbox="/srv/other") == 1
    assert one(m, "docinbox_folder_present", folder="outbox") == 0
    assert one(m, "docinbox_folder_present", folder="failed") == 1
    assert one(m, "docinbox_worker_restarts_total") == 0
    assert one(m, "docinbox_engine_switches_total") == 1
    code, page = get(srv, "/")
    assert code == 200 and "MISSING" in page and "/srv/nas/out" in page
    st = collect(cfg, now=NOW, store=store, live=lambda: live, monotonic=MONO)
    text = render_status(st)
    assert f"inbox:   {inbox} (MISSING since " in text and "(2m): gone (unmounted?)" in text
    assert "MISSING: outbox /srv/nas/out since " in text
    assert "0 restart(s) after a crash, 1 engine switch(es)" in text
    as_json = st.to_json()
    assert as_json["inboxes"][0]["missing_since"] == NOW - 125  # type: ignore[index]
    assert as_json["worker"]["engine_switches"] == 1  # type: ignore[index]


def test_a_share_that_does_not_answer_degrades_naming_it_and_is_never_asked_again(
    store: Store, start: Start, cfg: Config
) -> None:
    """A hung share: /healthz degraded naming the share, a gauge per share, and the
    outbox's free space not asked of it (the request would hang with it)."""
    inbox = str(cfg.inboxes[0].path)
    nas = "/srv/nas"
    hung = f"not answering (the share at {nas} hangs)"
    live = live_ok(
        cfg,
        inboxes=[{"path": inbox, "observer": "inotify", "share": "/"},
                 {"path": f"{nas}/scans", "observer": "poll", "missing": hung,
                  "missing_since": NOW - 12, "share": nas, "answering": False}],
        folders=[{"name": "outbox", "path": str(cfg.outbox), "missing": hung,
                  "missing_since": NOW - 12, "share": nas, "answering": False}],
    )
    srv = start(lambda: live)
    code, body = get(srv, "/healthz")
    h = json.loads(body)
    assert (code, h["status"]) == (200, "degraded"), h
    assert f"inbox {nas}/scans is {hung} for 12s: waiting for it to answer" in h["reasons"]
    assert f"outbox {cfg.outbox} is {hung}: documents wait until it returns" in h["reasons"]
    assert h["shares_not_answering"] == [nas]
    assert not any("not accessible" in r for r in h["reasons"])  # degraded, not failing
    m = metrics(srv)
    assert one(m, "docinbox_share_answering", share=nas) == 0
    assert one(m, "docinbox_share_answering", share="/") == 1
    assert one(m, "docinbox_inbox_present", inbox=f"{nas}/scans") == 0
    assert "outbox" not in {dict(k).get("folder") for k in m["docinbox_disk_free_bytes"]}


@pytest.mark.parametrize(
    ("precision", "shown"),
    [
        ("bf16-int8", "99.89 % (Qwen2.5-0.5B), 98.90 % (SmolLM2-135M): passes the gate"),
        ("int8-dynamic", "92.47 % (Qwen2.5-0.5B), 82.64 % (SmolLM2-135M): FAILS the gate"),
    ],
)
def test_status_shows_the_precisions_fidelity_beside_it(
    store: Store, cfg: Config, precision: str, shown: str
) -> None:
    from daemon.cli.status_view import render_status
    from daemon.service.status import collect

    live = live_ok(cfg, engine_info={"name": "mineru", "model_id": "m", "precision": precision})
    text = render_status(collect(cfg, now=NOW, store=store, live=lambda: live, monotonic=MONO))
    assert f"precision {precision}" in text
    assert f"fidelity: decoder top-1 vs fp32 {shown}" in text, text


def test_every_precision_but_the_reference_has_its_fidelity_figures() -> None:
    from typing import get_args

    from daemon.cli.status_view import PRECISION_FIDELITY
    from daemon.config.settings import LOSSY_PRECISIONS, Precision

    assert set(PRECISION_FIDELITY) == set(get_args(Precision)) - {"auto", "fp32"}
    # Figures and labels agree: a lossy precision is one whose figures miss the gate.
    for name, (qwen2, smollm2) in PRECISION_FIDELITY.items():
        assert (name in LOSSY_PRECISIONS) == (qwen2 < 99.5 or smollm2 < 98.5), name
