"""The `engine:` section: which engine, its model and precision, where MinerU generates
(`engine.http`, `engine.llama_cpp`), and the page keys an inbox may override.

Declared as every section is (see daemon/config/settings.py, the entry the rest of
docinbox imports the configuration from). The page keys' defaults are `PageOptions`' own,
so the worker's view of a page and this section cannot disagree.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Final, Literal, get_args
from urllib.parse import urlsplit, urlunsplit

from daemon.config.schema import declared, read_fields, section, setting, settings
from daemon.config.values import (
    INVALID,
    Ctx,
    echo,
    p_int,
    p_mapping,
    p_pages,
    p_path,
    p_seconds,
    p_text,
    type_name,
)
from daemon.document.page import PageOptions, TextLayer

Precision = Literal[
    "auto", "fp32", "bf16", "mixed", "int8", "bf16-int8", "int8-dynamic", "bf16-int8-dynamic"
]
# Precisions that fail the fidelity gate (bench/fidelity.py): selectable, never by `auto`,
# and named as lossy by check-config and in the worker's log.
LOSSY_PRECISIONS: tuple[str, ...] = ("int8-dynamic", "bf16-int8-dynamic")


# The engines `engine.name` may name without a module path; daemon/engines/registry.py
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


_SECRET_WORDS: Final = ("password", "passwd", "secret", "token", "api_key", "apikey")


def _redact_options(options: object) -> object:
    # Plugin engines' free-form options may carry credentials; mask the obvious ones.
    if not isinstance(options, dict):
        return options
    return {
        k: "***" if any(w in str(k).lower() for w in _SECRET_WORDS) else v
        for k, v in options.items()
    }


RuntimeKind = Literal["transformers", "http", "llama-cpp"]
# How the transformers runtime decodes MinerU's greedy steps (engine.decode).
DecodeKind = Literal["loop", "generate"]


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
    # Keys an older docinbox accepted: a config that still sets one is told why it went.
    REMOVED_KEYS: ClassVar[Mapping[str, str]] = MappingProxyType(
        {
            # It was declared but never read. The rapidocr wheel ships one recognition
            # model, and any other would be a download at run time, which lite never does.
            "ocr_languages": "delete the line: the lite engine reads with the one "
            "recognition model inside the rapidocr wheel (PP-OCRv6 small: Latin-script "
            "languages, Chinese, Japanese); no other installs offline, so there is "
            "nothing to choose",
        }
    )

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
    # loop: rows leave a batch as they finish and waiting ones join, and drafts (the PDF
    # text layer, prompt lookup) the model only confirms; the same greedy tokens as
    # generate() (tests/engines/test_decode_loop.py). generate: transformers' own, to compare.
    decode: DecodeKind = setting(
        default="loop",
        choices=get_args(DecodeKind),
        doc="mineru, transformers: `loop` (our decode loop: continuous batching, drafted "
        "decoding, same output) or `generate` (transformers' generate())",
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


def p_page_overrides(ctx: Ctx, key: str, value: object) -> object:
    # Checked exactly as the same keys under `engine:`, from the same declarations.
    return read_fields(ctx, key, value, EngineConfig, only=_page_keys)
