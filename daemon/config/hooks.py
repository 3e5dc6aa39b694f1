"""The `hooks:` section: after each document, which webhooks and commands are told.

Declared as every section is (see daemon/config/settings.py). The secret a webhook signs
with is named here (`secret_file`) and read by daemon/config/secrets.py; delivering the
events is daemon/service/hooks.py.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Final, Literal, get_args
from urllib.parse import urlsplit

from daemon.config.schema import read_fields, required, setting, settings
from daemon.config.values import (
    INVALID,
    Ctx,
    echo,
    p_bool,
    p_number,
    p_path,
    p_seconds,
    p_text,
    p_text_list,
    type_name,
)

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
    # Fractional days are allowed (0.01 = 14.4 min) so that a soak, or a user trying it
    # out, sees the retention pass within hours; the floor keeps a typo like 0 from
    # deleting events as soon as they are delivered.
    retention_days: float = setting(
        default=30.0,
        parse=p_number(0.001, 36500, "fractions of a day are fine, e.g. 0.5"),
        doc="delivered and given-up events are deleted from the state database this many "
        "days after they finished (fractions allowed, at least 0.001 = 86 s)",
    )
