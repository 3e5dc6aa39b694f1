"""The import graph of `daemon/` has no cycle.

A cycle (app -> health -> cli -> app was one) means two modules each need the other to be
understood, and a module-level import in either direction breaks start-up. Every import
counts here, also those inside functions and under TYPE_CHECKING: a lazy import hides a
cycle from Python, not from the reader.
"""

from __future__ import annotations

from pathlib import Path

from scripts import architecture
from tests.conftest import REPO

PACKAGE = REPO / "daemon"


def module_name(path: Path) -> str:
    return architecture.module_name(PACKAGE, path)


absolute = architecture.absolute


def import_graph() -> dict[str, set[str]]:
    """Every import of every module of daemon/, parent packages included (see
    scripts/architecture.py, which measures the same graph for docs/architecture.md)."""
    return architecture.import_graph(PACKAGE)


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
