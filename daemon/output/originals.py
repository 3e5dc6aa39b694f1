"""Moving originals out of the inbox: into archive/, duplicates/ and failed/.

Originals are moved by `os.rename` (atomic) or, across filesystems, copied to a hidden
temp name, fsynced, renamed, and only then unlinked: a crash leaves at worst a duplicate.
A name that is taken gets ` (1)`, ` (2)`, ... before its suffix; nothing is overwritten.
A failed original gets `<name>.error.json` beside it, with the hint from `errors.hint_for`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from daemon.common.errors import FailureKind, hint_for
from daemon.output.durable import (
    check_subdir,
    ensure_dir,
    fsync_dir,
    json_bytes,
    names_lock,
    write_atomic,
)

_ERROR_SUFFIX = ".error.json"


def _numbered(name: str, n: int) -> str:
    """'scan.pdf' -> 'scan (n).pdf'; the counter goes before the suffix."""
    if n == 0:
        return name
    p = PurePosixPath(name)
    suffix = p.suffix if p.stem else ""
    base_name = name[: len(name) - len(suffix)] if suffix else name
    return f"{base_name} ({n}){suffix}"


def _is_free(folder: Path, name: str, sidecar: str) -> bool:
    if os.path.lexists(folder / name):
        return False
    return not (sidecar and os.path.lexists(folder / (name + sidecar)))


def _free_name(folder: Path, name: str, sidecar: str = "") -> str:
    n = 0
    while not _is_free(folder, _numbered(name, n), sidecar):
        n += 1
    return _numbered(name, n)


def _copy_across(src: Path, dest: Path) -> None:
    """Cross-filesystem move, crash-safe: hidden temp copy, fsync, rename, then unlink."""
    tmp = dest.parent / f".docinbox-{secrets.token_hex(8)}.part"
    try:
        with open(src, "rb") as fin, open(tmp, "xb") as fout:
            shutil.copyfileobj(fin, fout, 1024 * 1024)
            fout.flush()
            os.fsync(fout.fileno())
        with contextlib.suppress(OSError):  # timestamps are nice to keep, not essential
            shutil.copystat(src, tmp)
        os.rename(tmp, dest)
        fsync_dir(dest.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    try:
        os.unlink(src)
    except FileNotFoundError:
        return  # someone else removed the source meanwhile: the move is complete anyway
    except OSError:
        # The source stays, so undo the copy: a half-done move would otherwise leave a
        # duplicate each time the caller retries.
        with contextlib.suppress(OSError):
            os.unlink(dest)
        raise
    with contextlib.suppress(OSError):
        fsync_dir(src.parent)


def _move(src: Path, dest_root: Path, subdir: str, sidecar: str = "") -> Path:
    rel = check_subdir(subdir)
    folder = Path(dest_root).joinpath(*rel.parts)
    ensure_dir(folder)
    with names_lock:
        dest = folder / _free_name(folder, src.name, sidecar)
        try:
            os.rename(src, dest)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            _copy_across(src, dest)
            return dest
    fsync_dir(folder)
    with contextlib.suppress(OSError):
        fsync_dir(src.parent)
    return dest


def move_into(src: Path, dest_root: Path, subdir: str) -> Path:
    """Move `src` to `dest_root/subdir/<name>`, never overwriting; return the new path.

    An existing name gets ` (1)`, ` (2)`, ... before its suffix. Across filesystems the
    file is copied to a hidden temp name, fsynced and renamed before the source is
    unlinked, so a crash leaves at worst a duplicate (and a `.docinbox-*.part` file).
    """
    return _move(Path(src), dest_root, subdir)


def _utc_now_iso() -> str:
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    return now.isoformat().replace("+00:00", "Z")


def _error_record(src: Path, held: Path | None, error: Mapping[str, Any]) -> dict[str, Any]:
    kind = error.get("kind")
    kind_text = kind.value if isinstance(kind, FailureKind) else (str(kind) if kind else None)
    job_id = error.get("job_id")
    record: dict[str, Any] = {
        "file": error.get("file", str(src)),
        "moved_to": str(held) if held is not None else None,
        "failed_at": error.get("failed_at") or _utc_now_iso(),
        "kind": kind_text,
        "reason": error.get("reason"),
        "attempts": error.get("attempts"),
        "sha256": error.get("sha256"),
        "hint": error.get("hint") or hint_for(kind_text or "", job_id),
        "job_id": job_id,
    }
    for key, value in error.items():
        record.setdefault(key, value)  # extra facts from the caller are kept
    return record


def write_failure(src: Path, failed_root: Path, subdir: str, error: Mapping[str, Any]) -> Path:
    """Move a failed original into `failed_root/subdir/` and write `<name>.error.json`
    beside it; return the original's path in failed/.

    `error` carries `kind`, `reason`, `attempts`, `sha256`, `job_id` and optionally `file`
    and `hint`; other keys are kept. If `src` no longer exists the error file is still
    written, named after the original, so the failure is visible in failed/; the returned
    path then does not exist (its `.error.json` sidecar does).
    """
    src = Path(src)
    rel = check_subdir(subdir)
    folder = Path(failed_root).joinpath(*rel.parts)
    moved: Path | None
    try:
        # Reserve a name free for both the original and its sidecar, so an older
        # `.error.json` of a same-named file is never overwritten.
        moved = _move(src, failed_root, subdir, sidecar=_ERROR_SUFFIX)
    except FileNotFoundError:
        if os.path.lexists(src):
            raise  # the destination side failed, not the source
        moved = None
    record = _error_record(src, moved, error)
    ensure_dir(folder)
    with names_lock:
        if moved is not None:
            base_name = moved.name
            if os.path.lexists(folder / (base_name + _ERROR_SUFFIX)):
                # Only possible if something outside docinbox raced us; never overwrite.
                base_name = _free_name(folder, base_name, _ERROR_SUFFIX)
        else:
            base_name = _free_name(folder, src.name, _ERROR_SUFFIX)
        write_atomic(folder / (base_name + _ERROR_SUFFIX), json_bytes(record))
    return moved if moved is not None else folder / base_name


def remove_error_file(original: Path) -> None:
    """Drop `<original>.error.json`: a retried original that succeeded is no failure now."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(Path(original).parent / (Path(original).name + _ERROR_SUFFIX))


def write_error_file(original: Path, error: Mapping[str, Any]) -> Path:
    """(Re)write `<original>.error.json` beside an original already in failed/; return it.

    For a retry that failed again: the record describes the same file, so replacing the
    previous one is what the user wants to see.
    """
    original = Path(original)
    held = original if os.path.lexists(original) else None
    record = _error_record(original, held, error)
    return write_atomic(original.parent / (original.name + _ERROR_SUFFIX), json_bytes(record))
