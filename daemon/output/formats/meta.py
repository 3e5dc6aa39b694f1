"""`<stem>.meta.json`: docinbox's provenance record of one finished document."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from daemon import __version__
from daemon.jobs.store import Job
from daemon.output.formats.content_list import bbox_1000


def document_meta(
    job: Job,
    pages: Sequence[dict[str, Any]],
    engine: dict[str, Any],
    *,
    original_paths: list[str],
    configured_engine: str,
    processed_at: str,
) -> dict[str, Any]:
    """The meta record of `job` from its stored pages (as `Store.pages` returns them)."""
    sources: dict[str, int] = {}
    for p in pages:
        for b in p["blocks"]:
            src = str(b.get("source", "model"))
            sources[src] = sources.get(src, 0) + 1
    engines_used = sorted({str(p["engine"]) for p in pages})
    return {
        "sha256": job.sha256,
        "original_path": job.source_path,
        "original_paths": original_paths,
        "size": job.size,
        "job_id": job.id,
        "engine": {
            "name": engine.get("name"),
            "model_id": engine.get("model_id"),
            "revision": engine.get("revision"),
            "precision": engine.get("precision"),
            # Where generation ran (engine.runtime) and, for `http`, which server and
            # served model: results from different runtimes can then be told apart.
            "runtime": (engine.get("details") or {}).get("runtime"),
            "server": (engine.get("details") or {}).get("server"),
            "model": (engine.get("details") or {}).get("model"),
            "engines_used_per_page": engines_used,
        },
        # True when any page was done by another engine than the configured one (all of
        # them at start-up, or the rest of a document after its engine went away midway).
        "fallback": any(e != configured_engine for e in engines_used),
        "page_count": len(pages),
        "seconds_per_page": [round(float(p["seconds"]), 3) for p in pages],
        "block_sources": sources,
        "pages": [
            {
                "page_idx": p["page_idx"],
                "engine": p["engine"],
                **p["info"],
                # Which block came from where, in the page's reading order (the order of
                # content_list.json): the PDF text layer, OCR or the model.
                "blocks": [
                    {
                        "type": b.get("type"),
                        "bbox": bbox_1000(b.get("bbox") or ()),
                        "source": b.get("source", "model"),
                    }
                    for b in p["blocks"]
                ],
            }
            for p in pages
        ],
        "docinbox_version": __version__,
        "processed_at": processed_at,
    }
