#!/usr/bin/env bash
# Set up and run everything CI checks: lint, type check, and the full test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check flexkv_adapter tests scripts
.venv/bin/mypy
exec .venv/bin/python -m pytest -q "$@"
