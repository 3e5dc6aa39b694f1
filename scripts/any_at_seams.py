"""Count `Any` at the seams of `daemon/`: annotations another module sees.

A seam is the signature of a public function or method (of a public class) and the
annotated fields of a public class; private names (leading underscore) are a module's
own business. Each annotation that mentions `Any` counts once (`dict[str, Any]` is one).

    .venv/bin/python scripts/any_at_seams.py [--list] [ROOT ...]   # default root: daemon
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path


def _mentions_any(node: ast.expr | None) -> bool:
    if node is None:
        return False
    return any(
        (isinstance(n, ast.Name) and n.id == "Any")
        or (isinstance(n, ast.Attribute) and n.attr == "Any")
        or (isinstance(n, ast.Constant) and isinstance(n.value, str) and "Any" in n.value)
        for n in ast.walk(node)
    )


def _function(fn: ast.FunctionDef | ast.AsyncFunctionDef, where: str) -> Iterator[str]:
    args = fn.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None and _mentions_any(arg.annotation):
            yield f"{where}({arg.arg})"
    if _mentions_any(fn.returns):
        yield f"{where} -> "


def seams(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if not node.name.startswith("_"):
                yield from _function(node, f"{path}:{node.lineno} {node.name}")
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                where = f"{path}:{item.lineno} {node.name}"
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    public = not item.name.startswith("_") or item.name == "__init__"
                    if public:
                        yield from _function(item, f"{where}.{item.name}")
                elif (
                    isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and not item.target.id.startswith("_")
                    and _mentions_any(item.annotation)
                ):
                    yield f"{where}.{item.target.id}"


def main(argv: list[str]) -> int:
    show = "--list" in argv
    roots = [Path(a) for a in argv if a != "--list"] or [Path("daemon")]
    total = 0
    for root in roots:
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        for path in files:
            found = list(seams(path))
            total += len(found)
            if show:
                for line in found:
                    print(line)
    print(total)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
