#!/usr/bin/env bash
# Create .venv (once) and install flexkv-adapter with its test tools. Idempotent: a second run
# reinstalls nothing unless pyproject.toml changed (the install is editable, so code changes need none).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_install_lib.sh
PYTHON=${PYTHON:-python3}
make_venv "$PYTHON" .venv
# torch first and pinned: the CPU build lies on local disk; an unpinned torch would pull a CUDA build.
if ! .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)"; then
    need_disk 1536 "torch 2.13.0 (CPU build) in .venv"
    step "torch 2.13.0 (CPU build) into .venv" "~750 MB on disk" "1-3 minutes" pip_q .venv "torch==2.13.0"
fi
install_project .venv
# versions from the metadata: importing torch here would add seconds to every demo run
.venv/bin/python -c "from importlib.metadata import version as v; print('flexkv-adapter', v('flexkv-adapter'), 'torch', v('torch'))"
