"""Measure and draw the module structure of `daemon/` from its imports.

    .venv/bin/python scripts/architecture.py [ROOT]          # figures + a Mermaid drawing
    .venv/bin/python scripts/architecture.py ROOT --modules  # one line per module

ROOT is a checkout (default: this one), so the same command measures an older commit
checked out elsewhere (`git worktree add /tmp/old <rev>`). Every import counts, also
those inside functions and under TYPE_CHECKING, and importing `daemon.a.b` counts as
importing the package `daemon.a` too, as tests/house/test_imports.py counts them.

Figures: modules, import edges, layers (the longest chain of imports, counted in
modules), the largest module in lines. The drawing groups modules by the folder they
sit in (the stage of the data path) and draws one arrow per pair of folders that import
each other, with the number of module imports behind it.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Figures:
    modules: int
    edges: int
    module_edges: int  # leaving out imports of package faces (__init__.py)
    layers: int
    cycle_imports: int
    largest: str
    largest_lines: int


def module_name(package: Path, path: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def absolute(importer: str, path: Path, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    package = importer.split(".") if path.name == "__init__.py" else importer.split(".")[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def import_graph(package: Path) -> dict[str, set[str]]:
    files = {module_name(package, p): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = absolute(name, path, node.module, node.level)
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            found = [t for t in targets if t in files]
            parents = [
                ".".join(t.split(".")[:i]) for t in found for i in range(2, t.count(".") + 1)
            ]
            deps.update(d for d in [*found, *parents] if d in files and d != name)
        deps.discard("daemon")  # the root package holds only __version__
        graph[name] = deps
    return graph


def layers(graph: dict[str, set[str]]) -> tuple[int, int]:
    """The longest import chain in modules, and how many imports close a cycle.

    An import back to a module still being walked closes a cycle; it is counted and left
    out of the chain, so that a tree with cycles still gets a depth.
    """
    depth: dict[str, int] = {}
    walking: set[str] = set()
    back_edges = 0

    def visit(module: str) -> int:
        nonlocal back_edges
        if module in depth:
            return depth[module]
        walking.add(module)
        deepest = 0
        for dep in sorted(graph[module]):
            if dep in walking:
                back_edges += 1
                continue
            deepest = max(deepest, visit(dep))
        walking.discard(module)
        depth[module] = deepest + 1
        return depth[module]

    longest = max(visit(m) for m in sorted(graph))
    return longest, back_edges


def figures(package: Path) -> Figures:
    graph = import_graph(package)
    sizes = {
        module_name(package, p): len(p.read_text(encoding="utf-8").splitlines())
        for p in package.rglob("*.py")
    }
    largest = max(sizes, key=lambda m: sizes[m])
    longest, back_edges = layers(graph)
    packages = {module_name(package, p) for p in package.rglob("__init__.py")}
    return Figures(
        modules=len(graph),
        edges=sum(len(d) for d in graph.values()),
        module_edges=sum(len(d - packages) for d in graph.values()),
        layers=longest,
        cycle_imports=back_edges,
        largest=largest,
        largest_lines=sizes[largest],
    )


def folder(module: str, packages: set[str]) -> str:
    """The folder a module sits in: `daemon.engines.lite.engine` -> `engines/lite`; a
    package's face (`daemon.engines.lite`) sits in its own folder."""
    parts = module.split(".")[1:]
    if module in packages:
        return "/".join(parts) or "daemon"
    return "/".join(parts[:-1]) or "daemon"


def mermaid(package: Path) -> str:
    graph = import_graph(package)
    packages = {module_name(package, p) for p in package.rglob("__init__.py")}
    arrows: Counter[tuple[str, str]] = Counter()
    members: Counter[str] = Counter()
    for module, deps in graph.items():
        members[folder(module, packages)] += 1
        for dep in deps:
            a, b = folder(module, packages), folder(dep, packages)
            if a != b and not a.startswith(b + "/") and not b.startswith(a + "/"):
                arrows[a.split("/")[0], b.split("/")[0]] += 1
    top = Counter[str]()
    for name, count in members.items():
        top[name.split("/")[0]] += count
    lines = ["flowchart TD"]
    for name in sorted(top):
        lines.append(f'    {name.replace("daemon", "top")}["{name}/ ({top[name]} modules)"]')
    for (a, b), n in sorted(arrows.items()):
        lines.append(f"    {a.replace('daemon', 'top')} -->|{n}| {b.replace('daemon', 'top')}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    root = Path(args[0]) if args else Path(__file__).resolve().parents[1]
    package = root / "daemon"
    if "--modules" in argv:
        for module, deps in sorted(import_graph(package).items()):
            print(f"{module}: {', '.join(sorted(deps))}")
        return 0
    f = figures(package)
    print(f"modules: {f.modules}")
    print(f"import edges: {f.edges} ({f.module_edges} without the package faces)")
    print(f"layers: {f.layers}")
    print(f"imports that close a cycle: {f.cycle_imports}")
    print(f"largest module: {f.largest} ({f.largest_lines} lines)")
    print()
    print("```mermaid")
    print(mermaid(package))
    print("```")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
