#!/usr/bin/env bash
# Create .venv (once) and install flexkv-adapter with its test tools. Idempotent: a second run
# reinstalls nothing unless pyproject.toml changed (the install is editable, so code changes need none).
# torch is the CPU build where one is reachable (pip's own sources, then PyTorch's CPU index,
# TORCH_CPU_INDEX); else the default index's build, on Linux x86_64 the CUDA one (several GB).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_install_lib.sh
PYTHON=${PYTHON:-python3}
make_venv "$PYTHON" .venv
if ! .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)"; then
    need_disk 1536 "torch 2.13.0 in .venv"
    step "torch 2.13.0 (the CPU build where one is reachable) into .venv" "~750 MB on disk" "1-3 minutes" \
        torch_cpu .venv 2.13.0
fi
install_project .venv
# versions from the metadata: importing torch here would add seconds to every demo run
say "setup: .venv holds $(torch_build .venv), $(du -sh .venv 2>/dev/null | cut -f1) on disk"
.venv/bin/python -c "from importlib.metadata import version as v; print('flexkv-adapter', v('flexkv-adapter'), 'torch', v('torch'))"
