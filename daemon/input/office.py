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
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import zipfile
from pathlib import Path

from daemon.common.errors import DocumentError, FailureKind

# Conversions of long documents take a while on a small CPU; a hung soffice must not hold the
# worker until the document deadline.
CONVERT_TIMEOUT_SECONDS = 300.0

# Format name -> what a user calls it, and the Debian package that converts it.
OFFICE_FORMATS: dict[str, tuple[str, str]] = {
    "DOCX": ("a Word document", "libreoffice-writer-nogui"),
    "ODT": ("an OpenDocument text", "libreoffice-writer-nogui"),
    "RTF": ("an RTF document", "libreoffice-writer-nogui"),
    "XLSX": ("an Excel workbook", "libreoffice-calc-nogui"),
    "ODS": ("an OpenDocument spreadsheet", "libreoffice-calc-nogui"),
    "PPTX": ("a PowerPoint presentation", "libreoffice-impress-nogui"),
    "ODP": ("an OpenDocument presentation", "libreoffice-impress-nogui"),
}

_ODF_MIMETYPES = {
    b"application/vnd.oasis.opendocument.text": "ODT",
    b"application/vnd.oasis.opendocument.spreadsheet": "ODS",
    b"application/vnd.oasis.opendocument.presentation": "ODP",
}
_OOXML_PARTS = (("word/", "DOCX"), ("xl/", "XLSX"), ("ppt/", "PPTX"))

# The folder of the document converted last: one document at a time per worker, so the
# previous one's PDF is removed when the next conversion starts, and at exit.
_current: list[Path] = []


def office_format(path: Path, head: bytes) -> str | None:
    """DOCX/XLSX/PPTX/ODT/ODS/ODP/RTF from the content, or None for anything else."""
    if head.startswith(b"{\\rtf"):
        return "RTF"
    if not head.startswith(b"PK\x03\x04"):
        return None
    # ODF stores an uncompressed `mimetype` member first, readable at a fixed offset.
    if head[30:38] == b"mimetype":
        for mime, fmt in _ODF_MIMETYPES.items():
            if head[38 : 38 + len(mime)] == mime:
                return fmt
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
    if "[Content_Types].xml" not in names:
        return None
    for prefix, fmt in _OOXML_PARTS:
        if any(n.startswith(prefix) for n in names):
            return fmt
    return None


def soffice() -> str | None:
    return shutil.which("soffice") or shutil.which("libreoffice")


def convert_to_pdf(path: Path, fmt: str, *, timeout: float = CONVERT_TIMEOUT_SECONDS) -> Path:
    """The PDF LibreOffice makes of `path`, in a private temporary folder."""
    what, package = OFFICE_FORMATS[fmt]
    program = soffice()
    if program is None:
        raise DocumentError(
            FailureKind.UNSUPPORTED,
            f"{what} ({fmt}) is converted to PDF with LibreOffice, which is not installed "
            f"here: install it (Debian/Ubuntu: apt-get install {package}) and retry",
        )
    _forget_previous()
    work = Path(tempfile.mkdtemp(prefix="docinbox-office-"))
    _current.append(work)
    source = work / f"document{path.suffix.lower() or '.' + fmt.lower()}"
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
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group, killed whole on timeout
        )
    except OSError as exc:
        raise DocumentError(
            FailureKind.UNSUPPORTED, f"LibreOffice could not be started ({exc})"
        ) from exc
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise DocumentError(
            FailureKind.TIMEOUT,
            f"LibreOffice did not convert {what} within {timeout:.0f} s",
        ) from None
    pdf = out / f"{source.stem}.pdf"
    if proc.returncode != 0 or not pdf.is_file() or pdf.stat().st_size == 0:
        said = output.decode("utf-8", "replace").strip().splitlines()[-1:] if output else []
        raise DocumentError(
            FailureKind.CORRUPT,
            f"LibreOffice could not convert {what} to PDF (exit {proc.returncode}"
            + (f": {said[0][:200]}" if said else "")
            + "); it may be damaged or password-protected",
        )
    return pdf


def _forget_previous() -> None:
    while _current:
        shutil.rmtree(_current.pop(), ignore_errors=True)


atexit.register(_forget_previous)
