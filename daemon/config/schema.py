"""How a configuration key is declared, read and checked.

A key is one field of a frozen settings dataclass (a section's module in `daemon/config/`,
the top level in `daemon/config/settings.py`), declared with
`setting(...)`, `required(...)` or `section(...)`. The field's name and type are the
Python side; the `Setting` in its metadata is everything else: the YAML key (when it
differs, e.g. `max_file_size` -> `max_file_bytes`), the parser that checks a value and words
the problem, the doc line, whether it is secret, whether an inbox may override it, and
relations to other keys. Everything else here is derived from those declarations:
reading a YAML mapping into a dataclass (every problem at once, with key paths, "did you
mean" and hints; a key a section lists in its `REMOVED_KEYS` is refused with the reason),
the effective config with secrets masked (`check-config --show`), and the README's
configuration table. The value parsers are in `daemon/config/values.py`.

This module imports nothing from the rest of `daemon` and nothing heavy: the daemon
process reads its config without paying for Pillow or torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar, dataclass_transform

from daemon.config.values import INVALID, Ctx, Parser, Problem, p_choice, type_name

T = TypeVar("T")
C = TypeVar("C")


# --------------------------------------------------------------------------------------
# Declaring keys
# --------------------------------------------------------------------------------------

SETTING: Final = "docinbox.setting"  # the metadata slot of a declared field


@dataclass(frozen=True)
class Setting:
    """Everything about one config key beyond its Python name, type and default."""

    doc: str  # one line: what the key means (the README table's "meaning")
    parse: Parser | None = None  # None for sections, which are read as mappings
    yaml: str | None = None  # the YAML key when it differs from the field name (a rename)
    nullable: bool = False  # `key: null` is a meaningful value, not a mistake
    secret: bool = False  # masked in --show and never echoed in problems
    page: bool = False  # a page-time engine key an inbox may override (engine_options)
    required_hint: str = ""  # for a key without a default: what to write
    sibling: str | None = None  # default: this folder next to the config file
    section: type | None = None  # a nested settings dataclass (a YAML mapping)
    items: type | None = None  # the settings dataclass of each list item (for --show, docs)
    at_least: tuple[str, str] | None = None  # (other field, why): this >= other
    differs_from: tuple[str, str] | None = None  # (other field, hint): this != other
    shown_default: str | None = None  # README text for the default, when not the value
    show: Callable[[object], object] | None = None  # --show form, when not the generic one
    check: Callable[[Ctx, str, Any], None] | None = None  # a section's rules across its keys

    def key_for(self, name: str) -> str:
        return self.yaml or name


# What `setting` gets when `default` or `default_factory` is not passed (dataclasses' own).
_NOT_GIVEN: Any = MISSING


def setting(
    *,
    default: T = _NOT_GIVEN,
    default_factory: Callable[[], T] = _NOT_GIVEN,
    doc: str,
    parse: Parser | None = None,
    choices: tuple[str, ...] = (),
    fold_case: bool = False,
    yaml: str | None = None,
    nullable: bool = False,
    secret: bool = False,
    page: bool = False,
    at_least: tuple[str, str] | None = None,
    differs_from: tuple[str, str] | None = None,
    shown_default: str | None = None,
    show: Callable[[object], object] | None = None,
    items: type | None = None,
) -> T:
    """A key with a `default` (or a `default_factory` for a mutable one). `parse` checks
    a value; `choices` is shorthand for a word out of a fixed set (pass `typing.get_args`
    of the field's Literal type)."""
    if choices:
        parse = p_choice(choices, fold_case=fold_case)
    if parse is None:
        raise TypeError(f"setting {doc!r} needs parse= or choices=")
    meta = Setting(
        doc=doc,
        parse=parse,
        yaml=yaml,
        nullable=nullable,
        secret=secret,
        page=page,
        at_least=at_least,
        differs_from=differs_from,
        shown_default=shown_default,
        show=show,
        items=items,
    )
    # Secrets stay out of reprs (and so out of logged dataclasses).
    if default_factory is not _NOT_GIVEN:
        return field(default_factory=default_factory, repr=not secret, metadata={SETTING: meta})
    return field(default=default, repr=not secret, metadata={SETTING: meta})


def required(
    *,
    doc: str,
    parse: Parser,
    required_hint: str = "",
    sibling: str | None = None,
    items: type | None = None,
) -> Any:
    """A key without a Python default: the file must give it, or (`sibling`) it defaults
    to a folder of that name next to the config file."""
    meta = Setting(doc=doc, parse=parse, required_hint=required_hint, sibling=sibling, items=items)
    return field(metadata={SETTING: meta})


def section(
    *,
    default_factory: Callable[[], T],
    doc: str,
    check: Callable[[Ctx, str, T], None] | None = None,
) -> T:
    """A nested mapping of keys, declared by its own settings dataclass (passed as
    `default_factory`, the name type checkers read as "has a default"). `check(ctx, key,
    section)` judges the keys together, once each is valid on its own."""
    cls = default_factory
    assert isinstance(cls, type)
    meta = Setting(doc=doc, section=cls, check=check)
    result: T = field(default_factory=cls, metadata={SETTING: meta})
    return result


@dataclass_transform(frozen_default=True, field_specifiers=(setting, required, section, field))
def settings(cls: type[C]) -> type[C]:
    """Make `cls` a frozen dataclass whose fields are config keys."""
    return dataclass(frozen=True)(cls)


def declared(cls: type) -> Iterator[tuple[dataclasses.Field[object], Setting]]:
    """The declared keys of a settings dataclass, in declaration order."""
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(SETTING)
        if isinstance(meta, Setting):
            yield f, meta


def has_default(f: dataclasses.Field[object]) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


def default_of(f: dataclasses.Field[object]) -> object:
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None if f.default is MISSING else f.default


# --------------------------------------------------------------------------------------
# Reading a mapping into a settings dataclass
# --------------------------------------------------------------------------------------


def join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def key_homes(root: type) -> dict[str, list[str]]:
    """YAML key -> the sections it lives in ("" = top level), to tell a user who put
    `dpi` at the top that it belongs under `engine:`."""
    homes: dict[str, list[str]] = {}

    def walk(cls: type, home: str) -> None:
        for f, s in declared(cls):
            name = s.key_for(f.name)
            homes.setdefault(name, []).append(home)
            if s.section is not None:
                walk(s.section, join(home, name))
            if s.items is not None:
                walk(s.items, f"{join(home, name)}[]")

    walk(root, "")
    return homes


def _removed_keys(cls: type) -> Mapping[str, str]:
    """A settings class's `REMOVED_KEYS` (YAML key -> why it went and what to do), if any."""
    removed: Mapping[str, str] = getattr(cls, "REMOVED_KEYS", {})
    return removed


def _unknown_key(ctx: Ctx, key: str, name: str, known: list[str], here: str) -> None:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        hint = f"did you mean {close[0]!r}?"
    else:
        elsewhere = [h for h in ctx.homes.get(name, []) if h != here]
        if elsewhere:
            where = " or ".join(h or "the top level" for h in elsewhere)
            hint = f"{name!r} belongs under {where}"
        else:
            hint = "known keys here: " + ", ".join(known)
    ctx.problem(key, "unknown key", hint)


def _scrub(ctx: Ctx, since: int, value: object) -> None:
    # A secret's own parser may echo what it read; the value must not reach the terminal.
    if not isinstance(value, str) or not value:
        return
    for i in range(since, len(ctx.problems)):
        p = ctx.problems[i]
        if value in p.message or value in p.hint:
            clean = Problem(p.key, p.message.replace(value, "***"), p.hint.replace(value, "***"))
            ctx._line_of[id(clean)] = ctx._line_of.pop(id(p), 1 << 30)
            ctx.problems[i] = clean


def read_fields(
    ctx: Ctx,
    prefix: str,
    raw: object,
    cls: type,
    *,
    only: Callable[[Setting], bool] | None = None,
    check_required: bool = True,
) -> dict[str, Any] | None:
    """Check the YAML mapping `raw` against `cls`'s declared keys.

    Returns the dataclass kwargs of the valid keys (field names, not YAML keys), with
    `sibling` folders filled in; None when a required key is missing or invalid (the
    problem is recorded). `only` restricts the keys accepted here (an inbox's
    engine_options take the page keys of `engine:`).
    """
    spec = [(f, s) for f, s in declared(cls) if only is None or only(s)]
    by_key = {s.key_for(f.name): (f, s) for f, s in spec}
    out: dict[str, Any] = {}
    if raw is None:
        # `engine:` with every sub-key commented out reads as null: all defaults.
        raw = {}
    if not isinstance(raw, dict):
        ctx.problem(prefix or "(top level)", f"expected a mapping of keys, got {type_name(raw)}")
        raw = {}
    for name, value in raw.items():
        if not isinstance(name, str):
            # YAML 1.1 reads unquoted on/off/yes/no keys as booleans.
            ctx.problem(join(prefix, str(name)), "keys must be strings", "quote the key")
            continue
        key = join(prefix, name)
        found = by_key.get(name)
        if found is None and name in _removed_keys(cls):
            ctx.problem(key, "was removed", _removed_keys(cls)[name])
            continue
        if found is None:
            here = re.sub(r"\[\d+\]", "[]", prefix)
            _unknown_key(ctx, key, name, list(by_key), here)
            continue
        f, s = found
        if s.section is not None:
            kwargs = read_fields(ctx, key, value, s.section)
            if kwargs is not None:
                out[f.name] = s.section(**kwargs)
                if s.check is not None:
                    s.check(ctx, key, out[f.name])
            continue
        if value is None:
            if s.nullable:
                out[f.name] = None
            else:
                ctx.problem(key, "has no value", "give a value, or remove the line for the default")
            continue
        assert s.parse is not None
        before = len(ctx.problems)
        parsed = s.parse(ctx, key, value)
        if s.secret:
            _scrub(ctx, before, value)
        if parsed is not INVALID:
            out[f.name] = parsed

    _relations(ctx, prefix, spec, out)
    complete = True
    for f, s in spec:
        if f.name in out or has_default(f):
            continue
        if s.sibling is not None:
            out[f.name] = ctx.base_dir / s.sibling
            continue
        complete = False
        name = s.key_for(f.name)
        if check_required and name not in raw:
            ctx.problem(join(prefix, name), "is required", s.required_hint or s.doc)
    return out if complete else None


def _relations(
    ctx: Ctx,
    prefix: str,
    spec: list[tuple[dataclasses.Field[object], Setting]],
    out: dict[str, Any],
) -> None:
    fields_by_name = {f.name: (f, s) for f, s in spec}

    def where(name: str) -> str:
        return join(prefix, fields_by_name[name][1].key_for(name))

    for f, s in spec:
        if s.at_least is not None:
            # Only when both were given and valid: a lone value is checked by its parser.
            low, why = s.at_least
            if low in out and f.name in out and out[low] > out[f.name]:
                ctx.problem(where(f.name), f"must be at least {where(low)} ({out[low]:g})", why)
        if s.differs_from is not None and s.differs_from[0] in fields_by_name:
            other, hint = s.differs_from
            mine = out.get(f.name)
            theirs = out.get(other, default_of(fields_by_name[other][0]))
            if mine is not None and mine == theirs:
                ctx.problem(where(f.name), f"is the same as {where(other)}", hint)


# --------------------------------------------------------------------------------------
# Deriving: the effective config (--show) and the README table
# --------------------------------------------------------------------------------------

MASK: Final = "***"


def _plain(value: object) -> object:
    """YAML-ready form: paths as strings, tuples as lists, settings as mappings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return shown(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _masked(value: object) -> object:
    if isinstance(value, tuple | list):
        return [MASK for _ in value]
    return MASK if value else value


def shown(obj: object) -> dict[str, Any]:
    """`obj` (a settings dataclass) as YAML data under its YAML keys, secrets masked, so
    that the output can be saved and loaded again as a config file."""
    out: dict[str, Any] = {}
    for f, s in declared(type(obj)):
        value = getattr(obj, f.name)
        if s.secret:
            value = _masked(value)
        elif s.show is not None:
            value = s.show(value)
        out[s.key_for(f.name)] = _plain(value)
    return out


def _default_text(f: dataclasses.Field[object], s: Setting) -> str:
    if s.shown_default is not None:
        return s.shown_default
    if s.sibling is not None:
        return f"`./{s.sibling}`"
    if not has_default(f):
        return "required"
    value = _plain(default_of(f))
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return "[" + ", ".join(f"`{v}`" for v in value) + "]"
    if isinstance(value, dict) and not value:
        return "{}"
    return f"`{value}`" if isinstance(value, str) and value else (str(value) or '`""`')


def table_rows(root: type) -> list[tuple[str, str, str]]:
    """(key path, default, meaning) for every declared key, in declaration order."""
    rows: list[tuple[str, str, str]] = []

    def walk(cls: type, prefix: str) -> None:
        for f, s in declared(cls):
            path = join(prefix, s.key_for(f.name))
            if s.section is not None:
                walk(s.section, path)
                continue
            meaning = s.doc
            if s.secret:
                meaning += " (secret: shown as `***`)"
            rows.append((f"`{path}`", _default_text(f, s), meaning))
            if s.items is not None:
                walk(s.items, f"{path}[]")

    walk(root, "")
    return rows


def markdown_table(root: type) -> str:
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for key, default, meaning in table_rows(root):
        cells = (c.replace("|", "\\|") for c in (key, default, meaning))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
