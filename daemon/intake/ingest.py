"""Stable file -> content hash -> queued job or duplicate record.

The watcher says a file is complete; ingest decides what it is. A file already recorded
with the same path, size and mtime is skipped without reading it (rescans every few
minutes must stay cheap on a big inbox). Otherwise it is hashed (streaming SHA-256, 1 MiB
chunks, so a 2 GB scan costs no memory) and handed to the store, which decides in one
transaction whether it is new or a duplicate. Duplicates cost no model time.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

from daemon.common.display import safe_display
from daemon.common.errors import FailureKind
from daemon.common.shares import NotAnswering, ShareCall, direct
from daemon.config.settings import Config, InboxConfig
from daemon.jobs.store import EventMaker, IngestResult, NoEvents, Outcome, Store
from daemon.output import originals

log = logging.getLogger("docinbox.ingest")

CHUNK = 1024 * 1024


def sha256_file(path: Path, call: ShareCall = direct) -> str:
    """The file's SHA-256. `call`: how each open and read is made (the daemon's share
    lanes: a share that hangs mid-file raises NotAnswering instead of freezing the loop;
    one call per 1 MiB chunk, so a big file on a slow share is not a hang)."""
    h = hashlib.sha256()
    # O_NOFOLLOW: a file swapped for a symlink between the scan and now is not followed.
    fd = call(path, lambda: os.open(path, os.O_RDONLY | os.O_NOFOLLOW))
    try:
        while chunk := call(path, lambda: os.read(fd, CHUNK)):
            h.update(chunk)
    finally:
        # Hung: the descriptor stays with the stuck call (one per hang, not per file).
        with contextlib.suppress(NotAnswering):
            call(path, lambda: os.close(fd))
    return h.hexdigest()


def _utf8_name(path: Path) -> bool:
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def subdir_for(inbox: InboxConfig, path: Path) -> str:
    """Where this file's outputs go below outbox/archive/failed: mirrors the inbox."""
    rel_parent = path.parent.relative_to(inbox.path)
    parts = [p for p in PurePosixPath(inbox.output_subfolder).parts if p not in ("", ".", "/")]
    parts += [p for p in rel_parent.parts if p not in ("", ".")]
    return str(PurePosixPath(*parts)) if parts else ""


class Ingestor:
    def __init__(
        self,
        cfg: Config,
        store: Store,
        wall: Callable[[], float],
        retry_later: Callable[[Path], None] = lambda path: None,
        events: EventMaker | None = None,
        call: ShareCall = direct,
    ) -> None:
        self.cfg = cfg
        # How the inbox is read: through the share lanes in the daemon.
        self.call = call
        self.store = store
        self.wall = wall
        self.events = events or NoEvents()
        # The watcher reports a file once per change; a file we could not read now must be
        # handed back to it (Watcher.forget) or it would never be offered again.
        self.retry_later = retry_later

    def ingest(self, inbox: InboxConfig, path: Path) -> IngestResult | None:
        try:
            st = self.call(path, lambda: os.lstat(path))
        except FileNotFoundError:
            return None  # gone between the scan and now: nothing to do
        except NotAnswering as exc:
            log.info("cannot read %s now: %s (taken when its share answers again)",
                     safe_display(path), exc.strerror)
            self.retry_later(path)
            return None
        if not stat.S_ISREG(st.st_mode):
            return None  # symlinks, fifos, sockets are never taken
        utf8 = _utf8_name(path)
        if utf8 and self.store.known_source(str(path), st.st_size, st.st_mtime_ns):
            return None
        try:
            digest = sha256_file(path, self.call)
            after = self.call(path, lambda: os.lstat(path))
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read %s: %s (will try again on the next scan)",
                        safe_display(path), exc)
            self.retry_later(path)
            return None
        if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            # Still being written after all: the watcher will report it again when stable.
            log.info(
                "%s changed while hashing; waiting for it to settle", safe_display(path)
            )
            return None
        if not utf8:
            return self._reject_name(inbox, path, st, digest)
        result = self._record(inbox, str(path), subdir_for(inbox, path), st, digest)
        if result is None:
            return None
        if result.duplicate:
            self._dispose_duplicate(path, result)
        else:
            log.info(
                "queued job %s: %s (%d bytes, sha256 %s)",
                result.job.id,
                safe_display(path),
                st.st_size,
                digest[:12],
            )
        return result

    def _reject_name(
        self, inbox: InboxConfig, path: Path, st: os.stat_result, digest: str
    ) -> IngestResult | None:
        """A name that is not valid UTF-8 (bytes from an old Windows share, say).

        SQLite stores text as UTF-8, so such a path cannot be queued and found again.
        It is failed at once, visibly: moved to failed/ with its error file, and recorded
        under an escaped name, instead of being retried on every rescan.
        """
        shown = safe_display(path)
        result = self._record(inbox, shown, subdir_for(inbox, path), st, digest)
        reason = ("the file name is not valid UTF-8, so it cannot be tracked; rename it "
                  "(e.g. convmv -f latin1 -t utf8) and drop it again")
        try:
            originals.write_failure(path, self.cfg.failed, subdir_for(inbox, path), {
                "kind": FailureKind.UNSUPPORTED.value, "reason": reason, "file": shown,
                "sha256": digest, "attempts": 0,
                "job_id": result.job.id if result else None,
            })
        except OSError as exc:
            log.error("could not move %s to failed/: %s", shown, exc)
        if result is not None and not result.duplicate:
            kind, now = FailureKind.UNSUPPORTED.value, self.wall()
            event = self.events.event_for(Outcome.failed(result.job, now, kind, reason))
            self.store.fail_job(result.job.id, now, kind, reason, event=event)
        log.warning("%s: %s", shown, reason)
        return result

    def _record(
        self, inbox: InboxConfig, path: str, subdir: str, st: os.stat_result, digest: str
    ) -> IngestResult | None:
        """Record the arrival; a duplicate's event (which lists its original's folder) is
        built first, outside the transaction."""
        now = self.wall()
        where = {"path": path, "inbox": str(inbox.path), "subdir": subdir}
        dup = self.store.arrival_outcome(**where, sha256=digest, now=now)
        return self.store.record_arrival(
            **where, size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=digest, now=now,
            event=self.events.event_for(dup) if dup is not None else None,
        )

    def _dispose_duplicate(self, path: Path, result: IngestResult) -> None:
        orig = result.original
        what = f"job {orig.id} ({safe_display(orig.source_path)})" if orig else "?"
        action = self.cfg.on_duplicate
        try:
            if action == "move":
                dest = originals.move_into(path, self.cfg.duplicates, result.job.subdir)
                self.store.forget_source(str(path))
                log.info(
                    "duplicate of %s: moved %s to %s",
                    what,
                    safe_display(path),
                    safe_display(dest),
                )
            elif action == "delete":
                path.unlink()
                self.store.forget_source(str(path))
                log.info("duplicate of %s: deleted %s", what, safe_display(path))
            else:
                log.info("duplicate of %s: kept %s", what, safe_display(path))
        except OSError as exc:
            log.error("duplicate %s could not be %sd: %s", safe_display(path), action, exc)


class IngestRetries:
    """Files whose ingest failed for a reason that is not theirs: the state disk was full
    or another process held the database. The watcher reports a file once per change, so
    without this such a file would wait for the next full rescan (minutes); here it is
    offered again after a short back-off that doubles up to `cap` seconds.
    """

    def __init__(self, first: float = 1.0, cap: float = 5.0) -> None:
        self.first = first
        self.cap = cap
        # path -> (its inbox, when to try again, the delay that was used)
        self._waiting: dict[Path, tuple[InboxConfig, float, float]] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, inbox: InboxConfig, path: Path, now: float) -> None:
        old = self._waiting.get(path)
        delay = self.first if old is None else min(old[2] * 2, self.cap)
        self._waiting[path] = (inbox, now + delay, delay)

    def discard(self, path: Path) -> None:
        self._waiting.pop(path, None)

    def due(self, now: float) -> list[tuple[InboxConfig, Path]]:
        """The files to offer again now (they stay listed until `discard`)."""
        return [(inbox, path) for path, (inbox, at, _) in self._waiting.items() if at <= now]

    def keep_inboxes(self, inboxes: Sequence[InboxConfig]) -> None:
        """After a reload: a file of an inbox that is no longer watched is not retried."""
        by_path = {i.path: i for i in inboxes}
        self._waiting = {
            path: (by_path[inbox.path], at, delay)
            for path, (inbox, at, delay) in self._waiting.items()
            if inbox.path in by_path
        }
