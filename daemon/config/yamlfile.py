"""Reading the config file: its text, its YAML, and the line of every key.

PyYAML silently keeps the last of two equal keys and forgets where a key was; the
composed node tree has both, so problems can name the line and duplicates are reported.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from daemon.config.schema import join
from daemon.config.values import ConfigError, Problem


def yaml_problem(path: Path, exc: yaml.YAMLError) -> Problem:
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
    node: yaml.Node, prefix: str, lines: dict[str, int], dups: list[Problem], seen: set[int]
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
            key = join(prefix, name)
            line = key_node.start_mark.line + 1
            if name in first:
                dups.append(
                    Problem(
                        key=key,
                        message=f"is given twice (lines {first[name]} and {line})",
                        hint="YAML would silently keep only the last one; merge them",
                    )
                )
            else:
                first[name] = line
                lines.setdefault(key, line)
            _collect_lines(value_node, key, lines, dups, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            key = f"{prefix}[{i}]"
            lines.setdefault(key, item.start_mark.line + 1)
            _collect_lines(item, key, lines, dups, seen)


def parse_yaml(text: str) -> tuple[object, dict[str, int], list[Problem]]:
    """(data, key path -> line, duplicate-key problems); raises yaml.YAMLError."""
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


def read_text(path: Path, env_hint: str) -> str:
    """The file's text; ConfigError when it cannot be read."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            [
                Problem(
                    key=str(path),
                    message="config file not found",
                    hint=f"pass --config PATH or set {env_hint}; the shipped config.yaml "
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
