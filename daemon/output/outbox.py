"""The outbox writer: a document's folder of files appears complete or not at all.

It writes whatever files it is given (`publish` decides which, `formats` renders them);
its one promise is that no output is ever lost or half-written.

- An outbox folder is built complete in `outbox/.docinbox-tmp/<random>/` (same filesystem,
  hidden), every file and folder is fsynced, and only then is it renamed into place. A
  reader therefore sees either no folder or a complete one.
- Reprocessing the same document (same sha256) replaces its folder in two renames: the old
  folder is moved aside into the staging folder, then the new one is moved in. Between
  those two renames (microseconds) the final name is absent. If the process dies exactly
  there, both complete folders sit in the staging folder next to a `target.json` marker
  written before the first rename, and `cleanup_orphans` (run at startup) moves the new
  one into place. So after any crash plus restart there is the old or the new complete
  folder, never neither and never a mix.
- A folder that belongs to a different document is never overwritten; the new one gets a
  `-<sha256 prefix>` suffix instead.
- The folder is identified as a document's by the `sha256` in its single `*.meta.json`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import secrets
import stat
import unicodedata
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath

from daemon.common.display import safe_display
from daemon.output.durable import (
    TMP_DIR_NAME,
    check_subdir,
    ensure_dir,
    fsync_dir,
    json_bytes,
    names_lock,
    remove_tree,
    write_new_file,
)

log = logging.getLogger("docinbox.outbox")

# Inside one staging folder (outbox/.docinbox-tmp/<random>/):
_NEW = "new"  # the folder being built; renamed to its final name when complete
_OLD = "old"  # a replaced folder of the same document, deleted once the new one is in place
_MARKER = "target.json"  # written only once `new` is complete: "roll forward if interrupted"

MAX_STEM_BYTES = 150  # leaves room for "-<64 hex>" plus ".meta.json" under NAME_MAX (255)
# Lengths of the sha256 prefix tried, in order, when a folder name is taken by another doc.
_SHA_PREFIXES = (8, 12, 16, 24, 32, 48, 64)

_WINDOWS_RESERVED_RE = re.compile(r'[<>:"|?*]')


def sanitize_stem(stem: str) -> str:
    """A safe single folder/file name component derived from a document's name.

    No path separators, no `..`, no control characters, no leading dots (hidden files /
    our own staging folder), no trailing dots or spaces and no `<>:"|?*` (outboxes are
    often synced to Windows machines, which refuse those), at most MAX_STEM_BYTES of
    UTF-8 cut on a character boundary. Unicode letters are kept. Empty -> "document".
    """
    chars: list[str] = []
    for ch in stem:
        cat = unicodedata.category(ch)
        if ch in "/\\":
            chars.append("_")
        elif ch.isspace():
            chars.append(" ")  # newlines, tabs, odd spaces: one plain space
        elif cat == "Cs":
            chars.append("_")  # an undecodable byte: mark the spot
        elif cat in ("Cc", "Cf", "Co", "Cn"):
            continue
        else:
            chars.append(ch)
    name = " ".join("".join(chars).split())
    name = _WINDOWS_RESERVED_RE.sub("_", name)
    name = re.sub(r"\.{2,}", ".", name)
    name = name.lstrip(". ").rstrip(". ")
    raw = name.encode("utf-8")
    if len(raw) > MAX_STEM_BYTES:
        name = raw[:MAX_STEM_BYTES].decode("utf-8", "ignore").rstrip(". ")
    return name or "document"


def _check_sha256(sha256: str) -> str:
    sha = sha256.lower()
    if len(sha) < 8 or not re.fullmatch(r"[0-9a-f]+", sha):
        raise ValueError(f"sha256 must be a hex digest, got {safe_display(sha256)}")
    return sha


def _folder_candidates(stem: str, sha: str) -> Iterator[str]:
    yield stem
    for n in _SHA_PREFIXES:
        if n <= len(sha):
            yield f"{stem}-{sha[:n]}"
    i = 2
    while True:  # only if even the full digest is taken by another document
        yield f"{stem}-{sha}-{i}"
        i += 1


def _make_staging(tmp_root: Path) -> Path:
    for _ in range(5):
        ensure_dir(tmp_root)
        try:
            return Path(os.path.realpath(os.fspath(_mkdtemp(tmp_root))))
        except FileNotFoundError:
            continue  # another writer removed the empty tmp root in between; recreate it
    raise FileNotFoundError(errno.ENOENT, "staging folder vanished repeatedly", str(tmp_root))


def _mkdtemp(parent: Path) -> Path:
    # mkdtemp's 0o700 is fine here: the staging folder itself is never published, only
    # the `new` folder inside it, which gets normal umask permissions.
    while True:
        p = parent / f"w-{secrets.token_hex(8)}"
        try:
            os.mkdir(p, 0o700)
            return p
        except FileExistsError:
            continue


def _remove_tmp_root_if_empty(tmp_root: Path) -> None:
    # Keeps the outbox tidy; a concurrent writer that needs it recreates it (_make_staging).
    with contextlib.suppress(OSError):
        os.rmdir(tmp_root)


def _meta_sha256(folder: Path) -> str | None:
    """The sha256 recorded in an existing outbox folder, or None if it is not a readable
    docinbox folder (then it is treated as someone else's and never touched)."""
    try:
        if folder.is_symlink() or not folder.is_dir():
            return None
        metas = [p for p in folder.iterdir() if p.name.endswith(".meta.json")]
        if len(metas) != 1:
            return None
        data = json.loads(metas[0].read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    sha = data.get("sha256") if isinstance(data, dict) else None
    return sha.lower() if isinstance(sha, str) else None


def _rename_in(new: Path, final: Path) -> bool:
    """Rename the complete `new` folder to `final`; False if `final` appeared meanwhile.

    rename(2) refuses to replace a non-empty folder, so a folder that some other writer
    created a moment ago is never clobbered.
    """
    try:
        os.rename(new, final)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            return False
        raise
    return True


def _replace(staging: Path, new: Path, final: Path, outbox: Path) -> None:
    """Swap an older outbox folder of the same document for `new` (see module docstring)."""
    rel = final.relative_to(outbox)
    write_new_file(staging / _MARKER, json_bytes({"target": list(rel.parts)}))
    fsync_dir(staging)
    aside = staging / _OLD
    os.rename(final, aside)
    # --- window: `final` is absent; both complete folders are in `staging` ---
    try:
        os.rename(new, final)
    except BaseException:
        try:
            os.rename(aside, final)  # roll back: the old folder is back, nothing changed
        except OSError:
            log.error(
                "could not put %s back; cleanup_orphans restores it at the next start",
                safe_display(final),
            )
            raise _KeepStaging() from None
        raise
    fsync_dir(final.parent)
    try:
        remove_tree(aside)
    except OSError as exc:
        # The new folder is in place; the old copy is just garbage for cleanup_orphans.
        log.warning("could not delete the replaced %s: %s", safe_display(aside), exc)


class _KeepStaging(OSError):
    """Internal: the staging folder holds the only copy of a folder; don't delete it."""


def _check_relpath(relpath: str) -> PurePosixPath:
    """A file's path inside the document folder: relative, no `..`, no empty parts."""
    p = PurePosixPath(relpath)
    if p.is_absolute() or not p.parts or any(part in ("", ".", "..") for part in p.parts):
        raise ValueError(f"bad file path inside an outbox folder: {safe_display(relpath)}")
    return p


def write_folder(
    outbox: Path, subdir: str, name: str, sha256: str, files: Mapping[str, bytes]
) -> Path:
    """Publish `files` ({path inside the folder: content}) as the new folder
    `outbox/<subdir>/<name>/`, atomically; return that folder.

    `name` must already be a `sanitize_stem` result. If the folder already holds this
    document (same sha256 in its meta.json) it is replaced; if it holds another document,
    the folder becomes `<name>-<sha256 prefix>`. Paths in `files` may have subfolders
    (`images/page_0_image_1.jpg`), which are created.

    Raises ValueError for a bad `subdir`/`sha256`/name/path, OSError for disk problems
    (after removing its staging folder; the caller retries with backoff).
    """
    rel_sub = check_subdir(subdir)
    sha = _check_sha256(sha256)
    if sanitize_stem(name) != name:
        raise ValueError(f"folder name is not sanitised: {safe_display(name)}")
    rel_files = {_check_relpath(path): data for path, data in files.items()}

    outbox = Path(os.path.realpath(outbox))
    ensure_dir(outbox)
    tmp_root = outbox / TMP_DIR_NAME
    staging = _make_staging(tmp_root)
    keep_staging = False
    try:
        new = staging / _NEW
        os.mkdir(new)
        folders = {new}
        for rel, data in rel_files.items():
            dest = new.joinpath(*rel.parts)
            if dest.parent not in folders:
                ensure_dir(dest.parent)
                folders.add(dest.parent)
            write_new_file(dest, data)
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            fsync_dir(folder)
        fsync_dir(staging)

        parent = outbox.joinpath(*rel_sub.parts)
        ensure_dir(parent)
        with names_lock:
            final = _place(staging, new, parent, name, sha, outbox)
        fsync_dir(parent)
    except _KeepStaging:
        keep_staging = True
        raise
    finally:
        if not keep_staging:
            try:
                remove_tree(staging)
            except OSError as exc:
                log.warning("could not remove staging %s: %s", safe_display(staging), exc)
            _remove_tmp_root_if_empty(tmp_root)
    return final


def _place(staging: Path, new: Path, parent: Path, name: str, sha: str, outbox: Path) -> Path:
    for candidate in _folder_candidates(name, sha):
        final = parent / candidate
        if os.path.lexists(final):
            if _meta_sha256(final) == sha:
                _replace(staging, new, final, outbox)
                return final
            continue  # another document's folder (or not ours at all): never touch it
        if _rename_in(new, final):
            return final
        # Appeared between the check and the rename; look at it again.
        if _meta_sha256(final) == sha:
            _replace(staging, new, final, outbox)
            return final
    raise AssertionError("unreachable: _folder_candidates is endless")


def _recover(entry: Path, outbox: Path) -> None:
    """Finish a same-document replacement that a crash interrupted (see module docstring)."""
    try:
        data = json.loads((entry / _MARKER).read_text(encoding="utf-8"))
        parts = data["target"]
        if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
            return
    except (OSError, ValueError, KeyError, TypeError):
        return  # no marker: the build never completed, so there is nothing to restore
    if not parts or any(p in ("", ".", "..") or "/" in p or "\x00" in p for p in parts):
        log.warning("ignoring a malformed %s in %s", _MARKER, safe_display(entry))
        return
    if parts[0] == TMP_DIR_NAME:
        return
    target = outbox.joinpath(*parts)
    if os.path.lexists(target):
        return  # the old or the new folder is in place; the rest is garbage
    for source in (entry / _NEW, entry / _OLD):
        if source.is_dir() and not source.is_symlink():
            ensure_dir(target.parent)
            os.rename(source, target)
            fsync_dir(target.parent)
            log.warning("restored %s after an interrupted replacement", safe_display(target))
            return


def cleanup_orphans(outbox: Path) -> int:
    """Remove what interrupted writes left in `outbox/.docinbox-tmp/`; return how many.

    Call at startup, before any writer runs. An interrupted same-document replacement is
    first completed (the new folder moved into place), so no document is lost. Nothing
    outside the staging area is deleted.
    """
    outbox = Path(os.path.realpath(outbox))
    tmp_root = outbox / TMP_DIR_NAME
    try:
        st = os.lstat(tmp_root)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "staging area is not a folder", str(tmp_root))
    count = 0
    for entry in sorted(tmp_root.iterdir()):
        try:
            if entry.is_dir() and not entry.is_symlink():
                _recover(entry, outbox)
            remove_tree(entry)
        except OSError as exc:
            # Startup must go on; the leftover stays hidden and is retried next start.
            log.warning("could not clean up %s: %s", safe_display(entry), exc)
            continue
        count += 1
    _remove_tmp_root_if_empty(tmp_root)
    if count:
        fsync_dir(outbox)
    return count
