#!/usr/bin/env bash
# The test command: set up (with test tools), lint, type-check, run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
.venv/bin/ruff check .
.venv/bin/mypy daemon tests bench
.venv/bin/python -m pytest "$@"
