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
