"""The optional HTTP server: `/healthz` (JSON), `/metrics` (Prometheus text), and the
status page for people: `/` (HTML), `/status.json` (what `docinbox status --json`
prints), `/doc/<job id>` (a converted document's Markdown, rendered) and
`/doc/<job id>/content_list.json`.

It runs in a daemon thread of the main process (stdlib `ThreadingHTTPServer`), bound to
`http.host` (127.0.0.1 by default: the numbers include file names' counts and engine
details). The caller decides whether to start it (`cfg.http.enabled`); a port already in
use raises OSError from `start_http_server`, which the daemon logs and carries on without:
the endpoint is optional, the documents are not.

It only serves: each request collects ONE `Status` (daemon.service.status), judges it
with `daemon.service.health.assess` and writes it out; what the numbers mean lives in those
modules, how the page looks in `daemon.service.web`, who may read it in
`daemon.service.auth`. The page and the documents need the token when one is configured;
/healthz and /metrics stay open.
Every path not listed above is 404: there is no file serving and no directory listing.
`live` is the daemon's own facts; it is called from the HTTP thread, so it must be cheap,
never block and never touch the main loop's Store (the daemon rebinds one frozen `Live`
per tick and `live` returns that reference).
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from daemon.common.live import LiveFn
from daemon.common.shares import Shares
from daemon.config.settings import Config
from daemon.jobs.store import Store
from daemon.service import metrics, web
from daemon.service.auth import TokenGate
from daemon.service.health import Thresholds, Verdict, assess, healthz_body
from daemon.service.status import Status, collect

log = logging.getLogger("docinbox.http")


class StatusSource:
    """Collects one Status per call from a read-only Store and the daemon's live facts."""

    def __init__(
        self,
        cfg: Config,
        live: LiveFn,
        *,
        thresholds: Thresholds | None = None,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        shares: Shares | None = None,
    ) -> None:
        # Rebound on SIGHUP (`server.cfg = new`): folders may move with a reload.
        self.cfg = cfg
        self.live = live
        self.thresholds = thresholds or Thresholds()
        self.wall = wall
        self.monotonic = monotonic
        # The daemon's share lanes: a request's calls into the folders go through them.
        self.shares = shares

    def read(self) -> Status:
        return collect(
            self.cfg, now=self.wall(), live=self.live, monotonic=self.monotonic(),
            shares=self.shares,
        )


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a hung client must never keep the daemon from exiting
    source: StatusSource
    gate: TokenGate


# A job id, nothing else: no path from the request ever reaches the file system.
_DOC = re.compile(r"/doc/([1-9][0-9]{0,17})(/content_list\.json)?")
_LOGIN_TEXT = (
    b"docinbox: this page needs the token (http.token). Open /?token=YOUR-TOKEN once in "
    b"this browser, or send 'Authorization: Bearer YOUR-TOKEN'.\n"
)


class _Server6(_Server):
    address_family = socket.AF_INET6  # http.host: "::1"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "docinbox"
    sys_version = ""
    # A client that connects and says nothing would otherwise hold its thread forever.
    timeout = 10

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        path = url.path
        try:
            if path in ("/healthz", "/metrics"):
                self._monitoring(path)
                return
            doc = _DOC.fullmatch(path)
            if path not in ("/", "/status.json") and path not in web.STATIC and doc is None:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")
                return
            gate = self.server.gate
            if path == "/" and gate.required:
                token = parse_qs(url.query).get("token")
                if token:
                    self._login(token[0])
                    return
            if not gate.allows(self.headers.get("Authorization"), self.headers.get("Cookie")):
                self._send(401, "text/plain; charset=utf-8", _LOGIN_TEXT)
                return
            if path == "/":
                src = self.server.source
                status = src.read()
                page = web.status_page(status, assess(status, src.thresholds))
                self._send(200, "text/html; charset=utf-8", page.encode())
            elif path == "/status.json":
                body = json.dumps(self.server.source.read().to_json(), default=str)
                self._send(200, "application/json", body.encode())
            elif doc is not None:
                self._document(int(doc.group(1)), doc.group(2) is not None)
            else:
                ctype, data = web.STATIC[path]
                self._send(200, ctype, data)
        except Exception:
            # Never let one odd request (or a bug here) kill the thread quietly.
            log.exception("http endpoint: %s failed", path)
            self._send(500, "text/plain; charset=utf-8", b"internal error\n")

    def _login(self, token: str) -> None:
        if not self.server.gate.token_matches(token):
            self._send(401, "text/plain; charset=utf-8", _LOGIN_TEXT)
            return
        # Redirect so the token leaves the address bar and the browser history.
        self._send(
            303,
            "text/plain; charset=utf-8",
            b"see /\n",
            extra=(("Location", "/"), ("Set-Cookie", self.server.gate.set_cookie_header())),
        )

    def _document(self, job_id: int, content_list: bool) -> None:
        cfg = self.server.source.cfg
        store = Store.of(cfg, readonly=True)
        try:
            job = store.job(job_id)
        finally:
            store.close()
        files = web.document_paths(cfg, job) if job is not None else None
        if job is None or files is None:
            self._send(404, "text/plain; charset=utf-8", b"no converted document with that id\n")
        elif content_list:
            if files.content_list is None:
                self._send(404, "text/plain; charset=utf-8", b"no content_list\n")
            else:
                self._send(200, "application/json", files.content_list.read_bytes())
        else:
            data, truncated = web.read_capped(files.markdown, web.MAX_MARKDOWN_BYTES)
            page = web.document_page(job, data, truncated)
            self._send(200, "text/html; charset=utf-8", page.encode())

    def _monitoring(self, path: str) -> None:
        try:
            if path == "/healthz":
                src = self.server.source
                status = src.read()
                health = assess(status, src.thresholds)
                body = json.dumps(healthz_body(status, health), default=str) + "\n"
                code = 503 if health.verdict == Verdict.FAILING else 200
                self._send(code, "application/json", body.encode())
            elif path == "/metrics":
                src = self.server.source
                status = src.read()
                health = assess(status, src.thresholds)
                self._send(200, metrics.CONTENT_TYPE, metrics.render(status, health))
        except Exception:
            log.exception("http endpoint: %s failed", path)
            self._send(500, "text/plain; charset=utf-8", b"internal error\n")

    def do_HEAD(self) -> None:
        self._send(405, "text/plain; charset=utf-8", b"", allow=True)

    def do_POST(self) -> None:
        self._send(405, "text/plain; charset=utf-8", b"GET only\n", allow=True)

    do_PUT = do_DELETE = do_PATCH = do_POST

    def _send(
        self,
        code: int,
        ctype: str,
        body: bytes,
        allow: bool = False,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        # Everything served here shows document names or contents: no inline script, no
        # framing, no type sniffing, no referrer to any link a document holds.
        self.send_header("Content-Security-Policy", web.CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        for name, value in extra:
            self.send_header(name, value)
        if allow:
            self.send_header("Allow", "GET")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # A scrape every 15 s would bury the journal: request lines only at DEBUG.
        log.debug("http endpoint: %s - %s", self.address_string(), format % args)


class HttpServer:
    def __init__(self, server: _Server, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def cfg(self) -> Config:
        return self._server.source.cfg

    @cfg.setter
    def cfg(self, new: Config) -> None:
        self._server.source.cfg = new

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_http_server(
    cfg: Config,
    live: LiveFn,
    *,
    thresholds: Thresholds | None = None,
    wall: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    poll_interval: float = 0.5,
    token: str | None = None,
    shares: Shares | None = None,
) -> HttpServer:
    """Serve on cfg.http.host:cfg.http.port (0: any free port).

    `poll_interval` bounds how long `stop()` waits for the serving thread to notice.
    `token`: required for the page and the documents when set (see daemon.service.auth).
    `shares`: the daemon's share lanes, through which a request asks for free space.
    """
    cls = _Server6 if ":" in cfg.http.host else _Server
    server = cls((cfg.http.host, cfg.http.port), _Handler)
    server.source = StatusSource(
        cfg, live, thresholds=thresholds, wall=wall, monotonic=monotonic, shares=shares
    )
    server.gate = TokenGate(token)
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": poll_interval},
        name="docinbox-http",
        daemon=True,
    )
    thread.start()
    log.info(
        "status page on http://%s:%d/ (and /healthz, /metrics)",
        cfg.http.host if ":" not in cfg.http.host else f"[{cfg.http.host}]",
        server.server_address[1],
    )
    return HttpServer(server, thread)
