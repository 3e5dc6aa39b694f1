"""The output folders, looked at every few seconds like the inboxes.

A share that went away (gone, unmounted) or hangs (a dead hard NFS mount) makes documents
wait in the queue, never fail: while one of the folders is away, `look` returns why, the
supervisor starts no new document (`Supervisor.hold_new_documents`), and a document
finished meanwhile is not written into it: `GuardedOutcomes` looks at the folders first,
through their shares' lanes, and a folder that does not answer raises `NotAnswering` (an
OSError), which the supervisor already turns into "wait and try again"
(daemon/supervisor/output_retry.py). Every look goes through the lanes
(daemon/common/shares.py): a hung share costs the main loop one deadline, then nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Protocol

from daemon.common.display import safe_display
from daemon.common.live import FolderFacts
from daemon.common.shares import NotAnswering, Shares
from daemon.config.settings import Config, output_folders
from daemon.document.page import EngineInfo
from daemon.intake.presence import FolderPresence, mount_points, probe_through
from daemon.jobs.store import Job, NewEvent, Published

# The publisher's logger: a failure it could not file is its message to the user.
log = logging.getLogger("docinbox.publish")

class OutputFolders:
    """The outbox, archive, failed and duplicates folders' presence (config key -> it)."""

    def __init__(
        self, shares: Shares, wall: Callable[[], float], log: logging.Logger
    ) -> None:
        self.shares = shares
        self.wall = wall
        self.log = log
        self.folders: dict[str, tuple[Path, FolderPresence]] = {}

    def watch(self, cfg: Config, now: float) -> None:
        """(Re)build the folders' presence from the config (start, reload)."""
        wanted = [(k, p) for k, p in output_folders(cfg) if k != "state_dir"]
        old = self.folders
        self.folders = {}
        points = mount_points()
        for key, folder in wanted:
            kept = old.get(key)
            if kept is not None and kept[0] == folder:
                self.folders[key] = kept
                continue
            presence = FolderPresence(
                f"the {key} ({folder})",
                waiting="documents wait in the queue until it returns",
                log=self.log,
            )
            presence.start(probe_through(self.shares.call, folder, points), now, self.wall())
            self.folders[key] = (folder, presence)

    def look(self, now: float) -> str | None:
        """Look at the folders that are due; why documents must wait now, or None."""
        due = [(f, p) for f, p in self.folders.values() if p.due(now)]
        if due:
            points = mount_points()
            self.shares.refresh()
            for folder, presence in due:
                presence.update(probe_through(self.shares.call, folder, points), now,
                                self.wall())
        missing = [
            f"the {key} ({safe_display(folder)}) is {presence.missing}"
            for key, (folder, presence) in self.folders.items()
            if presence.missing is not None
        ]
        return "; ".join(missing) if missing else None

    def facts(self) -> tuple[FolderFacts, ...]:
        return tuple(
            FolderFacts(
                key,
                str(folder),
                presence.missing,
                presence.missing_since_wall,
                share=self.shares.mount_of(folder),
                answering=not presence.hung,
            )
            for key, (folder, presence) in self.folders.items()
        )

    def ensure_answering(self) -> None:
        """Raise NotAnswering when an output folder's share hangs (looked at now, with
        the deadline): writing into it would freeze the main loop."""
        for folder, presence in self.folders.values():
            if presence.hung:
                raise NotAnswering(self.shares.mount_of(folder),
                                   f"{folder}: {presence.missing}")
            try:
                self.shares.call(folder, partial(os.stat, folder))
            except NotAnswering:
                presence.check_soon()  # the next look says so, once
                raise
            except OSError:
                pass  # gone or unreadable: writing says why, as it always did


class Filing(Protocol):
    """The publisher as the guard sees it: the supervisor's `Outcomes`, plus the failure's
    event alone for a document whose original cannot be filed (daemon.output.publish)."""

    def complete(self, job: Job, engine: EngineInfo | None, seconds: float) -> Published: ...

    def failed(self, job: Job, kind: str, message: str) -> NewEvent | None: ...

    def failure_event(self, job: Job, kind: str, message: str) -> NewEvent | None: ...


class GuardedOutcomes:
    """The publisher, after a look at the output folders (the supervisor's `Outcomes`)."""

    def __init__(self, publisher: Filing, folders: OutputFolders) -> None:
        self.publisher = publisher
        self.folders = folders

    def complete(self, job: Job, engine: EngineInfo | None, seconds: float) -> Published:
        self.folders.ensure_answering()
        return self.publisher.complete(job, engine, seconds)

    def failed(self, job: Job, kind: str, message: str) -> NewEvent | None:
        try:
            self.folders.ensure_answering()
        except NotAnswering as exc:
            # As for any disk problem: the failure is recorded (with its event), the
            # original stays where it is.
            log.error("job %s: could not move the original to failed/: %s", job.id, exc)
            return self.publisher.failure_event(job, kind, message)
        return self.publisher.failed(job, kind, message)
