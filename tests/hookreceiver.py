"""A real webhook receiver for the hook tests: an HTTP server on 127.0.0.1 that records
every request and answers as told (ok, 500, 429 with Retry-After, 410, or hang until
released); it can be stopped and started again on the same port."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

Mode = Literal["ok", "500", "429", "410", "hang"]


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]  # lower-case names
    body: bytes

    @property
    def event_id(self) -> str:
        return self.headers["webhook-id"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Receiver:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.mode: Mode = "ok"
        self.retry_after = "7"
        self.requests: list[Received] = []
        self.lock = threading.Lock()
        self.release = threading.Event()  # lets hanging requests go
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def received(self) -> list[Received]:
        with self.lock:
            return list(self.requests)

    def start(self) -> Receiver:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                with outer.lock:
                    outer.requests.append(Received(
                        {k.lower(): v for k, v in self.headers.items()}, body))
                    mode = outer.mode
                if mode == "hang":
                    outer.release.wait(120)
                    mode = "ok"
                status = {"ok": 204, "500": 500, "429": 429, "410": 410}[mode]
                self.send_response(status)
                if mode == "429":
                    self.send_header("Retry-After", outer.retry_after)
                answer = b"" if status == 204 else b"receiver says no"
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                if answer:
                    self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.server = server
        self.release.clear()
        self.thread = threading.Thread(target=server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
