"""The status page people open in a browser: HTML drawn on the server from one `Status`.

- Templates (Jinja2, autoescaping on) live in `daemon/service/templates/`, with the page's one
  stylesheet and its few lines of JavaScript; nothing is fetched from elsewhere, so the
  page works on a machine with no internet and under a strict Content-Security-Policy.
- Documents are untrusted input. Their Markdown is rendered by markdown-it-py with raw
  HTML disabled: a `<script>` in a document is shown as text, never run; its link
  validator drops `javascript:`-style URLs. The CSP forbids inline script anyway.
- Documents are found by job id only: the job's output folder comes from the database and
  must lie inside the configured outbox; nothing in the request names a file.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import time
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined
from markdown_it import MarkdownIt
from markupsafe import Markup

from daemon import __version__
from daemon.common.display import safe_display
from daemon.common.units import age, gib, mib
from daemon.config.settings import Config
from daemon.jobs.states import JobState
from daemon.jobs.store import Job
from daemon.output.publish import FileNames
from daemon.service import charts
from daemon.service.health import Health
from daemon.service.status import Status

# No inline script or style, nothing from other origins, no framing, no forms.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

# A Markdown file bigger than this is shown cut (a 2,000-page book would make a page the
# browser of a phone chokes on); the file in the outbox stays whole.
MAX_MARKDOWN_BYTES = 4 * 2**20

_STATIC_FILES = {"/static/page.css": "text/css", "/static/page.js": "text/javascript"}


def _name(path: str) -> str:
    return safe_display(Path(path).name)


def _clock(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("daemon.service", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        age=age, gib=gib, mib=mib, name=_name, display=safe_display, clock=_clock
    )
    return env


def _static() -> dict[str, tuple[str, bytes]]:
    folder = importlib.resources.files("daemon.service") / "templates"
    return {
        url: (f"{ctype}; charset=utf-8", (folder / url.rsplit("/", 1)[1]).read_bytes())
        for url, ctype in _STATIC_FILES.items()
    }


_ENV = _environment()
# Read once at import: served from memory by URL, never looked up from the request path.
STATIC = _static()
# commonmark + tables (the lite engine's and MinerU's Markdown use pipe tables); "html":
# False escapes every raw HTML tag in the document.
_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")


def signature(status: Status) -> str:
    """What the page's script compares with /status.json to know it must reload."""
    q = status.queue
    counts = q.counts if q else {}
    cur = status.current
    parts = [str(cur.job_id) if cur else ""]
    parts += [str(counts[s.value]) if s.value in counts else "" for s in JobState]
    parts += ["1" if status.fallback_reason else "0", "1" if status.running else "0"]
    # A folder going or coming back changes what the page must say.
    parts += [",".join(ib.path for ib in status.inboxes if ib.missing is not None)]
    parts += [",".join(f.name for f in status.missing_folders)]
    return "|".join(parts)


def status_page(status: Status, health: Health) -> str:
    recent = status.queue.last_page_seconds if status.queue else ()
    return _ENV.get_template("status.html").render(
        st=status,
        health=health,
        version=__version__,
        signature=signature(status),
        recent_seconds=recent,
        pages_chart=charts.pages_per_hour(status.queue.pages_per_hour if status.queue else ()),
        seconds_chart=charts.seconds_per_page(recent),
    )


@dataclass(frozen=True)
class DocumentPaths:
    """Where a done job's Markdown and content_list are on disk."""

    markdown: Path
    content_list: Path | None


def document_paths(cfg: Config, job: Job) -> DocumentPaths | None:
    """The outputs of a done job, or None. The folder comes from the database, and is
    accepted only inside the outbox (a database from elsewhere must not make this
    server read /etc). The file names are publish's (`FileNames`)."""
    if job.state != JobState.DONE or not job.output_dir:
        return None
    outbox = cfg.outbox.resolve()
    folder = Path(job.output_dir).resolve()
    if not folder.is_relative_to(outbox) or not folder.is_dir():
        return None
    names = FileNames.in_folder(folder)
    markdown = folder / names.markdown
    if not markdown.is_file():
        found = sorted(p for p in markdown.parent.glob("*.md") if not p.name.startswith("."))
        if not found:
            return None
        markdown = found[0]
        names = dataclasses.replace(names, name=markdown.stem)
    content_list = folder / names.content_list
    for p in (markdown, content_list):
        if p.is_symlink():
            return None
    return DocumentPaths(markdown, content_list if content_list.is_file() else None)


def read_capped(path: Path, cap: int) -> tuple[bytes, bool]:
    with path.open("rb") as f:
        data = f.read(cap + 1)
    return data[:cap], len(data) > cap


def document_page(job: Job, markdown: bytes, truncated: bool) -> str:
    text = markdown.decode("utf-8", "replace")
    # Safe to mark: markdown-it escapes raw HTML ("html": False) and rejects unsafe links.
    body = Markup(_MARKDOWN.render(text))
    return _ENV.get_template("document.html").render(
        job=job,
        name=_name(job.source_path),
        body=body,
        truncated=truncated,
        shown=len(markdown),
    )

