"""Regenerate the README's generated tables: the configuration keys (from the declarations
reached from daemon/config/settings.py) and "What docinbox reads" (from daemon/document/formats.py).

    .venv/bin/python scripts/readme_tables.py          # rewrite README.md in place
    .venv/bin/python scripts/readme_tables.py --check  # exit 1 when README.md is stale

tests/config/test_config.py and tests/input/test_input_formats.py fail while a table is
stale, so a new key or format cannot land undocumented.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from daemon.config import settings
from daemon.document import formats

README = Path(__file__).resolve().parent.parent / "README.md"

# (begin marker, end marker, the table between them)
TABLES: list[tuple[str, str, Callable[[], str]]] = [
    (settings.README_BEGIN, settings.README_END, settings.readme_table),
    (formats.README_BEGIN, formats.README_END, formats.readme_table),
]


def with_table(text: str, begin_marker: str, end_marker: str, table: str) -> str:
    head, begin, rest = text.partition(begin_marker)
    _old, end, tail = rest.partition(end_marker)
    if not begin or not end:
        raise SystemExit(f"README.md lacks the markers {begin_marker!r} ... {end_marker!r}")
    return f"{head}{begin_marker}\n{table}{end_marker}{tail}"


def main(argv: list[str]) -> int:
    text = README.read_text(encoding="utf-8")
    new = text
    for begin, end, table in TABLES:
        new = with_table(new, begin, end, table())
    if "--check" in argv:
        return 0 if new == text else 1
    if new != text:
        README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
