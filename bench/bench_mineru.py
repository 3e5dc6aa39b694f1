"""CPU benchmark of the `mineru` engine: docinbox's paths against the reference path a user
would copy from mineru-vl-utils' README and against MinerU 4's own CPU engine (llama.cpp).

Every path runs in its own fresh subprocess on the same rendered page, so cold start and peak
RSS are per path. Random weights stop at random places, so the work is fixed by a plan: the
layout step's token count and layout string, and each block's token count (see
bench_engine.py for how it is forced and timed).

- default ("forced") mode: page 1 of docling__2305.03393v1-pg9.pdf, a fixed layout of 4
  blocks, N layout tokens and M tokens per block (`--layout-tokens`, `--block-tokens`);
- `--realistic`: a real corpus page (docling__amt_handbook_sample.pdf, 17 blocks on their
  real regions from its text layer; bench/realistic.py), the layout step forced to the token
  count of MinerU's layout string for those blocks and each block to the token count of its
  real text (Qwen2's BPE), plus the document paths: a 4-page PDF (docling__normal_4pages)
  and a 12-page one (the first 12 pages of docling__redp5110_sampled) through the real
  supervisor and worker (`daemon.cli.parse.parse_files`), each page forced to its own plan:
  `document` with engine.page_batch 1, `document-batched` with the default page_batch
  (several pages' model steps in shared generate() calls); seconds per page and where the
  time went (vision, LM prefill, decode, outside generate()).

Paths: `reference` (mineru-vl-utils README: load_transformers_model(path) -> dtype="auto",
+ MinerUClient(backend="transformers").two_step_extract; device_map=None instead of "auto",
which needs accelerate; the processor is docinbox's image-only Qwen2-VL processor, because
transformers' AutoProcessor needs torchvision, not installed here), `auto` (docinbox's
default precision) and `fp32`/`bf16`/`mixed`/`int8`/`bf16-int8` (MinerUEngine, text layer
off, engine.batch_size blocks per generate(), engine.decode: generate), `auto-loop` (`auto`
with engine.decode: loop, the decode loop of our own; page seconds and the loop's passes and
drafts, no per-phase split), `textlayer` (the defaults a user gets:
precision auto, text_layer auto), `llama-cpp` (MinerU 4's mineru-llama-cpp engine on the
Q8_0 GGUF pair of the same random model, in bench/.venv-llama; bench/llama_child.py) and
`document`, `document-batched` (realistic only).

    python bench/make_model.py          # once
    python bench/make_gguf.py           # once, for llama-cpp
    python bench/bench_mineru.py --realistic --out ~/.cache/docinbox-bench/realistic.json
    python bench/bench_mineru.py --report ~/.cache/docinbox-bench/realistic.json

Results: a JSON file (per path: timings, per-generate-call details, RSS, load info, and
on the MinerUEngine paths the page estimate the worker would show, timed the worker's way
on the loaded model before the page: `estimate_seconds`, held against `page_seconds`) and
Markdown tables on stdout. `--token-scale 0.05` shrinks every forced count for a smoke run.
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
CACHE = Path("~/.cache/docinbox-bench").expanduser()
DEFAULT_MODEL = CACHE / "mineru2.5-shape"
DEFAULT_GGUF = CACHE / "mineru2.5-shape-gguf"
DEFAULT_PDF = REPO.parent / "shared" / "corpus" / "pdf" / "docling__2305.03393v1-pg9.pdf"
DEFAULT_OUT = CACHE / "results.json"
LLAMA_PYTHON = BENCH / ".venv-llama" / "bin" / "python"
PRECISION_PATHS = ("auto", "fp32", "bf16", "mixed", "int8", "bf16-int8")
DOCUMENT_PATHS = ("document", "document-batched")
# `auto` with engine.decode: loop (the decode loop of our own); every other docinbox path
# keeps engine.decode: generate, so its figures stay comparable with the earlier runs' and
# its phases (vision, prefill, decode: timed around generate()) stay measured.
LOOP_PATH = "auto-loop"
# `auto-loop` whose blocks are drafted: a first parse records each block's own output, the
# timed one drafts it corrupted to the page's OCR CER (bench/drafted_page.py).
DRAFTED_PATH = "auto-drafted"
ALL_PATHS = (
    "reference", *PRECISION_PATHS, LOOP_PATH, DRAFTED_PATH, "textlayer", "llama-cpp",
    *DOCUMENT_PATHS,
)  # fmt: skip
FORCED_PATHS = ("auto", "reference", "int8", "bf16-int8", "mixed", "bf16", "fp32", "textlayer")
REALISTIC_PATHS = (
    "auto", LOOP_PATH, "reference", "llama-cpp", "textlayer", "document", "document-batched",
    "int8", "bf16-int8", "bf16", "mixed", "fp32",
)  # fmt: skip

# The fixed layout of the default mode (MinerU's format: boxes in 0..1000 of the page). Boxes
# sit on the real regions of docling__2305.03393v1-pg9.pdf: a section title, a paragraph, the
# table, a paragraph. With text_layer auto, three are text-like and come from the PDF.
FIXED_LAYOUT_BLOCKS = (
    ("title", (218, 207, 524, 229)),
    ("text", (218, 229, 788, 325)),
    ("table", (230, 425, 772, 595)),
    ("text", (218, 656, 788, 843)),
)


def fixed_plan(pdf: Path, n_layout: int, m_block: int) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from bench.realistic import layout_string

    return {
        "pdf": str(pdf),
        "page_idx": 0,
        "blocks": [
            {"type": kind, "bbox": list(box), "text": "", "tokens": m_block}
            for kind, box in FIXED_LAYOUT_BLOCKS
        ],
        "layout": layout_string(list(FIXED_LAYOUT_BLOCKS)),
        "layout_tokens": n_layout,
        "counted_with": "fixed",
    }


# ----------------------------------------------------------------------------- child side


def _rss_mb() -> dict[str, float]:
    import psutil

    return {
        "rss_now_mb": round(psutil.Process().memory_info().rss / 2**20, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _engine_config(spec: dict[str, Any], precision: str, text_layer: str, **extra: Any) -> Any:
    from daemon.config.settings import EngineConfig

    plan = spec["plan"]
    return EngineConfig(
        model=spec["model"],
        precision=precision,  # type: ignore[arg-type]
        threads=spec.get("threads", 0),
        text_layer=text_layer,  # type: ignore[arg-type]
        batch_size=spec.get("batch_size", 8),
        # Caps at least the planned counts: the plan, not the cap, ends each call.
        max_new_tokens_layout=max(plan["layout_tokens"], 2),
        max_new_tokens_block=max([b["tokens"] for b in plan["blocks"]] + [2]),
        **extra,
    )


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One path in this (fresh) process. Returns the result record."""
    spawn_wall: float = spec["spawn_wall"]
    t_import = time.monotonic()
    import torch
    from PIL import Image

    sys.path.insert(0, str(REPO))
    from bench.bench_engine import instrument, plan_probe
    from daemon.document.page import PageInput, PageOptions, TextLayer

    import_seconds = time.monotonic() - t_import
    path: str = spec["path"]
    if path in DOCUMENT_PATHS:
        return document_child(spec, import_seconds)
    model_dir: str = spec["model"]
    image = Image.open(spec["image"]).convert("RGB")
    image.load()
    pdf = Path(spec["pdf"]) if spec.get("pdf") else None
    probe = plan_probe(spec["plan"], 32, spec.get("token_scale", 1.0))
    record: dict[str, Any] = {"path": path, "import_seconds": round(import_seconds, 2)}

    if path == "reference":
        from mineru_vl_utils import MinerUClient
        from mineru_vl_utils.transformers_loading import load_transformers_model

        from daemon.engines.mineru.runtimes.transformers_model import load_processor

        t_load = time.monotonic()
        # mineru-vl-utils' README loader (dtype="auto", its tie_word_embeddings fix).
        # device_map=None instead of the README's "auto": "auto" needs `accelerate`, and
        # on a machine without a GPU it places everything on the CPU anyway.
        model: Any = load_transformers_model(model_dir, device_map=None)
        # transformers' AutoProcessor would need torchvision: docinbox's image-only one.
        processor = load_processor(Path(model_dir))
        client: Any = MinerUClient(
            backend="transformers", model=model, processor=processor, use_tqdm=False
        )
        record["load_seconds"] = round(time.monotonic() - t_load, 2)
        ready_wall = time.time()
        record["dtype_vision"] = str(model.model.visual.dtype).removeprefix("torch.")
        record["dtype_decoder"] = str(model.model.language_model.dtype).removeprefix("torch.")
        record["threads"] = torch.get_num_threads()
        record["batch_size"] = 1  # the README's client: batch_size 0 = one block per call
        record["after_load"] = _rss_mb()
        instrument(model, client.helper, probe, client=client.client)
        t0 = time.monotonic()
        cpu0 = time.process_time()
        extracted = client.two_step_extract(image)
        t1 = time.monotonic()
        cpu1 = time.process_time()
        record["blocks_out"] = len(extracted)
    else:
        from daemon.engines.mineru.engine import MinerUEngine

        # textlayer: what a user gets by default (precision auto, text_layer auto)
        precision = "auto" if path in ("textlayer", LOOP_PATH, DRAFTED_PATH) else path
        text_layer: TextLayer = "auto" if path == "textlayer" else "off"
        decode = "loop" if path in (LOOP_PATH, DRAFTED_PATH) else "generate"
        engine = MinerUEngine(_engine_config(spec, precision, text_layer, decode=decode))
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
        record["batch_size"] = info.details.get("batch_size")
        record["after_load"] = _rss_mb()
        record.update(engine_estimate(engine))
        local: Any = engine.runtime  # the transformers runtime: its client and generator
        client = local.client
        instrument(client.client.model, client.helper, probe, generator=local.generator)
        if local.loop is not None:
            # The plan's counts, as generate()'s min_new_tokens forces them: rows end at
            # their cap (the forced count), never at an end-of-turn. The loop's own passes
            # and drafts are in page_info (decode_passes, draft_proposed, draft_accepted);
            # instrument() times its phases (joins = prefill, passes = decode).
            local.loop.eos_ids = set()
        page = PageInput(
            image=image,
            page_idx=spec.get("page_idx", 0),
            page_count=spec.get("page_count", 1),
            dpi=spec.get("dpi"),
            pdf_path=pdf,
        )
        cfg = engine.config
        options = PageOptions(
            text_layer=text_layer,
            max_new_tokens_layout=cfg.max_new_tokens_layout,
            max_new_tokens_block=cfg.max_new_tokens_block,
        )
        if path == DRAFTED_PATH:
            from bench.drafted_page import drafted_first_run

            record["drafted"] = drafted_first_run(
                lambda: engine.parse_page(page, options, lambda *_a: None),
                probe, local.loop, image, spec,
            )  # fmt: skip
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
    record.update(phases(record["calls"], record["page_seconds"]))
    record["end"] = _rss_mb()
    record["peak_rss_mb"] = record["end"]["peak_rss_mb"]
    return record


def engine_estimate(engine: Any) -> dict[str, Any]:
    """The page estimate the worker would show for this engine (daemon/common/estimate.py),
    timed the worker's way on the loaded model, before the page: at token scale 1 and
    text_layer off it is the figure to hold against the measured page seconds (±30 %)."""
    from daemon.common.estimate import page_breakdown

    t_probe = time.monotonic()
    timings = engine.time_passes()
    probe_seconds = round(time.monotonic() - t_probe, 2)
    if timings is None:
        return {}
    cfg = engine.config
    parts = page_breakdown(timings, cfg.batch_size, cfg.decode)
    return {
        "estimate_seconds": round(parts.total, 1),
        "estimate": {
            "vision_seconds": round(parts.vision, 1),
            "prefill_seconds": round(parts.prefill, 1),
            "layout_decode_seconds": round(parts.layout_decode, 1),
            "block_decode_seconds": round(parts.block_decode, 1),
            "probe_seconds": probe_seconds,
            "timings": timings.to_json(),
        },
    }


def phases(calls: list[dict[str, Any]], page_seconds: float) -> dict[str, Any]:
    """Where one page's time went: vision, LM prefill, decode, outside generate()."""
    vision = sum(c["vision_seconds"] for c in calls)
    prefill = sum(c["prefill_seconds"] for c in calls) - vision
    decode = sum(c["decode_seconds"] for c in calls)
    inside = sum(c["total_seconds"] for c in calls)
    steps = [c for c in calls if c["phase"] == "block"]
    layout = [c for c in calls if c["phase"] == "layout"]
    return {
        "vision_seconds": round(vision, 2),
        "prefill_seconds": round(prefill, 2),
        "decode_seconds": round(decode, 2),
        # Cropping, pre-/post-processing, token bookkeeping: the model is idle meanwhile.
        "outside_generate_seconds": round(page_seconds - inside, 2),
        "model_blocks": sum(c["rows"] for c in steps),
        "block_calls": len(steps),
        "decode_tokens": sum(sum(c["forced_tokens"]) for c in calls),
        "layout_decode_ms_per_step": _ms_per_step(layout),
        "block_decode_ms_per_step": _ms_per_step(steps),
    }


def _ms_per_step(calls: list[dict[str, Any]]) -> float | None:
    # The first new token comes out of the prefill; decode steps are the remaining ones.
    steps = sum(max(c["decode_steps"] - 1, 0) for c in calls)
    seconds = sum(c["decode_seconds"] for c in calls)
    return round(1000 * seconds / steps, 1) if steps else None


def document_child(spec: dict[str, Any], import_seconds: float) -> dict[str, Any]:
    """Multi-page PDFs through the real supervisor and worker (`docinbox parse`'s code).

    `document`: engine.page_batch 1 (one page at a time in the engine, the next one rendered
    ahead); `document-batched`: the default page_batch (several pages' model steps share
    generate() calls). One fresh worker per document, so its load is not in the per-page
    figures: seconds per page = from the first page's start in the engine to the last
    page's end, over the pages.
    """

    from daemon.config.settings import EngineConfig

    path: str = spec["path"]
    page_batch = 1 if path == "document" else spec.get("page_batch") or EngineConfig().page_batch
    record: dict[str, Any] = {
        "path": path,
        "page_batch": page_batch,
        "import_seconds": round(import_seconds, 2),
        "documents": [],
    }
    for n, doc in enumerate(spec["documents"]):
        record["documents"].append(_one_document(spec, doc, page_batch, n))
    # ru_maxrss of the largest finished child: a worker process.
    record["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    return record


def _one_document(
    spec: dict[str, Any], doc: dict[str, Any], page_batch: int, n: int
) -> dict[str, Any]:
    import dataclasses
    import tempfile

    from daemon.cli.parse import parse_files
    from daemon.config.settings import Config

    stem = Path(spec["result_path"]).with_suffix("")
    logs = stem.with_name(f"{stem.name}.doc{n}.pages.jsonl")
    logs.unlink(missing_ok=True)
    plans = stem.with_name(f"{stem.name}.doc{n}.plans.json")
    plans.write_text(json.dumps(doc["plans"]))
    # The worker is spawned: it finds the plugin engine through PYTHONPATH.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(BENCH)])
    options = {"plans": str(plans), "log": str(logs), "token_scale": spec.get("token_scale", 1.0)}
    biggest = {
        "layout_tokens": max(p["layout_tokens"] for p in doc["plans"]),
        "blocks": [b for p in doc["plans"] for b in p["blocks"]],
    }
    # generate(): the worker's forcing and per-call timings are generate()'s (see LOOP_PATH).
    engine = _engine_config(
        {**spec, "plan": biggest}, "auto", "off", options=options, decode="generate"
    )
    engine = dataclasses.replace(
        engine,
        name="bench_engine:BenchMinerU",
        fallback_engine=None,
        page_batch=page_batch,
        dpi=spec.get("dpi") or 200,  # --dpi: the render of every page, as of the single page
    )
    with tempfile.TemporaryDirectory(prefix="bench-doc-") as tmp:
        t = Path(tmp)
        cfg = Config(
            inboxes=(),
            outbox=t / "out",
            archive=t / "a",
            failed=t / "f",
            duplicates=t / "d",
            state_dir=t / "s",
            engine=engine,
        )
        t0 = time.monotonic()
        code = parse_files([Path(doc["document"])], t / "out", cfg)
        t1 = time.monotonic()
    pages = [json.loads(line) for line in logs.read_text().splitlines()] if logs.is_file() else []
    pages.sort(key=lambda p: p["page_idx"])
    calls = [c for p in pages for c in p["calls"]]
    out: dict[str, Any] = {
        "document": doc["document"],
        "page_count": len(doc["plans"]),
        "exit_code": int(code),
        "wall_seconds": round(t1 - t0, 2),
        "pages": [],
    }
    for page in pages:
        out["pages"].append(
            {
                "page_idx": page["page_idx"],
                "in_engine_seconds": round(page["ended"] - page["started"], 2),
                "calls_logged": len(page["calls"]),
            }
        )
    if pages:
        first = min(p["started"] for p in pages)
        span = max(p["ended"] for p in pages) - first
        out["first_page_start_after_seconds"] = round(first - t0, 2)
        out["span_seconds"] = round(span, 2)
        out["seconds_per_page"] = round(span / len(pages), 2)
        # Where the span went, over every generate() call of the document.
        out.update(phases(calls, span))
        inside = sum(c["total_seconds"] for c in calls)
        out["model_busy_fraction"] = round(inside / span, 4) if span else None
        layout = [c for c in calls if c["phase"] == "layout"]
        blocks = [c for c in calls if c["phase"] == "block"]
        out["layout_calls"] = len(layout)
        out["layout_rows"] = sum(c["rows"] for c in layout)
        out["block_calls"] = len(blocks)
        out["block_rows"] = sum(c["rows"] for c in blocks)
        out["calls_with_several_pages"] = sum(len(set(c.get("pages") or [])) > 1 for c in calls)
    return out


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
    from daemon.engines.mineru.runtimes.transformers_model import auto_precision, cpu_flags

    flags = cpu_flags()
    facts["flags"] = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c")))
    facts["auto_precision"] = auto_precision(flags)
    import psutil

    facts["mem_total_gb"] = round(psutil.virtual_memory().total / 2**30, 1)
    try:
        import torch
        import transformers

        from daemon.engines.mineru.runtimes.transformers_model import isa_caps

        facts["torch"] = torch.__version__
        facts["transformers"] = transformers.__version__
        # What torch really uses: ISA caps (ATen's, oneDNN's, MKL's) reproduce an older
        # CPU on a newer one.
        facts["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        facts["isa_caps"] = isa_caps()
    except ImportError:
        pass
    return facts


def prepare_page(pdf: Path, page_idx: int, dpi: int, cache: Path) -> dict[str, Any]:
    """Render the page once (PNG) so every path gets identical pixels."""
    sys.path.insert(0, str(REPO))
    cache.mkdir(parents=True, exist_ok=True)
    from daemon.config.settings import LimitsConfig
    from daemon.input.raster import render_page
    from daemon.input.sniff import inspect

    limits = LimitsConfig()
    info = inspect(pdf, passwords=(), limits=limits)
    page = render_page(
        pdf, info, page_idx, dpi=dpi, max_long_side=4000, max_image_pixels=limits.max_image_pixels
    )
    target = cache / f"{pdf.stem}-p{page_idx + 1}-{dpi}dpi.png"
    page.image.save(target)
    return {
        "image": str(target),
        "pdf": str(pdf),
        "page_idx": page_idx,
        "page_count": info.page_count,
        "dpi": dpi,
        "size": list(page.image.size),
    }


def warm_cache(*folders: Path) -> None:
    """Read the weights once so every path's cold start is from a warm page cache."""
    for folder in folders:
        for weights in [*folder.glob("*.safetensors"), *folder.glob("*.gguf")]:
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
    if path == "llama-cpp":
        spec_file = logs / "llama-cpp.spec.json"
        spec_file.write_text(json.dumps(spec))
        cmd = [str(LLAMA_PYTHON), str(BENCH / "llama_child.py"), str(spec_file), str(result_file)]
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    with (logs / f"{path}.log").open("w") as log:
        try:
            proc = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False
            )
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            returncode = -1
    wall = time.time() - spec["spawn_wall"]
    if returncode != 0 or not result_file.is_file():
        return {"path": path, "error": f"exit {returncode}, see {logs / (path + '.log')}"}
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


def _ratio(record: dict[str, Any], other: dict[str, Any] | None) -> str:
    if not other or not other.get("page_seconds"):
        return "–"
    return f"{record['page_seconds'] / other['page_seconds']:.2f}×"


def markdown(results: dict[str, Any]) -> str:
    paths = [r for r in results["paths"] if "error" not in r and r["path"] not in DOCUMENT_PATHS]
    ref = next((r for r in paths if r["path"] == "reference"), None)
    llama = next((r for r in paths if r["path"] == "llama-cpp"), None)
    m = results.get("machine", {})
    settings = results.get("settings", {})
    plan = settings.get("plan", {})
    lines = [
        f"machine: {m.get('Model name', '?')}, {m.get('cpu_count', '?')} CPUs, torch kernels "
        f"{m.get('torch_cpu_capability', '?')}"
        + (f" (capped: {m['isa_caps']})" if m.get("isa_caps") else "")
        + f", precision auto -> {m.get('auto_precision', '?')}",
        f"page: {Path(plan.get('pdf', '?')).name} p{plan.get('page_idx', 0) + 1}, "
        f"{len(plan.get('blocks', []))} layout blocks, layout {plan.get('layout_tokens')} "
        f"tokens, blocks {sum(b['tokens'] for b in plan.get('blocks', []))} tokens "
        f"(counted with {plan.get('counted_with')}), token scale "
        f"{settings.get('token_scale', 1.0)}",
        "",
        "| path | vision / decoder | batch | cold start s | layout s | recognition s | page s "
        "| vs reference | vs llama-cpp | vision s | LM prefill s | decode s | outside generate s "
        "| block decode ms/step | peak RSS MB | CPU/wall | load avg |",
        "|" + "---|" * 17,
    ]
    for r in paths:
        if r["path"] == "llama-cpp":
            # Four slots run concurrently: per-call sums exceed the wall time.
            prompt = sum((c["prompt_ms"] or 0) for c in r["calls"]) / 1000
            decode = sum((c["decode_ms"] or 0) for c in r["calls"]) / 1000
            detail = f"| (in prefill) | {_fmt(prompt)} Σslots | {_fmt(decode)} Σslots | – | – "
            batch = f"{r.get('n_parallel')} slots"
        else:
            detail = (
                f"| {_fmt(r['vision_seconds'])} | {_fmt(r['prefill_seconds'])} "
                f"| {_fmt(r['decode_seconds'])} | {_fmt(r['outside_generate_seconds'])} "
                f"| {_fmt(r['block_decode_ms_per_step'])} "
            )
            batch = str(r.get("batch_size"))
        lines.append(
            f"| {r['path']} | {r['dtype_vision']} / {r['dtype_decoder']} | {batch} "
            f"| {_fmt(r['cold_start_seconds'])} | {_fmt(r['layout_seconds'])} "
            f"| {_fmt(r['recognition_seconds'])} | {_fmt(r['page_seconds'])} "
            f"| {_ratio(r, ref)} | {_ratio(r, llama)} {detail}"
            f"| {_fmt(r['peak_rss_mb'])} | {_fmt(r.get('page_cpu_per_wall'))} | {_load(r)} |"
        )
    for r in results["paths"]:
        if "error" in r:
            lines.append(f"| {r['path']} | FAILED: {r['error']} |")
    textlayer = next((r for r in paths if r["path"] == "textlayer"), None)
    auto = next((r for r in paths if r["path"] == "auto"), None)
    if textlayer and auto:
        lines += [
            "",
            "| precision auto, text_layer | model blocks | text-layer blocks | recognition s "
            "| page s | vs reference |",
            "|---|---|---|---|---|---|",
        ]
        for label, r in (("off", auto), ("auto", textlayer)):
            info = r.get("page_info", {})
            lines.append(
                f"| {label} | {r['model_blocks']} | {info.get('text_layer_blocks', 0)} "
                f"| {_fmt(r['recognition_seconds'])} | {_fmt(r['page_seconds'])} "
                f"| {_ratio(r, ref)} |"
            )
    lines += estimate_table(paths, settings.get("token_scale", 1.0), plan)
    sys.path.insert(0, str(REPO))  # --report runs no child: bench/ is not importable yet
    from bench.drafted_page import drafted_table

    lines += drafted_table(paths)
    docs = [r for r in results["paths"] if r["path"] in DOCUMENT_PATHS and "documents" in r]
    if docs:
        unbatched = {
            d["document"]: d
            for r in docs
            if r["path"] == "document"
            for d in r["documents"]
            if d.get("seconds_per_page")
        }
        lines += [
            "",
            "documents through supervisor + worker (precision auto, text_layer off; seconds per "
            "page = first page in the engine -> last page out, over the pages; model load not "
            "included):",
            "",
            "| path | page_batch | document | pages | s/page | vs document | vision s "
            "| LM prefill s | decode s | outside generate s | layout calls (rows) "
            "| block calls (rows) | calls with several pages | worker peak RSS MB | load avg |",
            "|" + "---|" * 15,
        ]
        for r in docs:
            for d in r["documents"]:
                if not d.get("seconds_per_page"):
                    lines.append(f"| {r['path']} | FAILED: exit {d.get('exit_code')} |")
                    continue
                base = unbatched.get(d["document"])
                ratio = (
                    f"{d['seconds_per_page'] / base['seconds_per_page']:.2f}×" if base else "–"
                )
                lines.append(
                    f"| {r['path']} | {r['page_batch']} | {Path(d['document']).name} "
                    f"| {d['page_count']} | {_fmt(d['seconds_per_page'])} | {ratio} "
                    f"| {_fmt(d['vision_seconds'])} | {_fmt(d['prefill_seconds'])} "
                    f"| {_fmt(d['decode_seconds'])} | {_fmt(d['outside_generate_seconds'])} "
                    f"| {d['layout_calls']} ({d['layout_rows']}) "
                    f"| {d['block_calls']} ({d['block_rows']}) | {d['calls_with_several_pages']} "
                    f"| {_fmt(r['peak_rss_mb'])} | {_load(r)} |"
                )
    return "\n".join(lines)


def estimate_table(
    paths: list[dict[str, Any]], token_scale: float, plan: dict[str, Any]
) -> list[str]:
    """The estimate the worker would show (typical page, timed before the page) next to the
    page measured: the goal is within ±30 % on the realistic page, text_layer off."""
    from daemon.common.estimate import TYPICAL_PAGE

    rows = [r for r in paths if r.get("estimate_seconds")]
    if not rows:
        return []
    tokens = tuple(b["tokens"] for b in plan.get("blocks", []) if b["tokens"])
    typical = (plan.get("layout_tokens"), tokens) == (
        TYPICAL_PAGE.layout_tokens, TYPICAL_PAGE.block_tokens
    )
    lines = [
        "",
        "page estimate (daemon/common/estimate.py typical page, "
        + ("= this page" if typical else "NOT this page: not comparable")
        + "; timed on the loaded model before the page) against the page measured"
        + ("" if token_scale == 1.0 else f" (token scale {token_scale}: not comparable)")
        + ":",
        "",
        "| path | estimate s | page s | estimate / page | est. vision s | vision s "
        "| est. prefill s | LM prefill s | est. decode s | decode s | timing s |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        est = r["estimate"]
        ratio = r["estimate_seconds"] / r["page_seconds"] if r.get("page_seconds") else None
        note = " (text layer on)" if r["path"] == "textlayer" else ""
        decode = est["layout_decode_seconds"] + est["block_decode_seconds"]
        lines.append(
            f"| {r['path']}{note} | {_fmt(r['estimate_seconds'])} | {_fmt(r['page_seconds'])} "
            f"| {f'{ratio:.2f}×' if ratio else '–'} | {_fmt(est['vision_seconds'])} "
            f"| {_fmt(r.get('vision_seconds'))} | {_fmt(est['prefill_seconds'])} "
            f"| {_fmt(r.get('prefill_seconds'))} | {_fmt(decode)} "
            f"| {_fmt(r.get('decode_seconds'))} | {_fmt(est['probe_seconds'])} |"
        )
    return lines


def build_plans(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from bench import realistic

    if not args.realistic:
        pdf = args.pdf or DEFAULT_PDF
        return {
            "pdf": pdf,
            "page_idx": 0,
            "plan": fixed_plan(pdf, args.layout_tokens, args.block_tokens),
        }
    count = realistic.counter(model_dir, CACHE / "qwen-tokenizer")
    pdf = args.pdf or realistic.DEFAULT_PAGE[0]
    page_idx = args.page - 1 if args.page else realistic.DEFAULT_PAGE[1]
    plans: dict[str, Any] = {
        "pdf": pdf,
        "page_idx": page_idx,
        "plan": realistic.page_plan(pdf, page_idx, count).as_dict(),
    }
    import pypdfium2 as pdfium

    documents: list[Path] = args.document or realistic.default_documents(CACHE)
    plans["documents"] = [
        {
            "document": str(document),
            "plans": [
                realistic.page_plan(document, i, count).as_dict()
                for i in range(len(pdfium.PdfDocument(str(document))))
            ],
        }
        for document in documents
    ]
    return plans


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument(
        "--report",
        type=Path,
        nargs="+",
        help="print the tables of results files (or per-path records), run nothing",
    )
    parser.add_argument("--realistic", action="store_true", help="a real page's work (above)")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--gguf", type=Path, default=DEFAULT_GGUF, help="make_gguf.py's folder")
    parser.add_argument("--pdf", type=Path, help="the page's PDF")
    parser.add_argument("--page", type=int, help="1-based page of --pdf")
    parser.add_argument(
        "--document",
        type=Path,
        action="append",
        help="realistic: a multi-page PDF for the document paths (repeat; default: the 4-page "
        "and the 12-page document of bench/realistic.py)",
    )
    parser.add_argument("--dpi", type=int, default=200)
    parser.add_argument("--layout-tokens", type=int, default=64, help="forced mode: N")
    parser.add_argument("--block-tokens", type=int, default=32, help="forced mode: M per block")
    parser.add_argument("--token-scale", type=float, default=1.0, help="< 1: smoke runs only")
    parser.add_argument("--threads", type=int, default=0, help="engine threads (0 = cores)")
    parser.add_argument("--batch-size", type=int, default=8, help="engine.batch_size")
    parser.add_argument(
        "--page-batch",
        type=int,
        help="document-batched: engine.page_batch (default: the config default)",
    )
    parser.add_argument("--paths", help="comma-separated, in order (default: per mode)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--timeout", type=float, default=5400.0, help="per path, seconds")
    args = parser.parse_args(argv)

    if args.report:
        merged = merge(args.report)
        print(markdown(merged))
        return 0
    if args.child:
        spec = json.loads(args.child)
        record = child(spec)
        Path(spec["result_path"]).write_text(json.dumps(record, indent=2))
        return 0

    default = REALISTIC_PATHS if args.realistic else FORCED_PATHS
    paths = [p.strip() for p in (args.paths or ",".join(default)).split(",") if p.strip()]
    unknown = set(paths) - set(ALL_PATHS)
    if unknown:
        parser.error(f"unknown paths {sorted(unknown)} (known: {', '.join(ALL_PATHS)})")
    if set(paths) & set(DOCUMENT_PATHS) and not args.realistic:
        parser.error("the document paths need --realistic")
    sys.path.insert(0, str(REPO))
    from daemon.engines.mineru.runtimes.transformers_model import auto_precision

    if "auto" in paths and auto_precision() in paths:
        # The same configuration twice: keep `auto`, the name the target is stated in.
        print(f"{auto_precision()}: skipped, it is what auto picks here", flush=True)
        paths.remove(auto_precision())
    model_dir: Path = args.model.expanduser().resolve()
    gguf_dir: Path = args.gguf.expanduser().resolve()
    ggufs = sorted(gguf_dir.glob("*-Q8_0.gguf"))
    main_gguf = next((g for g in ggufs if not g.name.startswith("mmproj-")), None)
    mmproj = next((g for g in ggufs if g.name.startswith("mmproj-")), None)
    if "llama-cpp" in paths and not (main_gguf and mmproj and LLAMA_PYTHON.is_file()):
        print(
            f"llama-cpp: skipped (needs {LLAMA_PYTHON} and the Q8_0 pair in {gguf_dir}: see "
            "docs/benchmarks.md)",
            flush=True,
        )
        paths.remove("llama-cpp")
    out: Path = args.out.expanduser()
    logs = out.parent / (out.stem + "-logs")
    logs.mkdir(parents=True, exist_ok=True)
    plans = build_plans(args, model_dir)
    page = prepare_page(plans["pdf"], plans["page_idx"], args.dpi, out.parent)
    # Still in /proc/self/environ of the children: the ISA caps apply to every path.
    warm_cache(model_dir, gguf_dir)
    base = {
        "model": str(model_dir),
        "gguf": str(main_gguf),
        "mmproj": str(mmproj),
        "threads": args.threads,
        "batch_size": args.batch_size,
        "page_batch": args.page_batch,
        "token_scale": args.token_scale,
        "plan": plans["plan"],
        "documents": plans.get("documents", []),
        **page,
    }
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_facts(),
        "settings": {
            "model": str(model_dir),
            "realistic": args.realistic,
            "plan": plans["plan"],
            "documents": plans.get("documents", []),
            "token_scale": args.token_scale,
            "batch_size": args.batch_size,
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
        summary = record.get("error") or (
            f"page {record['page_seconds']}s"
            if "page_seconds" in record
            else ", ".join(
                f"{Path(d['document']).name} {d.get('seconds_per_page')} s/page"
                for d in record.get("documents", [])
            )
        )
        print(f"[{time.strftime('%H:%M:%S')}] {path}: {summary}", flush=True)
    print()
    print(markdown(results))
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
