"""Failure classes and process exit codes.

Every failure that reaches a user carries a `FailureKind`, so the job record, the
`<name>.error.json` next to a failed original and `docinbox status` all speak the same
words. Exit codes follow OCRmyPDF's idea of one code per failure class (and sysexits.h
where a code already means the same thing).
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED_DOCUMENTS = 1  # `parse`: at least one input failed; see its error
    USAGE = 2  # argparse's own code for bad command lines
    NOT_FOUND = 3  # `retry`/`reprocess`: no such job
    ENGINE_UNAVAILABLE = 4  # model weights missing and no fallback engine configured
    ALREADY_RUNNING = 5  # another `docinbox run` holds the state folder lock
    STATE_UNAVAILABLE = 75  # EX_TEMPFAIL: the state database could not be opened (disk
    # full, locked by another process past the busy timeout); the unit restarts it later
    INTERRUPTED = 130  # SIGINT during a one-shot command
    CONFIG = 78  # EX_CONFIG: the configuration is wrong; every problem was printed


class FailureKind(str, enum.Enum):
    """Why a document failed, in words a user can act on."""

    UNSUPPORTED = "unsupported"  # not a format we read, or content does not match the name
    CORRUPT = "corrupt"  # the file is damaged or truncated
    EMPTY = "empty"  # zero bytes
    ENCRYPTED = "encrypted"  # password-protected and no configured password opens it
    TOO_LARGE = "too_large"  # over limits.max_file_size or limits.max_pages
    BOMB = "decompression_bomb"  # image over limits.max_image_pixels
    TIMEOUT = "timeout"  # a page or the document took longer than its limit
    CRASHED = "crashed"  # the worker died on this document max_attempts times
    VANISHED = "vanished"  # the original disappeared before it was processed
    ENGINE = "engine_error"  # the engine raised on a page
    OUTPUT = "output_error"  # the outbox could not be written (retried with backoff first)


# What the user can do about each kind of failure; written into `<name>.error.json` and
# shown by `docinbox status`. Kept next to the kinds so a new kind cannot miss its hint.
_RETRY = "then run `docinbox retry {id}`"

_HINTS: dict[FailureKind, str] = {
    FailureKind.UNSUPPORTED: (
        "docinbox reads PDF and image files (PNG, JPEG, TIFF, WebP, BMP, GIF). Check that "
        "the file is one of those (a renamed Word file is not a PDF); convert it to PDF "
        "and drop it into the inbox again. A file whose name says one format and whose "
        "content is another is refused too: give it the right extension and drop it in "
        "again."
    ),
    FailureKind.CORRUPT: (
        "The file is damaged or incomplete. Open it in a viewer to check; if it was still "
        'being copied or downloaded, copy it again. A re-saved copy (e.g. "print to '
        'PDF") usually works: drop that into the inbox.'
    ),
    FailureKind.EMPTY: (
        "The file is empty (0 bytes), probably an interrupted copy or download. Copy the "
        "complete file into the inbox again."
    ),
    FailureKind.ENCRYPTED: (
        "The PDF is password-protected: add the password to `passwords:` in config.yaml, "
        + _RETRY
        + "."
    ),
    FailureKind.TOO_LARGE: (
        "The document is over `limits.max_file_size` or `limits.max_pages` in config.yaml. "
        "Split it into smaller files, or raise the limit and " + _RETRY + "."
    ),
    FailureKind.BOMB: (
        "The image has more pixels than `limits.max_image_pixels` allows (a guard against "
        "decompression bombs). Scale the image down, or if you trust it raise that limit "
        "in config.yaml and " + _RETRY + "."
    ),
    FailureKind.TIMEOUT: (
        "Processing took longer than `limits.page_timeout_seconds` or "
        "`limits.document_timeout_seconds`. Raise them (or lower `engine.dpi`) in "
        "config.yaml, " + _RETRY + "."
    ),
    FailureKind.CRASHED: (
        "The worker process died on this document `worker.max_attempts` times, often "
        "from running out of memory. Check the log, free memory or lower `engine.dpi` / "
        "`engine.max_long_side` in config.yaml, " + _RETRY + "."
    ),
    FailureKind.VANISHED: (
        "The file was moved or deleted from the inbox before it was processed. If that "
        "was not intended, put it back into the inbox."
    ),
    FailureKind.ENGINE: (
        "The recognition engine failed on a page; the log has the details. "
        + _RETRY[0].upper()
        + _RETRY[1:]
        + "; if it fails again, report it together with "
        "the log."
    ),
    FailureKind.OUTPUT: (
        "The outbox could not be written (disk full, permissions, or a read-only folder). "
        "Free disk space or fix the outbox permissions, " + _RETRY + "."
    ),
}

_GENERIC_HINT = "See the docinbox log for details, fix the cause, " + _RETRY + "."


def hint_for(kind: str | FailureKind, job_id: int | str | None = None) -> str:
    """What the user can do about a failure of this kind, in plain words.

    With `job_id`, the `docinbox retry` command in the hint is ready to paste.
    """
    try:
        fk = FailureKind(kind)
    except ValueError:
        text = _GENERIC_HINT
    else:
        text = _HINTS[fk]
    return text.replace("{id}", str(job_id) if job_id is not None else "<id>")


class DocumentError(Exception):
    """A problem with one input document. Never takes the daemon down."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.message}"


class EngineUnavailable(Exception):
    """The engine cannot be loaded here (weights missing, hub unreachable, ...).

    `hint` is the command that fixes it, shown to the user as it is.
    """

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
