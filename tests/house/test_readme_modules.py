"""README's module table matches the tree: every module has a row, every row names a file.

The table is where a newcomer looks for the home of a new config key, status field, worker
message or output file; a module missing from it is a module nobody finds, and a row naming
a file that was split or renamed sends the reader nowhere. The same holds for the folders of
tests/, one per stage, described in README's Development section.
"""

from __future__ import annotations

import re

from tests.conftest import REPO

PACKAGE = REPO / "daemon"
HEADER = "| module | what it owns |"


def table_rows() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert HEADER in text, "README has no module table"
    rows = []
    for line in text.split(HEADER, 1)[1].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def named_paths(rows: list[str]) -> set[str]:
    """The `daemon/...` paths in each row's first cell."""
    names: set[str] = set()
    for row in rows:
        first = row.split("|")[1]
        names.update(re.findall(r"`(daemon/[^`]*)`", first))
    return names


def expected_paths() -> set[str]:
    """Every module by its file, a subpackage's `__init__.py` by its folder."""
    wanted = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(REPO).as_posix()
        if path.name == "__init__.py" and path.parent != PACKAGE:
            rel = rel.removesuffix("__init__.py")
        wanted.add(rel)
    return wanted


def test_every_module_has_a_row() -> None:
    missing = sorted(expected_paths() - named_paths(table_rows()))
    assert missing == [], "add a row to README's module table"


def test_every_row_names_something_that_exists() -> None:
    rows = table_rows()
    assert len(rows) > 10
    for row in rows:
        assert re.findall(r"`(daemon/[^`]*)`", row.split("|")[1]), row
    gone = sorted(p for p in named_paths(rows) if not (REPO / p).exists())
    assert gone == []


def test_the_table_says_where_new_things_go() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    where = text.split("Where a new", 1)[1].split("\n\n", 1)[0]
    for thing in ("config key", "status field", "worker message", "input format", "engine",
                  "output file", "hook"):
        assert thing in where, thing
    assert set(re.findall(r"`(daemon/[^`]*)`", where)) <= named_paths(table_rows())


def test_every_test_folder_is_described() -> None:
    """README says what each folder of tests/ holds, as it does for daemon/'s: a folder it
    does not name is one a new test cannot be placed by."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    item = text.split("- `tests/` —", 1)[1].split("\n- ", 1)[0]
    folders = sorted(p.name for p in (REPO / "tests").iterdir() if (p / "__init__.py").is_file())
    assert len(folders) > 5
    assert [name for name in folders if f"`{name}/`" not in item] == []


def test_no_test_lies_loose_in_tests() -> None:
    """Tests are grouped by the stage they exercise; tests/ itself holds only their helpers."""
    assert sorted(p.name for p in (REPO / "tests").glob("test_*.py")) == []
