"""The status page over HTTP: a real server on an ephemeral port over a real Store.

What a browser does with it (scripts, the DOM) is in test_statuspage_browser.py.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from daemon.common.live import CurrentDoc, Live
from daemon.config.settings import Config, ConfigError, http_token, load_config, redacted_dict
from daemon.document.record import PageRecord
from daemon.jobs.store import Store
from daemon.service.httpserver import HttpServer, start_http_server
from daemon.service.status import collect
from tests.service.test_health import MONO, NOW, arrive, cfg, live_ok  # noqa: F401 - fixture

TOKEN = "s3cret-token-for-tests"


@pytest.fixture()
def store(cfg: Config) -> Iterator[Store]:  # noqa: F811 - uses the imported cfg fixture
    """1 done document with a hostile Markdown file, 1 failed, 1 queued."""
    s = Store(cfg.db_path)
    done = arrive(s, "report <b>.pdf", "a", NOW - 600)
    failed = arrive(s, "locked.pdf", "b", NOW - 500)
    arrive(s, "next.pdf", "c", NOW - 60)
    s.start_job(done, NOW - 400, "lite")
    s.set_page_count(done, 2)
    for i, secs in enumerate((1.5, 2.5)):
        s.save_page(done, PageRecord(i, (), "lite", secs), NOW - 300 + i)
    folder = cfg.outbox / "report"
    folder.mkdir()
    (folder / "report.md").write_text(
        "# Quarterly report\n\nText <script>document.title='pwned'</script> and "
        "[a link](javascript:alert(1)).\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    )
    (folder / "report_content_list.json").write_text('[{"type": "text", "text": "x"}]')
    s.finish_job(done, NOW - 290, str(folder), 4.0)
    s.start_job(failed, NOW - 280, "lite")
    s.fail_job(failed, NOW - 270, "encrypted", "the PDF is encrypted and no matching password")
    s.set_runtime({"pid": 1, "updated_at": NOW - 1})
    yield s
    s.close()


@pytest.fixture()
def server(cfg: Config) -> Iterator[HttpServer]:  # noqa: F811
    srv = start_http_server(cfg, lambda: live_ok(cfg), wall=lambda: NOW,
                            monotonic=lambda: MONO, poll_interval=0.01)
    yield srv
    srv.stop()


@pytest.fixture()
def guarded(cfg: Config) -> Iterator[HttpServer]:  # noqa: F811
    srv = start_http_server(cfg, lambda: live_ok(cfg), wall=lambda: NOW,
                            monotonic=lambda: MONO, poll_interval=0.01, token=TOKEN)
    yield srv
    srv.stop()


def request(srv: HttpServer, path: str, method: str = "GET",
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """A raw request: http.client sends the path exactly as given (no `..` folding)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read().decode()
    finally:
        conn.close()


def test_page_shows_queue_recent_documents_failures_and_charts(
    store: Store, server: HttpServer
) -> None:
    code, headers, html = request(server, "/")
    assert code == 200 and headers["Content-Type"].startswith("text/html")
    csp = headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp
    # names are escaped: a tag in a file name stays text
    assert "report &lt;b&gt;.pdf" in html and "report <b>.pdf" not in html
    assert 'href="/doc/1"' in html and 'href="/doc/1/content_list.json"' in html
    # the failure: kind, reason, hint and the command that retries it
    failure = html[html.index('id="failures"'):]
    assert "encrypted" in failure and "no matching password" in failure
    assert "passwords:" in failure and "docinbox retry 2" in failure
    # the queue: counts, the next document waiting
    assert "next.pdf" in html
    assert re.search(r'data-field="counts.queued">1<', html)
    # two server-drawn charts, no script library
    assert html.count("<svg") == 2 and html.count('class="bar"') == 24
    assert "polyline" in html
    assert "read-only" in html and "docinbox retry" in html
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/page.js" defer>']


def test_status_json_is_the_status_the_cli_prints(
    store: Store, server: HttpServer, cfg: Config  # noqa: F811
) -> None:
    code, headers, body = request(server, "/status.json")
    assert code == 200 and headers["Content-Type"] == "application/json"
    served = json.loads(body)
    cli = json.loads(json.dumps(collect(cfg, now=NOW, store=store).to_json(), default=str))
    assert served.keys() == cli.keys()
    for key in ("counts", "counters", "recent_failures", "recent_documents", "next_queued",
                "pages_per_hour", "recent_page_seconds", "queue_age_seconds", "disk_free_bytes"):
        if key != "disk_free_bytes":
            assert served[key] == cli[key], key
    assert served["recent_documents"][0]["seconds_per_page"] == 2.0
    assert served["pages_per_hour"][-1] == 2 and sum(served["pages_per_hour"]) == 2
    assert served["recent_failures"][0]["retry_command"] == "docinbox retry 2"


def test_markdown_view_escapes_the_document(store: Store, server: HttpServer) -> None:
    code, headers, html = request(server, "/doc/1")
    assert code == 200 and "default-src 'none'" in headers["Content-Security-Policy"]
    body = html[html.index('id="markdown"'):]
    assert "<h1>Quarterly report</h1>" in body
    assert "&lt;script&gt;document.title" in body and "<script>document" not in html
    assert 'href="javascript:' not in body  # the link validator drops it
    assert "<table>" in body  # pipe tables render
    code, headers, text = request(server, "/doc/1/content_list.json")
    assert code == 200 and json.loads(text) == [{"type": "text", "text": "x"}]
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_markdown_view_finds_the_mineru_legacy_layout(
    store: Store, server: HttpServer, cfg: Config  # noqa: F811
) -> None:
    # output.layout: mineru-legacy keeps the Markdown and content_list in <stem>/auto/.
    folder = cfg.outbox / "report"
    (folder / "auto").mkdir()
    for name in ("report.md", "report_content_list.json"):
        (folder / name).rename(folder / "auto" / name)
    code, _, html = request(server, "/doc/1")
    assert code == 200 and "<h1>Quarterly report</h1>" in html
    code, _, text = request(server, "/doc/1/content_list.json")
    assert code == 200 and json.loads(text) == [{"type": "text", "text": "x"}]


@pytest.mark.parametrize("path", [
    "/doc/../../etc/passwd", "/doc/1/../../../etc/passwd", "/doc/%2e%2e/etc/passwd",
    "/static/../config.yaml", "/static/", "/doc/", "/doc/01", "/doc/1/report.md",
    "/outbox/report/report.md", "/doc/2", "/doc/3", "/doc/999", "//etc/passwd",
])
def test_only_job_ids_reach_documents(store: Store, server: HttpServer, path: str) -> None:
    code, _, body = request(server, path)
    assert code == 404, (path, body)
    assert "root:" not in body


def test_a_done_job_pointing_outside_the_outbox_is_not_served(
    store: Store, server: HttpServer, tmp_path: Path
) -> None:
    # A database from elsewhere (or edited by hand) must not turn the server into a file
    # reader: the folder has to be inside the configured outbox.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "elsewhere.md").write_text("secret")
    store.conn.execute("UPDATE jobs SET output_dir = ? WHERE id = 1", (str(outside),))
    assert request(server, "/doc/1")[0] == 404


def test_read_only(store: Store, server: HttpServer) -> None:
    for method in ("POST", "PUT", "DELETE"):
        assert request(server, "/", method)[0] == 405
        assert request(server, "/doc/1", method)[0] == 405


def test_token_guards_page_json_and_documents_but_not_monitoring(
    store: Store, guarded: HttpServer
) -> None:
    for path in ("/", "/status.json", "/doc/1", "/doc/1/content_list.json", "/static/page.js"):
        code, _, body = request(guarded, path)
        assert code == 401 and "token" in body, path
    assert request(guarded, "/healthz")[0] == 200
    assert request(guarded, "/metrics")[0] == 200
    assert request(guarded, "/doc/../../etc/passwd")[0] == 404
    assert request(guarded, "/?token=wrong")[0] == 401

    code, headers, _ = request(guarded, f"/?token={TOKEN}")
    assert code == 303 and headers["Location"] == "/"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert TOKEN not in cookie  # the cookie proves the token without holding it
    jar = cookie.split(";")[0]
    assert request(guarded, "/", headers={"Cookie": jar})[0] == 200
    assert request(guarded, "/doc/1", headers={"Cookie": jar})[0] == 200
    assert request(guarded, "/", headers={"Cookie": jar[:-1] + "0"})[0] == 401
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert request(guarded, "/status.json", headers=bearer)[0] == 200
    assert request(guarded, "/status.json", headers={"Authorization": "Bearer nope"})[0] == 401


# -- configuration ----------------------------------------------------------------------


def load_http(tmp_path: Path, **http: object) -> Config:
    (tmp_path / "inbox").mkdir(exist_ok=True)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"inboxes": ["inbox"], "outbox": "outbox", "http": http}))
    return load_config(path)


def problems(tmp_path: Path, **http: object) -> str:
    with pytest.raises(ConfigError) as err:
        load_http(tmp_path, **http)
    return "\n".join(str(p) for p in err.value.problems)


def test_check_config_refuses_a_network_bind_without_a_token(tmp_path: Path) -> None:
    text = problems(tmp_path, enabled=True, host="0.0.0.0")
    assert "http.host" in text and "http.token" in text
    assert "http.host" in problems(tmp_path, enabled=True, host="192.168.1.20")
    # loopback needs none; a token opens any address; a disabled server needs nothing
    assert load_http(tmp_path, enabled=True, host="::1").http.token is None
    assert load_http(tmp_path, enabled=True, host="localhost").http.enabled
    guarded = load_http(tmp_path, enabled=True, host="0.0.0.0", token=TOKEN)
    assert http_token(guarded.http) == TOKEN
    assert TOKEN not in yaml.safe_dump(redacted_dict(guarded))
    assert not load_http(tmp_path, enabled=False, host="0.0.0.0").http.enabled


def test_token_file(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    from_file = load_http(tmp_path, enabled=True, host="0.0.0.0", token_file=str(secret))
    assert http_token(from_file.http) == TOKEN
    assert "cannot read" in problems(tmp_path, enabled=True, token_file="missing")
    secret.write_text("\n")
    assert "empty" in problems(tmp_path, enabled=True, token_file=str(secret))
    assert "not both" in problems(tmp_path, token="x", token_file=str(secret))


def test_now_shows_page_and_block_progress_and_a_loud_fallback(
    store: Store, cfg: Config  # noqa: F811
) -> None:
    def live() -> Live:
        return dataclasses.replace(
            live_ok(cfg, fallback_reason="MinerU weights are not in the cache",
                    engine_info={"name": "lite", "precision": "fp32"}),
            current=CurrentDoc(job_id=3, path="/in/next.pdf", page=2, pages=5, block=(3, 7),
                               stage="block"),
        )

    srv = start_http_server(cfg, live, wall=lambda: NOW, monotonic=lambda: MONO,
                            poll_interval=0.01)
    try:
        code, _, html = request(srv, "/")
    finally:
        srv.stop()
    assert code == 200
    now = html[html.index('id="now"'):html.index('id="queue"')]
    assert "next.pdf" in now
    assert '<progress id="page-progress" max="5" value="1">' in now
    assert '<progress id="block-progress" max="7" value="3">' in now
    banner = html[html.index('id="fallback"'):html.index('id="now"')]
    assert "FALLBACK" in banner and "MinerU weights are not in the cache" in banner
    assert "docinbox model pull" in banner and "reprocess --all" in banner
