"""The optional HTTP endpoint: serves `/healthz` (JSON) and `/metrics` (Prometheus text).

It runs in a daemon thread of the main process (stdlib `ThreadingHTTPServer`), bound to
`http.host` (127.0.0.1 by default: the numbers include file names' counts and engine
details). The caller decides whether to start it (`cfg.http.enabled`); a port already in
use raises OSError from `start_http_server`, which the daemon logs and carries on without:
the endpoint is optional, the documents are not.

It only serves: each request collects ONE `Status` (daemon.status), judges it with
`daemon.health.assess` and writes it out; what the numbers mean lives in those modules.
`live` is the daemon's own facts; it is called from the HTTP thread, so it must be cheap,
never block and never touch the main loop's Store (the daemon rebinds one frozen `Live`
per tick and `live` returns that reference).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from daemon import metrics
from daemon.config import Config
from daemon.health import Thresholds, Verdict, assess, healthz_body
from daemon.status import LiveFn, Status, collect

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
    ) -> None:
        # Rebound on SIGHUP (`server.cfg = new`): folders may move with a reload.
        self.cfg = cfg
        self.live = live
        self.thresholds = thresholds or Thresholds()
        self.wall = wall
        self.monotonic = monotonic

    def read(self) -> Status:
        return collect(self.cfg, now=self.wall(), live=self.live, monotonic=self.monotonic())


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a hung client must never keep the daemon from exiting
    source: StatusSource


class _Server6(_Server):
    address_family = socket.AF_INET6  # http.host: "::1"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "docinbox"
    sys_version = ""
    # A client that connects and says nothing would otherwise hold its thread forever.
    timeout = 10

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
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
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")
        except Exception:
            # Never let one odd request (or a bug here) kill the thread quietly.
            log.exception("http endpoint: %s failed", path)
            self._send(500, "text/plain; charset=utf-8", b"internal error\n")

    def do_HEAD(self) -> None:
        self._send(405, "text/plain; charset=utf-8", b"", allow=True)

    def do_POST(self) -> None:
        self._send(405, "text/plain; charset=utf-8", b"GET only\n", allow=True)

    do_PUT = do_DELETE = do_PATCH = do_POST

    def _send(self, code: int, ctype: str, body: bytes, allow: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
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
) -> HttpServer:
    """Serve on cfg.http.host:cfg.http.port (0: any free port).

    `poll_interval` bounds how long `stop()` waits for the serving thread to notice.
    """
    cls = _Server6 if ":" in cfg.http.host else _Server
    server = cls((cfg.http.host, cfg.http.port), _Handler)
    server.source = StatusSource(cfg, live, thresholds=thresholds, wall=wall, monotonic=monotonic)
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": poll_interval},
        name="docinbox-http",
        daemon=True,
    )
    thread.start()
    log.info(
        "http endpoint on http://%s:%d/healthz and /metrics",
        cfg.http.host if ":" not in cfg.http.host else f"[{cfg.http.host}]",
        server.server_address[1],
    )
    return HttpServer(server, thread)
