"""The report of `bench_mineru.py`: results files (or per-path records) merged, and their
Markdown tables: every page path against `reference` and `llama-cpp` with where the time
went, text layer off against on, the page estimate against the page measured, the drafted
page (bench/drafted_page.py), and the documents through the supervisor and worker.
`--report FILE...` prints them without running anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.mineru_paths import DOCUMENT_PATHS


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
    settings = results.get("settings", {})
    plan = settings.get("plan", {})
    lines = _paths_table(results, paths)
    lines += _text_layer_table(paths)
    lines += estimate_table(paths, settings.get("token_scale", 1.0), plan)
    from bench.drafted_page import drafted_table

    lines += drafted_table(paths)
    lines += _documents_table(results)
    return "\n".join(lines)


def _paths_table(results: dict[str, Any], paths: list[dict[str, Any]]) -> list[str]:
    """The machine, the page, and one row per page path (failed paths last)."""
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
    return lines


def _text_layer_table(paths: list[dict[str, Any]]) -> list[str]:
    """Precision auto with the text layer off (`auto`) and on (`textlayer`)."""
    textlayer = next((r for r in paths if r["path"] == "textlayer"), None)
    auto = next((r for r in paths if r["path"] == "auto"), None)
    if not (textlayer and auto):
        return []
    ref = next((r for r in paths if r["path"] == "reference"), None)
    lines = [
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
    return lines


def _documents_table(results: dict[str, Any]) -> list[str]:
    """The document paths: seconds per page through the supervisor and worker."""
    docs = [r for r in results["paths"] if r["path"] in DOCUMENT_PATHS and "documents" in r]
    if not docs:
        return []
    unbatched = {  # per decode: document-batched against document, *-generate apart
        (r["path"], d["document"]): d
        for r in docs
        if "-batched" not in r["path"]
        for d in r["documents"]
        if d.get("seconds_per_page")
    }
    lines = [
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
            base = unbatched.get((r["path"].replace("-batched", ""), d["document"]))
            ratio = f"{d['seconds_per_page'] / base['seconds_per_page']:.2f}×" if base else "–"
            lines.append(
                f"| {r['path']} | {r['page_batch']} | {Path(d['document']).name} "
                f"| {d['page_count']} | {_fmt(d['seconds_per_page'])} | {ratio} "
                f"| {_fmt(d['vision_seconds'])} | {_fmt(d['prefill_seconds'])} "
                f"| {_fmt(d['decode_seconds'])} | {_fmt(d['outside_generate_seconds'])} "
                f"| {d['layout_calls']} ({d['layout_rows']}) "
                f"| {d['block_calls']} ({d['block_rows']}) | {d['calls_with_several_pages']} "
                f"| {_fmt(r['peak_rss_mb'])} | {_load(r)} |"
            )
    return lines


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

