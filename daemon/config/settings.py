"""Typed configuration: `config.yaml` -> one frozen `Config`; the one entry to the config.

Every config key is declared ONCE, as a field of a settings dataclass:

    dpi: int = setting(default=200, doc="PDF render resolution", parse=p_int(50, 600), page=True)

The field gives the Python name, type and default; `setting(...)` adds the doc line, the
parser that checks a value (and words its problem), the YAML key when it differs
(`yaml="max_file_size"`), `secret=True`, `page=True` (an inbox may override it), and
relations (`at_least=`, `differs_from=`, a section's `check=`). Loading, problems,
`check-config --show` (`redacted_dict`), the README table (`readme_table`) and the page
options (`page_options_for`) are all derived from these declarations.

Where things are, one concept per module:
- here: the top level (`Config`), the checks across a section that read its secret files,
  loading, and the helpers the rest of the daemon uses; every other module imports the
  configuration from here, which re-exports the sections;
- the sections: `daemon/config/engine.py` (`engine:`, its `http:` and `llama_cpp:`),
  `daemon/config/hooks.py` (`hooks:`), `daemon/config/sections.py` (an inbox, `limits:`,
  `worker:`, `logging:`, `output:`, `http:`);
- the secret files a configuration names, read when a value is needed:
  `daemon/config/secrets.py`;
- the machinery: `daemon/config/schema.py`, the value parsers `daemon/config/values.py`,
  reading the file `daemon/config/yamlfile.py`, folder checks `daemon/config/folders.py`.

Loading rules:
- `yaml.safe_load`; unknown keys are errors; every problem is collected and reported at
  once as `ConfigError(problems)`, each with its key path and a hint (paperless-ngx's
  checks style), never a traceback. `docinbox check-config` and `run` exit 78 on them.
- Relative paths resolve against the folder of the config file.
- `--config PATH`, else `$DOCINBOX_CONFIG`, else `./config.yaml`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal, get_args
from urllib.parse import urlsplit

import yaml

from daemon.common.shares import ShareCall, direct
from daemon.config.engine import (
    BUILTIN_ENGINES,
    LOSSY_PRECISIONS,
    PAGE_OPTION_KEYS,
    EngineConfig,
    EngineHttpConfig,
    LlamaCppConfig,
    Precision,
    RuntimeKind,
)
from daemon.config.folders import check_folders, real_path
from daemon.config.hooks import (
    EVENT_TYPES,
    CommandHookConfig,
    EventType,
    HooksConfig,
    WebhookConfig,
)
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
from daemon.config.secrets import hook_secret, http_token
from daemon.config.sections import (
    HttpConfig,
    InboxConfig,
    LimitsConfig,
    LoggingConfig,
    OutputConfig,
    WatchMode,
    WorkerConfig,
)
from daemon.config.values import (
    INVALID,
    ConfigError,
    Ctx,
    Problem,
    is_loopback,
    p_path,
    p_seconds,
    parse_page_range,
    parse_size,
    type_name,
)
from daemon.config.yamlfile import parse_yaml, read_text, yaml_problem
from daemon.document.page import PageOptions

# What the rest of docinbox imports from here, wherever it is declared.
__all__ = [
    "BUILTIN_ENGINES",
    "EVENT_TYPES",
    "LOSSY_PRECISIONS",
    "PAGE_OPTION_KEYS",
    "CommandHookConfig",
    "Config",
    "ConfigError",
    "EngineConfig",
    "EngineHttpConfig",
    "EventType",
    "HooksConfig",
    "HttpConfig",
    "InboxConfig",
    "LimitsConfig",
    "LlamaCppConfig",
    "LoggingConfig",
    "OutputConfig",
    "Precision",
    "Problem",
    "RuntimeKind",
    "WatchMode",
    "WebhookConfig",
    "WorkerConfig",
    "check_paths",
    "hook_secret",
    "http_token",
    "inbox_for",
    "load_config",
    "output_folders",
    "page_options_for",
    "parse_page_range",
    "parse_size",
    "readme_table",
    "redacted_dict",
    "resolve_config_path",
]

AfterSuccess = Literal["archive", "delete", "keep"]
OnDuplicate = Literal["move", "delete", "keep"]


# --------------------------------------------------------------------------------------
# The top level's own keys, and the checks across a section that read its secret files
# --------------------------------------------------------------------------------------


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


def check_paths(cfg: Config, create: bool = True, call: ShareCall = direct) -> list[Problem]:
    """Every filesystem problem of `cfg` at once (see daemon/config/folders.py); `call`:
    how a call into a folder's share is made (the daemon passes its share lanes)."""
    return check_folders(
        [i.path for i in cfg.inboxes], output_folders(cfg), create=create, call=call
    )


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
