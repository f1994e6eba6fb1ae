#!/usr/bin/env bash
# Create .venv (once) and install flexkv-adapter with its test tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
pip_install() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored" || true; }
# torch first and pinned: the CPU build lies on local disk; an unpinned torch would pull a CUDA build.
.venv/bin/python -c "import torch" 2>/dev/null || pip_install "torch==2.13.0"
pip_install -e ".[test]"
.venv/bin/python -c "import flexkv_adapter, torch; print('flexkv-adapter', flexkv_adapter.__version__, 'torch', torch.__version__)"
