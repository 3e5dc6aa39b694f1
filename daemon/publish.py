"""The end of the data path: a finished document's outbox folder, and its original's fate.

Order matters for crash safety: the outbox folder is written (atomically) BEFORE the
original is archived or deleted, and the job is marked done only after both. A kill at
any point leaves the job `running`; on restart it is requeued, all its pages are already
stored, and completion runs again: the same-sha256 outbox folder is replaced, the original
(if still there) archived. Never lost, never half-written, never marked done without output.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemon import __version__, output
from daemon.config import Config
from daemon.errors import FailureKind
from daemon.page import Block
from daemon.store import Job, Store

log = logging.getLogger("docinbox.publish")


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")


class Publisher:
    def __init__(self, cfg: Config, store: Store, wall: Callable[[], float]) -> None:
        self.cfg = cfg
        self.store = store
        self.wall = wall

    def meta_for(
        self, job: Job, pages: list[dict[str, Any]], engine: dict[str, Any]
    ) -> dict[str, Any]:
        sources: dict[str, int] = {}
        for p in pages:
            for b in p["blocks"]:
                src = str(b.get("source", "model"))
                sources[src] = sources.get(src, 0) + 1
        engines_used = sorted({str(p["engine"]) for p in pages})
        return {
            "sha256": job.sha256,
            "original_path": job.source_path,
            "original_paths": self.original_paths(job),
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
            "fallback": self.cfg.engine.name not in engines_used,
            "page_count": len(pages),
            "seconds_per_page": [round(float(p["seconds"]), 3) for p in pages],
            "block_sources": sources,
            "pages": [
                {
                    "page_idx": p["page_idx"],
                    **p["info"],
                    # Which block came from where, in the page's reading order (the order of
                    # content_list.json): the PDF text layer, OCR or the model.
                    "blocks": [
                        {
                            "type": b.get("type"),
                            "bbox": output.bbox_1000(b.get("bbox") or ()),
                            "source": b.get("source", "model"),
                        }
                        for b in p["blocks"]
                    ],
                }
                for p in pages
            ],
            "docinbox_version": __version__,
            "processed_at": iso(self.wall()),
        }

    def original_paths(self, job: Job) -> list[str]:
        paths = [job.source_path]
        for j in self.store.duplicates_of(job.id):
            if j.source_path not in paths:
                paths.append(j.source_path)
        return paths

    def complete(self, job: Job, engine: dict[str, Any]) -> str:
        pages = self.store.pages(job.id)
        blocks = [[Block.from_dict(b) for b in p["blocks"]] for p in pages]
        stem = Path(job.source_path).stem
        folder = output.write_document(
            self.cfg.outbox,
            job.subdir,
            stem,
            job.sha256,
            blocks,
            self.meta_for(job, pages, engine),
        )
        self._dispose_original(job)
        return str(folder)

    def _dispose_original(self, job: Job) -> None:
        src = Path(job.read_path)
        if not src.exists():
            return  # archived by an earlier completion that was interrupted, or removed
        if src.is_relative_to(self.cfg.archive):
            return  # a reprocess of an archived original: it stays where it is
        if src.is_relative_to(self.cfg.failed):
            # A retry that worked: failed/ should list only what is still failed. The
            # record of the earlier failure stays in the job's history in the database.
            output.remove_error_file(src)
        action = self.cfg.after_success
        if action == "archive":
            dest = output.move_into(src, self.cfg.archive, job.subdir)
            self.store.set_held_path(job.id, str(dest))
            log.info("job %s: original archived to %s", job.id, output.safe_display(dest))
        elif action == "delete":
            os.unlink(src)
            self.store.set_held_path(job.id, None)
        else:
            return  # keep: the (path, size, mtime) memo stops it from being taken again
        self.store.forget_source(job.source_path)

    def failed(self, job: Job, kind: str, message: str) -> None:
        src = Path(job.read_path)
        error = {
            "job_id": job.id,
            "kind": kind,
            "reason": message,
            "attempts": job.attempts,
            "sha256": job.sha256,
            "file": job.source_path,
        }
        if kind == FailureKind.VANISHED.value and not src.exists():
            log.warning(
                "job %s: %s vanished; nothing to move to failed/", job.id, output.safe_display(src)
            )
        try:
            now_size: int | None = src.stat().st_size
        except OSError:
            now_size = None
        if now_size is not None and now_size != job.size and not src.is_relative_to(
            self.cfg.failed
        ):
            # The file changed since it was hashed: a writer that paused longer than
            # stability_seconds (smbd writes in 8 MiB steps) and is still going. Moving the
            # half-written file to failed/ would break the upload; leave it, and the watcher
            # offers the finished file again as a new version.
            log.warning("job %s: %s changed since it was queued (%d -> %d bytes); left in "
                        "place to be taken again when complete", job.id,
                        output.safe_display(src), job.size, now_size)
            self.store.forget_source(job.source_path)
            return
        if src.is_relative_to(self.cfg.failed):
            # A retry that failed again: the original is already in failed/; refresh its
            # error file in place instead of moving it to "name (1).pdf".
            output.write_error_file(src, error)
            return
        dest = output.write_failure(src, self.cfg.failed, job.subdir, error)
        if src.exists() or dest.exists():
            self.store.set_held_path(job.id, str(dest))
        log.warning("job %s: %s -> %s", job.id, message, output.safe_display(dest))
        self.store.forget_source(job.source_path)
