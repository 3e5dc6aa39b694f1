"""Typed configuration: `config.yaml` -> one frozen `Config`.

Loading rules (the loader below `Config` implements them):
- `yaml.safe_load`; unknown keys are errors; every problem is collected and reported at
  once as `ConfigError(problems)`, each with its key path and a hint (paperless-ngx's
  checks style), never a traceback. `docinbox check-config` and `run` exit 78 on them.
- Relative paths resolve against the folder of the config file.
- `--config PATH`, else `$DOCINBOX_CONFIG`, else `./config.yaml`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

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
    {"text_layer", "dpi", "max_long_side", "max_new_tokens_layout", "max_new_tokens_block"}
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
    shutdown_timeout_seconds: float = 60.0  # SIGTERM: let the current page finish this long


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
