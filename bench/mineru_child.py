"""The child side of `bench_mineru.py`: one path in a fresh process (`--child SPEC`), so cold
start and peak RSS are the path's own. A page path loads its model (mineru-vl-utils' README
loader for `reference`, `MinerUEngine` for the others), forces the plan's token counts
(bench_engine.py) and times the page; a document path runs whole PDFs through the real
supervisor and worker (`docinbox parse`'s code). Each returns the JSON record the parent
keeps.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.mineru_paths import (
    BENCH,
    DOCUMENT_PATHS,
    DRAFTED_PATH,
    LATE_PATH,
    LOOP_PATH,
    REPO,
)


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


@dataclass(frozen=True)
class _Timed:
    """When the model was ready (wall), and the page's wall and CPU clocks around it."""

    ready_wall: float
    t0: float
    t1: float
    cpu0: float
    cpu1: float


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One path in this (fresh) process. Returns the result record."""
    spawn_wall: float = spec["spawn_wall"]
    t_import = time.monotonic()
    # Timed as the path's import seconds: torch, Pillow, the probe and docinbox's page types.
    import torch  # noqa: F401
    from PIL import Image

    import daemon.document.page  # noqa: F401
    from bench.bench_engine import plan_probe

    import_seconds = time.monotonic() - t_import
    path: str = spec["path"]
    if path in DOCUMENT_PATHS:
        return document_child(spec, import_seconds)
    image = Image.open(spec["image"]).convert("RGB")
    image.load()
    probe = plan_probe(spec["plan"], 32, spec.get("token_scale", 1.0))
    record: dict[str, Any] = {"path": path, "import_seconds": round(import_seconds, 2)}
    if path == "reference":
        timed = _reference_page(spec, image, probe, record)
    else:
        timed = _engine_page(spec, image, probe, record)
    t0, t1 = timed.t0, timed.t1
    record["cold_start_seconds"] = round(timed.ready_wall - spawn_wall, 2)
    record["layout_seconds"] = round(probe.layout_parsed_at - t0, 2)
    record["recognition_seconds"] = round(t1 - probe.layout_parsed_at, 2)
    record["page_seconds"] = round(t1 - t0, 2)
    # CPU seconds of all threads / wall: ~threads when the cores were ours alone.
    record["page_cpu_seconds"] = round(timed.cpu1 - timed.cpu0, 2)
    record["page_cpu_per_wall"] = round((timed.cpu1 - timed.cpu0) / max(t1 - t0, 1e-9), 2)
    record["generated_layout_chars"] = probe.generated_layout_chars
    record["calls"] = [vars(c) for c in probe.calls]
    record.update(phases(record["calls"], record["page_seconds"]))
    record["end"] = _rss_mb()
    record["peak_rss_mb"] = record["end"]["peak_rss_mb"]
    return record


def _reference_page(spec: dict[str, Any], image: Any, probe: Any, record: dict[str, Any]) -> _Timed:
    """`reference`: what a user would copy from mineru-vl-utils' README."""
    import torch
    from mineru_vl_utils import MinerUClient
    from mineru_vl_utils.transformers_loading import load_transformers_model

    from bench.bench_engine import instrument
    from daemon.engines.mineru.runtimes.transformers_model import load_processor

    model_dir: str = spec["model"]
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
    return _Timed(ready_wall, t0, t1, cpu0, cpu1)


def _engine_page(spec: dict[str, Any], image: Any, probe: Any, record: dict[str, Any]) -> _Timed:
    """Every other page path: docinbox's `MinerUEngine` at the path's precision."""
    from bench.bench_engine import instrument
    from daemon.document.page import PageInput, PageOptions, TextLayer
    from daemon.engines.mineru.engine import MinerUEngine

    path: str = spec["path"]
    pdf = Path(spec["pdf"]) if spec.get("pdf") else None
    # textlayer: what a user gets by default (precision auto, text_layer auto)
    loops = (LOOP_PATH, LATE_PATH, DRAFTED_PATH)
    precision = "auto" if path in ("textlayer", *loops) else path
    if path in loops:
        precision = spec.get("loop_precision", "auto")
    text_layer: TextLayer = "auto" if path == "textlayer" else "off"
    decode = "loop" if path in loops else "generate"
    if path == LATE_PATH:
        # No block starts before the layout has ended: the loop hears no request from it.
        from daemon.engines.mineru import early_blocks

        early_blocks.EarlyBlocks.poll = lambda *_args: []  # type: ignore[method-assign]
    if spec.get("drafts") == "positions":
        # The runtime picks the scheduler only where it has a measured pass cost: without
        # one it falls back to the position budget (INT8_DRAFTS), as on other CPU classes.
        from daemon.engines.mineru.runtimes import transformers as runtime

        runtime.INT8_SCHEDULED.clear()
    record["drafts"] = spec.get("drafts", "default")
    if spec.get("packing") == "off":
        # load_model looks pack_model up at load time: this keeps every weight unpacked.
        from daemon.engines.mineru.runtimes import packed_linear

        packed_linear.pack_model = lambda *_parts: "none"
    record["packing"] = spec.get("packing", "default")
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
    return _Timed(ready_wall, t0, t1, cpu0, cpu1)


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
    batched = path.startswith("document-batched")
    page_batch = (spec.get("page_batch") or EngineConfig().page_batch) if batched else 1
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

    from bench.rss_phases import rss_summary
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
    options["rss_log"] = str(logs.with_suffix(".rss.jsonl"))  # bench/rss_phases.py
    biggest = {
        "layout_tokens": max(p["layout_tokens"] for p in doc["plans"]),
        "blocks": [b for p in doc["plans"] for b in p["blocks"]],
    }
    decode = {"decode": "generate"} if spec["path"].endswith("-generate") else {}
    engine = _engine_config({**spec, "plan": biggest}, "auto", "off", options=options, **decode)
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
        out.update(_document_span(pages, calls, t0))
        out["rss_phases"] = rss_summary(Path(options["rss_log"]))
    return out


def _document_span(
    pages: list[dict[str, Any]], calls: list[dict[str, Any]], t0: float
) -> dict[str, Any]:
    """Seconds per page (first page in the engine to last page out) and where they went."""
    first = min(p["started"] for p in pages)
    span = max(p["ended"] for p in pages) - first
    out: dict[str, Any] = {
        "first_page_start_after_seconds": round(first - t0, 2),
        "span_seconds": round(span, 2),
        "seconds_per_page": round(span / len(pages), 2),
    }
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

