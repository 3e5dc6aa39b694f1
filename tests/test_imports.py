"""The import graph of `daemon/` has no cycle.

A cycle (app -> health -> cli -> app was one) means two modules each need the other to be
understood, and a module-level import in either direction breaks start-up. Every import
counts here, also those inside functions and under TYPE_CHECKING: a lazy import hides a
cycle from Python, not from the reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "daemon"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def absolute(importer: str, path: Path, module: str | None, level: int) -> str:
    """The absolute name `from <level dots><module> import ...` refers to in `importer`."""
    if level == 0:
        return module or ""
    package = importer.split(".") if path.name == "__init__.py" else importer.split(".")[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = absolute(name, path, node.module, node.level)
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            found = [t for t in targets if t in files]
            # Importing daemon.a.b.c runs daemon/a/__init__.py and daemon/a/b/__init__.py
            # first: each parent package is a dependency as real as the module itself.
            parents = [
                ".".join(t.split(".")[:i]) for t in found for i in range(2, t.count(".") + 1)
            ]
            deps.update(d for d in [*found, *parents] if d in files and d != name)
        # The package itself only holds __version__; importing it is not a dependency
        # on the modules it contains.
        deps.discard("daemon")
        graph[name] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> list[str] | None:
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep in on_stack:
                return [*stack[stack.index(dep):], dep]
            if dep not in done:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        on_stack.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            found = visit(start)
            if found:
                return found
    return None


def test_relative_imports_count() -> None:
    # `from .sibling import X` inside a module of a package is an edge too. The names are
    # made up: the rule is about dots, not about today's modules.
    module = PACKAGE / "stage" / "part.py"
    init = PACKAGE / "stage" / "__init__.py"
    assert absolute("daemon.stage.part", module, "sibling", 1) == "daemon.stage.sibling"
    assert absolute("daemon.stage", init, "part", 1) == "daemon.stage.part"
    assert absolute("daemon.stage.part", module, "other", 2) == "daemon.other"
    assert absolute("daemon.stage.part", module, None, 2) == "daemon"
    assert absolute("daemon.cli.main", PACKAGE / "cli.py", "daemon.x.y", 0) == "daemon.x.y"


def test_the_checker_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_daemon_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "daemon.service.status" in graph and "daemon.cli.main" in graph
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_status_is_read_without_the_cli_or_the_server() -> None:
    # The status value sits below everything that shows it.
    graph = import_graph()
    readers = ("daemon.cli.main", "daemon.service.httpserver", "daemon.service.metrics",
               "daemon.service.health", "daemon.service.web")
    for reader in readers:
        assert reader not in graph["daemon.service.status"]
        assert reader not in graph["daemon.common.live"]
    # the daemon's own facts are plain data: no store, no supervisor, no config
    assert graph["daemon.common.live"] == set()
