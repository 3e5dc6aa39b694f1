"""Side-by-side CPU benchmark: mineru-vl-utils' reference transformers path vs docinbox's engine.

Every path runs in its own fresh subprocess on the same rendered page, so cold start and peak
RSS are per path. Random weights stop at random places, so the amount of work is fixed:

- every generate() call is forced to exactly N (layout) or M (per block) new tokens
  (``min_new_tokens == max_new_tokens``; any ``max_length`` the caller set is dropped);
- the layout step's generated text is replaced, after its generate() has run and been timed,
  by a fixed layout string (K blocks with given boxes and types), by wrapping the client
  helper's ``parse_layout_output``. Both paths call that same helper method, so both see the
  same K blocks and crop the same block images.

Paths: ``reference`` (mineru-vl-utils' README: load_transformers_model(path) -> dtype="auto",
+ MinerUClient(backend="transformers").two_step_extract; device_map=None instead of "auto",
which needs accelerate; the processor is docinbox's image-only Qwen2-VL processor, because
transformers' AutoProcessor needs torchvision, not installed here),
``fp32``/``bf16``/``mixed``/``int8`` (docinbox's MinerUEngine, text_layer off) and
``textlayer`` (MinerUEngine with the defaults, precision auto and text_layer auto, on the
born-digital page).

    python bench/make_model.py
    python bench/bench_mineru.py --out ~/.cache/docinbox-bench/results.json

Results: a JSON file (per path: timings, per-generate-call details, RSS, load info) and
Markdown tables on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = Path("~/.cache/docinbox-bench/mineru2.5-shape").expanduser()
DEFAULT_PDF = REPO.parent / "shared" / "corpus" / "pdf" / "docling__2305.03393v1-pg9.pdf"
DEFAULT_OUT = Path("~/.cache/docinbox-bench/results.json").expanduser()
ENGINE_PATHS = ("fp32", "bf16", "mixed", "int8")
ALL_PATHS = ("mixed", "reference", "int8", "fp32", "textlayer", "bf16")

# The fixed layout (MinerU's format: boxes in 0..1000 of the page). Boxes sit on the real
# regions of docling__2305.03393v1-pg9.pdf: a section title, a paragraph, the table, a
# paragraph. With text_layer auto, three are text-like and come from the PDF; the table
# still goes to the model.
FIXED_LAYOUT_BLOCKS = (
    ("title", (218, 207, 524, 229)),
    ("text", (218, 229, 788, 325)),
    ("table", (230, 425, 772, 595)),
    ("text", (218, 656, 788, 843)),
)


def fixed_layout(blocks: tuple[tuple[str, tuple[int, int, int, int]], ...]) -> str:
    return "".join(
        f"<|box_start|>{x0} {y0} {x1} {y1}<|box_end|><|ref_start|>{kind}<|ref_end|><|rotate_up|>\n"
        for kind, (x0, y0, x1, y1) in blocks
    )


# ----------------------------------------------------------------------------- child side


@dataclass
class Call:
    phase: str
    prompt_tokens: int = 0
    image_grid_thw: list[int] = field(default_factory=list)
    vision_seconds: float = 0.0
    prefill_seconds: float = 0.0  # call start -> first new token (vision + LM prefill)
    decode_tokens: int = 0
    decode_seconds: float = 0.0  # first new token -> last new token
    total_seconds: float = 0.0


class TimingStreamer:
    """generate() streamer: timestamps every new token, forwards to the caller's streamer."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.stamps: list[float] = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if self._prompt_seen:
            self.stamps.append(time.monotonic())
        self._prompt_seen = True
        if self.inner is not None:
            self.inner.put(value)

    def end(self) -> None:
        if self.inner is not None:
            self.inner.end()


@dataclass
class Probe:
    layout_text: str
    n_layout: int
    m_block: int
    phase: str = "layout"
    layout_parsed_at: float = 0.0
    generated_layout_chars: int = 0
    calls: list[Call] = field(default_factory=list)
    _vision_started: float = 0.0


def instrument(model: Any, helper: Any, probe: Probe) -> None:
    """Force token counts, inject the fixed layout, time vision/prefill/decode per call."""
    original_parse = helper.parse_layout_output

    def parse_layout_output(output: str) -> Any:
        probe.layout_parsed_at = time.monotonic()
        probe.generated_layout_chars = len(output)
        probe.phase = "block"
        return original_parse(probe.layout_text)

    helper.parse_layout_output = parse_layout_output

    visual = model.model.visual

    def vision_pre(_module: Any, _inputs: Any) -> None:
        probe._vision_started = time.monotonic()

    def vision_post(_module: Any, _inputs: Any, _output: Any) -> None:
        if probe.calls:
            probe.calls[-1].vision_seconds += time.monotonic() - probe._vision_started

    visual.register_forward_pre_hook(vision_pre)
    visual.register_forward_hook(vision_post)

    original_generate = model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        n = probe.n_layout if probe.phase == "layout" else probe.m_block
        kwargs.pop("max_length", None)
        kwargs["max_new_tokens"] = n
        kwargs["min_new_tokens"] = n
        streamer = TimingStreamer(kwargs.pop("streamer", None))
        kwargs["streamer"] = streamer
        call = Call(phase=probe.phase)
        input_ids = kwargs.get("input_ids")
        if input_ids is not None:
            call.prompt_tokens = int(input_ids.shape[-1])
        grid = kwargs.get("image_grid_thw")
        if grid is not None:
            call.image_grid_thw = [int(v) for v in grid[0].tolist()]
        probe.calls.append(call)
        start = time.monotonic()
        out = original_generate(*args, **kwargs)
        end = time.monotonic()
        call.total_seconds = end - start
        if streamer.stamps:
            call.prefill_seconds = streamer.stamps[0] - start
            call.decode_tokens = len(streamer.stamps)
            call.decode_seconds = streamer.stamps[-1] - streamer.stamps[0]
        return out

    model.generate = generate


def _rss_mb() -> dict[str, float]:
    import psutil

    return {
        "rss_now_mb": round(psutil.Process().memory_info().rss / 2**20, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One path in this (fresh) process. Returns the result record."""
    spawn_wall: float = spec["spawn_wall"]
    t_import = time.monotonic()
    import torch
    from PIL import Image

    sys.path.insert(0, str(REPO))
    from daemon.page import PageInput, PageOptions

    import_seconds = time.monotonic() - t_import
    path: str = spec["path"]
    model_dir: str = spec["model"]
    image = Image.open(spec["image"]).convert("RGB")
    image.load()
    pdf = Path(spec["pdf"]) if spec.get("pdf") else None
    probe = Probe(fixed_layout(FIXED_LAYOUT_BLOCKS), spec["n_layout"], spec["m_block"])
    record: dict[str, Any] = {"path": path, "import_seconds": round(import_seconds, 2)}

    if path == "reference":
        from mineru_vl_utils import MinerUClient
        from mineru_vl_utils.transformers_loading import load_transformers_model

        from daemon.engines.mineru_model import load_processor

        t_load = time.monotonic()
        # mineru-vl-utils' README loader (dtype="auto", its tie_word_embeddings fix).
        # device_map=None instead of the README's "auto": "auto" needs `accelerate`, and
        # on a machine without a GPU it places everything on the CPU anyway.
        model: Any = load_transformers_model(model_dir, device_map=None)
        # transformers' AutoProcessor would need torchvision: docinbox's image-only one.
        processor = load_processor(Path(model_dir))
        client: Any = MinerUClient(backend="transformers", model=model, processor=processor)
        record["load_seconds"] = round(time.monotonic() - t_load, 2)
        ready_wall = time.time()
        record["dtype_vision"] = str(model.model.visual.dtype).removeprefix("torch.")
        record["dtype_decoder"] = str(model.model.language_model.dtype).removeprefix("torch.")
        record["threads"] = torch.get_num_threads()
        record["attn_implementation"] = model.config._attn_implementation
        record["after_load"] = _rss_mb()
        instrument(model, client.helper, probe)
        t0 = time.monotonic()
        cpu0 = time.process_time()
        extracted = client.two_step_extract(image)
        t1 = time.monotonic()
        cpu1 = time.process_time()
        record["blocks_out"] = len(extracted)
    else:
        from daemon.config import EngineConfig
        from daemon.engines.mineru import MinerUEngine

        # textlayer: what a user gets by default (precision auto, text_layer auto)
        precision = "auto" if path == "textlayer" else path
        text_layer = "auto" if path == "textlayer" else "off"
        cfg: Any = EngineConfig(
            model=model_dir,
            precision=precision,  # type: ignore[arg-type]
            threads=spec.get("threads", 0),
            text_layer=text_layer,  # type: ignore[arg-type]
            max_new_tokens_layout=spec["n_layout"],
            max_new_tokens_block=spec["m_block"],
        )
        engine = MinerUEngine(cfg)
        t_load = time.monotonic()
        info = engine.load()
        record["load_seconds"] = round(time.monotonic() - t_load, 2)
        ready_wall = time.time()
        record["engine_info"] = {
            "precision": info.precision,
            **{k: v for k, v in info.details.items() if k != "weights_path"},
        }
        record["dtype_vision"] = info.details["dtype_vision"]
        record["dtype_decoder"] = info.details["dtype_decoder"]
        record["threads"] = info.details["threads"]
        qwen = engine._client.client.model
        record["attn_implementation"] = qwen.config._attn_implementation
        record["after_load"] = _rss_mb()
        instrument(qwen, engine._client.helper, probe)
        page = PageInput(
            image=image,
            page_idx=spec.get("page_idx", 0),
            page_count=spec.get("page_count", 1),
            dpi=spec.get("dpi"),
            pdf_path=pdf,
        )
        options = PageOptions(
            text_layer=text_layer,
            max_new_tokens_layout=spec["n_layout"],
            max_new_tokens_block=spec["m_block"],
        )
        t0 = time.monotonic()
        cpu0 = time.process_time()
        result = engine.parse_page(page, options, lambda *_a: None)
        t1 = time.monotonic()
        cpu1 = time.process_time()
        record["page_info"] = result.info
        record["blocks_out"] = len(result.blocks)

    record["cold_start_seconds"] = round(ready_wall - spawn_wall, 2)
    record["layout_seconds"] = round(probe.layout_parsed_at - t0, 2)
    record["recognition_seconds"] = round(t1 - probe.layout_parsed_at, 2)
    record["page_seconds"] = round(t1 - t0, 2)
    # CPU seconds of all threads / wall: ~threads when the cores were ours alone.
    record["page_cpu_seconds"] = round(cpu1 - cpu0, 2)
    record["page_cpu_per_wall"] = round((cpu1 - cpu0) / max(t1 - t0, 1e-9), 2)
    record["generated_layout_chars"] = probe.generated_layout_chars
    record["calls"] = [vars(c) for c in probe.calls]
    layout_calls = [c for c in probe.calls if c.phase == "layout"]
    block_calls = [c for c in probe.calls if c.phase == "block"]
    record["model_blocks"] = len(block_calls)
    record["layout_decode_ms_per_token"] = _ms_per_token(layout_calls)
    record["block_decode_ms_per_token"] = _ms_per_token(block_calls)
    record["layout_vision_seconds"] = round(sum(c.vision_seconds for c in layout_calls), 2)
    record["layout_prefill_seconds"] = round(sum(c.prefill_seconds for c in layout_calls), 2)
    record["block_vision_seconds"] = round(sum(c.vision_seconds for c in block_calls), 2)
    record["block_prefill_seconds"] = round(sum(c.prefill_seconds for c in block_calls), 2)
    record["block_decode_seconds"] = round(sum(c.decode_seconds for c in block_calls), 2)
    record["end"] = _rss_mb()
    record["peak_rss_mb"] = record["end"]["peak_rss_mb"]
    return record


def _ms_per_token(calls: list[Call]) -> float | None:
    # The first new token comes out of the prefill; decode steps are the remaining ones.
    steps = sum(max(c.decode_tokens - 1, 0) for c in calls)
    seconds = sum(c.decode_seconds for c in calls)
    return round(1000 * seconds / steps, 1) if steps else None


# ---------------------------------------------------------------------------- parent side


def machine_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"python": platform.python_version(), "cpu_count": os.cpu_count()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in lscpu.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "Core(s) per socket", "Thread(s) per core", "CPU(s)"):
                facts[key.strip()] = value.strip()
    except OSError:
        pass
    sys.path.insert(0, str(REPO))
    from daemon.engines.mineru_model import auto_precision, cpu_flags

    flags = cpu_flags()
    facts["flags"] = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c")))
    facts["auto_precision"] = auto_precision(flags)
    import psutil

    facts["mem_total_gb"] = round(psutil.virtual_memory().total / 2**30, 1)
    try:
        import torch
        import transformers

        facts["torch"] = torch.__version__
        facts["transformers"] = transformers.__version__
        # What torch really uses: an ISA cap (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA)
        # reproduces an older CPU on a newer one.
        facts["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        facts["isa_caps"] = {
            k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
            if k in os.environ
        }
    except ImportError:
        pass
    return facts


def prepare_page(pdf: Path, dpi: int, cache: Path) -> dict[str, Any]:
    """Render page 1 once (PNG) so every path gets identical pixels."""
    sys.path.insert(0, str(REPO))
    cache.mkdir(parents=True, exist_ok=True)
    if pdf.is_file():
        from daemon.config import LimitsConfig
        from daemon.raster import render_page
        from daemon.sniff import inspect

        limits = LimitsConfig()
        info = inspect(pdf, passwords=(), limits=limits)
        page = render_page(
            pdf, info, 0, dpi=dpi, max_long_side=4000, max_image_pixels=limits.max_image_pixels
        )
        target = cache / f"{pdf.stem}-{dpi}dpi.png"
        page.image.save(target)
        return {
            "image": str(target),
            "pdf": str(pdf),
            "page_idx": 0,
            "page_count": info.page_count,
            "dpi": dpi,
            "size": list(page.image.size),
        }
    # No corpus: a generated text page (no PDF text layer, so no text-layer comparison).
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (1700, 2200), "white")
    draw = ImageDraw.Draw(image)
    for row in range(60):
        draw.text((150, 150 + row * 32), f"Line {row}: generated benchmark text " * 3, fill="black")
    target = cache / "generated-page.png"
    image.save(target)
    return {"image": str(target), "pdf": None, "dpi": dpi, "size": list(image.size)}


def warm_cache(model_dir: Path) -> None:
    """Read the weights once so every path's cold start is from a warm page cache."""
    for weights in model_dir.glob("*.safetensors"):
        with weights.open("rb") as fh:
            while fh.read(64 * 2**20):
                pass


def loadavg() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def run_path(path: str, base: dict[str, Any], logs: Path, timeout: float) -> dict[str, Any]:
    result_file = logs / f"{path}.json"
    result_file.unlink(missing_ok=True)
    spec = {**base, "path": path, "result_path": str(result_file)}
    load_before = loadavg()
    spec["spawn_wall"] = time.time()
    with (logs / f"{path}.log").open("w") as log:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    wall = time.time() - spec["spawn_wall"]
    if proc.returncode != 0 or not result_file.is_file():
        return {"path": path, "error": f"exit {proc.returncode}, see {logs / (path + '.log')}"}
    record: dict[str, Any] = json.loads(result_file.read_text())
    record["subprocess_wall_seconds"] = round(wall, 1)
    record["loadavg_before"] = load_before
    record["loadavg_after"] = loadavg()
    return record


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"
    return str(value)


def _load(record: dict[str, Any]) -> str:
    before, after = record.get("loadavg_before"), record.get("loadavg_after")
    return f"{before[0]}→{after[0]}" if before and after else "–"


def _best_decode(record: dict[str, Any]) -> float | None:
    """The fastest single call's decode ms/token: the least disturbed by other load."""
    rates = [
        1000 * c["decode_seconds"] / (c["decode_tokens"] - 1)
        for c in record.get("calls", [])
        if c["decode_tokens"] > 1
    ]
    return round(min(rates), 1) if rates else None


def merge(files: list[Path]) -> dict[str, Any]:
    """Results files (or single per-path records from a -logs folder) -> one results dict."""
    merged: dict[str, Any] = {"paths": []}
    for file in files:
        data = json.loads(file.read_text())
        if "paths" in data:
            merged.update({k: v for k, v in data.items() if k != "paths"})
            merged["paths"] += data["paths"]
        else:
            merged["paths"].append(data)
    return merged


def markdown(results: dict[str, Any]) -> str:
    paths = [r for r in results["paths"] if "error" not in r]
    ref = next((r for r in paths if r["path"] == "reference"), None)
    head = (
        "| path | vision / decoder dtype | threads | cold start s | layout s (vision) "
        "| recognition s | page s | vs reference | layout decode ms/tok "
        "| block decode ms/tok | best-call decode ms/tok | peak RSS MB | CPU/wall "
        "| load avg before→after |"
    )
    m = results.get("machine", {})
    lines = [
        f"machine: {m.get('Model name', '?')}, {m.get('cpu_count', '?')} CPUs, torch kernels "
        f"{m.get('torch_cpu_capability', '?')}"
        + (f" (capped: {m['isa_caps']})" if m.get("isa_caps") else "")
        + f", precision auto -> {m.get('auto_precision', '?')}",
        "",
        head,
        "|" + "---|" * 14,
    ]
    for r in paths:
        ratio = f"{r['page_seconds'] / ref['page_seconds']:.2f}×" if ref else "–"
        lines.append(
            f"| {r['path']} | {r['dtype_vision']} / {r['dtype_decoder']} | {r['threads']} "
            f"| {_fmt(r['cold_start_seconds'])} "
            f"| {_fmt(r['layout_seconds'])} ({_fmt(r['layout_vision_seconds'])}) "
            f"| {_fmt(r['recognition_seconds'])} | {_fmt(r['page_seconds'])} | {ratio} "
            f"| {_fmt(r['layout_decode_ms_per_token'])} | {_fmt(r['block_decode_ms_per_token'])} "
            f"| {_fmt(_best_decode(r))} "
            f"| {_fmt(r['peak_rss_mb'])} | {_fmt(r.get('page_cpu_per_wall'))} "
            f"| {_load(r)} |"
        )
    for r in results["paths"]:
        if "error" in r:
            lines.append(f"| {r['path']} | FAILED: {r['error']} |")
    auto = next((r for r in paths if r["path"] == "textlayer"), None)
    # Compared with the text_layer-off run of the same precision (what auto picked).
    off = auto and next(
        (
            r
            for r in paths
            if r["path"] in ENGINE_PATHS
            and (r["dtype_vision"], r["dtype_decoder"])
            == (auto["dtype_vision"], auto["dtype_decoder"])
        ),
        None,
    )
    if off and auto:
        lines += [
            "",
            f"| {off['path']} (auto), text_layer | model blocks | text-layer blocks "
            "| recognition s | page s |",
        ]
        lines.append("|---|---|---|---|---|")
        for label, r in (("off", off), ("auto", auto)):
            info = r.get("page_info", {})
            lines.append(
                f"| {label} | {r['model_blocks']} | {info.get('text_layer_blocks', 0)} "
                f"| {_fmt(r['recognition_seconds'])} | {_fmt(r['page_seconds'])} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument(
        "--report",
        type=Path,
        nargs="+",
        help="print the tables of results files (or per-path records), run nothing",
    )
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--pdf", type=Path, default=DEFAULT_PDF)
    parser.add_argument("--dpi", type=int, default=200)
    parser.add_argument("--layout-tokens", type=int, default=64, help="N, forced")
    parser.add_argument("--block-tokens", type=int, default=32, help="M per block, forced")
    parser.add_argument("--threads", type=int, default=0, help="engine threads (0 = cores)")
    parser.add_argument("--paths", default=",".join(ALL_PATHS), help="comma-separated, in order")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--timeout", type=float, default=3600.0, help="per path, seconds")
    args = parser.parse_args(argv)

    if args.report:
        merged = merge(args.report)
        if args.out != DEFAULT_OUT:
            args.out.write_text(json.dumps(merged, indent=2))
        print(markdown(merged))
        return 0
    if args.child:
        spec = json.loads(args.child)
        record = child(spec)
        Path(spec["result_path"]).write_text(json.dumps(record, indent=2))
        return 0

    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = set(paths) - set(ALL_PATHS)
    if unknown:
        parser.error(f"unknown paths {sorted(unknown)} (known: {', '.join(ALL_PATHS)})")
    model_dir: Path = args.model.expanduser().resolve()
    out: Path = args.out.expanduser()
    logs = out.parent / (out.stem + "-logs")
    logs.mkdir(parents=True, exist_ok=True)
    page = prepare_page(args.pdf, args.dpi, out.parent)
    if page["pdf"] is None and "textlayer" in paths:
        paths.remove("textlayer")
    warm_cache(model_dir)
    base = {
        "model": str(model_dir),
        "n_layout": args.layout_tokens,
        "m_block": args.block_tokens,
        "threads": args.threads,
        **page,
    }
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_facts(),
        "settings": {
            "model": str(model_dir),
            "layout_tokens": args.layout_tokens,
            "block_tokens": args.block_tokens,
            "fixed_layout": fixed_layout(FIXED_LAYOUT_BLOCKS),
            "page": page,
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
        },
        "paths": [],
    }
    for path in paths:
        print(f"[{time.strftime('%H:%M:%S')}] {path} (load {loadavg()}) ...", flush=True)
        record = run_path(path, base, logs, args.timeout)
        results["paths"].append(record)
        results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        out.write_text(json.dumps(results, indent=2))
        summary = record.get("error") or f"page {record['page_seconds']}s"
        print(f"[{time.strftime('%H:%M:%S')}] {path}: {summary}", flush=True)
    print()
    print(markdown(results))
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
