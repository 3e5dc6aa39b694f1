"""`engine.runtime: http` and `llama-cpp` against REAL llama.cpp: the wheel's llama-server
and the in-process Engine, both on the tiny GGUF fixture (../shared/models/tiny-gguf).

Same engine (`mineru`), same two steps, same output as the transformers runtime; what is
tested here is where generation runs and how it fails: server down, wrong model name,
429/503 with Retry-After, a hanging request, a server killed mid-page, TLS with a private
CA, and concurrency actually reaching the server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from PIL import Image

from daemon.common.errors import DocumentError, EngineUnavailable
from daemon.config.settings import EngineConfig, EngineHttpConfig, LlamaCppConfig
from daemon.document.page import PageInput, PageOptions, no_progress
from daemon.engines.mineru.engine import MinerUEngine
from daemon.engines.mineru.runtimes.http import ServerUnavailable, probe_server
from tests.llama_server import (
    MODEL_ID,
    REPO,
    TINY_BBOX,
    TINY_MAIN,
    TINY_MMPROJ,
    TINY_PAGE,
    FaultProxy,
    LlamaServer,
    SlotWatcher,
    free_port,
    llama_server,
    make_ca,
    server_binary,
)

OPTIONS = PageOptions(text_layer="off", max_new_tokens_layout=64, max_new_tokens_block=64)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with llama_server(tmp_path_factory.mktemp("llama"), parallel=4) as s:
        yield s


def page(idx: int = 0, count: int = 1) -> PageInput:
    image = Image.open(TINY_PAGE).convert("RGB")
    return PageInput(image=image, page_idx=idx, page_count=count, dpi=None)


def http_engine(url: str, **kw: Any) -> MinerUEngine:
    return MinerUEngine(
        EngineConfig(runtime="http", http=EngineHttpConfig(server_url=url, **kw))
    )


def assert_tiny_page(result: Any) -> None:
    assert [b.type for b in result.blocks] == ["text"]
    assert result.blocks[0].bbox == pytest.approx(TINY_BBOX)
    assert result.info["layout_blocks"] == 1
    assert result.info["model_blocks"] == 1
    assert result.info["decode_tokens"] > 0  # read from the server's `usage`


def test_http_runtime_runs_both_steps_on_a_real_server(server: LlamaServer) -> None:
    engine = http_engine(server.url, max_in_flight=2)
    info = engine.load()
    try:
        assert info.name == "mineru"
        assert info.details["runtime"] == "http"
        assert info.details["server"] == server.url
        assert info.model_id == MODEL_ID == info.details["model"]
        assert engine.max_pages_in_flight == 2
        assert_tiny_page(engine.parse_page(page(), OPTIONS, no_progress))
    finally:
        engine.close()


def test_http_runtime_fills_text_blocks_from_the_pdf_text_layer(
    server: LlamaServer, tmp_path: Path
) -> None:
    """The text-layer fill is the engine's, not the runtime's: on a born-digital PDF the
    server is asked for the layout only, and the block's text comes from the PDF."""
    from daemon.config.settings import LimitsConfig
    from daemon.document.page import SOURCE_TEXT_LAYER
    from daemon.input.raster import render_page
    from daemon.input.sniff import inspect
    from daemon.input.textlayer import with_text_layer
    from tests.docgen import make_text_pdf

    lines = [f"Line {i} of a born-digital page, read from its own text layer." for i in range(12)]
    pdf = make_text_pdf(tmp_path / "digital.pdf", [lines])
    limits = LimitsConfig()
    doc = inspect(pdf, passwords=(), limits=limits)
    rendered = render_page(pdf, doc, 0, dpi=72, max_long_side=4000,
                           max_image_pixels=limits.max_image_pixels)
    engine = http_engine(server.url)
    engine.load()
    try:
        options = PageOptions(text_layer="auto", max_new_tokens_layout=64,
                              max_new_tokens_block=64)
        result = engine.parse_page(with_text_layer(rendered, options), options, no_progress)
    finally:
        engine.close()
    assert result.info["text_layer"] == "used"
    assert result.info["model_blocks"] == 0 and result.info["text_layer_blocks"] == 1
    (block,) = result.blocks
    assert block.source == SOURCE_TEXT_LAYER and "Line 0 of a born-digital page" in block.text


def test_llama_cpp_runtime_gives_the_same_page_in_process() -> None:
    server_binary()  # same skip conditions: the fixture and the wheel
    llama = LlamaCppConfig(model=TINY_MAIN, mmproj=TINY_MMPROJ, threads=1, parallel=2)
    engine = MinerUEngine(EngineConfig(runtime="llama-cpp", llama_cpp=llama))
    info = engine.load()
    try:
        assert info.details["runtime"] == "llama-cpp"
        assert info.model_id == TINY_MAIN.name
        assert engine.max_pages_in_flight == EngineConfig().page_batch
        assert_tiny_page(engine.parse_page(page(), OPTIONS, no_progress))
    finally:
        engine.close()


class CountingEngine:
    """The llama.cpp Engine, counting how many generate() calls are inside it at once."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            return self.inner.generate(*args, **kwargs)
        finally:
            with self.lock:
                self.now -= 1

    def close(self) -> None:
        self.inner.close()


def test_llama_cpp_pages_in_the_engine_together_share_its_slots() -> None:
    server_binary()
    llama = LlamaCppConfig(model=TINY_MAIN, mmproj=TINY_MMPROJ, threads=1, parallel=2)
    engine = MinerUEngine(EngineConfig(runtime="llama-cpp", llama_cpp=llama, page_batch=3))
    engine.load()
    runtime: Any = engine.runtime
    counting = CountingEngine(runtime.engine)
    runtime.engine = counting
    try:
        assert engine.max_pages_in_flight == 3  # the worker parses 3 pages at once
        with ThreadPoolExecutor(max_workers=3) as pool:
            results = list(
                pool.map(lambda i: engine.parse_page(page(i, 3), OPTIONS, no_progress), range(3))
            )
    finally:
        engine.close()
    for result in results:
        assert_tiny_page(result)
    assert counting.peak == 2  # layouts and blocks of 3 pages, never more than the 2 slots


def test_llama_cpp_finds_the_pair_in_a_folder_under_minerus_names(tmp_path: Path) -> None:
    """MinerU keeps the Pro GGUF pair in one folder; engine.llama_cpp.model may name it."""
    server_binary()
    (tmp_path / "MinerU2.5-Pro-2605-1.2B-Q8_0.gguf").symlink_to(TINY_MAIN)
    (tmp_path / "mmproj-MinerU2.5-Pro-2605-1.2B-Q8_0.gguf").symlink_to(TINY_MMPROJ)
    engine = MinerUEngine(
        EngineConfig(
            model="opendatalab/MinerU2.5-Pro-2605-1.2B",
            runtime="llama-cpp",
            llama_cpp=LlamaCppConfig(model=tmp_path, threads=1, parallel=1),
        )
    )
    info = engine.load()
    try:
        assert info.model_id == "MinerU2.5-Pro-2605-1.2B-Q8_0.gguf"
        assert_tiny_page(engine.parse_page(page(), OPTIONS, no_progress))
    finally:
        engine.close()


def test_llama_cpp_without_gguf_is_unavailable_with_the_pull_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    engine = MinerUEngine(
        EngineConfig(model="opendatalab/MinerU2.5-Pro-2605-1.2B", runtime="llama-cpp")
    )
    with pytest.raises(EngineUnavailable) as err:
        engine.load()
    assert "model pull --runtime llama-cpp" in err.value.hint
    unknown = MinerUEngine(EngineConfig(runtime="llama-cpp"))
    with pytest.raises(EngineUnavailable, match="no GGUF is known"):
        unknown.load()


def test_pages_and_blocks_in_flight_reach_the_server_together(server: LlamaServer) -> None:
    """Four pages through parse_page at once (as the worker's pipeline does) keep four
    requests outstanding: the server's own /slots shows several slots busy at once."""
    engine = http_engine(server.url, max_in_flight=4)
    engine.load()
    try:
        with SlotWatcher(server) as watcher, ThreadPoolExecutor(4) as pool:
            results = list(
                pool.map(lambda i: engine.parse_page(page(i, 8), OPTIONS, no_progress), range(8))
            )
        for result in results:
            assert_tiny_page(result)
        remote: Any = engine.runtime
        assert remote.peak_in_flight == 4  # never more than max_in_flight
        assert watcher.peak >= 2, "the server never had two requests at once"
    finally:
        engine.close()


def test_server_down_at_start_is_unavailable_in_seconds() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EngineUnavailable) as err:
        http_engine(url).load()
    assert "cannot connect" in err.value.message
    assert "re-probes" in err.value.hint
    assert not probe_server(EngineHttpConfig(server_url=url)).reachable


def test_http_without_a_server_url_says_which_key_to_set() -> None:
    with pytest.raises(EngineUnavailable) as err:
        MinerUEngine(EngineConfig(runtime="http")).load()
    assert "engine.http.server_url" in err.value.message
    assert "engine.http.server_url" in err.value.hint


def test_wrong_model_name_names_the_servers_models(server: LlamaServer) -> None:
    with pytest.raises(EngineUnavailable) as err:
        http_engine(server.url, model_name="MinerU2.5-2509-1.2B").load()
    assert "'MinerU2.5-2509-1.2B'" in err.value.message
    assert f"it serves: {MODEL_ID}" in err.value.message
    ok = http_engine(server.url, model_name=MODEL_ID)
    ok.load()
    ok.close()


def test_429_and_503_are_retried_honouring_retry_after(server: LlamaServer) -> None:
    def fault(path: str, n: int) -> Any:
        if path.endswith("/chat/completions"):
            fault.chats += 1  # type: ignore[attr-defined]
            if fault.chats == 1:  # type: ignore[attr-defined]
                return 429, {"Retry-After": "1"}, b'{"error": "busy"}'
            if fault.chats == 2:  # type: ignore[attr-defined]
                return 503, {}, b'{"error": "loading"}'
        return None

    fault.chats = 0  # type: ignore[attr-defined]
    with FaultProxy(server.url, fault) as proxy:
        engine = http_engine(proxy.url, retry_backoff_seconds=0.1)
        engine.load()
        try:
            assert_tiny_page(engine.parse_page(page(), OPTIONS, no_progress))
        finally:
            engine.close()
    chats = [(t, s) for t, p, s in proxy.log.requests if p.endswith("/chat/completions")]
    assert [s for _, s in chats] == [429, 503, 200, 200]
    # The 429 said "Retry-After: 1": the retry came no sooner (a lower bound, not a timing).
    assert chats[1][0] - chats[0][0] >= 0.9


def test_a_server_that_keeps_failing_makes_the_runtime_unavailable(server: LlamaServer) -> None:
    def fault(path: str, n: int) -> Any:
        return (500, {}, b'{"error": "boom"}') if path.endswith("/chat/completions") else None

    with FaultProxy(server.url, fault) as proxy:
        engine = http_engine(proxy.url, retries=2, retry_backoff_seconds=0.05)
        engine.load()
        try:
            with pytest.raises(ServerUnavailable, match="kept answering HTTP 500"):
                engine.parse_page(page(), OPTIONS, no_progress)
        finally:
            engine.close()
    assert sum(p.endswith("/chat/completions") for _, p, _ in proxy.log.requests) == 3


def test_a_hanging_request_times_out_with_a_clear_error(server: LlamaServer) -> None:
    def fault(path: str, n: int) -> Any:
        return "hang" if path.endswith("/chat/completions") else None

    with FaultProxy(server.url, fault) as proxy:
        engine = http_engine(proxy.url, timeout_seconds=1.0)
        engine.load()
        try:
            with pytest.raises(DocumentError, match=r"did not answer within 1 s"):
                engine.parse_page(page(), OPTIONS, no_progress)
        finally:
            engine.close()


def test_a_server_killed_mid_page_and_restarted_finishes_the_page(tmp_path: Path) -> None:
    """Requests in flight when the server dies are retried with back-off until it is back."""
    srv = LlamaServer(tmp_path, parallel=2).start()
    engine = http_engine(srv.url, retry_backoff_seconds=0.5, retry_backoff_max_seconds=2)
    engine.load()
    try:
        srv.kill()
        restarted = threading.Timer(1.5, lambda: LlamaServer(tmp_path, 2, srv.port).start())
        restarted.start()
        # Every request of this page meets the dead server first.
        result = engine.parse_page(page(), OPTIONS, no_progress)
        assert_tiny_page(result)
    finally:
        engine.close()
        restarted.join()
        for proc in _servers_on(srv.port):
            proc.terminate()


def _servers_on(port: int) -> list[Any]:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd and cmd[0].endswith("llama-server") and str(port) in cmd:
            found.append(proc)
    return found


def test_tls_with_a_private_ca_bundle(server: LlamaServer, tmp_path: Path) -> None:
    ca = make_ca(tmp_path / "ca")
    with FaultProxy(server.url, tls=ca) as proxy:
        with pytest.raises(EngineUnavailable, match=r"engine\.http\.ca_bundle"):
            http_engine(proxy.url).load()
        engine = http_engine(proxy.url, ca_bundle=ca / "ca.pem", api_key="s3cret-key")
        info = engine.load()
        try:
            assert str(info.details["server"]).startswith("https://localhost:")
            assert_tiny_page(engine.parse_page(page(), OPTIONS, no_progress))
            assert "s3cret" not in repr(engine.config)
        finally:
            engine.close()


def test_the_api_key_is_sent_and_a_refusal_names_it(server: LlamaServer) -> None:
    def refuse(path: str, n: int) -> Any:
        return (401, {}, b'{"error": "bad key"}') if path.endswith("/models") else None

    with FaultProxy(server.url) as proxy:
        engine = http_engine(proxy.url, api_key="s3cret-key")
        engine.load()
        try:
            assert_tiny_page(engine.parse_page(page(), OPTIONS, no_progress))
        finally:
            engine.close()
    assert set(proxy.log.authorizations) == {"Bearer s3cret-key"}
    with FaultProxy(server.url, refuse) as proxy, pytest.raises(EngineUnavailable) as err:
        http_engine(proxy.url, api_key="wrong").load()
    assert "HTTP 401" in err.value.message and "engine.http.api_key" in err.value.message


def test_probe_reports_models_and_health(server: LlamaServer) -> None:
    probe = probe_server(EngineHttpConfig(server_url=server.url + "/v1"))
    assert probe.reachable and probe.healthy and probe.error is None
    assert probe.models == (MODEL_ID,)


def docinbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "daemon", *args],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def engine_config(tmp_path: Path, engine: dict[str, Any]) -> Path:
    (tmp_path / "inbox").mkdir(exist_ok=True)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"inboxes": ["inbox"], "outbox": "outbox", "engine": engine}))
    return path


def test_model_info_asks_the_http_server(server: LlamaServer, tmp_path: Path) -> None:
    cfg = engine_config(tmp_path, {"runtime": "http", "http": {"server_url": server.url}})
    ok = docinbox("model", "info", "--json", "--config", str(cfg))
    assert ok.returncode == 0, ok.stderr
    info = json.loads(ok.stdout)
    assert info["runtime"] == "http" and info["healthy"] is True
    assert info["models"] == [MODEL_ID] and info["model_name"] == MODEL_ID
    wrong = engine_config(
        tmp_path, {"runtime": "http", "http": {"server_url": server.url, "model_name": "x"}}
    )
    bad = docinbox("model", "info", "--config", str(wrong))
    assert bad.returncode == 4
    assert f"it serves: {MODEL_ID}" in bad.stderr
    pull = docinbox("model", "pull", "--config", str(cfg))
    assert pull.returncode == 0 and "nothing to pull" in pull.stdout


def test_model_info_loads_the_gguf_pair(tmp_path: Path) -> None:
    server_binary()
    llama = {"model": str(TINY_MAIN), "mmproj": str(TINY_MMPROJ), "threads": 1, "parallel": 1}
    cfg = engine_config(tmp_path, {"runtime": "llama-cpp", "llama_cpp": llama})
    out = docinbox("model", "info", "--json", "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["loads"] is True and info["model_path"] == str(TINY_MAIN)


def test_model_pull_fetches_the_known_pair_and_the_engine_finds_it(tmp_path: Path) -> None:
    """The Pro model's pair, as `model pull --runtime llama-cpp` leaves it in the Hugging
    Face cache (laid out by hand here: the hub is not reachable from the tests). Offline,
    pull verifies the cached pair, and the engine loads it without any path configured."""
    server_binary()
    repo = "jinzhenj/MinerU2.5-Pro-2605-1.2B-GGUF"
    cache = tmp_path / "hub"
    store = cache / ("models--" + repo.replace("/", "--"))
    snap = store / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (store / "refs").mkdir()
    (store / "refs" / "main").write_text("0" * 40)
    shutil.copy(TINY_MAIN, snap / "MinerU2.5-Pro-2605-1.2B-Q8_0.gguf")
    shutil.copy(TINY_MMPROJ, snap / "mmproj-MinerU2.5-Pro-2605-1.2B-Q8_0.gguf")
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    pro = "opendatalab/MinerU2.5-Pro-2605-1.2B"
    cfg = engine_config(tmp_path, {"model": pro, "runtime": "llama-cpp",
                                   "llama_cpp": {"threads": 1, "parallel": 1}})
    pulled = docinbox("model", "pull", "--config", str(cfg), env=env)
    assert pulled.returncode == 0, pulled.stderr
    assert "MinerU2.5-Pro-2605-1.2B-Q8_0.gguf" in pulled.stdout
    info = docinbox("model", "info", "--json", "--config", str(cfg), env=env)
    assert json.loads(info.stdout)["loads"] is True, info.stderr
    # The 2509 model has no published GGUF: a clear refusal, not a download attempt.
    other = docinbox("model", "pull", "--runtime", "llama-cpp", "--model",
                     "opendatalab/MinerU2.5-2509-1.2B", "--config", str(cfg), env=env)
    assert other.returncode == 4 and "no GGUF is known" in other.stderr


def test_show_masks_the_api_key_and_url_credentials(tmp_path: Path) -> None:
    cfg = engine_config(tmp_path, {"runtime": "http", "http": {
        "server_url": "https://bob:hunter2@gpu-box:8000", "api_key": "sk-very-secret"}})
    shown = docinbox("check-config", "--show", "--config", str(cfg))
    assert shown.returncode == 0, shown.stderr
    assert "hunter2" not in shown.stdout and "sk-very-secret" not in shown.stdout
    http = yaml.safe_load(shown.stdout)["engine"]["http"]
    assert http["api_key"] == "***"
    assert http["server_url"] == "https://***@gpu-box:8000"


def test_bad_runtime_keys_are_reported_with_their_paths(tmp_path: Path) -> None:
    cfg = engine_config(tmp_path, {"runtime": "vllm", "http": {
        "server_url": "gpu-box:8000", "max_in_flight": 0},
        "llama_cpp": {"parallel": 0}})
    out = docinbox("check-config", "--config", str(cfg))
    assert out.returncode == 78
    for key in ("engine.runtime", "engine.http.server_url", "engine.http.max_in_flight",
                "engine.llama_cpp.parallel"):
        assert key in out.stderr


def test_progress_carries_the_pages_in_flight() -> None:
    """`status` reads the document in progress back from the runtime table: the number of
    pages in flight (runtime http) survives that trip; older rows without it read as 1."""
    from daemon.common.live import CurrentDoc

    doc = CurrentDoc(job_id=7, path="/in/a.pdf", page=3, pages=12, block=(1, 4),
                     stage="block", pages_in_flight=4)
    assert CurrentDoc.from_json(json.loads(json.dumps(doc.to_json()))) == doc
    old = {k: v for k, v in doc.to_json().items() if k != "pages_in_flight"}
    back = CurrentDoc.from_json(old)
    assert back is not None and back.pages_in_flight == 1
