"""What docinbox tells the next tool after each document: the event and its body.

One event per outcome: `document.done`, `document.reprocessed` (done again after
`docinbox reprocess`), `document.failed`, `document.duplicate`. The body is the same for
webhooks (the signed POST body) and command hooks (stdin, with the common fields also as
`DOCINBOX_*` environment variables). It is built just BEFORE the transaction that records
the outcome, from the files the publisher wrote (a duplicate's: its original's folder,
listed here), and handed to that transaction to be recorded with the outcome; so it is
written once and sent byte for byte as written, however often a delivery is retried, and
the transaction holding the database's write lock never waits on a share.

The shape follows the Standard Webhooks payload (`type`, `timestamp`, `data`), plus the
event's `id` (also the `webhook-id` header): a receiver deduplicates by it, because
delivery is at least once. Paths are given twice: relative to the outbox (for a consumer on
another machine that mounts the share elsewhere) and absolute (for a local script).
Failures carry the same `kind`, `reason` and `hint` as `failed/<name>.error.json` and
`docinbox status`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from daemon.common.errors import hint_for
from daemon.config.settings import Config
from daemon.jobs.store import Job, Outcome

# A document folder holds a handful of files and its crops; a book's hundreds of crops are
# listed too, but a body must stay a message, not an inventory.
MAX_FILES_LISTED = 1000


def new_event_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds").replace(
        "+00:00", "Z"
    )


@dataclass(frozen=True)
class SourceInfo:
    name: str  # the file name it arrived under
    path: str  # where it arrived (absolute)
    inbox: str
    sha256: str
    size: int
    # Where the original is now: archive/ or failed/, the inbox (`keep`), or None
    # (deleted after success, or a duplicate about to be moved by `on_duplicate`).
    original: str | None


@dataclass(frozen=True)
class OutputInfo:
    folder: str  # relative to the outbox
    path: str  # absolute
    markdown: str | None  # relative to the outbox
    content_list: str | None  # relative to the outbox
    files: tuple[str, ...]  # every file of the folder, relative to the outbox


@dataclass(frozen=True)
class FailureInfo:
    kind: str
    reason: str
    hint: str


@dataclass(frozen=True)
class DocumentEvent:
    id: str
    type: str
    timestamp: float
    job_id: int
    source: SourceInfo
    output: OutputInfo | None  # done and reprocessed; a duplicate: its original's
    pages: int | None  # in the document
    pages_done: int  # converted (fewer when engine.pages picks some)
    engine: str | None
    runtime: str | None  # mineru's engine.runtime; None for other engines
    seconds: float | None  # converting, for done and reprocessed
    error: FailureInfo | None
    duplicate_of: int | None

    def to_json(self) -> dict[str, Any]:
        s, o, e = self.source, self.output, self.error
        return {
            "id": self.id,
            "type": self.type,
            "timestamp": iso(self.timestamp),
            "data": {
                "job_id": self.job_id,
                "source": {
                    "name": s.name, "path": s.path, "inbox": s.inbox, "sha256": s.sha256,
                    "size": s.size, "original": s.original,
                },
                "output": None if o is None else {
                    "folder": o.folder, "path": o.path, "markdown": o.markdown,
                    "content_list": o.content_list, "files": list(o.files),
                },
                "pages": self.pages,
                "pages_done": self.pages_done,
                "engine": self.engine,
                "runtime": self.runtime,
                "seconds": self.seconds,
                "error": None if e is None else {
                    "kind": e.kind, "reason": e.reason, "hint": e.hint,
                },
                "duplicate_of": self.duplicate_of,
            },
        }

    def body(self) -> str:
        # ensure_ascii: the body is signed as bytes; ASCII-only JSON reads the same to
        # every receiver whatever it assumes about encodings.
        return json.dumps(self.to_json(), separators=(",", ":"))


def _original_now(job: Job) -> str | None:
    if job.held_path:
        return job.held_path
    return job.source_path if os.path.lexists(job.source_path) else None


def _walk_order(inner: str) -> tuple[tuple[str, ...], str]:
    # os.walk's order below: a folder's files (sorted) before its subfolders (sorted).
    p = PurePosixPath(inner)
    return p.parent.parts, p.name


def _listed(root: Path) -> list[str]:
    """The folder's files, relative to it, read from the disk."""
    inner: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        inner.extend(Path(dirpath, n).relative_to(root).as_posix() for n in sorted(filenames))
        if len(inner) >= MAX_FILES_LISTED:
            break
    return inner


def output_info(
    outbox: Path, folder: str | None, written: Sequence[str] | None = None
) -> OutputInfo | None:
    """The output folder as an event tells of it: `written` are its files (relative to
    it) when the caller knows them; else the folder is listed."""
    if not folder:
        return None
    root = Path(folder)
    try:
        rel = PurePosixPath(root.relative_to(outbox).as_posix())
    except ValueError:
        rel = PurePosixPath(root.name)
    inner = sorted(written, key=_walk_order) if written is not None else _listed(root)
    files = [str(rel / f) for f in inner[:MAX_FILES_LISTED]]

    def pick(suffix: str) -> str | None:
        # The folder may be `<stem>-<sha prefix>/`; its files are named after the stem.
        return next((f for f in files if f.endswith(suffix)), None)

    return OutputInfo(
        folder=str(rel),
        path=str(root),
        markdown=pick(".md"),
        content_list=pick("_content_list.json"),
        files=tuple(files),
    )


def build_event(
    cfg: Config, outcome: Outcome, *, now: float, event_id: str,
    files: Sequence[str] | None = None,
) -> DocumentEvent:
    """The event telling of `outcome`; `files` are those of its output folder when known
    (else the folder is listed: a duplicate's original)."""
    job = outcome.job
    failed = outcome.event == "document.failed"
    folder = job.output_dir if not failed else None
    if outcome.event == "document.duplicate" and outcome.original is not None:
        folder = outcome.original.output_dir
        files = None  # the original's folder, not this job's
    return DocumentEvent(
        id=event_id,
        type=outcome.event,
        timestamp=now,
        job_id=job.id,
        source=SourceInfo(
            name=Path(job.source_path).name,
            path=job.source_path,
            inbox=job.inbox,
            sha256=job.sha256,
            size=job.size,
            original=None if outcome.event == "document.duplicate" else _original_now(job),
        ),
        output=output_info(cfg.outbox, folder, files),
        pages=job.page_count,
        pages_done=job.pages_done,
        engine=job.engine,
        runtime=cfg.engine.runtime if job.engine == "mineru" else None,
        seconds=job.seconds if not failed else None,
        error=FailureInfo(
            kind=job.error_kind or "",
            reason=job.error or "",
            hint=hint_for(job.error_kind or "", job.id),
        ) if failed else None,
        duplicate_of=outcome.original.id if outcome.original is not None else job.duplicate_of,
    )


def probe_event(now: float, event_id: str) -> dict[str, Any]:
    """`docinbox hooks test`: an event of its own type that no document stands behind."""
    return {"id": event_id, "type": "docinbox.test", "timestamp": iso(now),
            "data": {"message": "a test event from `docinbox hooks test`"}}


def event_env(payload: Mapping[str, Any], outbox: Path) -> dict[str, str]:
    """The common fields of an event body as `DOCINBOX_*` variables for a command hook."""
    data = payload.get("data")
    data = data if isinstance(data, Mapping) else {}
    src = data.get("source") if isinstance(data.get("source"), Mapping) else {}
    out = data.get("output") if isinstance(data.get("output"), Mapping) else {}
    err = data.get("error") if isinstance(data.get("error"), Mapping) else {}
    assert isinstance(src, Mapping) and isinstance(out, Mapping) and isinstance(err, Mapping)

    def under_outbox(rel: object) -> str | None:
        return str(outbox / str(rel)) if isinstance(rel, str) and rel else None

    values: dict[str, object] = {
        "DOCINBOX_EVENT": payload.get("type"),
        "DOCINBOX_EVENT_ID": payload.get("id"),
        "DOCINBOX_TIMESTAMP": payload.get("timestamp"),
        "DOCINBOX_JOB_ID": data.get("job_id"),
        "DOCINBOX_SOURCE": src.get("path"),
        "DOCINBOX_SOURCE_NAME": src.get("name"),
        "DOCINBOX_SHA256": src.get("sha256"),
        "DOCINBOX_ORIGINAL": src.get("original"),
        "DOCINBOX_OUTPUT_DIR": out.get("path"),
        "DOCINBOX_MARKDOWN": under_outbox(out.get("markdown")),
        "DOCINBOX_CONTENT_LIST": under_outbox(out.get("content_list")),
        "DOCINBOX_PAGES": data.get("pages"),
        "DOCINBOX_ENGINE": data.get("engine"),
        "DOCINBOX_ERROR_KIND": err.get("kind"),
        "DOCINBOX_ERROR": err.get("reason"),
        "DOCINBOX_DUPLICATE_OF": data.get("duplicate_of"),
    }
    return {k: str(v) for k, v in values.items() if v is not None and v != ""}
