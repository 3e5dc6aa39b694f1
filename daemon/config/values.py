"""Checking one config value: the problems it can have and how they are worded.

A parser takes (ctx, key path, YAML value) and returns the value to store, or INVALID
after recording a Problem with a hint. Messages use YAML words ("a whole number",
"true/false"), say where (key path and line), and suggest the closest allowed word.
Secrets are never echoed (the caller scrubs them, see schema.read_fields).
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Final


@dataclass(frozen=True)
class Problem:
    key: str  # e.g. "inboxes[0].watch"
    message: str
    hint: str = ""
    # An inbox that is only missing now (its path as configured): a share that may be
    # away. `docinbox run` starts anyway for one its state database has seen before.
    away: str | None = None

    def __str__(self) -> str:
        return f"{self.key}: {self.message}" + (f" (hint: {self.hint})" if self.hint else "")


class ConfigError(Exception):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


class Invalid:
    """Returned by a value parser that has already recorded a Problem."""


INVALID: Final = Invalid()

# Values are echoed in messages so a user sees what was read; long ones are cut so a
# pasted blob does not flood the terminal.
_ECHO_MAX = 60


def echo(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _ECHO_MAX else text[: _ECHO_MAX - 3] + "..."


# YAML words rather than Python's, since the reader edits YAML. bool before int: in
# Python, true/false are ints.
_YAML_WORDS: Final = (
    (bool, "true/false"),
    (int, "a whole number"),
    (float, "a number"),
    (str, "a string"),
    (list, "a list"),
    (dict, "a mapping"),
)


def type_name(value: object) -> str:
    if value is None:
        return "an empty value"
    return next((word for t, word in _YAML_WORDS if isinstance(value, t)), type(value).__name__)


class Ctx:
    """Collects problems for one load so that all of them are reported together."""

    def __init__(
        self, base_dir: Path, lines: dict[str, int], homes: Mapping[str, list[str]]
    ) -> None:
        self.base_dir = base_dir
        self.lines = lines  # key path -> 1-based line, to point the user at the spot
        self.homes = homes  # YAML key -> sections it belongs to (see key_homes)
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
        # be a symlink); the folder checks compare real paths where it matters.
        p = Path(raw).expanduser()
        if not p.is_absolute():
            p = self.base_dir / p
        return Path(os.path.normpath(p))


# A parser checks one YAML value: the parsed value, or INVALID after ctx.problem(...).
Parser = Callable[[Ctx, str, object], object]


def p_bool(ctx: Ctx, key: str, value: object) -> object:
    if isinstance(value, bool):
        return value
    hint = "write true or false"
    if isinstance(value, str) and value.strip().lower() in {"true", "false", "yes", "no"}:
        hint = "write true or false without quotes"
    ctx.problem(key, f"expected true or false, got {type_name(value)}", hint)
    return INVALID


def _range(lo: float, hi: float | None, note: str = "", *, strict_lo: bool = False) -> str:
    low = f"greater than {lo:g}" if strict_lo else f"at least {lo:g}"
    text = f"between {lo:g} and {hi:g}" if hi is not None else low
    return f"use a number {text}" + (f"; {note}" if note else "")


def p_int(lo: int, hi: int | None = None, note: str = "") -> Parser:
    def parse(ctx: Ctx, key: str, value: object) -> object:
        # bool is an int subclass in Python; `threads: yes` must not become 1.
        if isinstance(value, bool) or not isinstance(value, int):
            ctx.problem(key, f"expected a whole number, got {type_name(value)}", _range(lo, hi))
            return INVALID
        if value < lo or (hi is not None and value > hi):
            ctx.problem(key, f"{value} is out of range", _range(lo, hi, note))
            return INVALID
        return value

    return parse


def p_number(lo: float, hi: float, note: str = "") -> Parser:
    """A plain number, whole or not, between `lo` and `hi` (both included)."""

    def parse(ctx: Ctx, key: str, value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int | float):
            ctx.problem(key, f"expected a number, got {type_name(value)}", _range(lo, hi))
            return INVALID
        if not math.isfinite(value) or value < lo or value > hi:
            ctx.problem(key, f"{value} is out of range", _range(lo, hi, note))
            return INVALID
        return float(value)

    return parse


def p_seconds(lo: float = 0.0, *, strict: bool = True, note: str = "") -> Parser:
    """Durations are plain numbers of seconds; `strict` means the lower bound is excluded."""

    def parse(ctx: Ctx, key: str, value: object) -> object:
        hint = _range(lo, None, note, strict_lo=strict)
        if isinstance(value, bool) or not isinstance(value, int | float):
            if isinstance(value, str):
                hint = "durations are plain numbers of seconds, e.g. 300 (not '5m')"
            ctx.problem(key, f"expected a number of seconds, got {type_name(value)}", hint)
            return INVALID
        if not math.isfinite(value) or value < lo or (strict and value == lo):
            ctx.problem(key, f"{value} seconds is out of range", hint)
            return INVALID
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
        raise ValueError(f"{echo(text)} is not a size")
    unit = m.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise ValueError(f"unknown unit {echo(m.group(2))}")
    try:
        number = Decimal(m.group(1))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"{echo(text)} is not a size") from exc
    # Decimal keeps "1.5 GiB" exact; a fraction of a byte is rounded down.
    return int(number * _SIZE_UNITS[unit])


def p_size(ctx: Ctx, key: str, value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, int | str):
        ctx.problem(key, f"expected a size, got {type_name(value)}", _SIZE_HINT)
        return INVALID
    try:
        size = parse_size(value)
    except ValueError as exc:
        ctx.problem(key, str(exc), _SIZE_HINT)
        return INVALID
    if size < 1:
        ctx.problem(key, "must be at least 1 byte", _SIZE_HINT)
        return INVALID
    return size


def p_choice(choices: tuple[str, ...], *, fold_case: bool = False) -> Parser:
    def parse(ctx: Ctx, key: str, value: object) -> object:
        allowed = "allowed values: " + ", ".join(choices)
        if not isinstance(value, str):
            ctx.problem(key, f"expected one of the allowed words, got {type_name(value)}", allowed)
            return INVALID
        candidate = value.strip()
        if fold_case:
            candidate = candidate.upper()
        if candidate in choices:
            return candidate
        close = difflib.get_close_matches(candidate.lower(), [c.lower() for c in choices], 1)
        hint = allowed + (f" (did you mean {close[0]!r}?)" if close else "")
        ctx.problem(key, f"{echo(value)} is not allowed", hint)
        return INVALID

    return parse


def p_text(ctx: Ctx, key: str, value: object) -> object:
    if not isinstance(value, str) or not value.strip():
        ctx.problem(key, f"expected a non-empty string, got {type_name(value)}")
        return INVALID
    return value.strip()


def p_path(ctx: Ctx, key: str, value: object) -> object:
    if not isinstance(value, str) or not value.strip():
        ctx.problem(
            key,
            f"expected a folder path, got {type_name(value)}",
            "absolute, or relative to the config file's folder; ~ is expanded",
        )
        return INVALID
    return ctx.path(value.strip())


def p_text_list(*, allow_empty: bool) -> Parser:
    def parse(ctx: Ctx, key: str, value: object) -> object:
        if isinstance(value, str):
            ctx.problem(
                key, "expected a list, got a single string", f"write it as a list: [{value!r}]"
            )
            return INVALID
        if not isinstance(value, list):
            ctx.problem(key, f"expected a list of strings, got {type_name(value)}")
            return INVALID
        if not value and not allow_empty:
            ctx.problem(key, "must not be empty", "give at least one entry or remove the key")
            return INVALID
        ok = True
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item.strip():
                ctx.problem(f"{key}[{i}]", f"expected a non-empty string, got {type_name(item)}")
                ok = False
        return tuple(s.strip() for s in value) if ok else INVALID

    return parse


def p_mapping(ctx: Ctx, key: str, value: object) -> object:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        ctx.problem(key, f"expected a mapping with string keys, got {type_name(value)}")
        return INVALID
    return dict(value)


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


def p_pages(ctx: Ctx, key: str, value: object) -> object:
    try:
        parse_page_range(str(value), 10**6)
    except ValueError:
        ctx.problem(
            key,
            f"{echo(value)} is not a page range",
            'use 1-based pages like "1-3,7" or "2-" (quoted), or null for all',
        )
        return INVALID
    return str(value)


def is_loopback(host: str) -> bool:
    """Whether a configured host (a bind address, a receiver's) is this machine only:
    what decides that the status page needs a token and that a webhook needs https."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
