"""The status page of a real `docinbox run`, loaded in a real headless chromium.

chromium comes from Debian's `chromium` package (scripts/setup.sh --dev installs it).
`--dump-dom` prints the DOM after the page loaded and its scripts ran, which is what a
person would see. DOCINBOX_SCREENSHOT=path also saves the screenshot taken during the
run there (that is how docs/status-page.png was made).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.test_cli import cli
from tests.conftest import DaemonProc, wait_for
from tests.docgen import make_text_pdf

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (setup.sh --dev)"),
]

SLOW_SECONDS = 3  # per page of the document the test watches in progress
PAGES = 6


def chromium(tmp_path: Path, url: str, *args: str, budget_ms: int = 1500) -> str:
    assert CHROMIUM is not None
    profile = tmp_path / "chromium-profile"
    cmd = [
        CHROMIUM, "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
        "--disable-dev-shm-usage", f"--user-data-dir={profile}",
        # by default shorter than the page's refresh interval: the DOM the server drew
        f"--virtual-time-budget={budget_ms}",
        *args, url,
    ]
    if os.geteuid() == 0:
        cmd.insert(1, "--no-sandbox")  # chromium refuses to run as root with its sandbox
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def dom(tmp_path: Path, url: str) -> str:
    return chromium(tmp_path, url, "--dump-dom")


def section(html: str, sid: str) -> str:
    start = html.index(f'id="{sid}"')
    end = html.find("<section", start)
    return html[start:end if end > 0 else len(html)]


def raw_get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)  # sent as written: no ".." folding by a client
        return conn.getresponse().status
    finally:
        conn.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_status_page_in_a_real_browser(
    tmp_path: Path, daemon_factory: Callable[..., DaemonProc]
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    d = daemon_factory(
        http={"enabled": True, "port": port},
        engine={"name": "tests.plugins:FaultEngine",
                "options": {"fault": "slow", "slow_seconds": SLOW_SECONDS, "on_page": -1}},
    ).start()
    src = tmp_path / "src"
    src.mkdir()
    inbox = tmp_path / "inbox"
    # a failure, and a finished document whose text tries to run a script
    (src / "broken.pdf").write_bytes(b"%PDF-1.4 this is not a real PDF")
    make_text_pdf(src / "hostile.pdf",
                  [["Invoice text <script>document.title='pwned'</script> ends here"]])
    # .docx is read since LibreOffice conversion; a zip archive is not a document type
    (src / "photos.zip").write_bytes(b"PK\x03\x04 not a type docinbox reads")
    for name in ("broken.pdf", "hostile.pdf", "photos.zip"):
        os.replace(src / name, inbox / name)
    d.wait_settled(2)

    # a long document, watched while it is being read
    make_text_pdf(src / "long report.pdf", [[f"Page {i} of the long report"] for i in
                                            range(1, PAGES + 1)])
    os.replace(src / "long report.pdf", inbox / "long report.pdf")

    def in_progress() -> bool:
        cur = d.runtime().get("current") or {}
        return bool(cur.get("page")) and cur.get("path", "").endswith("long report.pdf")

    wait_for(in_progress, 120, "the long document to be in progress", d.proc)
    wait_for(lambda: any(ib.get("ignored") for ib in d.runtime().get("inboxes") or []), 60,
             "a rescan to notice the .zip", d.proc)
    html = dom(tmp_path, base + "/")
    now = section(html, "now")
    assert "long report.pdf" in now, now
    assert 'id="page-progress"' in now and f"/{PAGES}" in now
    pages = re.search(r'id="page-progress" max="(\d+)" value="(\d+)"', now)
    assert pages and int(pages.group(1)) == PAGES and int(pages.group(2)) < PAGES
    assert "hostile.pdf" in section(html, "recent")
    ignored = section(html, "queue")
    assert re.search(r'class="ignored">1: <span class="name">photos.zip<', ignored), ignored
    failures = section(html, "failures")
    assert "broken.pdf" in failures and "corrupt" in failures
    assert re.search(r"docinbox retry \d+", failures)
    assert html.count("<svg") == 2
    assert "read-only" in html
    # the screenshot a little later: some progress to see
    wait_for(lambda: (d.runtime().get("current") or {}).get("page", 0) >= 3 or d.settled(3),
             120, "page 3", d.proc)
    shot = tmp_path / "status-page.png"
    chromium(tmp_path, base + "/", f"--screenshot={shot}", "--window-size=1000,1700",
             "--hide-scrollbars")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("DOCINBOX_SCREENSHOT"):
        shutil.copy(shot, os.environ["DOCINBOX_SCREENSHOT"])

    # finished: it moves to "recent"; nothing is in progress
    jobs = d.wait_settled(3, timeout=PAGES * SLOW_SECONDS + 120)
    html = dom(tmp_path, base + "/")
    assert "long report.pdf" in section(html, "recent")
    assert "No document in progress" in section(html, "now")
    # the script refreshes in place from /status.json: its idea of "nothing changed" is
    # the server's (else it would reload instead of counting a refresh)
    later = chromium(tmp_path, base + "/", "--dump-dom", budget_ms=7000)
    assert re.search(r'data-refreshed="[1-9]', later), later[:500]

    # the Markdown view shows the document's script as text and never runs it
    hostile = next(j for j in jobs if j["source_path"].endswith("hostile.pdf"))
    view = dom(tmp_path, f"{base}/doc/{hostile['id']}")
    article = view[view.index('id="markdown"'):]
    assert "Invoice text" in article
    assert "&lt;script&gt;document.title" in article, article[:2000]
    assert "<script>document.title" not in view
    assert "<title>docinbox: hostile.pdf</title>" in view  # the script did not run

    # a path in the request never reaches the file system
    assert raw_get(port, "/doc/../../etc/passwd") == 404
    assert raw_get(port, f"/doc/{hostile['id']}/../../../etc/passwd") == 404

    # /status.json: the facts `docinbox status --json` prints, from the same code
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/status.json")
    served = json.loads(conn.getresponse().read())
    conn.close()
    printed = json.loads(cli("status", "--json", "--config", str(d.config)).stdout)
    assert served.keys() == printed.keys()
    assert served["counts"] == printed["counts"] == {
        "queued": 0, "running": 0, "done": 2, "failed": 1, "duplicate": 0}
    assert served["recent_documents"] == printed["recent_documents"]
    assert d.stop() == 0
