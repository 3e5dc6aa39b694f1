"""Office documents (Word, Excel, PowerPoint, OpenDocument, RTF) become PDFs through LibreOffice.

MinerU 4 reads these formats too. docinbox converts them with LibreOffice's own
`soffice --headless --convert-to pdf` (no reimplementation of Office layout could match it)
and then reads the PDF like any other: its text layer is exact, so the lite engine takes it
as it is. Runs in the worker process, one document at a time:

- the original is copied into a private temporary folder first, so LibreOffice never writes
  a lock file (`.~lock.name#`) next to the user's file in the inbox;
- LibreOffice gets its own profile folder there (`-env:UserInstallation`): it neither
  touches the service user's home nor collides with a desktop LibreOffice that is open;
- the conversion has a deadline; past it the whole process group is killed;
- without `soffice` the document fails as unsupported, with the package to install.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from daemon.common.child import SessionChild
from daemon.common.errors import DocumentError, FailureKind
from daemon.document.formats import InputFormat

# Conversions of long documents take a while on a small CPU; a hung soffice must not hold the
# worker until the document deadline.
CONVERT_TIMEOUT_SECONDS = 300.0

# The folder of the document converted last: one document at a time per worker, so the
# previous one's PDF is removed when the next conversion starts, and at exit.
_current: list[Path] = []


def soffice() -> str | None:
    return shutil.which("soffice") or shutil.which("libreoffice")


def convert_to_pdf(
    path: Path, fmt: InputFormat, *, timeout: float = CONVERT_TIMEOUT_SECONDS
) -> Path:
    """The PDF LibreOffice makes of `path` (of office format `fmt`), in a private folder."""
    what, package = fmt.what, fmt.package
    program = soffice()
    if program is None:
        raise DocumentError(
            FailureKind.UNSUPPORTED,
            f"{what} ({fmt.name}) is converted to PDF with LibreOffice, which is not installed "
            f"here: install it (Debian/Ubuntu: apt-get install {package}) and retry",
        )
    _forget_previous()
    work = Path(tempfile.mkdtemp(prefix="docinbox-office-"))
    _current.append(work)
    source = work / f"document{path.suffix.lower() or fmt.usual_extension}"
    try:
        shutil.copyfile(path, source)
    except FileNotFoundError as exc:
        raise DocumentError(FailureKind.VANISHED, "the file disappeared") from exc
    out = work / "out"
    cmd = [
        program,
        f"-env:UserInstallation={(work / 'profile').as_uri()}",
        "--headless",
        "--norestore",
        "--nologo",
        "--nolockcheck",
        "--convert-to",
        "pdf",
        "--outdir",
        str(out),
        str(source),
    ]
    env = {**os.environ, "HOME": str(work)}  # nothing lands in the service user's home
    try:
        child = SessionChild(cmd, env=env)  # its own process group, killed whole on timeout
    except OSError as exc:
        raise DocumentError(
            FailureKind.UNSUPPORTED, f"LibreOffice could not be started ({exc})"
        ) from exc
    code = child.wait(timeout)
    if code is None:
        raise DocumentError(
            FailureKind.TIMEOUT,
            f"LibreOffice did not convert {what} within {timeout:.0f} s",
        )
    # Only for the message below; a helper it left holding the pipe is not waited for
    # past the deadline.
    output, _ = child.output(grace=timeout)
    pdf = out / f"{source.stem}.pdf"
    if code != 0 or not pdf.is_file() or pdf.stat().st_size == 0:
        said = output.decode("utf-8", "replace").strip().splitlines()[-1:] if output else []
        raise DocumentError(
            FailureKind.CORRUPT,
            f"LibreOffice could not convert {what} to PDF (exit {code}"
            + (f": {said[0][:200]}" if said else "")
            + "); it may be damaged or password-protected",
        )
    return pdf


def _forget_previous() -> None:
    while _current:
        shutil.rmtree(_current.pop(), ignore_errors=True)


atexit.register(_forget_previous)
