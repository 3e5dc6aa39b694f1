"""The smaller sections: an inbox (`inboxes[]`), `limits:`, `worker:`, `logging:`,
`output:` and `http:` (the status page).

Declared as every section is (see daemon/config/settings.py, which holds the top level
and reads the status page's token file through daemon/config/secrets.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from daemon.common.shares import DEADLINE_SECONDS
from daemon.config.engine import PAGE_OPTION_KEYS, p_page_overrides
from daemon.config.schema import required, setting, settings
from daemon.config.values import (
    INVALID,
    Ctx,
    echo,
    p_bool,
    p_int,
    p_path,
    p_seconds,
    p_size,
    p_text,
    p_text_list,
    type_name,
)
from daemon.document.formats import DEFAULT_PATTERNS

WatchMode = Literal["auto", "events", "poll"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


def _p_subfolder(ctx: Ctx, key: str, value: object) -> object:
    if not isinstance(value, str):
        ctx.problem(key, f"expected a string, got {type_name(value)}")
        return INVALID
    text = value.strip().strip("/")
    parts = Path(text).parts
    if value.strip().startswith(("/", "~")) or ".." in parts:
        # The subfolder is joined under outbox/archive/failed; this keeps it there.
        ctx.problem(
            key,
            f"{echo(value)} must stay inside the outbox",
            "use a relative name like 'invoices' (no leading /, ~ or ..)",
        )
        return INVALID
    return text


@settings
class InboxConfig:
    path: Path = required(
        parse=p_path, doc="the folder to watch", required_hint="the folder to watch"
    )
    recursive: bool = setting(
        default=True, parse=p_bool, doc="also watch subfolders; outputs mirror their layout"
    )
    patterns: tuple[str, ...] = setting(
        default=DEFAULT_PATTERNS,
        parse=p_text_list(allow_empty=False),
        shown_default="every extension in [What docinbox reads](#what-docinbox-reads)",
        doc="file-name patterns to pick up",
    )
    watch: WatchMode = setting(
        default="auto",
        choices=get_args(WatchMode),
        doc="`auto` polls network/FUSE mounts and uses inotify elsewhere; `events`; `poll`",
    )
    # Subfolder of the outbox (and archive/failed/duplicates) for this inbox's documents.
    output_subfolder: str = setting(
        default="",
        parse=_p_subfolder,
        doc="put this inbox's outputs (and originals) under this subfolder",
    )
    # Overrides of page-time engine keys (PAGE_OPTION_KEYS) for documents from this inbox.
    engine_options: dict[str, object] = setting(
        default_factory=dict,
        parse=p_page_overrides,
        doc="per-inbox values of the engine's page keys: " + ", ".join(sorted(PAGE_OPTION_KEYS)),
    )


@settings
class LimitsConfig:
    max_file_bytes: int = setting(
        default=512 * 1024 * 1024,
        yaml="max_file_size",
        parse=p_size,
        shown_default="`512MiB`",
        doc="larger files fail as `too_large` without being opened",
    )
    max_pages: int = setting(
        default=2000, parse=p_int(1), doc="documents with more pages fail as `too_large`"
    )
    page_timeout_seconds: float = setting(
        default=900.0,
        parse=p_seconds(),
        doc="deadline per page (a CPU VLM page can take minutes); the worker is killed, "
        "the document fails as `timeout`",
    )
    document_timeout_seconds: float = setting(
        default=24 * 3600.0,
        parse=p_seconds(),
        at_least=("page_timeout_seconds", "a page cannot outlast its document"),
        doc="deadline per document",
    )
    max_image_pixels: int = setting(
        default=180_000_000, parse=p_int(1), doc="Pillow's decompression-bomb limit"
    )
    share_deadline_seconds: float = setting(
        default=DEADLINE_SECONDS,
        parse=p_seconds(),
        doc="a call into an inbox or output folder that has not returned after this long "
        "marks its share not answering (a hard NFS mount whose server is down); the "
        "daemon goes on without it",
    )
    database_wait_seconds: float = setting(
        default=60.0,
        parse=p_seconds(),
        doc="how long a database write waits for another process's lock (a backup, an "
        "`sqlite3` shell) before the daemon logs `database busy` and tries again later",
    )


@settings
class WorkerConfig:
    max_attempts: int = setting(
        default=3,
        parse=p_int(1),
        doc="worker crashes on one document before it fails as `crashed`; for `docinbox "
        "parse`, also the worker's failed starts in a row before it gives up",
    )
    heartbeat_seconds: float = setting(
        default=5.0, parse=p_seconds(), doc="the worker reports it is alive this often"
    )
    heartbeat_timeout_seconds: float = setting(
        default=120.0,
        parse=p_seconds(),
        at_least=(
            "heartbeat_seconds",
            "otherwise a healthy worker would be declared dead between two heartbeats",
        ),
        doc="silence after which the worker is killed and restarted",
    )
    startup_timeout_seconds: float = setting(
        default=900.0,
        parse=p_seconds(),
        doc="time allowed to load the engine (weights from a slow disk)",
    )
    recycle_after_documents: int = setting(
        default=500, parse=p_int(1), doc="restart the worker after this many documents"
    )
    # No "0 = off" here: the supervisor compares against these directly, so 0 would
    # recycle the worker after every document.
    max_rss_mb: int = setting(
        default=12_000, parse=p_int(1), doc="restart the worker between documents above this RSS"
    )
    restart_backoff_seconds: float = setting(
        default=2.0,
        parse=p_seconds(strict=False),
        doc="wait before restarting a crashed worker; doubles per crash in a row",
    )
    restart_backoff_max_seconds: float = setting(
        default=300.0,
        parse=p_seconds(strict=False),
        at_least=("restart_backoff_seconds", "the cap must not be below the start"),
        doc="the cap of that wait",
    )
    output_retry_seconds: float = setting(
        default=30.0,
        parse=p_seconds(strict=False),
        doc="when the outbox cannot be written, retry a finished document after this long; "
        "doubles per failed try",
    )
    output_retry_max_seconds: float = setting(
        default=900.0,
        parse=p_seconds(strict=False),
        at_least=("output_retry_seconds", "the cap must not be below the start"),
        doc="the cap of that wait",
    )
    # Off by default: the brief is one resident model, ready at once. On a small box
    # (4-8 GB) the ~2.8 GB a MinerU worker keeps matters more than a cold start.
    idle_unload_seconds: float = setting(
        default=0.0,
        parse=p_seconds(strict=False),
        doc="after this long with nothing to do, stop the worker to give its memory back; "
        "the next document starts it again (0 = never)",
    )
    # As long as a page may take (page_timeout_seconds): a MinerU page on a CPU costs
    # minutes, and killing it on every restart throws that work away.
    shutdown_timeout_seconds: float = setting(
        default=900.0, parse=p_seconds(), doc="on SIGTERM, let the current page finish this long"
    )


@settings
class LoggingConfig:
    level: LogLevel = setting(
        default="INFO", choices=get_args(LogLevel), fold_case=True, doc="log level, any case"
    )
    file: Path | None = setting(
        default=None,
        parse=p_path,
        nullable=True,
        shown_default="null (stderr)",
        doc="log file; under systemd, stderr goes to the journal",
    )
    json: bool = setting(default=False, parse=p_bool, doc="one JSON object per line")


OutputLayout = Literal["default", "mineru-legacy"]


@settings
class OutputConfig:
    layout: OutputLayout = setting(
        default="default",
        choices=get_args(OutputLayout),
        doc="`default`: files in `<stem>/`; `mineru-legacy`: MinerU's files in "
        "`<stem>/auto/` (where RAGFlow's MinerU parser looks), meta.json beside `auto/`",
    )
    extra_json: bool = setting(
        default=True,
        parse=p_bool,
        doc="also write `<stem>_content_list_v2.json`, `_middle.json` and `_model.json`",
    )


@settings
class HttpConfig:
    enabled: bool = setting(
        default=False, parse=p_bool, doc="serve the status page, `/healthz` and `/metrics`"
    )
    host: str = setting(
        default="127.0.0.1",
        parse=p_text,
        doc="address to listen on; anything but loopback needs `http.token` or `token_file`",
    )
    port: int = setting(default=8731, parse=p_int(1, 65535), doc="TCP port")
    token: str | None = setting(
        default=None,
        parse=p_text,
        nullable=True,
        secret=True,
        doc="required to open the page, `/status.json` and documents (not `/healthz`, "
        "`/metrics`)",
    )
    token_file: Path | None = setting(
        default=None,
        parse=p_path,
        nullable=True,
        doc="a file holding the token instead (e.g. a systemd credential)",
    )
