"""Everything docinbox writes for users: Markdown, content_list.json, meta.json, and the
moves of originals into archive/, duplicates/ and failed/.

The one promise of this module: no user file is ever lost or half-written.

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
- Originals are moved by `os.rename` (atomic) or, across filesystems, copied to a hidden
  temp name, fsynced, renamed, and only then unlinked: a crash leaves at worst a duplicate.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import errno
import json
import logging
import math
import os
import re
import secrets
import shutil
import stat
import threading
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from daemon import __version__
from daemon import page as base
from daemon.errors import FailureKind
from daemon.page import Block

log = logging.getLogger("docinbox.output")

TMP_DIR_NAME = ".docinbox-tmp"
# Inside one staging folder (outbox/.docinbox-tmp/<random>/):
_NEW = "new"  # the folder being built; renamed to its final name when complete
_OLD = "old"  # a replaced folder of the same document, deleted once the new one is in place
_MARKER = "target.json"  # written only once `new` is complete: "roll forward if interrupted"

MAX_STEM_BYTES = 150  # leaves room for "-<64 hex>" plus ".meta.json" under NAME_MAX (255)
# Lengths of the sha256 prefix tried, in order, when a folder name is taken by another doc.
_SHA_PREFIXES = (8, 12, 16, 24, 32, 48, 64)

# Page furniture: MinerU leaves it out of the Markdown (it repeats on every page and breaks
# paragraphs), but it stays in content_list.json so nothing the engine saw is lost.
_MD_DROPPED = frozenset({base.HEADER, base.FOOTER, base.PAGE_NUMBER, "aside_text"})
_TITLE_TYPES = frozenset({base.TITLE, "doc_title", "paragraph_title"})
_CODE_TYPES = frozenset({base.CODE, "algorithm"})
_EQUATION_TYPES = frozenset({base.EQUATION, "equation_block"})
_IMAGE_TYPES = frozenset({base.IMAGE, "chart", "image_block"})

# Serialises "pick a free name, rename into it" within this process, so two threads of the
# daemon never pick the same free name. The archive/failed/duplicates/outbox folders are
# owned by docinbox; nobody else is expected to create names in them concurrently.
_names_lock = threading.Lock()


# --------------------------------------------------------------------------- text hygiene

# C0 controls except \t and \n, DEL, and C1 controls. \r is handled separately (see below).
_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# Lone surrogates come from undecodable bytes (surrogateescape) or broken engine output;
# they cannot be encoded as UTF-8 and would make the write fail, so they go too.
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Remove characters that have no business in a Markdown/JSON file.

    Windows/old-Mac line ends become \\n (dropping \\r would glue lines together); NUL,
    other control characters and lone surrogates are removed. Nothing else is escaped.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL_RE.sub("", text)
    return _SURROGATE_RE.sub("", text)


def _json_safe(value: Any) -> Any:
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
        return _json_safe(value.value)
    if isinstance(value, Mapping):
        return {str(_json_safe(str(k))): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_json_safe(v) for v in value]
    if isinstance(value, os.PathLike):
        return _json_safe(os.fspath(value))
    if isinstance(value, bytes):
        return _json_safe(value.decode("utf-8", "surrogateescape"))
    return _json_safe(str(value))


def _json_bytes(obj: Any) -> bytes:
    text = json.dumps(_json_safe(obj), ensure_ascii=False, indent=2, allow_nan=False)
    return (text + "\n").encode("utf-8")


def safe_display(path_or_name: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> str:
    """A file name made harmless for one log line.

    Printable text is kept as is (so ordinary names, including non-Latin ones, read
    normally). Newlines, control and format characters (e.g. the right-to-left override)
    are shown as Python escapes, undecodable bytes as \\xNN, and a backslash is doubled so
    an escape in the output cannot be mistaken for one in the name.
    """
    raw = os.fspath(path_or_name)
    text = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that was not valid UTF-8 (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch == "\\":
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(repr(ch)[1:-1])
    return "".join(out)


# --------------------------------------------------------------------------- Markdown


def _strip_lines(text: str) -> str:
    """No trailing whitespace on any line, no blank lines at either end."""
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")


def _unwrap_latex(latex: str) -> str:
    """Drop display-math delimiters an engine may already have put around the formula,
    so it is not wrapped twice."""
    s = latex.strip()
    for left, right in (("$$", "$$"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            return s[len(left) : len(s) - len(right)].strip()
    return s


def _fence(code: str) -> str:
    # A fence longer than any backtick run inside, so code containing ``` stays code.
    longest = max((len(m) for m in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{code}\n{fence}"


def _heading_level(block: Block) -> int:
    """0 for body text, else 1..6. A title without a level is a top heading."""
    if block.type in _TITLE_TYPES:
        return min(max(block.text_level, 1), 6)
    if block.type == base.TEXT and block.text_level > 0:
        # MinerU marks headings as text with a text_level; honour that from engines too.
        return min(block.text_level, 6)
    return 0


def _block_markdown(block: Block, image_path: str | None = None) -> str:
    if block.type in _MD_DROPPED:
        return ""
    if block.md is not None:
        return _strip_lines(clean_text(block.md))
    text = clean_text(block.text)
    level = _heading_level(block)
    if level:
        heading = " ".join(text.split())  # a heading is one line
        return f"{'#' * level} {heading}" if heading else ""
    if block.type == base.TABLE:
        if block.html:
            return _strip_lines(clean_text(block.html))
        return _strip_lines(text)
    if block.type in _EQUATION_TYPES:
        latex = _unwrap_latex(clean_text(block.latex if block.latex else block.text))
        return f"$$\n{_strip_lines(latex)}\n$$" if latex else ""
    if block.type in _CODE_TYPES:
        code = _strip_lines(text)
        return _fence(code) if code else ""
    if block.type in _IMAGE_TYPES:
        # No crop was saved for this image, so there is nothing to link to.
        return f"![]({image_path})" if image_path else ""
    if block.type == base.LIST:
        return _strip_lines(text)  # items one per line, as the engine wrote them
    return _strip_lines(text.strip())


def pages_to_markdown(pages: Sequence[Sequence[Block]]) -> str:
    """The document's Markdown, MinerU-style, in the reading order given.

    Blocks are separated by one blank line; headers, footers and page numbers are left out
    (they are in content_list.json); the result ends with exactly one newline.
    """
    parts = [md for page in pages for b in page if (md := _block_markdown(b))]
    return "\n\n".join(parts) + "\n"


# --------------------------------------------------------------------------- content_list


def bbox_1000(bbox: Sequence[float]) -> list[int]:
    """0..1 page fractions -> MinerU's 0..1000 integer grid (clamped; NaN -> 0)."""
    out: list[int] = []
    for v in list(bbox)[:4]:
        f = float(v)
        out.append(min(1000, max(0, round(f * 1000))) if math.isfinite(f) else 0)
    return out + [0] * (4 - len(out))


def _content_entry(block: Block, page_idx: int) -> dict[str, Any]:
    entry: dict[str, Any]
    text = clean_text(block.text)
    if block.type == base.TABLE:
        entry = {
            "type": "table",
            "img_path": "",
            "table_caption": [],
            "table_footnote": [],
            "table_body": clean_text(block.html) if block.html else "",
        }
        if not block.html and text:
            # No HTML structure was recognised; keep the plain text rather than lose it.
            entry["text"] = text
    elif block.type in _EQUATION_TYPES:
        latex = _unwrap_latex(clean_text(block.latex if block.latex else block.text))
        entry = {"type": "equation", "text": f"$$\n{latex}\n$$", "text_format": "latex"}
    elif block.type in _IMAGE_TYPES:
        entry = {"type": block.type, "img_path": "", "image_caption": [], "image_footnote": []}
    elif block.type == base.LIST:
        # MinerU 2.5 (VLM backend) lists: sub_type + one string per item.
        items = [line.rstrip() for line in text.split("\n") if line.strip()]
        entry = {"type": "list", "sub_type": "text", "list_items": items}
    elif block.type in _CODE_TYPES:
        entry = {
            "type": "code",
            "sub_type": block.type,  # "code" | "algorithm"
            "code_body": _strip_lines(text),
            "code_caption": [],
        }
    else:
        level = _heading_level(block)
        # MinerU has no "title" entry type: a title is text with a text_level.
        entry = {"type": "text" if block.type in _TITLE_TYPES else block.type, "text": text}
        if level > 0:
            entry["text_level"] = level
    entry["bbox"] = bbox_1000(block.bbox)
    entry["page_idx"] = page_idx
    return entry


def content_list(pages: Sequence[Sequence[Block]]) -> list[dict[str, Any]]:
    """MinerU-compatible `<stem>_content_list.json` entries, every block, in reading order
    (page furniture included, as MinerU 2.5 does)."""
    return [_content_entry(b, page_idx) for page_idx, page in enumerate(pages) for b in page]


# --------------------------------------------------------------------------- names


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


def _check_subdir(subdir: str) -> PurePosixPath:
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


def _numbered(name: str, n: int) -> str:
    """'scan.pdf' -> 'scan (n).pdf'; the counter goes before the suffix."""
    if n == 0:
        return name
    p = PurePosixPath(name)
    suffix = p.suffix if p.stem else ""
    base_name = name[: len(name) - len(suffix)] if suffix else name
    return f"{base_name} ({n}){suffix}"


# --------------------------------------------------------------------------- durable I/O


def _fsync_dir(path: Path) -> None:
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


def _write_new_file(path: Path, data: bytes) -> None:
    """Create `path` (must not exist), write, flush and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _ensure_dir(path: Path) -> None:
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
        _fsync_dir(d.parent)
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(path))


def _remove_tree(path: Path) -> None:
    """Delete a staging leftover; never follows symlinks out of it."""
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    shutil.rmtree(path)


def _discard(path: Path) -> None:
    """Best-effort cleanup on an error path: the original error matters more."""
    try:
        _remove_tree(path)
    except OSError as exc:
        log.warning("could not remove %s: %s", safe_display(path), exc)


def _make_staging(tmp_root: Path) -> Path:
    for _ in range(5):
        _ensure_dir(tmp_root)
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


# --------------------------------------------------------------------------- outbox


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
    _write_new_file(staging / _MARKER, _json_bytes({"target": list(rel.parts)}))
    _fsync_dir(staging)
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
    _fsync_dir(final.parent)
    try:
        _remove_tree(aside)
    except OSError as exc:
        # The new folder is in place; the old copy is just garbage for cleanup_orphans.
        log.warning("could not delete the replaced %s: %s", safe_display(aside), exc)


class _KeepStaging(OSError):
    """Internal: the staging folder holds the only copy of a folder; don't delete it."""


def write_document(
    outbox: Path,
    subdir: str,
    stem: str,
    sha256: str,
    pages: Sequence[Sequence[Block]],
    meta: Mapping[str, Any],
) -> Path:
    """Write `<stem>.md`, `<stem>_content_list.json` and `<stem>.meta.json` into one new
    folder `outbox/<subdir>/<stem>/`, atomically; return that folder.

    `stem` is sanitised (`sanitize_stem`); the files inside are named after it. If the
    folder already holds this document (same sha256 in its meta.json) it is replaced; if it
    holds another document, the folder becomes `<stem>-<sha256 prefix>`.

    Raises ValueError for a bad `subdir`/`sha256`, OSError for disk problems (after
    removing its staging folder; the caller retries with backoff).
    """
    rel_sub = _check_subdir(subdir)
    sha = _check_sha256(sha256)
    name = sanitize_stem(stem)
    full_meta = dict(meta)
    if "sha256" in full_meta and str(full_meta["sha256"]).lower() != sha:
        raise ValueError("meta['sha256'] does not match the sha256 argument")
    full_meta.setdefault("sha256", sha)
    full_meta.setdefault("docinbox_version", __version__)

    # Render everything before touching the disk: a rendering bug must not leave files.
    files = {
        f"{name}.md": pages_to_markdown(pages).encode("utf-8"),
        f"{name}_content_list.json": _json_bytes(content_list(pages)),
        f"{name}.meta.json": _json_bytes(full_meta),
    }

    outbox = Path(os.path.realpath(outbox))
    _ensure_dir(outbox)
    tmp_root = outbox / TMP_DIR_NAME
    staging = _make_staging(tmp_root)
    keep_staging = False
    try:
        new = staging / _NEW
        os.mkdir(new)
        for filename, data in files.items():
            _write_new_file(new / filename, data)
        _fsync_dir(new)
        _fsync_dir(staging)

        parent = outbox.joinpath(*rel_sub.parts)
        _ensure_dir(parent)
        with _names_lock:
            final = _place(staging, new, parent, name, sha, outbox)
        _fsync_dir(parent)
    except _KeepStaging:
        keep_staging = True
        raise
    finally:
        if not keep_staging:
            try:
                _remove_tree(staging)
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
            _ensure_dir(target.parent)
            os.rename(source, target)
            _fsync_dir(target.parent)
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
            _remove_tree(entry)
        except OSError as exc:
            # Startup must go on; the leftover stays hidden and is retried next start.
            log.warning("could not clean up %s: %s", safe_display(entry), exc)
            continue
        count += 1
    _remove_tmp_root_if_empty(tmp_root)
    if count:
        _fsync_dir(outbox)
    return count


# --------------------------------------------------------------------------- originals


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
        _fsync_dir(dest.parent)
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
        _fsync_dir(src.parent)


def _move(src: Path, dest_root: Path, subdir: str, sidecar: str = "") -> Path:
    rel = _check_subdir(subdir)
    folder = Path(dest_root).joinpath(*rel.parts)
    _ensure_dir(folder)
    with _names_lock:
        dest = folder / _free_name(folder, src.name, sidecar)
        try:
            os.rename(src, dest)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            _copy_across(src, dest)
            return dest
    _fsync_dir(folder)
    with contextlib.suppress(OSError):
        _fsync_dir(src.parent)
    return dest


def move_into(src: Path, dest_root: Path, subdir: str) -> Path:
    """Move `src` to `dest_root/subdir/<name>`, never overwriting; return the new path.

    An existing name gets ` (1)`, ` (2)`, ... before its suffix. Across filesystems the
    file is copied to a hidden temp name, fsynced and renamed before the source is
    unlinked, so a crash leaves at worst a duplicate (and a `.docinbox-*.part` file).
    """
    return _move(Path(src), dest_root, subdir)


# --------------------------------------------------------------------------- failures

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


def _utc_now_iso() -> str:
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    return now.isoformat().replace("+00:00", "Z")


def _write_json_beside(folder: Path, name: str, obj: Any) -> Path:
    """Atomically create `folder/name` (temp file + fsync + rename); never overwrites:
    the caller reserved the name under _names_lock."""
    dest = folder / name
    tmp = folder / f".docinbox-{secrets.token_hex(8)}.tmp"
    try:
        _write_new_file(tmp, _json_bytes(obj))
        os.rename(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)
    return dest


_ERROR_SUFFIX = ".error.json"


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
    rel = _check_subdir(subdir)
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
    _ensure_dir(folder)
    with _names_lock:
        if moved is not None:
            base_name = moved.name
            if os.path.lexists(folder / (base_name + _ERROR_SUFFIX)):
                # Only possible if something outside docinbox raced us; never overwrite.
                base_name = _free_name(folder, base_name, _ERROR_SUFFIX)
        else:
            base_name = _free_name(folder, src.name, _ERROR_SUFFIX)
        _write_json_beside(folder, base_name + _ERROR_SUFFIX, record)
    return moved if moved is not None else folder / base_name


def remove_error_file(original: Path) -> None:
    """Drop `<original>.error.json`: a retried original that succeeded is no failure now."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(Path(original).parent / (Path(original).name + _ERROR_SUFFIX))


def write_error_file(original: Path, error: Mapping[str, Any]) -> Path:
    """(Re)write `<original>.error.json` beside an original already in failed/; return it.

    For a retry that failed again: the record describes the same file, so replacing the
    previous one (atomically: temp file, fsync, rename) is what the user wants to see.
    """
    original = Path(original)
    held = original if os.path.lexists(original) else None
    record = _error_record(original, held, error)
    folder = original.parent
    dest = folder / (original.name + _ERROR_SUFFIX)
    tmp = folder / f".docinbox-{secrets.token_hex(8)}.tmp"
    try:
        _write_new_file(tmp, _json_bytes(record))
        os.rename(tmp, dest)  # replaces the previous record of this same file
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)
    return dest
