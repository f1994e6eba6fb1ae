#!/usr/bin/env bash
# Set up and run the main job: adapt one small CPU pool of every supported kind.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
exec .venv/bin/flexkv-adapter demo "$@"
