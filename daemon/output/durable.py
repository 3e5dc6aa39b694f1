"""Durable file-system steps every writer of docinbox shares.

One rule for all of them: a file a user can see is complete. Files are created new and
fsynced, folders fsynced after a rename or creation inside them, and `write_atomic` is the
one way docinbox replaces a single file (temp name, fsync, rename). Folders of files are
published by `outbox`; originals are moved by `originals`; both build on these steps.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import json
import math
import os
import re
import secrets
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from daemon.common.display import safe_display

# The hidden staging folder of the outbox. Reserved in every folder tree docinbox writes,
# so that no document's subfolder can ever be mistaken for (or land in) the staging area.
TMP_DIR_NAME = ".docinbox-tmp"

# Serialises "pick a free name, rename into it" within this process, so two threads of the
# daemon never pick the same free name. The archive/failed/duplicates/outbox folders are
# owned by docinbox; nobody else is expected to create names in them concurrently.
names_lock = threading.Lock()

# Lone surrogates come from undecodable bytes (surrogateescape) or broken engine output;
# they cannot be encoded as UTF-8 and would make the write fail.
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def json_safe(value: Any) -> Any:
    """Turn `value` into something `json.dumps(ensure_ascii=False)` can write as UTF-8.

    File names from the OS may carry surrogate-escaped bytes; they are shown as \\xNN
    rather than dropped, so the original name stays recognisable.
    """
    if isinstance(value, str):
        if _SURROGATE_RE.search(value):
            return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        return value
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None  # NaN is not JSON
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if isinstance(value, Mapping):
        return {str(json_safe(str(k))): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    if isinstance(value, os.PathLike):
        return json_safe(os.fspath(value))
    if isinstance(value, bytes):
        return json_safe(value.decode("utf-8", "surrogateescape"))
    return json_safe(str(value))


def json_bytes(obj: Any) -> bytes:
    text = json.dumps(json_safe(obj), ensure_ascii=False, indent=2, allow_nan=False)
    return (text + "\n").encode("utf-8")


def check_subdir(subdir: str) -> PurePosixPath:
    """A relative folder path below a root: no absolute paths, no `..`, not our tmp area."""
    if "\x00" in subdir:
        raise ValueError(f"subdir contains a NUL byte: {safe_display(subdir)}")
    p = PurePosixPath(subdir)
    if p.is_absolute() or subdir.startswith(("/", "\\")):
        raise ValueError(f"subdir must be a relative path, got {safe_display(subdir)}")
    parts = [part for part in re.split(r"[/\\]", subdir) if part not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"subdir must not contain '..', got {safe_display(subdir)}")
    if parts and parts[0] == TMP_DIR_NAME:
        raise ValueError(f"subdir must not be docinbox's staging folder {TMP_DIR_NAME}")
    return PurePosixPath(*parts)


def fsync_dir(path: Path) -> None:
    """Make a rename/creation inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some filesystems (certain network/FUSE mounts) cannot fsync a directory; the data
        # files themselves were fsynced, which is the best available there.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def write_new_file(path: Path, data: bytes) -> None:
    """Create `path` (must not exist), write, flush and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(dest: Path, data: bytes) -> Path:
    """Create or replace the file `dest` atomically: a reader sees the old or the new
    content, never a part. Temp file in the same folder, fsync, rename, fsync the folder."""
    folder = dest.parent
    tmp = folder / f".docinbox-{secrets.token_hex(8)}.tmp"
    try:
        write_new_file(tmp, data)
        os.rename(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(folder)
    return dest


def ensure_dir(path: Path) -> None:
    """mkdir -p, fsyncing each new folder's parent so the folder survives a power cut."""
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # created concurrently: fine
            os.mkdir(d)
        fsync_dir(d.parent)
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(path))


def remove_tree(path: Path) -> None:
    """Delete a staging leftover; never follows symlinks out of it."""
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    shutil.rmtree(path)
