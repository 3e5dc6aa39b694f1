"""`worker.idle_unload_seconds` on the real `docinbox run` with the `lite` engine.

The decisions (when to unload, what wakes the worker, a document arriving while it exits)
are unit-tested against a fake clock in tests/supervisor/test_supervisor_idle.py; here the real
processes: the worker really exits, the daemon says so and stays healthy, the next document
converts exactly as it would have without the unload, and SIGTERM while unloaded is clean.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO, DaemonFactory, DaemonProc, wait_for
from tests.docgen import make_text_pdf

pytestmark = pytest.mark.integration

log = logging.getLogger(__name__)

UNLOADED = "unloaded (idle)"
# A sanity bound only, far above the goal (300 MB for the whole service while unloaded):
# it catches a worker that did not go, not a few MB of growth.
RSS_SANITY_BYTES = 1024 * 2**20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _document(path: Path) -> Path:
    return make_text_pdf(path, [["Idle unload", "The same words either way."],
                                ["A second page", "so the worker does some work."]])


def _phase(d: DaemonProc) -> object:
    return d.runtime().get("phase")


def _worker_pid(d: DaemonProc) -> object:
    return d.runtime().get("worker_pid")


def _markdown(d: DaemonProc) -> str:
    (md,) = d.outputs()
    return md.read_text()


def test_idle_unload_frees_the_worker_and_the_next_document_converts_the_same(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    # The same document, converted by a daemon that never unloads...
    plain_root = tmp_path / "plain"
    plain = daemon_factory(plain_root).start()
    _document(plain_root / "inbox" / "doc.pdf")
    plain.wait_settled(1)
    assert plain.stop() == 0, plain.output()[-3000:]
    expected = _markdown(plain)

    # ... and by one that unloads its worker while idle, then gets it.
    root = tmp_path / "unloading"
    port = _free_port()
    d = daemon_factory(root, worker={"idle_unload_seconds": 3},
                       http={"enabled": True, "port": port}).start()
    assert d.proc is not None
    pid = wait_for(lambda: _worker_pid(d), 120, "the worker to start", d.proc)
    assert isinstance(pid, int)
    wait_for(lambda: _phase(d) == UNLOADED, 120, "the idle unload", d.proc)
    assert _worker_pid(d) is None
    wait_for(lambda: not psutil.pid_exists(pid), 30, "the worker process to go", d.proc)
    # The whole service: the daemon and what it started (multiprocessing's resource
    # tracker stays; no worker does).
    service = [psutil.Process(d.proc.pid), *psutil.Process(d.proc.pid).children(recursive=True)]
    assert not [p for p in service if "spawn_main" in " ".join(p.cmdline())], service
    rss = sum(p.memory_info().rss for p in service)
    log.warning("service RSS while unloaded: %.0f MiB in %d processes", rss / 2**20,
                len(service))
    assert rss < RSS_SANITY_BYTES

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
        status, health = r.status, json.loads(r.read())
    assert status == 200, health
    assert not [why for why in health["reasons"] if "worker" in why], health
    shown = subprocess.run(
        [sys.executable, "-m", "daemon", "status", "--config", str(d.config)],
        capture_output=True, text=True, timeout=120, cwd=root,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert UNLOADED in shown.stdout, shown.stdout + shown.stderr

    _document(root / "inbox" / "doc.pdf")  # the next document starts a worker again
    (job,) = d.wait_settled(1)
    assert job["state"] == "done", job
    assert _markdown(d) == expected
    assert "worker unloaded" in d.output()

    # Idle again: unloaded again, and SIGTERM while unloaded is a clean stop.
    wait_for(lambda: _phase(d) == UNLOADED, 120, "the second unload", d.proc)
    assert d.stop() == 0, d.output()[-3000:]
    assert "stopped cleanly" in d.output()
