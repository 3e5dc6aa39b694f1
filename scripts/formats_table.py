"""Regenerate the README's "What docinbox reads" table from daemon/input/formats.py.

    .venv/bin/python scripts/formats_table.py          # rewrite README.md in place
    .venv/bin/python scripts/formats_table.py --check  # exit 1 when README.md is stale

tests/test_input_formats.py fails while the table is stale, so a new format cannot land
undocumented.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from daemon.input.formats import README_BEGIN, README_END, readme_table

README = Path(__file__).resolve().parent.parent / "README.md"


def with_table(text: str) -> str:
    head, begin, rest = text.partition(README_BEGIN)
    _old, end, tail = rest.partition(README_END)
    if not begin or not end:
        raise SystemExit(f"README.md lacks the markers {README_BEGIN!r} ... {README_END!r}")
    return f"{head}{README_BEGIN}\n{readme_table()}{README_END}{tail}"


def main(argv: list[str]) -> int:
    text = README.read_text(encoding="utf-8")
    new = with_table(text)
    if "--check" in argv:
        return 0 if new == text else 1
    if new != text:
        README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
