"""The end of the data path: a finished document's outbox folder, and its original's fate.

Publish decides WHAT a finished document becomes: which files (rendered by `formats`),
published as one folder by `outbox` (which owns HOW: atomically, never clobbering another
document), then the original archived, deleted or kept (`originals`). A failed document's
original goes to failed/ with its error record.

Order matters for crash safety: the outbox folder is written (atomically) BEFORE the
original is archived or deleted, and the job is marked done only after both. The
outcome's event is built here, from the files just written, before the transaction that
marks the job done: that transaction reads no folder. A kill at
any point leaves the job `running`; on restart it is requeued, all its pages are already
stored, and completion runs again: the same-sha256 outbox folder is replaced, the original
(if still there) archived. Never lost, never half-written, never marked done without output.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from daemon import __version__
from daemon.common.display import safe_display
from daemon.common.errors import FailureKind
from daemon.common.shares import ShareCall, direct
from daemon.config.settings import Config
from daemon.document.page import Block, EngineInfo, Json
from daemon.document.record import PageRecord
from daemon.intake.presence import InboxAway, InboxLooks, NoInboxLooks
from daemon.jobs.store import EventMaker, Job, NewEvent, NoEvents, Outcome, Published, Store
from daemon.output import originals, outbox
from daemon.output.durable import json_bytes
from daemon.output.formats.content_list import content_list, content_list_v2
from daemon.output.formats.markdown import markdown
from daemon.output.formats.meta import document_meta
from daemon.output.formats.middle import PageData, build_middle
from daemon.output.formats.model import model_json
from daemon.output.rehash import FileKey, Rehashes

log = logging.getLogger("docinbox.publish")


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")


# output.layout "mineru-legacy" keeps MinerU's files in this subfolder.
LEGACY_LAYOUT = "mineru-legacy"
LEGACY_SUBFOLDER = "auto"


@dataclass(frozen=True)
class FileNames:
    """The names of a document's files inside its outbox folder, in one place:
    `document_files` writes them and the status page finds them by them."""

    name: str  # the sanitised stem the files are named after
    layout: str = "default"

    @classmethod
    def in_folder(cls, folder: Path) -> FileNames:
        """The names a published folder was written with, as far as the folder shows:
        its layout (a real `auto/` subfolder, not a link) and its own name as the stem."""
        sub = folder / LEGACY_SUBFOLDER
        legacy = sub.is_dir() and not sub.is_symlink()
        return cls(folder.name, LEGACY_LAYOUT if legacy else "default")

    @property
    def prefix(self) -> str:
        return f"{LEGACY_SUBFOLDER}/" if self.layout == LEGACY_LAYOUT else ""

    @property
    def markdown(self) -> str:
        return f"{self.prefix}{self.name}.md"

    @property
    def content_list(self) -> str:
        return f"{self.prefix}{self.name}_content_list.json"

    @property
    def content_list_v2(self) -> str:
        return f"{self.prefix}{self.name}_content_list_v2.json"

    @property
    def middle(self) -> str:
        return f"{self.prefix}{self.name}_middle.json"

    @property
    def model(self) -> str:
        return f"{self.prefix}{self.name}_model.json"

    def image(self, crop: str) -> str:
        return f"{self.prefix}images/{crop}"

    @property
    def meta(self) -> str:
        # Always at the top: the outbox writer recognises a document's folder by it.
        return f"{self.name}.meta.json"


@dataclass(frozen=True)
class DocumentFiles:
    """Everything a finished document's folder is rendered from."""

    pages: Sequence[PageData]
    meta: Mapping[str, Json]  # `<stem>.meta.json`; write_document adds sha256 and version
    crops: Mapping[str, bytes] = dataclasses.field(default_factory=dict)  # name -> JPEG
    model: Sequence[Mapping[str, Json]] = ()  # `<stem>_model.json` entries, one per page
    page_count: int | None = None  # of the whole document (pages may be a selection)
    file_suffix: str = ""
    engine: str | None = None


def document_files(
    name: str, doc: DocumentFiles, *, layout: str = "default", extra_json: bool = True
) -> dict[str, bytes]:
    """The folder's files, {path inside the folder: content}, rendered in memory.

    `layout` "mineru-legacy" puts MinerU's files under `auto/` (where RAGFlow's MinerU
    parser and RAG-Anything look); `<name>.meta.json` always sits at the top, because the
    outbox writer recognises a document's folder by it.
    """
    middle = build_middle(
        doc.pages, page_count=doc.page_count, file_suffix=doc.file_suffix, engine=doc.engine
    )
    names = FileNames(name, layout)
    files = {
        names.markdown: markdown(middle).encode("utf-8"),
        names.content_list: json_bytes(content_list(middle)),
    }
    if extra_json:
        files[names.content_list_v2] = json_bytes(content_list_v2(middle))
        files[names.middle] = json_bytes(middle)
        files[names.model] = json_bytes(list(doc.model))
    for crop, jpeg in doc.crops.items():
        files[names.image(crop)] = jpeg
    files[names.meta] = json_bytes(doc.meta)
    return files


def as_pages(pages: Sequence[PageData | Sequence[Block]]) -> list[PageData]:
    """PageData as they are; bare block lists (tests, simple callers) numbered from 0."""
    out: list[PageData] = []
    for i, page in enumerate(pages):
        if isinstance(page, PageData):
            out.append(page)
        else:
            out.append(PageData(page_idx=i, blocks=tuple(page)))
    return out


def write_document(
    outbox_root: Path,
    subdir: str,
    stem: str,
    sha256: str,
    doc: DocumentFiles,
    *,
    layout: str = "default",
    extra_json: bool = True,
) -> Path:
    """Write a document's folder `outbox/<subdir>/<stem>/` atomically
    (`outbox.write_folder`); return it.

    `stem` is sanitised (`outbox.sanitize_stem`); the files inside are named after it.
    Raises ValueError for a bad `subdir`/`sha256` or a meta of another document, OSError
    for disk problems.
    """
    name, files = render_document(stem, sha256, doc, layout=layout, extra_json=extra_json)
    return outbox.write_folder(outbox_root, subdir, name, sha256, files)


def render_document(
    stem: str, sha256: str, doc: DocumentFiles, *, layout: str = "default",
    extra_json: bool = True,
) -> tuple[str, dict[str, bytes]]:
    """The folder's sanitised name and its files, rendered in memory (`write_document`)."""
    sha = sha256.lower()
    full_meta = dict(doc.meta)
    if "sha256" in full_meta and str(full_meta["sha256"]).lower() != sha:
        raise ValueError("meta['sha256'] does not match the sha256 argument")
    full_meta.setdefault("sha256", sha)
    full_meta.setdefault("docinbox_version", __version__)
    name = outbox.sanitize_stem(stem)
    # Render everything before touching the disk: a rendering bug must not leave files.
    files = document_files(
        name, dataclasses.replace(doc, meta=full_meta), layout=layout, extra_json=extra_json
    )
    return name, files


def page_data(page: PageRecord) -> PageData:
    """What the formats need of a stored page."""
    return PageData(
        page_idx=page.page_idx,
        blocks=page.blocks,
        crop_names=frozenset(c.name for c in page.crops),
        size_pt=page.size_pt,
    )


class Publisher:
    def __init__(
        self, cfg: Config, store: Store, wall: Callable[[], float],
        events: EventMaker | None = None, inboxes: InboxLooks | None = None,
        call: ShareCall = direct,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.wall = wall
        self.events = events or NoEvents()
        # Whether an original's inbox is away (the watcher): then it is not archived
        # "later", it is waited for.
        self.inboxes: InboxLooks = inboxes or NoInboxLooks()
        # An original to hash again is read off the main loop, through its share's lane
        # (`call`; the daemon's Shares): a large file or a hung share cannot stall it.
        self.rehashes = Rehashes(call)

    def meta_for(
        self, job: Job, pages: Sequence[PageRecord], engine: EngineInfo | None
    ) -> dict[str, Json]:
        return document_meta(
            job,
            pages,
            engine,
            original_paths=self.original_paths(job),
            configured_engine=self.cfg.engine.name,
            processed_at=iso(self.wall()),
        )

    def original_paths(self, job: Job) -> list[str]:
        paths = [job.source_path]
        for j in self.store.duplicates_of(job.id):
            if j.source_path not in paths:
                paths.append(j.source_path)
        return paths

    def complete(self, job: Job, engine: EngineInfo | None, seconds: float) -> Published:
        """Publish a job whose pages are all stored; `engine` is the one the worker
        loaded, `seconds` its converting time. Returns the outbox folder and the event
        that tells of it; raises OSError when the folder cannot be written, InboxAway
        (nothing written) when the original is to be archived or deleted and its inbox is
        away, OriginalNotReady (nothing written) while it is being hashed again: the
        document then waits like one whose outbox is full."""
        self._check_inbox(job)
        self._check_original(job)
        stored = self.store.pages(job.id)
        doc = DocumentFiles(
            pages=[page_data(p) for p in stored],
            meta=self.meta_for(job, stored, engine),
            crops={c.name: c.jpeg for p in stored for c in p.crops},
            model=model_json(stored),
            page_count=job.page_count,
            file_suffix=Path(job.source_path).suffix.lstrip(".").lower(),
            engine=engine.name if engine is not None else None,
        )
        name, files = render_document(
            Path(job.source_path).stem, job.sha256, doc, layout=self.cfg.output.layout,
            extra_json=self.cfg.output.extra_json,
        )
        folder = str(outbox.write_folder(self.cfg.outbox, job.subdir, name, job.sha256, files))
        self._dispose_original(job)
        # As it stands now (the original archived): what the event tells.
        now = self.store.job(job.id) or job
        outcome = Outcome.done(now, self.wall(), folder, seconds)
        return Published(
            folder=folder,
            event=self.events.event_for(outcome, files=sorted(files)),
            pages=len(stored),
            page_seconds=sum(p.seconds for p in stored),
        )

    def _check_inbox(self, job: Job) -> None:
        """Raise InboxAway when the original is to leave its inbox and is not there
        because the inbox is away. Done as the job is done, the original would stay in
        the inbox for good: when the inbox is back it is a known file, never taken again.
        An inbox known to be away is not looked into: it may be a share that hangs."""
        if not self._leaves_inbox(job):
            return
        away = self.inboxes.missing_inboxes().get(job.inbox)
        if away is None and not os.path.lexists(job.source_path):
            away = self.inboxes.look_at_inbox(job.inbox)
        if away is not None:
            raise InboxAway(job.inbox, away)

    def _leaves_inbox(self, job: Job) -> bool:
        """Whether publishing moves or deletes the original out of its inbox: not with
        `after_success: keep`, nor for one already in archive/ or failed/ (held_path)."""
        return self.cfg.after_success != "keep" and job.held_path is None

    def _check_original(self, job: Job) -> None:
        """Raise OriginalNotReady, before anything is written, while it is not known yet
        whether the original about to leave its inbox is still the content converted."""
        src = Path(job.read_path)
        if self._leaves_inbox(job) and src.exists():
            self._unchanged(job, src)

    def _unchanged(self, job: Job, src: Path) -> bool:
        """Whether the file at the original's path is still the content converted: the
        (path, size, mtime) ingest recorded, else its hash (as ingest decides), taken off
        the main loop: OriginalNotReady until it is known."""
        st = src.stat()
        if self.store.known_source(str(src), st.st_size, st.st_mtime_ns, sha256=job.sha256):
            return True
        if st.st_size != job.size:
            return False
        return self.rehashes.digest(FileKey.of(src, st)) == job.sha256

    def _decided_unchanged(self, job: Job, src: Path) -> bool:
        """`_unchanged` once it is decided: its hash (if one was taken) is not kept."""
        unchanged = self._unchanged(job, src)
        self.rehashes.forget(str(src))
        return unchanged

    def _dispose_original(self, job: Job) -> None:
        src = Path(job.read_path)
        if not src.exists():
            self._check_inbox(job)  # it went away since the check before writing
            if self._leaves_inbox(job):
                log.warning("job %s: the original %s is no longer in the inbox; nothing to "
                            "%s", job.id, safe_display(src), self.cfg.after_success)
            return  # archived by an earlier completion that was interrupted, or removed
        if self._leaves_inbox(job) and not self._decided_unchanged(job, src):
            # Another file at its path now (replaced while the inbox was away, or a
            # writer still going): never archived as this document; the watcher offers
            # it as what it is.
            log.warning("job %s: %s changed since it was queued; left in place to be taken "
                        "as a new file", job.id, safe_display(src))
            self.store.forget_source(job.source_path)
            return
        if src.is_relative_to(self.cfg.archive):
            return  # a reprocess of an archived original: it stays where it is
        if src.is_relative_to(self.cfg.failed):
            # A retry that worked: failed/ should list only what is still failed. The
            # record of the earlier failure stays in the job's history in the database.
            originals.remove_error_file(src)
        action = self.cfg.after_success
        if action == "archive":
            dest = originals.move_into(src, self.cfg.archive, job.subdir)
            self.store.set_held_path(job.id, str(dest))
            log.info("job %s: original archived to %s", job.id, safe_display(dest))
        elif action == "delete":
            os.unlink(src)
            self.store.set_held_path(job.id, None)
        else:
            return  # keep: the (path, size, mtime) memo stops it from being taken again
        self.store.forget_source(job.source_path)

    def failed(self, job: Job, kind: str, message: str) -> NewEvent | None:
        """The original to failed/ with its error file; returns the failure's event. A
        disk problem is logged: the record of the failure is kept all the same."""
        try:
            self._hold_failed(job, kind, message)
        except OSError as exc:
            log.error("job %s: could not move the original to failed/: %s", job.id, exc)
        return self.failure_event(job, kind, message)

    def failure_event(self, job: Job, kind: str, message: str) -> NewEvent | None:
        """The failure's event alone, for when the original cannot be moved at all."""
        outcome = Outcome.failed(self.store.job(job.id) or job, self.wall(), kind, message)
        return self.events.event_for(outcome)

    def _hold_failed(self, job: Job, kind: str, message: str) -> None:
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
                "job %s: %s vanished; nothing to move to failed/", job.id, safe_display(src)
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
                        safe_display(src), job.size, now_size)
            self.store.forget_source(job.source_path)
            return
        if src.is_relative_to(self.cfg.failed):
            # A retry that failed again: the original is already in failed/; refresh its
            # error file in place instead of moving it to "name (1).pdf".
            originals.write_error_file(src, error)
            return
        dest = originals.write_failure(src, self.cfg.failed, job.subdir, error)
        if src.exists() or dest.exists():
            self.store.set_held_path(job.id, str(dest))
        log.warning("job %s: %s -> %s", job.id, message, safe_display(dest))
        self.store.forget_source(job.source_path)
