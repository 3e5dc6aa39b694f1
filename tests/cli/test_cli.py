"""The command line as a user meets it: real processes, real config files, real exit codes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, DaemonFactory, wait_for, write_config
from tests.docgen import make_encrypted_pdf, make_text_image, make_text_pdf
from tests.tinymodel import tiny_model_once

pytestmark = pytest.mark.integration


def cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "daemon", *args], capture_output=True, text=True,
        cwd=cwd, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_once(tmp_path_factory.mktemp("tiny-qwen2vl"))


def test_check_config_reports_every_problem_and_exits_78(tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    cfgfile = tmp_path / "config.yaml"
    cfgfile.write_text(yaml.safe_dump({
        "inboxes": [{"path": "inbox", "watch": "sometimes"}],
        "outbox": "inbox/out",
        "stabilty_seconds": 3,
        "engine": {"precision": "fp64"},
        "passwords": ["hunter2"],
    }))
    r = cli("check-config", "--config", str(cfgfile))
    assert r.returncode == 78, r.stderr
    for needle in ("inboxes[0].watch", "stabilty_seconds", "stability_seconds",
                   "engine.precision"):
        assert needle in r.stderr, (needle, r.stderr)
    assert "Traceback" not in r.stderr and "hunter2" not in r.stderr
    # ... and in the same round the folder checks: the outbox inside the inbox
    assert "outbox:" in r.stderr and "inside" in r.stderr, r.stderr
    assert not (tmp_path / "inbox" / "out").exists()  # nothing created for a broken file
    # the folder problem alone, once the rest is fixed
    cfgfile.write_text(yaml.safe_dump({"inboxes": ["inbox"], "outbox": "inbox/out"}))
    r = cli("check-config", "--config", str(cfgfile))
    assert r.returncode == 78 and "outbox" in r.stderr and "inside" in r.stderr, r.stderr


def test_check_config_names_a_lossy_precision(tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    cfgfile = tmp_path / "config.yaml"
    cfgfile.write_text(yaml.safe_dump({"inboxes": ["inbox"], "outbox": "out",
                                       "engine": {"precision": "bf16-int8-dynamic"}}))
    r = cli("check-config", "--config", str(cfgfile))
    assert r.returncode == 0, r.stderr  # selectable: a warning, not an error
    assert "bf16-int8-dynamic is lossy" in r.stdout, r.stdout
    cfgfile.write_text(yaml.safe_dump({"inboxes": ["inbox"], "outbox": "out",
                                       "engine": {"precision": "mixed"}}))
    r = cli("check-config", "--config", str(cfgfile))
    assert r.returncode == 0 and "lossy" not in r.stdout, r.stdout


def test_shipped_config_checks_clean(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text((REPO / "config.yaml").read_text())
    (tmp_path / "inbox").mkdir()
    r = cli("check-config", "--show", env={"DOCINBOX_CONFIG": str(cfg)})
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stdout and "name: mineru" in r.stdout


def test_check_config_prints_the_systemd_paths_the_unit_needs(tmp_path: Path) -> None:
    (tmp_path / "scans in").mkdir()
    cfgfile = tmp_path / "config.yaml"
    cfgfile.write_text(yaml.safe_dump({
        "inboxes": ["scans in"], "outbox": "out", "archive": "out/../arch",
        "failed": "failed", "duplicates": "dup", "state_dir": "state",
        "logging": {"file": "state/docinbox.log"},
    }))
    r = cli("check-config", "--systemd", "--config", str(cfgfile))
    assert r.returncode == 0, r.stderr
    rw = [line for line in r.stdout.splitlines() if line.startswith("ReadWritePaths=")]
    assert "[Service]" in r.stdout.splitlines()
    assert rw == [
        f'ReadWritePaths=-"{tmp_path / "scans in"}"',  # quoted: it has a space
        f"ReadWritePaths=-{tmp_path / 'out'}",
        f"ReadWritePaths=-{tmp_path / 'arch'}",  # resolved
        f"ReadWritePaths=-{tmp_path / 'failed'}",
        f"ReadWritePaths=-{tmp_path / 'dup'}",
        f"ReadWritePaths=-{tmp_path / 'state'}",  # once, though the log file is there too
    ]


def test_parse_one_shot_keeps_originals(tmp_path: Path) -> None:
    pdf = make_text_pdf(tmp_path / "letter.pdf", [["Dear reader, the parse command works"]])
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4 garbage")
    out = tmp_path / "out"
    r = cli("parse", str(pdf), str(broken), "-o", str(out), "--engine", "lite",
            cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # one input failed
    assert "broken.pdf: FAILED: corrupt" in r.stderr
    assert "parse command works" in (out / "letter" / "letter.md").read_text()
    assert pdf.exists() and broken.exists()  # never moved by parse


SEGFAULT_ON_LOAD = {"name": "tests.plugins:FaultEngine", "fallback_engine": None,
                    "options": {"fault": "segfault", "on_load": True}}


def test_parse_gives_up_on_a_worker_that_segfaults_loading_the_engine(tmp_path: Path) -> None:
    pdf = make_text_pdf(tmp_path / "letter.pdf", [["Never converted"]])
    before = (pdf.read_bytes(), pdf.stat().st_mtime_ns)
    config = write_config(tmp_path, engine=SEGFAULT_ON_LOAD)
    out = tmp_path / "out"
    # It used to restart the worker for ever (backoff up to 300 s): the timeout is only
    # there so that a regression fails instead of hanging the suite.
    r = cli("parse", str(pdf), "-o", str(out), "--config", str(config), cwd=tmp_path,
            timeout=240)
    assert r.returncode == 4, r.stderr
    assert ("docinbox: the worker failed to start 3 times in a row (engine "
            "'tests.plugins:FaultEngine'; the last time it crashed (SIGSEGV)); see the "
            "worker's messages above") in r.stderr, r.stderr
    assert "Fatal Python error: Segmentation fault" in r.stderr  # those messages
    assert "fix: " in r.stderr and f"{pdf}: not converted (left as it was)" in r.stderr
    assert "Traceback" not in r.stderr
    assert (pdf.read_bytes(), pdf.stat().st_mtime_ns) == before
    assert sorted(out.iterdir()) == [] and sorted(tmp_path.iterdir()) == sorted(
        [pdf, config, tmp_path / "inbox", out]
    )


def test_status_names_a_worker_that_keeps_dying_loading_the_engine(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    d = daemon_factory(engine=SEGFAULT_ON_LOAD).start()
    wait_for(lambda: (d.runtime().get("worker_failed_starts") or 0) >= 2, 120,
             "two failed worker starts", d.proc)
    r = cli("status", "--config", str(d.config))
    assert r.returncode == 0, r.stderr
    assert "running (pid" in r.stdout  # the daemon keeps trying, with backoff
    assert ("  CRASHING: the worker crashed (SIGSEGV) before its engine was loaded ("
            in r.stdout), r.stdout
    assert "times in a row" in r.stdout and "daemon's log" in r.stdout
    worker = json.loads(cli("status", "--json", "--config", str(d.config)).stdout)["worker"]
    assert worker["failed_starts"] >= 2 and "SIGSEGV" in worker["last_crash"]
    assert d.stop() == 0


def test_status_list_retry_after_adding_the_password(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    d = daemon_factory().start()
    make_encrypted_pdf(tmp_path / "inbox" / "locked.pdf", "letmein",
                       pages=[["Quarterly secrets"]])
    jobs = d.wait_settled(1)
    assert jobs[0]["state"] == "failed"
    jid = str(jobs[0]["id"])
    r = cli("status", "--config", str(d.config))
    assert r.returncode == 0, r.stderr
    assert "running (pid" in r.stdout and "1 failed" in r.stdout
    assert "encrypted" in r.stdout and "no matching password" in r.stdout
    facts = json.loads(cli("status", "--json", "--config", str(d.config)).stdout)
    assert facts["counts"]["failed"] == 1 and facts["running"] is True
    # the same facts the health endpoint serves, read from the database
    assert facts["worker"]["last_heartbeat_age"] is not None
    assert facts["disk_free_bytes"]["outbox"] > 0 and facts["queue_age_seconds"] is None
    assert "totals:  0 pages processed, 0 duplicates skipped" in r.stdout
    assert "disk:    outbox " in r.stdout and "last heartbeat" in r.stdout
    listing = json.loads(cli("list", "--state", "failed", "--json",
                             "--config", str(d.config)).stdout)
    assert [j["id"] for j in listing] == [int(jid)]

    # the user adds the password, reloads (SIGHUP) and retries
    raw = yaml.safe_load(d.config.read_text())
    raw["passwords"] = ["letmein"]
    d.config.write_text(yaml.safe_dump(raw))
    assert d.proc is not None
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "configuration reloaded" in d.output(), 30, "the reload", d.proc)
    r = cli("retry", jid, "--config", str(d.config))
    assert r.returncode == 0, r.stderr
    wait_for(lambda: d.jobs()[0]["state"] == "done", 120, "the retry", d.proc)
    assert "Quarterly secrets" in d.outputs()[0].read_text()
    assert "letmein" not in d.output()  # the password opened the file, never reached the log
    assert (tmp_path / "archive" / "locked.pdf").exists()
    assert not (tmp_path / "failed" / "locked.pdf").exists()
    # the old error file goes with it: failed/ lists only what is still failed
    assert not (tmp_path / "failed" / "locked.pdf.error.json").exists()
    assert cli("retry", "999", "--config", str(d.config)).returncode == 3
    r = cli("retry", "--failed", "--config", str(d.config))
    assert r.returncode == 3 and "no failed jobs to retry" in r.stderr, r.stderr
    # options before the subcommand count too (argparse would let the subcommand's
    # defaults overwrite them)
    r = cli("--config", str(d.config), "status", "--json", cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["counts"]["done"] == 1
    d.stop()


def test_systemd_notify_ready_status_and_watchdog(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(60)
    d = daemon_factory(env={"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "2000000"})
    d.start()
    got: list[str] = []
    try:
        while not (any("READY=1" in m for m in got) and any("WATCHDOG=1" in m for m in got)
                   and any("STATUS=" in m for m in got)):
            got.append(sock.recv(4096).decode())
    finally:
        sock.close()
    ready = next(m for m in got if "READY=1" in m)
    assert "STATUS=0 queued" in ready and "engine lite" in ready
    assert f"MAINPID={d.proc.pid}" in ready if d.proc else False
    d.stop()


def test_mineru_engine_end_to_end_with_a_tiny_model(
    tmp_path: Path, daemon_factory: DaemonFactory, tiny_model: Path
) -> None:
    make_text_image(tmp_path / "scan.png", ["A scanned page for the model"])
    d = daemon_factory(engine={"name": "mineru", "model": str(tiny_model),
                               "precision": "fp32", "fallback_engine": "lite"}).start()
    os.rename(tmp_path / "scan.png", tmp_path / "inbox" / "scan.png")
    jobs = d.wait_settled(1, timeout=300)
    assert jobs[0]["state"] == "done", d.output()
    md = d.outputs()[0]
    meta = d.meta(md)
    assert meta["engine"]["name"] == "mineru" and meta["fallback"] is False
    assert meta["engine"]["model_id"] and meta["engine"]["precision"] == "fp32"
    page = meta["pages"][0]
    for key in ("layout_seconds", "recognition_seconds", "model_blocks"):
        assert key in page, page
    content = json.loads(md.with_name("scan_content_list.json").read_text())
    assert isinstance(content, list)
    d.stop()


def test_missing_weights_fall_back_to_lite_loudly(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    d = daemon_factory(
        engine={"name": "mineru", "model": "opendatalab/MinerU2.5-2509-1.2B",
                "fallback_engine": "lite"},
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    ).start()
    make_text_pdf(tmp_path / "inbox" / "a.pdf", [["Fallback still converts"]])
    d.wait_settled(1)
    out = d.output()
    assert "FALLING BACK" in out and "docinbox model pull" in out
    meta = d.meta(d.outputs()[0])
    assert meta["engine"]["name"] == "lite" and meta["fallback"] is True
    status = cli("status", "--config", str(d.config)).stdout
    assert "FALLBACK" in status and "docinbox model pull" in status
    d.stop()


def test_missing_weights_without_fallback_exit_4_with_the_fix(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, engine={"name": "mineru", "fallback_engine": None,
                                         "model": "opendatalab/MinerU2.5-2509-1.2B"})
    r = cli("run", "--config", str(cfg),
            env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert r.returncode == 4, r.stderr
    assert "docinbox model pull" in r.stderr and "Traceback" not in r.stderr


def test_second_daemon_on_the_same_state_refuses(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    d = daemon_factory().start()
    wait_for(lambda: d.runtime().get("phase") == "idle", 60, "the first daemon", d.proc)
    r = cli("run", "--config", str(d.config))
    assert r.returncode == 5 and "already running" in r.stderr
    d.stop()


def test_parse_page_range_converts_only_those_pages(tmp_path: Path) -> None:
    pdf = make_text_pdf(tmp_path / "book.pdf", [[f"Chapter {i} text"] for i in range(1, 5)])
    r = cli("parse", str(pdf), "-o", str(tmp_path / "out"), "--engine", "lite",
            "--pages", "2-3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "out" / "book" / "book.md").read_text()
    assert "Chapter 2" in md and "Chapter 3" in md
    assert "Chapter 1" not in md and "Chapter 4" not in md
    assert cli("parse", str(pdf), "--pages", "3-1", cwd=tmp_path).returncode == 2


def test_health_endpoint_of_the_running_daemon(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = daemon_factory(http={"enabled": True, "port": port}).start()
    make_text_pdf(tmp_path / "inbox" / "a.pdf", [["Health check document"]])
    d.wait_settled(1)

    def get(path: str) -> tuple[int, str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()

    status, body = wait_for(lambda: get("/healthz"), 30, "/healthz", d.proc)
    health = json.loads(body)
    assert status == 200 and health["status"] in ("ok", "degraded"), health
    assert health["worker_alive"] is True
    _, metrics = get("/metrics")
    assert 'docinbox_documents{state="done"} 1.0' in metrics
    assert "docinbox_worker_rss_bytes" in metrics
    d.stop()


def test_model_info_loads_a_local_checkpoint(tiny_model: Path, tmp_path: Path) -> None:
    r = cli("model", "info", "--model", str(tiny_model), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["loads"] is True, info
    missing = cli("model", "info", "--model", "opendatalab/MinerU2.5-2509-1.2B", cwd=tmp_path,
                  env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert missing.returncode == 4 and "docinbox model pull" in missing.stderr, missing


def test_model_pull_says_why_it_cannot_download_and_what_to_do(
    tiny_model: Path, tmp_path: Path
) -> None:
    hf = {"HF_HOME": str(tmp_path / "hf")}
    offline = cli("model", "pull", cwd=tmp_path, env={**hf, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 4, offline
    assert "cannot download opendatalab/MinerU2.5-2509-1.2B: HF_HUB_OFFLINE is set" in (
        offline.stderr)
    assert "fix: unset HF_HUB_OFFLINE" in offline.stderr and "Traceback" not in offline.stderr
    # HF_ENDPOINT is honoured: a mirror that refuses the connection (loopback, port 9)
    refused = cli("model", "pull", cwd=tmp_path, env={**hf, "HF_ENDPOINT": "http://127.0.0.1:9"},
                  timeout=120)
    assert refused.returncode == 4 and "cannot reach http://127.0.0.1:9" in refused.stderr
    assert "fix: check the network or proxy; HF_ENDPOINT selects a mirror" in refused.stderr
    local = cli("model", "pull", "--model", str(tiny_model), cwd=tmp_path)
    assert local.returncode == 0 and "nothing to download" in local.stdout, local


@pytest.mark.parametrize("layout", ["default", "mineru-legacy"])
def test_parse_writes_crops_cut_by_the_worker(tmp_path: Path, layout: str) -> None:
    from PIL import Image

    pdf = make_text_pdf(tmp_path / "memo.pdf", [["A page with a figure"], ["And another"]])
    config = write_config(tmp_path, output={"layout": layout},
                          engine={"name": "tests.plugins:FigureEngine", "fallback_engine": None,
                                  "dpi": 100})
    out = tmp_path / "out"
    r = cli("parse", str(pdf), "-o", str(out), "--config", str(config), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    folder = out / "memo" / ("auto" if layout == "mineru-legacy" else "")
    items = json.loads((folder / "memo_content_list.json").read_text())
    figures = [i for i in items if i["type"] == "image"]
    # One per page, named as MinerU names crops: page_<page_idx>_<type>_<block index>.jpg
    assert [f["page_idx"] for f in figures] == [0, 1]
    for figure in figures:
        assert figure["img_path"].startswith(f"images/page_{figure['page_idx']}_image_")
    for figure in figures:
        assert figure["content"] == "a test picture" and figure["sub_type"] == "natural_image"
        # Cut from the page the worker rendered: US Letter at 100 DPI is 850x1100 px, the
        # figure's box (0.1..0.6 x 0.5..0.9) is 425x440 px of it.
        with Image.open(folder / figure["img_path"]) as crop:
            assert crop.format == "JPEG" and crop.size == (425, 440)
        assert f"![]({figure['img_path']})" in (folder / "memo.md").read_text()
    assert (out / "memo" / "memo.meta.json").exists()


def test_the_log_file_follows_logrotate_without_copytruncate(tmp_path: Path) -> None:
    """logrotate renames docinbox.log away; the next record starts a new docinbox.log."""
    import dataclasses
    import logging

    from daemon.cli.main import setup_logging
    from daemon.config.settings import Config, LoggingConfig

    logfile = tmp_path / "logs" / "docinbox.log"
    cfg = Config(inboxes=(), outbox=tmp_path / "out", archive=tmp_path / "archive",
                 failed=tmp_path / "failed", duplicates=tmp_path / "dup",
                 state_dir=tmp_path / "state")
    cfg = dataclasses.replace(cfg, logging=LoggingConfig(file=logfile))
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging(cfg)
        logging.getLogger("docinbox.test").info("before the rotation")
        rotated = logfile.with_name("docinbox.log.1")
        logfile.rename(rotated)
        logging.getLogger("docinbox.test").info("after the rotation")
        assert "before the rotation" in rotated.read_text()
        assert "after the rotation" not in rotated.read_text()
        assert "after the rotation" in logfile.read_text()
    finally:
        for h in root.handlers:
            h.close()
        root.handlers[:], level = saved
        root.setLevel(level)


def test_vacuum_compacts_the_state_database_and_hooks_retry_enables_a_gone_receiver(
    tmp_path: Path,
) -> None:
    from daemon.config.settings import load_config
    from daemon.jobs.store import Store

    cfgfile = write_config(tmp_path)
    (tmp_path / "inbox").mkdir(exist_ok=True)
    out = cli("vacuum", "--config", str(cfgfile))
    assert out.returncode == 3 and "no database yet" in out.stderr
    store = Store(load_config(cfgfile).db_path)
    store.conn.execute("CREATE TABLE filler(x BLOB)")
    store.conn.executemany("INSERT INTO filler VALUES(?)", [(b"x" * 4000,)] * 500)
    store.conn.execute("DROP TABLE filler")  # 2 MB of free pages
    store.disable_receiver("rx", "id", "HTTP 410", 1.0)
    store.close()
    out = cli("vacuum", "--config", str(cfgfile))
    assert out.returncode == 0, out.stderr
    before, after = (int(n.replace(",", "")) for n in
                     out.stdout.split(": ", 1)[1].replace(" bytes", "").split(" -> "))
    assert after < before - 1_000_000
    out = cli("hooks", "retry", "--dead", "--config", str(cfgfile))
    assert "hook rx: enabled again" in out.stdout
    store = Store(load_config(cfgfile).db_path)
    assert store.receiver_disabled("rx", "id") is None
    store.close()
