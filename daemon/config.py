"""Typed configuration: `config.yaml` -> one frozen `Config`.

Loading rules (the loader below `Config` implements them):
- `yaml.safe_load`; unknown keys are errors; every problem is collected and reported at
  once as `ConfigError(problems)`, each with its key path and a hint (paperless-ngx's
  checks style), never a traceback. `docinbox check-config` and `run` exit 78 on them.
- Relative paths resolve against the folder of the config file.
- `--config PATH`, else `$DOCINBOX_CONFIG`, else `./config.yaml`.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import yaml

if TYPE_CHECKING:
    from daemon.page import PageOptions

WatchMode = Literal["auto", "events", "poll"]
AfterSuccess = Literal["archive", "delete", "keep"]
OnDuplicate = Literal["move", "delete", "keep"]
Precision = Literal["auto", "fp32", "bf16", "mixed", "int8"]
TextLayer = Literal["auto", "off"]

DEFAULT_PATTERNS: tuple[str, ...] = (
    "*.pdf",
    "*.png",
    "*.jpg",
    "*.jpeg",
    "*.tif",
    "*.tiff",
    "*.webp",
    "*.bmp",
    "*.gif",
)

# Page-time engine keys an inbox may override (the model itself is loaded once per worker).
PAGE_OPTION_KEYS: frozenset[str] = frozenset(
    {"text_layer", "dpi", "max_long_side", "max_new_tokens_layout", "max_new_tokens_block",
     "pages"}
)


@dataclass(frozen=True)
class InboxConfig:
    path: Path
    recursive: bool = True
    patterns: tuple[str, ...] = DEFAULT_PATTERNS
    watch: WatchMode = "auto"
    # Subfolder of the outbox (and archive/failed/duplicates) for this inbox's documents.
    output_subfolder: str = ""
    # Overrides of page-time engine keys (PAGE_OPTION_KEYS) for documents from this inbox.
    engine_options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineConfig:
    name: str = "mineru"  # mineru | lite | package.module:Class
    fallback_engine: str | None = "lite"  # used when `name` cannot load (weights missing)
    model: str = "opendatalab/MinerU2.5-2509-1.2B"  # hub id or local folder
    revision: str | None = None
    threads: int = 0  # 0 = number of physical cores
    precision: Precision = "auto"
    text_layer: TextLayer = "auto"
    dpi: int = 200
    max_long_side: int = 4000  # pixels; a page rendered larger is scaled down to this
    max_new_tokens_layout: int = 1536
    max_new_tokens_block: int = 1024
    # Which pages to convert, 1-based, e.g. "1-3,7" or "2-"; None = all. Pages outside the
    # document are ignored. Mostly useful per inbox ("first page of every invoice").
    pages: str | None = None
    ocr_languages: tuple[str, ...] = ()  # lite: reserved for RapidOCR model choice
    # Free-form options for plugin engines (`package.module:Class`).
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LimitsConfig:
    max_file_bytes: int = 512 * 1024 * 1024
    max_pages: int = 2000
    page_timeout_seconds: float = 900.0  # a page of a CPU VLM can take minutes
    document_timeout_seconds: float = 24 * 3600.0
    max_image_pixels: int = 180_000_000  # Pillow's decompression-bomb limit


@dataclass(frozen=True)
class WorkerConfig:
    max_attempts: int = 3  # worker crashes on one document before it is failed
    heartbeat_seconds: float = 5.0
    heartbeat_timeout_seconds: float = 120.0
    startup_timeout_seconds: float = 900.0  # engine load (model weights from a slow disk)
    recycle_after_documents: int = 500
    max_rss_mb: int = 12_000
    restart_backoff_seconds: float = 2.0
    restart_backoff_max_seconds: float = 300.0
    # SIGTERM: let the current page finish this long. As long as a page may take
    # (page_timeout_seconds): a MinerU page on a CPU costs minutes, and killing it on
    # every restart throws that work away.
    shutdown_timeout_seconds: float = 900.0


@dataclass(frozen=True)
class LoggingConfig:
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    file: Path | None = None  # None: stderr (journald under systemd)
    json: bool = False


@dataclass(frozen=True)
class HttpConfig:
    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 8731


@dataclass(frozen=True)
class Config:
    inboxes: tuple[InboxConfig, ...]
    outbox: Path
    archive: Path
    failed: Path
    duplicates: Path
    state_dir: Path
    after_success: AfterSuccess = "archive"
    on_duplicate: OnDuplicate = "move"
    stability_seconds: float = 5.0
    rescan_seconds: float = 300.0
    engine: EngineConfig = field(default_factory=EngineConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    # PDF passwords to try, in order. Never logged: repr=False keeps them out of reprs.
    passwords: tuple[str, ...] = field(default=(), repr=False)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    source: Path | None = None  # the file this was loaded from

    @property
    def db_path(self) -> Path:
        return self.state_dir / "docinbox.sqlite3"

    def page_options_for(self, inbox: InboxConfig | None) -> PageOptions:
        """Page options for a document from `inbox` (None: the engine block's own values)."""
        return page_options_for(self, inbox)


@dataclass(frozen=True)
class Problem:
    key: str  # e.g. "inboxes[0].watch"
    message: str
    hint: str = ""

    def __str__(self) -> str:
        return f"{self.key}: {self.message}" + (f" (hint: {self.hint})" if self.hint else "")


class ConfigError(Exception):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


# --------------------------------------------------------------------------------------
# Locating the file
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


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------


class _Invalid:
    """Returned by a value parser that has already recorded a Problem."""


_INVALID: Final = _Invalid()

# Values are echoed in messages so a user sees what was read; long ones are cut so a
# pasted blob does not flood the terminal.
_ECHO_MAX = 60


def _echo(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _ECHO_MAX else text[: _ECHO_MAX - 3] + "..."


def _type_name(value: object) -> str:
    # YAML words rather than Python's, since the reader edits YAML.
    if value is None:
        return "an empty value"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


class _Ctx:
    """Collects problems for one load so that all of them are reported together."""

    def __init__(self, base_dir: Path, lines: dict[str, int]) -> None:
        self.base_dir = base_dir
        self.lines = lines  # key path -> 1-based line, to point the user at the spot
        self.problems: list[Problem] = []
        # id(problem) -> line, to report in file order; duplicate-key problems added
        # directly have no entry and sort first, where the file's structure is wrong.
        self._line_of: dict[int, int] = {}

    def problem(self, key: str, message: str, hint: str = "") -> None:
        line = self.lines.get(key)
        if line is not None:
            message = f"{message} (line {line})"
        problem = Problem(key=key, message=message, hint=hint)
        self.problems.append(problem)
        # Problems without a line (missing keys) go last.
        self._line_of[id(problem)] = line if line is not None else 1 << 30

    def sorted_problems(self) -> list[Problem]:
        return sorted(self.problems, key=lambda p: self._line_of.get(id(p), 0))

    def path(self, raw: str) -> Path:
        # Lexical normalisation only: symlinks are kept as written (a NAS mount point may
        # be a symlink); check_paths compares real paths where it matters.
        p = Path(raw).expanduser()
        if not p.is_absolute():
            p = self.base_dir / p
        return Path(os.path.normpath(p))


Parser = Callable[[_Ctx, str, Any], Any]


@dataclass(frozen=True)
class _Field:
    attr: str  # dataclass field name (may differ from the YAML key)
    parse: Parser
    nullable: bool = False  # `key: null` is a meaningful value, not a mistake


def _p_bool(ctx: _Ctx, key: str, value: Any) -> Any:
    if isinstance(value, bool):
        return value
    hint = "write true or false"
    if isinstance(value, str) and value.strip().lower() in {"true", "false", "yes", "no"}:
        hint = "write true or false without quotes"
    ctx.problem(key, f"expected true or false, got {_type_name(value)}", hint)
    return _INVALID


def _p_int(lo: int, hi: int | None = None, note: str = "") -> Parser:
    def parse(ctx: _Ctx, key: str, value: Any) -> Any:
        # bool is an int subclass in Python; `threads: yes` must not become 1.
        if isinstance(value, bool) or not isinstance(value, int):
            ctx.problem(key, f"expected a whole number, got {_type_name(value)}", _range(lo, hi))
            return _INVALID
        if value < lo or (hi is not None and value > hi):
            ctx.problem(key, f"{value} is out of range", _range(lo, hi, note))
            return _INVALID
        return value

    return parse


def _range(lo: float, hi: float | None, note: str = "", *, strict_lo: bool = False) -> str:
    low = f"greater than {lo:g}" if strict_lo else f"at least {lo:g}"
    text = f"between {lo:g} and {hi:g}" if hi is not None else low
    return f"use a number {text}" + (f"; {note}" if note else "")


def _p_seconds(lo: float = 0.0, *, strict: bool = True, note: str = "") -> Parser:
    """Durations are plain numbers of seconds; `strict` means the lower bound is excluded."""

    def parse(ctx: _Ctx, key: str, value: Any) -> Any:
        hint = _range(lo, None, note, strict_lo=strict)
        if isinstance(value, bool) or not isinstance(value, int | float):
            if isinstance(value, str):
                hint = "durations are plain numbers of seconds, e.g. 300 (not '5m')"
            ctx.problem(key, f"expected a number of seconds, got {_type_name(value)}", hint)
            return _INVALID
        if not math.isfinite(value) or value < lo or (strict and value == lo):
            ctx.problem(key, f"{value} seconds is out of range", hint)
            return _INVALID
        return float(value)

    return parse


# Units without "i" are decimal (SI: kB = 1000) and units with "i" binary (KiB = 1024), as
# in IEC 80000-13; a bare letter ("200k") reads like its decimal unit.
_SIZE_UNITS: Final[dict[str, int]] = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE_RE: Final = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")
_SIZE_HINT: Final = (
    "a number of bytes or a size like '512MiB', '1.5 GiB', '200k' "
    "(kB/MB/GB = powers of 1000, KiB/MiB/GiB = powers of 1024)"
)


def parse_size(text: str | int) -> int:
    """Bytes from an int or a size string; ValueError with a readable reason otherwise."""
    if isinstance(text, bool):
        raise ValueError("true/false is not a size")
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"{_echo(text)} is not a size")
    unit = m.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise ValueError(f"unknown unit {_echo(m.group(2))}")
    try:
        number = Decimal(m.group(1))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"{_echo(text)} is not a size") from exc
    # Decimal keeps "1.5 GiB" exact; a fraction of a byte is rounded down.
    return int(number * _SIZE_UNITS[unit])


def _p_size(ctx: _Ctx, key: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | str):
        ctx.problem(key, f"expected a size, got {_type_name(value)}", _SIZE_HINT)
        return _INVALID
    try:
        size = parse_size(value)
    except ValueError as exc:
        ctx.problem(key, str(exc), _SIZE_HINT)
        return _INVALID
    if size < 1:
        ctx.problem(key, "must be at least 1 byte", _SIZE_HINT)
        return _INVALID
    return size


def _p_choice(choices: tuple[str, ...], *, fold_case: bool = False) -> Parser:
    def parse(ctx: _Ctx, key: str, value: Any) -> Any:
        allowed = "allowed values: " + ", ".join(choices)
        if not isinstance(value, str):
            ctx.problem(key, f"expected one of the allowed words, got {_type_name(value)}", allowed)
            return _INVALID
        candidate = value.strip()
        if fold_case:
            candidate = candidate.upper()
        if candidate in choices:
            return candidate
        close = difflib.get_close_matches(candidate.lower(), [c.lower() for c in choices], 1)
        hint = allowed + (f" (did you mean {close[0]!r}?)" if close else "")
        ctx.problem(key, f"{_echo(value)} is not allowed", hint)
        return _INVALID

    return parse


def _p_text(ctx: _Ctx, key: str, value: Any) -> Any:
    if not isinstance(value, str) or not value.strip():
        ctx.problem(key, f"expected a non-empty string, got {_type_name(value)}")
        return _INVALID
    return value.strip()


def _p_path(ctx: _Ctx, key: str, value: Any) -> Any:
    if not isinstance(value, str) or not value.strip():
        ctx.problem(
            key,
            f"expected a folder path, got {_type_name(value)}",
            "absolute, or relative to the config file's folder; ~ is expanded",
        )
        return _INVALID
    return ctx.path(value.strip())


def _p_text_list(*, allow_empty: bool) -> Parser:
    def parse(ctx: _Ctx, key: str, value: Any) -> Any:
        if isinstance(value, str):
            ctx.problem(
                key, "expected a list, got a single string", f"write it as a list: [{value!r}]"
            )
            return _INVALID
        if not isinstance(value, list):
            ctx.problem(key, f"expected a list of strings, got {_type_name(value)}")
            return _INVALID
        if not value and not allow_empty:
            ctx.problem(key, "must not be empty", "give at least one entry or remove the key")
            return _INVALID
        ok = True
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item.strip():
                ctx.problem(f"{key}[{i}]", f"expected a non-empty string, got {_type_name(item)}")
                ok = False
        return tuple(s.strip() for s in value) if ok else _INVALID

    return parse


def _p_mapping(ctx: _Ctx, key: str, value: Any) -> Any:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        ctx.problem(key, f"expected a mapping with string keys, got {_type_name(value)}")
        return _INVALID
    return dict(value)


_BUILTIN_ENGINES: Final = ("mineru", "lite")
_PLUGIN_RE: Final = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def _p_engine_name(ctx: _Ctx, key: str, value: Any) -> Any:
    hint = "use mineru, lite, or package.module:ClassName for a plugin engine"
    if not isinstance(value, str):
        ctx.problem(key, f"expected an engine name, got {_type_name(value)}", hint)
        return _INVALID
    name = value.strip()
    if name in _BUILTIN_ENGINES or _PLUGIN_RE.match(name):
        return name
    close = difflib.get_close_matches(name.lower(), _BUILTIN_ENGINES, 1)
    if close:
        hint += f" (did you mean {close[0]!r}?)"
    ctx.problem(key, f"{_echo(value)} is not a known engine", hint)
    return _INVALID


def _p_model(ctx: _Ctx, key: str, value: Any) -> Any:
    text = _p_text(ctx, key, value)
    if isinstance(text, str) and text.startswith(("~", ".", "/")):
        # A local folder: resolve it like any other path so the daemon's working
        # directory (/ under systemd) does not matter. Hub ids ("org/name") are kept.
        return str(ctx.path(text))
    return text


def _p_passwords(ctx: _Ctx, key: str, value: Any) -> Any:
    # Messages here never echo values: they are secrets.
    if not isinstance(value, list):
        ctx.problem(
            key, f"expected a list of strings, got {_type_name(value)}", "passwords: ['one', 'two']"
        )
        return _INVALID
    ok = True
    for i, item in enumerate(value):
        if not isinstance(item, str):
            ctx.problem(
                f"{key}[{i}]",
                f"expected a string, got {_type_name(item)}",
                "put the password in quotes: YAML reads 1234 as a number and 0123 as octal",
            )
            ok = False
        elif not item:
            ctx.problem(f"{key}[{i}]", "is an empty string", "remove the entry")
            ok = False
    return tuple(value) if ok else _INVALID


def _p_subfolder(ctx: _Ctx, key: str, value: Any) -> Any:
    if not isinstance(value, str):
        ctx.problem(key, f"expected a string, got {_type_name(value)}")
        return _INVALID
    text = value.strip().strip("/")
    parts = Path(text).parts
    if value.strip().startswith(("/", "~")) or ".." in parts:
        # The subfolder is joined under outbox/archive/failed; this keeps it there.
        ctx.problem(
            key,
            f"{_echo(value)} must stay inside the outbox",
            "use a relative name like 'invoices' (no leading /, ~ or ..)",
        )
        return _INVALID
    return text


def parse_page_range(text: str, page_count: int) -> list[int]:
    """ "1-3,7,10-" -> 0-based page indexes within page_count. Raises ValueError."""
    chosen: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        first, dash, last = part.partition("-")
        lo = int(first) if first else 1
        hi = (int(last) if last else page_count) if dash else lo
        if lo < 1 or hi < lo:
            raise ValueError(f"bad page range {part!r}")
        chosen.update(range(lo - 1, min(hi, page_count)))
    if not chosen and not text.strip(", "):
        raise ValueError("empty page range")
    return sorted(chosen)


def _p_pages(ctx: _Ctx, key: str, value: Any) -> Any:
    try:
        parse_page_range(str(value), 10**6)
    except ValueError:
        ctx.problem(key, f"{_echo(value)} is not a page range",
                    'use 1-based pages like "1-3,7" or "2-" (quoted), or null for all')
        return _INVALID
    return str(value)


# Page-time keys, shared by `engine:` and `inboxes[].engine_options` so both validate alike.
_PAGE_FIELDS: Final[dict[str, _Field]] = {
    "text_layer": _Field("text_layer", _p_choice(("auto", "off"))),
    "dpi": _Field("dpi", _p_int(50, 600)),
    "max_long_side": _Field("max_long_side", _p_int(256, 20_000, "pixels")),
    "max_new_tokens_layout": _Field("max_new_tokens_layout", _p_int(1, 131_072)),
    "max_new_tokens_block": _Field("max_new_tokens_block", _p_int(1, 131_072)),
    "pages": _Field("pages", _p_pages, nullable=True),
}
assert set(_PAGE_FIELDS) == PAGE_OPTION_KEYS

_ENGINE_FIELDS: Final[dict[str, _Field]] = {
    "name": _Field("name", _p_engine_name),
    "fallback_engine": _Field("fallback_engine", _p_engine_name, nullable=True),
    "model": _Field("model", _p_model),
    "revision": _Field("revision", _p_text, nullable=True),
    "threads": _Field("threads", _p_int(0, 1024, "0 = one per physical core")),
    "precision": _Field("precision", _p_choice(("auto", "fp32", "bf16", "mixed", "int8"))),
    **_PAGE_FIELDS,
    "ocr_languages": _Field("ocr_languages", _p_text_list(allow_empty=True)),
    "options": _Field("options", _p_mapping),
}

_LIMITS_FIELDS: Final[dict[str, _Field]] = {
    "max_file_size": _Field("max_file_bytes", _p_size),
    "max_pages": _Field("max_pages", _p_int(1)),
    "page_timeout_seconds": _Field("page_timeout_seconds", _p_seconds()),
    "document_timeout_seconds": _Field("document_timeout_seconds", _p_seconds()),
    "max_image_pixels": _Field("max_image_pixels", _p_int(1)),
}

_WORKER_FIELDS: Final[dict[str, _Field]] = {
    "max_attempts": _Field("max_attempts", _p_int(1)),
    "heartbeat_seconds": _Field("heartbeat_seconds", _p_seconds()),
    "heartbeat_timeout_seconds": _Field("heartbeat_timeout_seconds", _p_seconds()),
    "startup_timeout_seconds": _Field("startup_timeout_seconds", _p_seconds()),
    "recycle_after_documents": _Field("recycle_after_documents", _p_int(1)),
    # No "0 = off" here: the supervisor compares against these directly, so 0 would
    # recycle the worker after every document.
    "max_rss_mb": _Field("max_rss_mb", _p_int(1)),
    "restart_backoff_seconds": _Field("restart_backoff_seconds", _p_seconds(strict=False)),
    "restart_backoff_max_seconds": _Field("restart_backoff_max_seconds", _p_seconds(strict=False)),
    "shutdown_timeout_seconds": _Field("shutdown_timeout_seconds", _p_seconds()),
}

_LOGGING_FIELDS: Final[dict[str, _Field]] = {
    "level": _Field("level", _p_choice(("DEBUG", "INFO", "WARNING", "ERROR"), fold_case=True)),
    "file": _Field("file", _p_path, nullable=True),
    "json": _Field("json", _p_bool),
}

_HTTP_FIELDS: Final[dict[str, _Field]] = {
    "enabled": _Field("enabled", _p_bool),
    "host": _Field("host", _p_text),
    "port": _Field("port", _p_int(1, 65535)),
}

_INBOX_FIELDS: Final[dict[str, _Field]] = {
    "path": _Field("path", _p_path),
    "recursive": _Field("recursive", _p_bool),
    "patterns": _Field("patterns", _p_text_list(allow_empty=False)),
    "watch": _Field("watch", _p_choice(("auto", "events", "poll"))),
    "output_subfolder": _Field("output_subfolder", _p_subfolder),
    "engine_options": _Field("engine_options", _p_mapping),  # checked key by key below
}

# Top-level scalars; inboxes and the sections are handled by load_config itself.
_TOP_FIELDS: Final[dict[str, _Field]] = {
    "outbox": _Field("outbox", _p_path),
    "archive": _Field("archive", _p_path),
    "failed": _Field("failed", _p_path),
    "duplicates": _Field("duplicates", _p_path),
    "state_dir": _Field("state_dir", _p_path),
    "after_success": _Field("after_success", _p_choice(("archive", "delete", "keep"))),
    "on_duplicate": _Field("on_duplicate", _p_choice(("move", "delete", "keep"))),
    "stability_seconds": _Field("stability_seconds", _p_seconds(strict=False)),
    "rescan_seconds": _Field("rescan_seconds", _p_seconds()),
    "passwords": _Field("passwords", _p_passwords),
}

_SECTIONS: Final[dict[str, dict[str, _Field]]] = {
    "engine": _ENGINE_FIELDS,
    "limits": _LIMITS_FIELDS,
    "worker": _WORKER_FIELDS,
    "logging": _LOGGING_FIELDS,
    "http": _HTTP_FIELDS,
}
_TOP_KEYS: Final = ("inboxes", *_TOP_FIELDS, *_SECTIONS)

# Where each key lives, to tell a user who put `dpi` at the top that it belongs in `engine:`.
_KEY_HOMES: Final[dict[str, list[str]]] = {}
_LEVELS: Final[dict[str, Iterable[str]]] = {"": _TOP_KEYS, **_SECTIONS, "inboxes[]": _INBOX_FIELDS}
for _home, _names in _LEVELS.items():
    for _k in _names:
        _KEY_HOMES.setdefault(_k, []).append(_home)

# Folders that default to siblings of the config file when omitted.
_DEFAULT_DIRS: Final = {
    "archive": "archive",
    "failed": "failed",
    "duplicates": "duplicates",
    "state_dir": "state",
}


def _unknown_key(ctx: _Ctx, key: str, name: str, known: Iterable[str], here: str) -> None:
    known = list(known)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        hint = f"did you mean {close[0]!r}?"
    else:
        homes = [h for h in _KEY_HOMES.get(name, []) if h != here]
        if homes:
            where = " or ".join("the top level" if not h else f"{h}" for h in homes)
            hint = f"{name!r} belongs under {where}"
        else:
            hint = "known keys here: " + ", ".join(known)
    ctx.problem(key, "unknown key", hint)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _read_section(
    ctx: _Ctx, prefix: str, raw: Any, fields: Mapping[str, _Field], skip: Iterable[str] = ()
) -> dict[str, Any]:
    """Parse a mapping against `fields`; returns dataclass kwargs for the valid keys."""
    if raw is None:
        # `engine:` with every sub-key commented out reads as null: all defaults.
        return {}
    if not isinstance(raw, dict):
        ctx.problem(prefix or "(top level)", f"expected a mapping of keys, got {_type_name(raw)}")
        return {}
    skipped = set(skip)
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if not isinstance(name, str):
            # YAML 1.1 reads unquoted on/off/yes/no keys as booleans.
            ctx.problem(_join(prefix, str(name)), "keys must be strings", "quote the key")
            continue
        if name in skipped:
            continue
        key = _join(prefix, name)
        spec = fields.get(name)
        if spec is None:
            _unknown_key(ctx, key, name, [*fields, *skipped], prefix)
            continue
        if value is None:
            if spec.nullable:
                out[spec.attr] = None
            else:
                ctx.problem(key, "has no value", "give a value, or remove the line for the default")
            continue
        parsed = spec.parse(ctx, key, value)
        if parsed is not _INVALID:
            out[spec.attr] = parsed
    return out


def _read_inbox(ctx: _Ctx, key: str, raw: Any) -> InboxConfig | None:
    if isinstance(raw, str):
        path = _p_path(ctx, key, raw)
        return None if path is _INVALID else InboxConfig(path=path)
    if not isinstance(raw, dict):
        ctx.problem(
            key,
            f"expected a folder path or a mapping with 'path', got {_type_name(raw)}",
            "e.g. '- /srv/scans' or '- {path: /srv/scans, recursive: false}'",
        )
        return None
    kwargs = _read_section(ctx, key, raw, _INBOX_FIELDS)
    options = kwargs.get("engine_options")
    if options is not None:
        kwargs["engine_options"] = _read_section(
            ctx, f"{key}.engine_options", options, _PAGE_FIELDS
        )
    if "path" not in raw:
        ctx.problem(f"{key}.path", "is required", "the folder to watch")
        return None
    if "path" not in kwargs:
        return None  # the problem is already recorded
    return InboxConfig(**kwargs)


def _cross_checks(
    ctx: _Ctx, section: str, kw: Mapping[str, Any], pairs: Iterable[tuple[str, str, str]]
) -> None:
    # (low, high, why): both valid and low > high is a problem at `high`.
    for low, high, why in pairs:
        if low in kw and high in kw and kw[low] > kw[high]:
            ctx.problem(f"{section}.{high}", f"must be at least {section}.{low} ({kw[low]:g})", why)


def _yaml_problem(path: Path, exc: yaml.YAMLError) -> Problem:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    # Only the parser's description, never its snippet of the file: the offending line
    # may be a password.
    what = getattr(exc, "problem", None) or "invalid YAML"
    context = getattr(exc, "context", None)
    detail = f"{what} ({context})" if context else str(what)
    return Problem(
        key=str(path),
        message=f"YAML syntax error{where}: {detail}",
        hint="check indentation (spaces, not tabs) and quote values containing ': ' or ' #'",
    )


def _collect_lines(
    node: yaml.Node, prefix: str, lines: dict[str, int], ctx_dups: list[Problem], seen: set[int]
) -> None:
    """Record each key path's line and find duplicate keys, which PyYAML silently merges."""
    if id(node) in seen:  # anchors/aliases may form cycles
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            if (
                not isinstance(key_node, yaml.ScalarNode)
                or key_node.tag == "tag:yaml.org,2002:merge"
            ):
                continue
            name = str(key_node.value)
            key = _join(prefix, name)
            line = key_node.start_mark.line + 1
            if name in first:
                ctx_dups.append(
                    Problem(
                        key=key,
                        message=f"is given twice (lines {first[name]} and {line})",
                        hint="YAML would silently keep only the last one; merge them",
                    )
                )
            else:
                first[name] = line
                lines.setdefault(key, line)
            _collect_lines(value_node, key, lines, ctx_dups, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            key = f"{prefix}[{i}]"
            lines.setdefault(key, item.start_mark.line + 1)
            _collect_lines(item, key, lines, ctx_dups, seen)


def _parse_yaml(path: Path, text: str) -> tuple[Any, dict[str, int], list[Problem]]:
    lines: dict[str, int] = {}
    dups: list[Problem] = []
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, lines, dups
        _collect_lines(node, "", lines, dups, set())
        return loader.construct_document(node), lines, dups
    finally:
        loader.dispose()


def _read_text(path: Path) -> str:
    """The file's text; ConfigError when it cannot be read."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            [
                Problem(
                    key=str(path),
                    message="config file not found",
                    hint=f"pass --config PATH or set {ENV_CONFIG}; the shipped config.yaml "
                    "is a commented starting point",
                )
            ]
        ) from None
    except IsADirectoryError:
        raise ConfigError(
            [Problem(str(path), "is a folder, not a config file", "point at the .yaml file")]
        ) from None
    except PermissionError:
        raise ConfigError(
            [
                Problem(
                    str(path),
                    "cannot read the config file: permission denied",
                    "make it readable by the user the daemon runs as (chmod/chown)",
                )
            ]
        ) from None
    except OSError as exc:
        raise ConfigError(
            [Problem(str(path), f"cannot read the config file: {exc.strerror}")]
        ) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            [Problem(str(path), f"not valid UTF-8 at line {line}", "save the file as UTF-8")]
        ) from None


def load_config(path: Path) -> Config:
    """Read and validate `path`; raises ConfigError listing every problem found."""
    # normpath: the config folder is the base of every relative path, so "../etc/x.yaml"
    # must not leave a ".." in all of them (nor in cfg.source).
    path = Path(os.path.normpath(Path(path).expanduser().absolute()))
    text = _read_text(path)
    try:
        data, lines, dups = _parse_yaml(path, text)
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_problem(path, exc)]) from None

    ctx = _Ctx(base_dir=path.parent, lines=lines)
    ctx.problems.extend(dups)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        ctx.problem("(top level)", f"expected a mapping of keys, got {_type_name(data)}")
        raise ConfigError(ctx.problems)

    top = _read_section(ctx, "", data, _TOP_FIELDS, skip=("inboxes", *_SECTIONS))
    sections = {
        name: _read_section(ctx, name, data.get(name), fields) for name, fields in _SECTIONS.items()
    }

    inboxes: list[InboxConfig] = []
    raw_inboxes = data.get("inboxes")
    if "inboxes" not in data:
        ctx.problem(
            "inboxes", "is required", "list at least one folder to watch, e.g. inboxes: [./inbox]"
        )
    elif isinstance(raw_inboxes, str):
        ctx.problem(
            "inboxes",
            "expected a list, got a single string",
            f"write it as a list: [{raw_inboxes!r}]",
        )
    elif not isinstance(raw_inboxes, list) or not raw_inboxes:
        ctx.problem(
            "inboxes",
            "must be a non-empty list of folders",
            "list at least one folder to watch, e.g. inboxes: [./inbox]",
        )
    else:
        for i, raw in enumerate(raw_inboxes):
            inbox = _read_inbox(ctx, f"inboxes[{i}]", raw)
            if inbox is not None:
                inboxes.append(inbox)

    if "outbox" not in data:
        ctx.problem(
            "outbox",
            "is required",
            "the folder that receives the Markdown and JSON, e.g. outbox: ./outbox",
        )

    engine = sections["engine"]
    if engine.get("fallback_engine") is not None and engine.get("fallback_engine") == engine.get(
        "name", EngineConfig.name
    ):
        ctx.problem(
            "engine.fallback_engine",
            "is the same as engine.name",
            "use a different engine, or null for no fallback",
        )
    _cross_checks(
        ctx,
        "limits",
        sections["limits"],
        [
            (
                "page_timeout_seconds",
                "document_timeout_seconds",
                "a page cannot outlast its document",
            )
        ],
    )
    _cross_checks(
        ctx,
        "worker",
        sections["worker"],
        [
            (
                "heartbeat_seconds",
                "heartbeat_timeout_seconds",
                "otherwise a healthy worker would be declared dead between two heartbeats",
            ),
            (
                "restart_backoff_seconds",
                "restart_backoff_max_seconds",
                "the cap must not be below the start",
            ),
        ],
    )

    for name, folder in _DEFAULT_DIRS.items():
        top.setdefault(name, path.parent / folder)
    if ctx.problems:
        raise ConfigError(ctx.sorted_problems() + _folder_problems_too(ctx, inboxes, top, path))

    return Config(
        inboxes=tuple(inboxes),
        engine=EngineConfig(**engine),
        limits=LimitsConfig(**sections["limits"]),
        worker=WorkerConfig(**sections["worker"]),
        logging=LoggingConfig(**sections["logging"]),
        http=HttpConfig(**sections["http"]),
        source=path,
        **top,
    )


_FOLDER_KEYS: Final = ("outbox", "archive", "failed", "duplicates", "state_dir")
# A problem with one of these keys leaves a folder unknown: then no folder checks.
_FOLDER_PROBLEM_KEY: Final = re.compile(
    r"inboxes(\[\d+\](\.path)?)?|" + "|".join(_FOLDER_KEYS)
)


def _folder_problems_too(
    ctx: _Ctx, inboxes: list[InboxConfig], top: dict[str, Any], path: Path
) -> list[Problem]:
    """The folder checks, on a file that has other problems too, so that one round of
    edits fixes everything (paperless-ngx's checks work that way).

    Only when every folder key itself parsed: a folder check on a half-read value would
    report noise. Nothing is created for a config that does not load.
    """
    if not inboxes or not all(isinstance(top.get(k), Path) for k in _FOLDER_KEYS):
        return []
    if any(_FOLDER_PROBLEM_KEY.fullmatch(p.key) for p in ctx.problems):
        return []
    partial = Config(inboxes=tuple(inboxes), source=path, **{k: top[k] for k in _FOLDER_KEYS})
    # Missing folders are left to the check of the loaded file (outputs are created, an
    # inbox may be a share not mounted yet); what is reported here is a set-up that is
    # wrong whatever exists: an output inside an inbox, two keys on one folder.
    return [p for p in check_paths(partial, create=False) if "does not exist" not in p.message]


# --------------------------------------------------------------------------------------
# Filesystem checks
# --------------------------------------------------------------------------------------


def _real(path: Path) -> Path:
    # strict=False: folders that do not exist yet still compare by their resolved parent.
    return path.expanduser().resolve(strict=False)


def _inside(inner: Path, outer: Path) -> bool:
    """True when `inner` is `outer` or below it (both already resolved)."""
    return inner == outer or outer in inner.parents


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


def check_paths(cfg: Config, create: bool = True) -> list[Problem]:
    """Every filesystem problem of `cfg` at once (empty list: good to run).

    With `create`, missing output folders are made (with parents); state_dir gets mode
    0o700 since its database holds file names.
    """
    problems: list[Problem] = []
    inboxes = [
        (f"inboxes[{i}].path", inbox, _real(inbox.path)) for i, inbox in enumerate(cfg.inboxes)
    ]

    for key, inbox, real in inboxes:
        mkdir_hint = f"is the share mounted? create it with: mkdir -p {inbox.path}"
        if not real.exists():
            problems.append(Problem(key, f"inbox {inbox.path} does not exist", mkdir_hint))
        elif not real.is_dir():
            problems.append(
                Problem(key, f"inbox {inbox.path} is not a folder", "point it at a folder")
            )
        elif not os.access(real, os.R_OK | os.X_OK):
            problems.append(
                Problem(
                    key, f"inbox {inbox.path} is not readable", "give the daemon's user read access"
                )
            )

    # Nested inboxes: one file would belong to two inboxes and be processed twice.
    for a in range(len(inboxes)):
        for b in range(a + 1, len(inboxes)):
            key_a, _, real_a = inboxes[a]
            key_b, _, real_b = inboxes[b]
            if real_a == real_b:
                problems.append(
                    Problem(
                        key_b, f"is the same folder as {key_a} ({real_a})", "list each folder once"
                    )
                )
            elif _inside(real_a, real_b) or _inside(real_b, real_a):
                inner, outer = (key_a, key_b) if _inside(real_a, real_b) else (key_b, key_a)
                problems.append(
                    Problem(
                        inner,
                        f"is inside {outer}: its files would belong to both inboxes",
                        "use one inbox (recursive: true covers subfolders) or move one out",
                    )
                )

    outputs = [(key, folder, _real(folder)) for key, folder in output_folders(cfg)]
    dangerous: set[str] = set()
    reingest = "the daemon would ingest its own output over and over"
    for out_key, folder, out_real in outputs:
        for in_key, _inbox, in_real in inboxes:
            if _inside(out_real, in_real):
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
            elif _inside(in_real, out_real):
                problems.append(
                    Problem(
                        in_key,
                        f"inbox {in_real} is inside {out_key} ({folder}): {reingest}",
                        "put the inbox next to the output folders, not inside one",
                    )
                )
                dangerous.add(out_key)

    # Pairwise distinct: e.g. archive == failed would mix good and failed originals, and
    # failed == outbox would hand originals to whatever consumes the outbox.
    for a in range(len(outputs)):
        for b in range(a + 1, len(outputs)):
            key_a, _fa, real_a = outputs[a]
            key_b, folder_b, real_b = outputs[b]
            if real_a == real_b:
                problems.append(
                    Problem(
                        key_b,
                        f"{folder_b} is the same folder as {key_a}",
                        f"give {key_a} and {key_b} separate folders",
                    )
                )

    for key, folder, real in outputs:
        if key in dangerous:
            continue  # do not create folders inside an inbox; the problem is reported
        if not os.path.lexists(real):
            if not create:
                problems.append(
                    Problem(key, f"{folder} does not exist", f"create it with: mkdir -p {folder}")
                )
                continue
            try:
                real.mkdir(parents=True, exist_ok=True)
                if key == "state_dir":
                    # mkdir's mode is filtered by the umask; chmod sets it exactly.
                    real.chmod(0o700)
            except OSError as exc:
                problems.append(
                    Problem(
                        key,
                        f"cannot create {folder}: {exc.strerror or exc}",
                        "create it by hand or fix the parent folder's permissions",
                    )
                )
                continue
        problem = _check_writable(key, real)
        if problem is not None:
            problems.append(problem)
    return problems


# --------------------------------------------------------------------------------------
# Helpers for the rest of the daemon
# --------------------------------------------------------------------------------------


def page_options_for(cfg: Config, inbox: InboxConfig | None) -> PageOptions:
    """The engine block's page keys with `inbox.engine_options` laid over them."""
    from daemon.page import PageOptions

    e = cfg.engine
    merged: dict[str, Any] = {
        "text_layer": e.text_layer,
        "dpi": e.dpi,
        "max_long_side": e.max_long_side,
        "max_new_tokens_layout": e.max_new_tokens_layout,
        "max_new_tokens_block": e.max_new_tokens_block,
        "pages": e.pages,
    }
    if inbox is not None:
        merged.update(inbox.engine_options)
    return PageOptions(
        text_layer=merged["text_layer"],
        dpi=merged["dpi"],
        max_long_side=merged["max_long_side"],
        max_new_tokens_layout=merged["max_new_tokens_layout"],
        max_new_tokens_block=merged["max_new_tokens_block"],
        pages=merged["pages"],
    )


def inbox_for(cfg: Config, path: Path) -> InboxConfig | None:
    """The inbox `path` belongs to (the deepest one), or None.

    Compared both as written and with symlinks resolved, so a file reached through a
    symlinked mount point still finds its inbox. A non-recursive inbox only owns its
    direct children.
    """
    file_forms = {Path(os.path.abspath(path)), _real(Path(path))}
    best: InboxConfig | None = None
    best_depth = -1
    for inbox in cfg.inboxes:
        for root in {Path(os.path.abspath(inbox.path)), _real(inbox.path)}:
            for f in file_forms:
                if root not in f.parents:
                    continue
                if not inbox.recursive and f.parent != root:
                    continue
                if len(root.parts) > best_depth:
                    best, best_depth = inbox, len(root.parts)
    return best


_SECRET_WORDS: Final = ("password", "passwd", "secret", "token", "api_key", "apikey")


def _redact_options(options: Mapping[str, Any]) -> dict[str, Any]:
    # Plugin engines' free-form options may carry credentials; mask the obvious ones.
    return {
        k: "***" if any(w in k.lower() for w in _SECRET_WORDS) else v for k, v in options.items()
    }


def redacted_dict(cfg: Config) -> dict[str, Any]:
    """The effective config as plain YAML data with secrets replaced by "***".

    Keys are the YAML keys (`limits.max_file_size`, not the field name), so the output
    can be saved and loaded again as a config file.
    """
    e, lim, w, log, h = cfg.engine, cfg.limits, cfg.worker, cfg.logging, cfg.http
    return {
        "inboxes": [
            {
                "path": str(i.path),
                "recursive": i.recursive,
                "patterns": list(i.patterns),
                "watch": i.watch,
                "output_subfolder": i.output_subfolder,
                "engine_options": dict(i.engine_options),
            }
            for i in cfg.inboxes
        ],
        "outbox": str(cfg.outbox),
        "archive": str(cfg.archive),
        "failed": str(cfg.failed),
        "duplicates": str(cfg.duplicates),
        "state_dir": str(cfg.state_dir),
        "after_success": cfg.after_success,
        "on_duplicate": cfg.on_duplicate,
        "stability_seconds": cfg.stability_seconds,
        "rescan_seconds": cfg.rescan_seconds,
        "engine": {
            "name": e.name,
            "fallback_engine": e.fallback_engine,
            "model": e.model,
            "revision": e.revision,
            "threads": e.threads,
            "precision": e.precision,
            "text_layer": e.text_layer,
            "dpi": e.dpi,
            "max_long_side": e.max_long_side,
            "max_new_tokens_layout": e.max_new_tokens_layout,
            "max_new_tokens_block": e.max_new_tokens_block,
            "pages": e.pages,
            "ocr_languages": list(e.ocr_languages),
            "options": _redact_options(e.options),
        },
        "limits": {
            "max_file_size": lim.max_file_bytes,
            "max_pages": lim.max_pages,
            "page_timeout_seconds": lim.page_timeout_seconds,
            "document_timeout_seconds": lim.document_timeout_seconds,
            "max_image_pixels": lim.max_image_pixels,
        },
        "worker": {
            "max_attempts": w.max_attempts,
            "heartbeat_seconds": w.heartbeat_seconds,
            "heartbeat_timeout_seconds": w.heartbeat_timeout_seconds,
            "startup_timeout_seconds": w.startup_timeout_seconds,
            "recycle_after_documents": w.recycle_after_documents,
            "max_rss_mb": w.max_rss_mb,
            "restart_backoff_seconds": w.restart_backoff_seconds,
            "restart_backoff_max_seconds": w.restart_backoff_max_seconds,
            "shutdown_timeout_seconds": w.shutdown_timeout_seconds,
        },
        "passwords": ["***" for _ in cfg.passwords],
        "logging": {
            "level": log.level,
            "file": str(log.file) if log.file is not None else None,
            "json": log.json,
        },
        "http": {"enabled": h.enabled, "host": h.host, "port": h.port},
    }
