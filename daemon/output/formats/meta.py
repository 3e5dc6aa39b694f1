"""`<stem>.meta.json`: docinbox's provenance record of one finished document."""

from __future__ import annotations

from collections.abc import Sequence

from daemon import __version__
from daemon.document.page import EngineInfo, Json
from daemon.document.record import PageRecord
from daemon.jobs.store import Job
from daemon.output.formats.content_list import bbox_1000


def document_meta(
    job: Job,
    pages: Sequence[PageRecord],
    engine: EngineInfo | None,
    *,
    original_paths: list[str],
    configured_engine: str,
    processed_at: str,
) -> dict[str, Json]:
    """The meta record of `job` from its stored pages (`Store.pages`); `engine` is the
    one the worker loaded (None: none reported)."""
    sources: dict[str, int] = {}
    for p in pages:
        for b in p.blocks:
            sources[b.source] = sources.get(b.source, 0) + 1
    engines_used = sorted({p.engine for p in pages})
    details = engine.details if engine is not None else {}
    return {
        "sha256": job.sha256,
        "original_path": job.source_path,
        "original_paths": list(original_paths),
        "size": job.size,
        "job_id": job.id,
        "engine": {
            "name": engine.name if engine is not None else None,
            "model_id": engine.model_id if engine is not None else None,
            "revision": engine.revision if engine is not None else None,
            "precision": engine.precision if engine is not None else None,
            # Where generation ran (engine.runtime) and, for `http`, which server and
            # served model: results from different runtimes can then be told apart.
            "runtime": details.get("runtime"),
            "server": details.get("server"),
            "model": details.get("model"),
            "engines_used_per_page": list(engines_used),
        },
        # True when any page was done by another engine than the configured one (all of
        # them at start-up, or the rest of a document after its engine went away midway).
        "fallback": any(e != configured_engine for e in engines_used),
        "page_count": len(pages),
        "seconds_per_page": [round(float(p.seconds), 3) for p in pages],
        "block_sources": dict(sources),
        "pages": [
            {
                "page_idx": p.page_idx,
                "engine": p.engine,
                **p.info,
                # Which block came from where, in the page's reading order (the order of
                # content_list.json): the PDF text layer, OCR or the model.
                "blocks": [
                    {"type": b.type, "bbox": list(bbox_1000(b.bbox)), "source": b.source}
                    for b in p.blocks
                ],
            }
            for p in pages
        ],
        "docinbox_version": __version__,
        "processed_at": processed_at,
    }
