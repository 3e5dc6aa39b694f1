"""An original hashed again when it is published, off the main loop.

Publishing moves an original out of its inbox only when it is still the content that was
converted. Ingest recorded its (path, size, mtime); a file there that no longer matches
(replaced while its inbox was away, or only touched) is hashed again to decide. Reading a
large file takes seconds, one on a share that stopped answering forever: on the main loop
either stalls every inbox, the worker's heartbeats and the systemd watchdog with it.

So the hash runs in a thread of its own, each open and read through the lane of the share
holding the file, with its deadline (`sha256_file` with `Shares.call`): a share that does
not answer is marked not answering by its lane, and the hash ends with `NotAnswering`
instead of hanging. The publisher asks for the digest on each try; while it is not known
the document waits in the queue (`OriginalNotReady`), as one whose inbox is away does, and
is tried again later.
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from daemon.common.display import safe_display
from daemon.common.shares import ShareCall, direct
from daemon.intake.ingest import sha256_file


class OriginalNotReady(OSError):
    """Whether a finished document's original is still the content converted is not known
    yet: it is being hashed again, or its hash could not be read. Not the document's
    fault: its output waits and is tried again, as for an inbox that is away."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.EAGAIN, f"{safe_display(path)} {why}", path)


@dataclass(frozen=True)
class FileKey:
    """The file a hash is of: its path and what stat said of it when it was asked for.
    Another file at the path (or the same one written again) is another key."""

    path: str
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path, st: os.stat_result) -> FileKey:
        return cls(str(path), st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(eq=False)
class _Hash:
    """One hash in its thread; `done` is set when it has its digest or its error."""

    key: FileKey
    done: threading.Event = field(default_factory=threading.Event)
    digest: str | None = None
    error: BaseException | None = None


class Rehashes:
    """The hashes of originals the publisher asked for, one per path (the latest key).

    Called from the main loop only; each hash runs in a daemon thread of its own, never
    joined (one stuck in a dead mount must not keep the process from exiting). Few run
    at once: only a document being completed asks, and it then waits in the queue.
    """

    def __init__(self, call: ShareCall = direct) -> None:
        self._call = call  # how each open and read is made: the share lanes in the daemon
        self._hashes: dict[str, _Hash] = {}

    def digest(self, key: FileKey) -> str:
        """The SHA-256 of the file `key` names, once its hash is done. Raises
        OriginalNotReady while it runs (started by the first ask), and once when it
        failed: the next ask starts it again."""
        running = self._hashes.get(key.path)
        if running is None or running.key != key:
            running = self._hashes[key.path] = _Hash(key)
            threading.Thread(target=self._run, args=(running,), daemon=True,
                             name=f"rehash {safe_display(key.path)}").start()
        if not running.done.is_set():
            raise OriginalNotReady(key.path, "changed since it was queued and is being "
                                   "hashed again")
        if running.error is not None:
            del self._hashes[key.path]
            if not isinstance(running.error, OSError):
                raise running.error  # a bug of ours: the caller's, as if it hashed itself
            why = running.error.strerror or str(running.error)
            raise OriginalNotReady(key.path, f"could not be hashed again: {why}")
        assert running.digest is not None
        return running.digest

    def done(self, path: str) -> threading.Event | None:
        """Set when the latest hash asked for of `path` is done (None: none asked for);
        for a caller that would rather wait than ask again."""
        running = self._hashes.get(path)
        return running.done if running is not None else None

    def forget(self, path: str) -> None:
        """The publisher is done with `path`: its digest is not kept."""
        self._hashes.pop(path, None)

    def _run(self, running: _Hash) -> None:
        try:
            running.digest = sha256_file(Path(running.key.path), self._call)
        except BaseException as exc:  # handed to the main loop, raised there
            running.error = exc
        finally:
            running.done.set()
