"""Folder checks: the inboxes exist, are mounted (a share listed in /etc/fstab) and can be
read, no output folder is inside an inbox (or holds one), output folders are distinct, and
each is created and actually written into (a read-only or full NFS/SMB mount passes
os.access).

Plain paths in, problems out: this module knows nothing of the config's shape, so the
config can run it on a half-valid file too.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from daemon.common.display import safe_display
from daemon.common.mounttable import read_fstab, read_mountinfo, unmounted_share
from daemon.common.shares import NotAnswering, ShareCall, direct
from daemon.config.values import Problem


def folder_in_error(
    exc: OSError, folders: Sequence[tuple[str, Path]], *, default: tuple[str, Path]
) -> str:
    """Which of the named folders an OSError is about, as "the archive (/srv/archive)".

    A failed rename names both ends (filename, filename2) whichever end refused, so where
    both are known the one that is not writable now is named.
    """
    found: list[tuple[str, Path]] = []
    for filename in (exc.filename2, exc.filename):
        if not filename:
            continue
        path = Path(os.fsdecode(filename))
        found += [(name, folder) for name, folder in folders
                  if path == folder or path.is_relative_to(folder)][:1]
    for name, folder in found:
        if not os.access(folder, os.W_OK):
            return f"the {name} ({safe_display(folder)})"
    name, folder = found[0] if found else default
    return f"the {name} ({safe_display(folder)})"


def real_path(path: Path) -> Path:
    # strict=False: folders that do not exist yet still compare by their resolved parent.
    return path.expanduser().resolve(strict=False)


def inside(inner: Path, outer: Path) -> bool:
    """True when `inner` is `outer` or below it (both already resolved)."""
    return inner == outer or outer in inner.parents


def _check_writable(key: str, folder: Path) -> Problem | None:
    hint = f"fix the owner or mount options, e.g. chown <daemon user> {folder}"
    if not folder.is_dir():
        return Problem(
            key,
            f"{folder} exists but is not a folder",
            "point it at a folder, or move the file away",
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        return Problem(key, f"{folder} is not writable", hint)
    # os.access answers from mode bits; a read-only (or full) NFS/SMB mount can still
    # refuse the write, so actually write.
    try:
        fd, probe = tempfile.mkstemp(prefix=".docinbox-write-test-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return Problem(key, f"cannot write into {folder}: {exc.strerror or exc}", hint)
    return None


def _read_or_none(read: Callable[[], str]) -> str | None:
    try:
        return read()
    except OSError:
        return None  # no fstab (containers) or no /proc: the check cannot be made


def _unmounted(
    key: str, path: Path, real: Path, fstab: str | None, mountinfo: str | None
) -> Problem | None:
    """A share's mount point that exists but has nothing mounted on it: an empty folder
    of the parent file system, which must not be taken for an empty inbox."""
    if fstab is None or mountinfo is None:
        return None
    entry = unmounted_share(str(real), fstab, mountinfo)
    if entry is None:
        return None
    return Problem(
        key,
        f"inbox {path} is not mounted: {entry.mount_point} is listed in /etc/fstab "
        f"({entry.fstype} {entry.source}) but nothing is mounted there now",
        f"mount it (mount {entry.mount_point}); under systemd, start docinbox after it with "
        f"RequiresMountsFor={entry.mount_point} (docs/systemd.md)",
    )


def _not_answering(key: str, what: str, exc: NotAnswering) -> Problem:
    # Said like a share that is not mounted: the folder cannot be used now.
    return Problem(
        key,
        f"{what} is not answering: {exc.strerror}",
        "is its server down (a hard NFS mount)? try again once it answers",
    )


def _inbox_problem(
    key: str, path: Path, real: Path, fstab: str | None, mountinfo: str | None
) -> Problem | None:
    """One inbox: there, a folder, mounted and readable (calls into its share)."""
    mkdir_hint = f"is the share mounted? create it with: mkdir -p {path}"
    if not real.exists():
        return Problem(key, f"inbox {path} does not exist", mkdir_hint, away=str(path))
    if not real.is_dir():
        return Problem(key, f"inbox {path} is not a folder", "point it at a folder")
    if (unmounted := _unmounted(key, path, real, fstab, mountinfo)) is not None:
        return unmounted
    if not os.access(real, os.R_OK | os.X_OK):
        return Problem(key, f"inbox {path} is not readable", "give the daemon's user read access")
    return None


def _inbox_problems(
    inboxes: list[tuple[str, Path, Path]],
    fstab: str | None,
    mountinfo: str | None,
    call: ShareCall = direct,
) -> list[Problem]:
    problems: list[Problem] = []
    for key, path, real in inboxes:
        try:
            problem = call(real, partial(_inbox_problem, key, path, real, fstab, mountinfo))
        except NotAnswering as exc:
            problem = _not_answering(key, f"inbox {path}", exc)
        if problem is not None:
            problems.append(problem)

    # Nested inboxes: one file would belong to two inboxes and be processed twice.
    for (key_a, _, real_a), (key_b, _, real_b) in itertools.combinations(inboxes, 2):
        if real_a == real_b:
            problems.append(
                Problem(key_b, f"is the same folder as {key_a} ({real_a})", "list each folder once")
            )
        elif inside(real_a, real_b) or inside(real_b, real_a):
            inner, outer = (key_a, key_b) if inside(real_a, real_b) else (key_b, key_a)
            problems.append(
                Problem(
                    inner,
                    f"is inside {outer}: its files would belong to both inboxes",
                    "use one inbox (recursive: true covers subfolders) or move one out",
                )
            )
    return problems


def check_folders(
    inbox_paths: Sequence[Path],
    outputs: Sequence[tuple[str, Path]],
    *,
    create: bool,
    fstab: str | None = None,
    mountinfo: str | None = None,
    call: ShareCall = direct,
) -> list[Problem]:
    """Every filesystem problem at once (empty list: good to run).

    `inbox_paths` are reported as `inboxes[i].path`; `outputs` are (config key, folder)
    for the folders the daemon writes to. With `create`, missing output folders are made
    (with parents); `state_dir` gets mode 0o700 since its database holds file names.
    `fstab`, `mountinfo`: the mount tables' text (None: read /etc/fstab and
    /proc/self/mountinfo), to refuse an inbox on a share that is not mounted.
    `call`: how a call into a folder's share is made (the daemon's reload passes its
    share lanes, so a hung share costs one deadline and is reported as not answering).
    """
    hung: list[Problem] = []

    def resolve(key: str, what: str, path: Path) -> Path | None:
        try:
            return call(path, lambda: real_path(path))
        except NotAnswering as exc:
            hung.append(_not_answering(key, what, exc))
            return None

    inboxes = [
        (key, p, real)
        for i, p in enumerate(inbox_paths)
        if (real := resolve(key := f"inboxes[{i}].path", f"inbox {p}", p)) is not None
    ]
    if inboxes:
        fstab = fstab if fstab is not None else _read_or_none(read_fstab)
        mountinfo = mountinfo if mountinfo is not None else _read_or_none(read_mountinfo)
    problems = _inbox_problems(inboxes, fstab, mountinfo, call)

    resolved = [
        (key, folder, real)
        for key, folder in outputs
        if (real := resolve(key, f"{key} {folder}", folder)) is not None
    ]
    overlaps, dangerous = _overlap_problems(resolved, inboxes)
    problems += overlaps
    problems += _distinct_problems(resolved)
    for key, folder, real in resolved:
        if key in dangerous:
            continue  # do not create folders inside an inbox; the problem is reported
        try:
            problem = call(real, partial(_ensure_output, key, folder, real, create=create))
        except NotAnswering as exc:
            problem = _not_answering(key, f"{key} {folder}", exc)
        if problem is not None:
            problems.append(problem)
    return problems + hung


def _overlap_problems(
    resolved: list[tuple[str, Path, Path]], inboxes: list[tuple[str, Path, Path]]
) -> tuple[list[Problem], set[str]]:
    """An output folder inside an inbox, or an inbox inside an output folder; and the
    output keys involved, which are then neither created nor test-written."""
    problems: list[Problem] = []
    dangerous: set[str] = set()
    reingest = "the daemon would ingest its own output over and over"
    for out_key, folder, out_real in resolved:
        for in_key, _inbox, in_real in inboxes:
            if inside(out_real, in_real):
                relation = "is the same folder as" if out_real == in_real else "is inside"
                inbox_key = in_key.removesuffix(".path")
                problems.append(
                    Problem(
                        out_key,
                        f"{folder} {relation} inbox {inbox_key} ({in_real}): {reingest}",
                        "put output folders next to the inbox, not inside it",
                    )
                )
                dangerous.add(out_key)
            elif inside(in_real, out_real):
                problems.append(
                    Problem(
                        in_key,
                        f"inbox {in_real} is inside {out_key} ({folder}): {reingest}",
                        "put the inbox next to the output folders, not inside one",
                    )
                )
                dangerous.add(out_key)
    return problems, dangerous


def _distinct_problems(resolved: list[tuple[str, Path, Path]]) -> list[Problem]:
    # Pairwise distinct: e.g. archive == failed would mix good and failed originals, and
    # failed == outbox would hand originals to whatever consumes the outbox.
    problems: list[Problem] = []
    for (key_a, _, real_a), (key_b, folder_b, real_b) in itertools.combinations(resolved, 2):
        if real_a == real_b:
            problems.append(
                Problem(
                    key_b,
                    f"{folder_b} is the same folder as {key_a}",
                    f"give {key_a} and {key_b} separate folders",
                )
            )
    return problems


def _ensure_output(key: str, folder: Path, real: Path, *, create: bool) -> Problem | None:
    """One output folder: there (made, with `create`) and actually writable."""
    if not os.path.lexists(real):
        if not create:
            return Problem(key, f"{folder} does not exist", f"create it with: mkdir -p {folder}")
        try:
            real.mkdir(parents=True, exist_ok=True)
            if key == "state_dir":
                # mkdir's mode is filtered by the umask; chmod sets it exactly.
                real.chmod(0o700)
        except OSError as exc:
            return Problem(
                key,
                f"cannot create {folder}: {exc.strerror or exc}",
                "create it by hand or fix the parent folder's permissions",
            )
    return _check_writable(key, real)
