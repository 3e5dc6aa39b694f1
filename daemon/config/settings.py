"""Typed configuration: `config.yaml` -> one frozen `Config`.

Every config key is declared ONCE, below, as a field of a settings dataclass:

    dpi: int = setting(default=200, doc="PDF render resolution", parse=p_int(50, 600), page=True)

The field gives the Python name, type and default; `setting(...)` adds the doc line, the
parser that checks a value (and words its problem), the YAML key when it differs
(`yaml="max_file_size"`), `secret=True`, `page=True` (an inbox may override it), and
relations (`at_least=`, `differs_from=`, a section's `check=`). Loading, problems,
`check-config --show` (`redacted_dict`), the README table (`readme_table`) and the page
options (`page_options_for`) are all derived from these declarations; the machinery is in
`daemon/config/schema.py`, the value parsers in `daemon/config/values.py`, reading the
file in `daemon/config/yamlfile.py`, folder checks in `daemon/config/folders.py`.

Loading rules:
- `yaml.safe_load`; unknown keys are errors; every problem is collected and reported at
  once as `ConfigError(problems)`, each with its key path and a hint (paperless-ngx's
  checks style), never a traceback. `docinbox check-config` and `run` exit 78 on them.
- Relative paths resolve against the folder of the config file.
- `--config PATH`, else `$DOCINBOX_CONFIG`, else `./config.yaml`.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal, get_args
from urllib.parse import urlsplit, urlunsplit

import yaml

from daemon.config.folders import check_folders, real_path
from daemon.config.schema import (
    declared,
    key_homes,
    markdown_table,
    read_fields,
    required,
    section,
    setting,
    settings,
    shown,
)
from daemon.config.values import (
    INVALID,
    ConfigError,
    Ctx,
    Problem,
    echo,
    is_loopback,
    p_bool,
    p_int,
    p_mapping,
    p_pages,
    p_path,
    p_seconds,
    p_size,
    p_text,
    p_text_list,
    parse_page_range,
    parse_size,
    type_name,
)
from daemon.config.yamlfile import parse_yaml, read_text, yaml_problem
from daemon.document.formats import DEFAULT_PATTERNS
from daemon.document.page import PageOptions, TextLayer

__all__ = [
    "ConfigError",
    "Problem",
    "parse_page_range",
    "parse_size",
]

WatchMode = Literal["auto", "events", "poll"]
AfterSuccess = Literal["archive", "delete", "keep"]
OnDuplicate = Literal["move", "delete", "keep"]
Precision = Literal[
    "auto", "fp32", "bf16", "mixed", "int8", "bf16-int8", "int8-dynamic", "bf16-int8-dynamic"
]
# Precisions that fail the fidelity gate (bench/fidelity.py): selectable, never by `auto`,
# and named as lossy by check-config and in the worker's log.
LOSSY_PRECISIONS: tuple[str, ...] = ("int8-dynamic", "bf16-int8-dynamic")
# What bench/fidelity.py measured for each precision's decoder: teacher-forced top-1
# agreement with fp32 on Qwen2.5-Coder-0.5B (MinerU2.5's decoder class) and SmolLM2-135M,
# in percent (docs/benchmarks.md, 2026-12-04); `docinbox status` shows it beside the
# precision. fp32 is the reference itself.
PRECISION_FIDELITY: dict[str, tuple[float, float]] = {
    "bf16": (99.79, 98.90),
    "mixed": (99.79, 98.90),
    "int8": (99.89, 98.90),
    "bf16-int8": (99.89, 98.90),
    "int8-dynamic": (92.47, 82.64),
    "bf16-int8-dynamic": (92.47, 82.64),
}
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


# --------------------------------------------------------------------------------------
# Parsers specific to docinbox's keys (the generic ones are in config_schema)
# --------------------------------------------------------------------------------------

# The engines `engine.name` may name without a module path; daemon/engines/__init__.py
# builds them (and imports this tuple, so the two cannot drift apart).
BUILTIN_ENGINES: Final = ("mineru", "lite")
_PLUGIN_RE: Final = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def _p_engine_name(ctx: Ctx, key: str, value: object) -> object:
    builtin = ", ".join(BUILTIN_ENGINES)
    hint = f"use {builtin}, or package.module:ClassName for a plugin engine"
    if not isinstance(value, str):
        ctx.problem(key, f"expected an engine name, got {type_name(value)}", hint)
        return INVALID
    name = value.strip()
    if name in BUILTIN_ENGINES or _PLUGIN_RE.match(name):
        return name
    close = difflib.get_close_matches(name.lower(), BUILTIN_ENGINES, 1)
    if close:
        hint += f" (did you mean {close[0]!r}?)"
    ctx.problem(key, f"{echo(value)} is not a known engine", hint)
    return INVALID


def _p_model(ctx: Ctx, key: str, value: object) -> object:
    text = p_text(ctx, key, value)
    if isinstance(text, str) and text.startswith(("~", ".", "/")):
        # A local folder: resolve it like any other path so the daemon's working
        # directory (/ under systemd) does not matter. Hub ids ("org/name") are kept.
        return str(ctx.path(text))
    return text


def _p_passwords(ctx: Ctx, key: str, value: object) -> object:
    # Messages here never echo values: they are secrets.
    if not isinstance(value, list):
        ctx.problem(
            key, f"expected a list of strings, got {type_name(value)}", "passwords: ['one', 'two']"
        )
        return INVALID
    ok = True
    for i, item in enumerate(value):
        if not isinstance(item, str):
            ctx.problem(
                f"{key}[{i}]",
                f"expected a string, got {type_name(item)}",
                "put the password in quotes: YAML reads 1234 as a number and 0123 as octal",
            )
            ok = False
        elif not item:
            ctx.problem(f"{key}[{i}]", "is an empty string", "remove the entry")
            ok = False
    return tuple(value) if ok else INVALID


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


_SECRET_WORDS: Final = ("password", "passwd", "secret", "token", "api_key", "apikey")


def _redact_options(options: object) -> object:
    # Plugin engines' free-form options may carry credentials; mask the obvious ones.
    if not isinstance(options, dict):
        return options
    return {
        k: "***" if any(w in str(k).lower() for w in _SECRET_WORDS) else v
        for k, v in options.items()
    }


# --------------------------------------------------------------------------------------
# The declarations. A new key is one `setting(...)` line in the right class below (plus
# its commented entry in config.yaml and `python scripts/readme_tables.py` for the README).
# --------------------------------------------------------------------------------------


RuntimeKind = Literal["transformers", "http", "llama-cpp"]


def _p_server_url(ctx: Ctx, key: str, value: object) -> object:
    text = p_text(ctx, key, value)
    if text is INVALID:
        return INVALID
    parts = urlsplit(str(text))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        ctx.problem(
            key,
            f"{echo(_url_for_show(str(text)))} is not an http:// or https:// URL",
            "e.g. http://gpu-box:30000 (the OpenAI-compatible server's address)",
        )
        return INVALID
    return text


def _url_for_show(url: Any) -> Any:
    # A URL may carry user:password@; --show and problems never print it.
    if not isinstance(url, str):
        return url
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = f"***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@settings
class EngineHttpConfig:
    """`engine.http`: the OpenAI-compatible server `engine.runtime: http` sends pages to."""

    server_url: str | None = setting(
        default=None,
        parse=_p_server_url,
        nullable=True,
        show=_url_for_show,
        doc="the server, e.g. `http://gpu-box:30000` (vLLM, SGLang, LMDeploy, llama-server)",
    )
    api_key: str | None = setting(
        default=None,
        parse=p_text,
        nullable=True,
        secret=True,
        doc="sent as `Authorization: Bearer`; never logged",
    )
    model_name: str | None = setting(
        default=None,
        parse=p_text,
        nullable=True,
        shown_default="null (the one the server lists)",
        doc="the served model's name; null: the only model `/v1/models` lists",
    )
    max_in_flight: int = setting(
        default=8,
        parse=p_int(1, 1024),
        doc="requests outstanding at once, pages and blocks together (feeds batching)",
    )
    timeout_seconds: float = setting(
        default=600.0, parse=p_seconds(), doc="one request, queueing on the server included"
    )
    connect_timeout_seconds: float = setting(
        default=10.0, parse=p_seconds(), doc="connecting to the server"
    )
    retries: int = setting(
        default=6,
        parse=p_int(0, 100),
        doc="retries of a request on connection errors, 429 and 5xx (Retry-After honoured)",
    )
    retry_backoff_seconds: float = setting(
        default=1.0, parse=p_seconds(), doc="first wait between retries; doubles each time"
    )
    retry_backoff_max_seconds: float = setting(
        default=30.0,
        parse=p_seconds(),
        at_least=("retry_backoff_seconds", "the cap cannot be below the first wait"),
        doc="longest wait between retries",
    )
    ca_bundle: Path | None = setting(
        default=None,
        parse=p_path,
        nullable=True,
        doc="PEM file of CA certificates to trust for an `https://` server",
    )
    reprobe_seconds: float = setting(
        default=60.0,
        parse=p_seconds(),
        doc="while the fallback runs because the server is down: how often to look again",
    )


@settings
class LlamaCppConfig:
    """`engine.llama_cpp`: llama.cpp inside the worker (`engine.runtime: llama-cpp`)."""

    model: Path | None = setting(
        default=None,
        parse=p_path,
        nullable=True,
        shown_default="null (the pulled pair)",
        doc="main GGUF file, or a folder holding the pair; null: `docinbox model pull` cache",
    )
    mmproj: Path | None = setting(
        default=None, parse=p_path, nullable=True, doc="the vision projector `mmproj-*.gguf`"
    )
    repo: str | None = setting(
        default=None,
        parse=p_text,
        nullable=True,
        shown_default="null (known for engine.model)",
        doc="hub repo of the GGUF pair; null: the one known for `engine.model`",
    )
    threads: int = setting(
        default=0, parse=p_int(0, 1024), doc="llama.cpp threads; 0 = `engine.threads`"
    )
    parallel: int = setting(
        default=2,
        parse=p_int(1, 64),
        doc="slots: blocks of a page decoded together in one batch",
    )
    context_per_slot: int = setting(
        default=0,
        parse=p_int(0, 1_048_576),
        doc="tokens of context per slot; 0 = the model's training context",
    )


# The page keys' defaults are PageOptions' own: the worker's view of a page and the
# engine section cannot disagree on them.
_PAGE: Final = PageOptions()


@settings
class EngineConfig:
    name: str = setting(
        default="mineru",
        parse=_p_engine_name,
        doc="`mineru`, `lite`, or `package.module:Class` for a plugin engine",
    )
    fallback_engine: str | None = setting(
        default="lite",
        parse=_p_engine_name,
        nullable=True,
        differs_from=("name", "use a different engine, or null for no fallback"),
        doc="used when `name` cannot load (weights missing); null: refuse to start instead",
    )
    model: str = setting(
        default="opendatalab/MinerU2.5-2509-1.2B",
        parse=_p_model,
        doc="Hugging Face hub id, or a local folder (relative to the config file)",
    )
    revision: str | None = setting(
        default=None, parse=p_text, nullable=True, doc="hub revision to pin; null: default branch"
    )
    threads: int = setting(
        default=0,
        parse=p_int(0, 1024, "0 = one per physical core"),
        doc="CPU threads for the model; 0 = physical cores (within the affinity mask)",
    )
    precision: Precision = setting(
        default="auto",
        choices=get_args(Precision),
        doc="`auto`, `fp32`, `bf16`, `mixed`, `int8`, `bf16-int8`; lossy (fail the fidelity"
        " gate): `int8-dynamic`, `bf16-int8-dynamic` (see below)",
    )
    # 8: decoding 8 rows costs little more per step than 1 (memory-bound), while larger
    # batches mostly add padding on a page's ~20 blocks (docs/benchmarks.md).
    batch_size: int = setting(
        default=8,
        parse=p_int(1, 64, "blocks per generate() call"),
        doc="mineru, transformers: a page's blocks recognised together per generate() call",
    )
    # 4: a page's layout step decodes a few hundred tokens, one row at a time without this;
    # 4 layout rows (~1,400 prompt tokens each) stay inside the 8,192-token batch bound, and
    # 4 rendered pages in memory are ~50 MB at 200 DPI (docs/benchmarks.md).
    page_batch: int = setting(
        default=4,
        parse=p_int(1, 16, "pages whose model steps share generate() calls"),
        doc="mineru: pages of a document worked on together (layout steps batched, block "
        "batches filled across pages; llama-cpp shares its slots); 1 = page by page",
    )
    text_layer: TextLayer = setting(
        default=_PAGE.text_layer,
        choices=get_args(TextLayer),
        page=True,
        doc='use a born-digital PDF\'s own text inside layout boxes; `"off"` = model everywhere',
    )
    dpi: int = setting(
        default=_PAGE.dpi, parse=p_int(50, 600), page=True, doc="PDF render resolution"
    )
    max_long_side: int = setting(
        default=_PAGE.max_long_side,
        parse=p_int(256, 20_000, "pixels"),
        page=True,
        doc="pixel cap: a larger rendered page or image is scaled down to it",
    )
    max_new_tokens_layout: int = setting(
        default=_PAGE.max_new_tokens_layout,
        parse=p_int(1, 131_072),
        page=True,
        doc="generation cap of the layout step",
    )
    max_new_tokens_block: int = setting(
        default=_PAGE.max_new_tokens_block,
        parse=p_int(1, 131_072),
        page=True,
        doc="generation cap per block",
    )
    # Mostly useful per inbox ("first page of every invoice"); pages past the end are ignored.
    pages: str | None = setting(
        default=_PAGE.pages,
        parse=p_pages,
        nullable=True,
        page=True,
        shown_default="null (all)",
        doc='1-based pages to convert, e.g. `"1-3,7"` or `"2-"`',
    )
    runtime: RuntimeKind = setting(
        default="transformers",
        choices=get_args(RuntimeKind),
        doc="where `mineru` generates: `transformers` (here, torch), `http` (a server, "
        "see `engine.http`), `llama-cpp` (here, llama.cpp, see `engine.llama_cpp`)",
    )
    http: EngineHttpConfig = section(
        default_factory=EngineHttpConfig, doc="the MinerU server of `runtime: http`"
    )
    llama_cpp: LlamaCppConfig = section(
        default_factory=LlamaCppConfig, doc="the GGUF pair of `runtime: llama-cpp`"
    )
    ocr_languages: tuple[str, ...] = setting(
        default=(),
        parse=p_text_list(allow_empty=True),
        doc="lite: reserved for choosing RapidOCR's language models",
    )
    options: dict[str, object] = setting(
        default_factory=dict,
        parse=p_mapping,
        show=_redact_options,
        doc="free-form options for a plugin engine (keys naming a password/token are masked)",
    )


def _page_keys(s: Any) -> bool:
    return bool(s.page)


# Page-time engine keys an inbox may override (the model itself is loaded once per worker).
PAGE_OPTION_KEYS: frozenset[str] = frozenset(
    s.key_for(f.name) for f, s in declared(EngineConfig) if s.page
)


def _p_page_overrides(ctx: Ctx, key: str, value: object) -> object:
    # Checked exactly as the same keys under `engine:`, from the same declarations.
    return read_fields(ctx, key, value, EngineConfig, only=_page_keys)


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
        parse=_p_page_overrides,
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


@settings
class WorkerConfig:
    max_attempts: int = setting(
        default=3, parse=p_int(1), doc="worker crashes on one document before it fails as `crashed`"
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


def _check_http(ctx: Ctx, key: str, http: HttpConfig) -> None:
    """The status page shows document names and contents: off loopback it needs a
    token, and a token file must be readable now rather than at the first request."""
    if http.token is not None and http.token_file is not None:
        ctx.problem("http.token_file", "set either http.token or http.token_file, not both")
        return
    try:
        token = http_token(http)
    except OSError as exc:
        ctx.problem(
            "http.token_file",
            f"cannot read {http.token_file}: {exc.strerror or exc}",
            "make it readable by the user docinbox runs as",
        )
        return
    if http.token_file is not None and not token:
        ctx.problem("http.token_file", f"{http.token_file} is empty", "write the token into it")
        return
    if http.enabled and not token and not is_loopback(http.host):
        ctx.problem(
            "http.host",
            f"{http.host!r} is reachable from other machines, and the status page shows "
            "document names and contents",
            "set http.token (or http.token_file), or bind to 127.0.0.1",
        )


def http_token(http: HttpConfig) -> str | None:
    """The token the status page requires, or None (read from `token_file` if set)."""
    if http.token_file is not None:
        return http.token_file.read_text(encoding="utf-8").strip() or None
    return http.token


def _p_inboxes(ctx: Ctx, key: str, value: object) -> object:
    hint = "list at least one folder to watch, e.g. inboxes: [./inbox]"
    if isinstance(value, str):
        ctx.problem(key, "expected a list, got a single string", f"write it as a list: [{value!r}]")
        return INVALID
    if not isinstance(value, list) or not value:
        ctx.problem(key, "must be a non-empty list of folders", hint)
        return INVALID
    inboxes: list[InboxConfig] = []
    for i, raw in enumerate(value):
        item_key = f"{key}[{i}]"
        if isinstance(raw, str):
            path = p_path(ctx, item_key, raw)
            if isinstance(path, Path):
                inboxes.append(InboxConfig(path=path))
        elif isinstance(raw, dict):
            kwargs = read_fields(ctx, item_key, raw, InboxConfig)
            if kwargs is not None:
                inboxes.append(InboxConfig(**kwargs))
        else:
            ctx.problem(
                item_key,
                f"expected a folder path or a mapping with 'path', got {type_name(raw)}",
                "e.g. '- /srv/scans' or '- {path: /srv/scans, recursive: false}'",
            )
    # The valid ones, even when others are not: the folder checks still look at them.
    return tuple(inboxes)


# -- hooks: after each document, tell the next tool -------------------------------------

EventType = Literal[
    "document.done", "document.failed", "document.duplicate", "document.reprocessed"
]
EVENT_TYPES: Final[tuple[str, ...]] = get_args(EventType)
_NAME_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


def _p_events(ctx: Ctx, key: str, value: object) -> object:
    items = p_text_list(allow_empty=False)(ctx, key, value)
    if items is INVALID:
        return INVALID
    assert isinstance(items, tuple)
    ok = True
    for i, item in enumerate(items):
        if item not in EVENT_TYPES:
            close = difflib.get_close_matches(item, EVENT_TYPES, 1)
            ctx.problem(
                f"{key}[{i}]",
                f"{echo(item)} is not an event docinbox sends",
                f"did you mean {close[0]!r}?" if close else "one of " + ", ".join(EVENT_TYPES),
            )
            ok = False
    return tuple(dict.fromkeys(items)) if ok else INVALID


def _p_hook_name(ctx: Ctx, key: str, value: object) -> object:
    text = p_text(ctx, key, value)
    if text is INVALID:
        return INVALID
    if not _NAME_RE.match(str(text)):
        ctx.problem(key, f"{echo(text)} is not a usable name",
                    "letters, digits and . _ : - (up to 64), e.g. paperless")
        return INVALID
    return text


def _p_webhook_url(ctx: Ctx, key: str, value: object) -> object:
    text = p_text(ctx, key, value)
    if text is INVALID:
        return INVALID
    parts = urlsplit(str(text))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        ctx.problem(key, "is not an http:// or https:// URL",
                    "e.g. https://n8n.example.org/webhook/docinbox")
        return INVALID
    return text


def _p_headers(ctx: Ctx, key: str, value: object) -> object:
    if not isinstance(value, dict):
        ctx.problem(key, f"expected a mapping of header names to values, got {type_name(value)}")
        return INVALID
    ok = True
    out: dict[str, str] = {}
    for name, v in value.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
            ctx.problem(f"{key}", f"{echo(name)} is not a header name")
            ok = False
        elif not isinstance(v, str | int) or isinstance(v, bool) or "\n" in str(v):
            # Never echo the value: headers carry tokens.
            ctx.problem(f"{key}.{name}", "expected a one-line string value", "quote it")
            ok = False
        elif name.lower().startswith("webhook-") or name.lower() == "content-type":
            ctx.problem(f"{key}.{name}", "is set by docinbox itself (signing, JSON body)",
                        "remove it")
            ok = False
        else:
            out[name] = str(v)
    return out if ok else INVALID


def _mask_values(headers: object) -> object:
    # Headers are where receivers take their credentials (Authorization, X-Api-Key).
    if not isinstance(headers, dict):
        return headers
    return {k: "***" for k in headers}


def _p_argv(ctx: Ctx, key: str, value: object) -> object:
    if isinstance(value, str):
        ctx.problem(
            key, "expected a list (the program and its arguments; no shell)",
            f"write it as a list: [{value.split()[0]!r}, ...]" if value.split() else "",
        )
        return INVALID
    return p_text_list(allow_empty=False)(ctx, key, value)


@settings
class WebhookConfig:
    """`hooks.webhooks[]`: one HTTP receiver of signed events."""

    url: str = required(
        parse=_p_webhook_url,
        required_hint="where to POST events, e.g. https://n8n.example.org/webhook/docinbox",
        doc="where events are POSTed (JSON, signed per Standard Webhooks); a network "
        "address needs `https://`",
    )
    name: str | None = setting(
        default=None,
        parse=_p_hook_name,
        nullable=True,
        shown_default="null (the URL's host)",
        doc="how logs, `docinbox hooks` and `/metrics` call it; pending events follow it",
    )
    events: tuple[str, ...] = setting(
        default=EVENT_TYPES,
        parse=_p_events,
        doc="which events it gets",
    )
    secret_file: Path | None = setting(
        default=None,
        parse=p_path,
        nullable=True,
        doc="file holding the signing secret (`whsec_` + base64, as Standard Webhooks "
        "libraries take it); null: unsigned",
    )
    headers: dict[str, str] = setting(
        default_factory=dict,
        parse=_p_headers,
        show=_mask_values,
        doc="extra request headers, e.g. `Authorization` (values shown as `***`)",
    )
    timeout_seconds: float = setting(
        default=10.0, parse=p_seconds(), doc="one delivery attempt, connecting included"
    )
    allow_http: bool = setting(
        default=False,
        parse=p_bool,
        doc="allow plain `http://` to a non-loopback address (a trusted LAN only)",
    )

    @property
    def receiver(self) -> str:
        return self.name or (urlsplit(self.url).netloc.rpartition("@")[2] or "webhook")


@settings
class CommandHookConfig:
    """`hooks.commands[]`: a program run once per event (argv, no shell)."""

    command: tuple[str, ...] = required(
        parse=_p_argv,
        required_hint="the program and its arguments, e.g. [/usr/local/bin/to-paperless]",
        doc="the program and its arguments (a list; no shell); the event JSON on stdin",
    )
    name: str | None = setting(
        default=None,
        parse=_p_hook_name,
        nullable=True,
        shown_default="null (the program's file name)",
        doc="how logs, `docinbox hooks` and `/metrics` call it",
    )
    events: tuple[str, ...] = setting(
        default=EVENT_TYPES, parse=_p_events, doc="which events run it"
    )
    timeout_seconds: float = setting(
        default=60.0,
        parse=p_seconds(),
        doc="then its process group is killed and the delivery counts as failed",
    )

    @property
    def receiver(self) -> str:
        return self.name or (Path(self.command[0]).name if self.command else "command")


def _p_hook_list(item: type[Any], example: str) -> Any:
    def parse(ctx: Ctx, key: str, value: object) -> object:
        if not isinstance(value, list):
            ctx.problem(key, f"expected a list of mappings, got {type_name(value)}", example)
            return INVALID
        out = []
        for i, raw in enumerate(value):
            kwargs = read_fields(ctx, f"{key}[{i}]", raw, item)
            if kwargs is not None:
                out.append(item(**kwargs))
        return tuple(out)

    return parse


def hook_secret(hook: WebhookConfig) -> bytes | None:
    """The signing key of `hook` (read from its file), or None when it is unsigned.

    The file holds what Standard Webhooks libraries take: `whsec_` + base64 (the prefix is
    optional). Raises OSError (unreadable) or ValueError (not base64, too short).
    """
    if hook.secret_file is None:
        return None
    text = hook.secret_file.read_text(encoding="utf-8").strip()
    text = text.removeprefix("whsec_")
    try:
        key = base64.b64decode(text + "==", validate=False)
    except (binascii.Error, ValueError):
        raise ValueError("not base64 (write `whsec_` followed by base64)") from None
    if len(key) < 24:
        raise ValueError(
            "the secret is shorter than 24 bytes; make one with: "
            "echo whsec_$(openssl rand -base64 32)"
        )
    return key


def _check_hooks(ctx: Ctx, key: str, hooks: HooksConfig) -> None:
    """Names unique (pending events are kept per name), secrets readable now, plain http
    only to loopback unless allowed."""
    seen: dict[str, str] = {}
    items: tuple[tuple[str, int, WebhookConfig | CommandHookConfig], ...] = (
        *(("webhooks", i, h) for i, h in enumerate(hooks.webhooks)),
        *(("commands", i, h) for i, h in enumerate(hooks.commands)),
    )
    for kind, i, hook in items:
        where = f"{key}.{kind}[{i}]"
        name = hook.receiver
        if name in seen:
            ctx.problem(f"{where}.name", f"{name!r} is also the name of {seen[name]}",
                        "give each hook its own `name:`")
        seen.setdefault(name, where)
        if not isinstance(hook, WebhookConfig):
            continue
        host = urlsplit(hook.url).hostname or ""
        if urlsplit(hook.url).scheme == "http" and not is_loopback(host) \
                and not hook.allow_http:
            ctx.problem(
                f"{where}.url",
                f"plain http:// to {host!r} sends document names (and a token, if any) "
                "over the network unencrypted",
                "use https://, or set allow_http: true for a trusted LAN",
            )
        try:
            hook_secret(hook)
        except OSError as exc:
            ctx.problem(f"{where}.secret_file",
                        f"cannot read {hook.secret_file}: {exc.strerror or exc}",
                        "make it readable by the user docinbox runs as")
        except ValueError as exc:
            ctx.problem(f"{where}.secret_file", f"{hook.secret_file}: {exc}")


@settings
class HooksConfig:
    """`hooks:` what is told, and to whom, after each document."""

    webhooks: tuple[WebhookConfig, ...] = setting(
        default=(),
        parse=_p_hook_list(WebhookConfig, "webhooks: [{url: https://example.org/hook}]"),
        items=WebhookConfig,
        doc="HTTP receivers of signed events: a list of mappings with the keys below",
    )
    commands: tuple[CommandHookConfig, ...] = setting(
        default=(),
        parse=_p_hook_list(CommandHookConfig, "commands: [{command: [/usr/local/bin/x]}]"),
        items=CommandHookConfig,
        doc="programs run per event: a list of mappings with the keys below",
    )
    max_age_seconds: float = setting(
        default=3 * 86400.0,
        parse=p_seconds(),
        doc="an event not delivered for this long is given up (dead, reported; "
        "`docinbox hooks retry --dead`)",
    )
    retry_backoff_seconds: float = setting(
        default=5.0, parse=p_seconds(), doc="first wait after a failed delivery; doubles each time"
    )
    retry_backoff_max_seconds: float = setting(
        default=3600.0,
        parse=p_seconds(),
        at_least=("retry_backoff_seconds", "the cap cannot be below the first wait"),
        doc="longest wait between attempts (a `Retry-After` may ask for longer)",
    )


@settings
class Config:
    inboxes: tuple[InboxConfig, ...] = required(
        parse=_p_inboxes,
        items=InboxConfig,
        required_hint="list at least one folder to watch, e.g. inboxes: [./inbox]",
        doc="folders to watch: a list of paths, or mappings with the keys below",
    )
    outbox: Path = required(
        parse=p_path,
        required_hint="the folder that receives the Markdown and JSON, e.g. outbox: ./outbox",
        doc="where results go",
    )
    archive: Path = required(
        parse=p_path, sibling="archive", doc="originals after success (`after_success: archive`)"
    )
    failed: Path = required(
        parse=p_path, sibling="failed", doc="originals that failed, each with `<name>.error.json`"
    )
    duplicates: Path = required(
        parse=p_path, sibling="duplicates", doc="duplicates (`on_duplicate: move`)"
    )
    state_dir: Path = required(
        parse=p_path, sibling="state", doc="the SQLite database and lock (mode 0700); keep it local"
    )
    after_success: AfterSuccess = setting(
        default="archive",
        choices=get_args(AfterSuccess),
        doc="`archive`, `delete` or `keep` the original",
    )
    on_duplicate: OnDuplicate = setting(
        default="move",
        choices=get_args(OnDuplicate),
        doc="`move` to `duplicates`, `delete` or `keep`",
    )
    stability_seconds: float = setting(
        default=5.0,
        parse=p_seconds(strict=False),
        doc="a file is taken when no events and the same size+mtime for this long",
    )
    rescan_seconds: float = setting(
        default=300.0, parse=p_seconds(), doc="full rescan period (events are only hints)"
    )
    engine: EngineConfig = section(default_factory=EngineConfig, doc="the engine and its page keys")
    limits: LimitsConfig = section(default_factory=LimitsConfig, doc="input limits and deadlines")
    worker: WorkerConfig = section(default_factory=WorkerConfig, doc="the worker process")
    passwords: tuple[str, ...] = setting(
        default=(),
        parse=_p_passwords,
        secret=True,
        doc="tried in order on encrypted PDFs; never logged",
    )
    logging: LoggingConfig = section(default_factory=LoggingConfig, doc="logging")
    http: HttpConfig = section(
        default_factory=HttpConfig, doc="the status endpoint", check=_check_http
    )
    output: OutputConfig = section(default_factory=OutputConfig, doc="what an outbox folder holds")
    hooks: HooksConfig = section(
        default_factory=HooksConfig, doc="webhooks and commands after each document",
        check=_check_hooks,
    )
    # Not a key: the file this was loaded from.
    source: Path | None = dataclasses.field(default=None)

    @property
    def db_path(self) -> Path:
        return self.state_dir / "docinbox.sqlite3"

    def page_options_for(self, inbox: InboxConfig | None) -> PageOptions:
        """Page options for a document from `inbox` (None: the engine block's own values)."""
        return page_options_for(self, inbox)


_KEY_HOMES: Final = key_homes(Config)


# --------------------------------------------------------------------------------------
# Locating and loading the file
# --------------------------------------------------------------------------------------

ENV_CONFIG: Final = "DOCINBOX_CONFIG"
DEFAULT_CONFIG_NAME: Final = "config.yaml"


def resolve_config_path(arg: str | None, environ: Mapping[str, str] | None = None) -> Path:
    """`--config PATH`, else `$DOCINBOX_CONFIG`, else `./config.yaml` (`~` expanded)."""
    env = os.environ if environ is None else environ
    if arg:
        return Path(arg).expanduser()
    from_env = env.get(ENV_CONFIG, "").strip()
    if from_env:
        return Path(from_env).expanduser()
    return Path(DEFAULT_CONFIG_NAME)


def load_config(path: Path) -> Config:
    """Read and validate `path`; raises ConfigError listing every problem found."""
    # normpath: the config folder is the base of every relative path, so "../etc/x.yaml"
    # must not leave a ".." in all of them (nor in cfg.source).
    path = Path(os.path.normpath(Path(path).expanduser().absolute()))
    text = read_text(path, ENV_CONFIG)
    try:
        data, lines, dups = parse_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError([yaml_problem(path, exc)]) from None

    ctx = Ctx(base_dir=path.parent, lines=lines, homes=_KEY_HOMES)
    ctx.problems.extend(dups)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        ctx.problem("(top level)", f"expected a mapping of keys, got {type_name(data)}")
        raise ConfigError(ctx.problems)

    kwargs = read_fields(ctx, "", data, Config)
    if ctx.problems or kwargs is None:
        raise ConfigError(ctx.sorted_problems() + _folder_problems_too(ctx, data, path))
    return Config(**kwargs, source=path)


_FOLDER_KEYS: Final = ("outbox", "archive", "failed", "duplicates", "state_dir")
# A problem with one of these keys leaves a folder unknown: then no folder checks.
_FOLDER_PROBLEM_KEY: Final = re.compile(r"inboxes(\[\d+\](\.path)?)?|" + "|".join(_FOLDER_KEYS))


def _folder_problems_too(ctx: Ctx, data: dict[str, Any], path: Path) -> list[Problem]:
    """The folder checks, on a file that has other problems too, so that one round of
    edits fixes everything (paperless-ngx's checks work that way).

    Only when every folder key itself parsed: a folder check on a half-read value would
    report noise. Nothing is created for a config that does not load.
    """
    if any(_FOLDER_PROBLEM_KEY.fullmatch(p.key) for p in ctx.problems):
        return []
    # Read the folder keys again on their own, into a throwaway context: their problems
    # are reported already (an invalid inbox option does not stop the check).
    scratch = Ctx(base_dir=ctx.base_dir, lines={}, homes=_KEY_HOMES)
    folders = {k: data[k] for k in ("inboxes", *_FOLDER_KEYS) if k in data}
    kwargs = read_fields(scratch, "", folders, Config)
    if kwargs is None or not kwargs.get("inboxes"):
        return []
    partial = Config(**kwargs, source=path)
    # Missing folders are left to the check of the loaded file (outputs are created, an
    # inbox may be a share not mounted yet); what is reported here is a set-up that is
    # wrong whatever exists: an output inside an inbox, two keys on one folder.
    return [
        p
        for p in check_paths(partial, create=False)
        if "does not exist" not in p.message and "is not mounted" not in p.message
    ]


# --------------------------------------------------------------------------------------
# Helpers for the rest of the daemon
# --------------------------------------------------------------------------------------


def output_folders(cfg: Config) -> list[tuple[str, Path]]:
    """The folders the daemon writes to with this config, as (config key, path).

    archive and duplicates count only when a setting sends files there, so that e.g.
    `after_success: delete` does not make an unused archive folder appear.
    """
    folders = [("outbox", cfg.outbox), ("failed", cfg.failed), ("state_dir", cfg.state_dir)]
    if cfg.after_success == "archive":
        folders.insert(1, ("archive", cfg.archive))
    if cfg.on_duplicate == "move":
        folders.insert(-1, ("duplicates", cfg.duplicates))
    return folders


def check_paths(cfg: Config, create: bool = True) -> list[Problem]:
    """Every filesystem problem of `cfg` at once (see daemon/config/folders.py)."""
    return check_folders([i.path for i in cfg.inboxes], output_folders(cfg), create=create)


def page_options_for(cfg: Config, inbox: InboxConfig | None) -> PageOptions:
    """The engine block's page keys with `inbox.engine_options` laid over them.

    Every `page=True` key is a field of PageOptions of the same name (a test holds them
    equal), so a new page key reaches the worker without a change here.
    """
    merged = {f.name: getattr(cfg.engine, f.name) for f, s in declared(EngineConfig) if s.page}
    if inbox is not None:
        merged.update(inbox.engine_options)
    return PageOptions(**merged)


def inbox_for(cfg: Config, path: Path) -> InboxConfig | None:
    """The inbox `path` belongs to (the deepest one), or None.

    Compared both as written and with symlinks resolved, so a file reached through a
    symlinked mount point still finds its inbox. A non-recursive inbox only owns its
    direct children.
    """
    file_forms = {Path(os.path.abspath(path)), real_path(Path(path))}
    best: InboxConfig | None = None
    best_depth = -1
    for inbox in cfg.inboxes:
        for root in {Path(os.path.abspath(inbox.path)), real_path(inbox.path)}:
            for f in file_forms:
                if root not in f.parents:
                    continue
                if not inbox.recursive and f.parent != root:
                    continue
                if len(root.parts) > best_depth:
                    best, best_depth = inbox, len(root.parts)
    return best


def redacted_dict(cfg: Config) -> dict[str, Any]:
    """The effective config as plain YAML data with secrets replaced by "***".

    Keys are the YAML keys (`limits.max_file_size`, not the field name), so the output
    can be saved and loaded again as a config file.
    """
    return shown(cfg)


README_BEGIN: Final = (
    "<!-- config-keys: generated from daemon/config/settings.py by scripts/readme_tables.py -->"
)
README_END: Final = "<!-- /config-keys -->"


def readme_table() -> str:
    """The README's configuration table, generated from the declarations above."""
    return markdown_table(Config)
