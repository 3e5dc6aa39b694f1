"""When a finished document cannot be written: wait and try again, never fail it.

A full disk, an unwritable outbox, a NAS share that went away or an inbox that did (its
original cannot be archived), or an original being hashed again (is it still the
content converted?) is not the document's fault. Its pages stay stored, the job
goes back to the queue with a not-before time that doubles with each attempt
(`worker.output_retry_seconds`, capped at `worker.output_retry_max_seconds`), and nothing
is marked done without its output.
"""

from __future__ import annotations

from dataclasses import dataclass

from daemon.config.folders import folder_in_error
from daemon.config.settings import Config
from daemon.intake.presence import InboxAway
from daemon.output.rehash import OriginalNotReady


@dataclass(frozen=True)
class OutputWait:
    """How long a document waits before its output is tried again, and why, in the
    words `docinbox status` and the log show."""

    delay: float  # seconds
    message: str


def output_wait(cfg: Config, attempts: int, exc: OSError) -> OutputWait:
    """The wait after the `attempts`-th try to write a document failed with `exc`."""
    w = cfg.worker
    delay = min(w.output_retry_seconds * 2 ** max(0, attempts - 1), w.output_retry_max_seconds)
    why = exc.strerror or str(exc)
    if isinstance(exc, InboxAway | OriginalNotReady):
        return OutputWait(
            delay=delay,
            message=f"waiting: the original cannot be {cfg.after_success}d now: {why}; "
            f"retry in {delay:.0f} s",
        )
    return OutputWait(
        delay=delay,
        message=f"waiting: cannot write {folder_of(cfg, exc)} ({why}); retry in {delay:.0f} s",
    )


def folder_of(cfg: Config, exc: OSError) -> str:
    """Which configured folder an OSError is about, in the user's words."""
    named = [("outbox", cfg.outbox), ("archive", cfg.archive), ("failed", cfg.failed)]
    # Moving or deleting the original out of its inbox: under systemd, an inbox missing
    # from ReadWritePaths= is read-only (see check-config --systemd).
    named += [("inbox", inbox.path) for inbox in cfg.inboxes]
    return folder_in_error(exc, named, default=("outbox", cfg.outbox))
