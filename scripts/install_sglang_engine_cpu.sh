#!/usr/bin/env bash
# The SGLang CPU engine for tests/e2e/test_sglang_generate.py, on top of the SGLang tier (.venv-sglang).
# SGLang 0.5.23's Engine(device="cpu") imports these beyond the tier's set (found by trial: each one
# the next import missed); the tier script already added FlexKV's requirements. torch stays pinned so pip
# never swaps the tier's build; openai and xgrammar are SGLang 0.5.23's own pins. The one vLLM name SGLang
# imports (vllm._custom_ops.rotary_embedding) is a stand-in in tests/e2e/sglang_standins (vLLM's Python is 877 MB, past the 12 GB budget). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_install_lib.sh
VENV=${SGLANG_VENV:-.venv-sglang}
INSTALL_LOG=$VENV/install.log
INSTALL_NOTE="ERROR lines there from pip's dependency resolver are expected: SGLang is installed without its \
dependency tree, and pip names each package of that tree it does not find"
bash scripts/install_sglang_cpu.sh
ENGINE="import uvloop, fastapi, uvicorn, openai, partial_json_parser, setproctitle, einops, xgrammar"
if ! "$VENV/bin/python" -c "$ENGINE" 2>/dev/null; then
    need_disk 512 "SGLang's CPU engine packages ($VENV)"
    step "SGLang's CPU engine packages into $VENV" "~45 MB" "under a minute" \
        pip_q "$VENV" torch==2.14.1 uvloop==0.23.0 fastapi==0.165.0 uvicorn==0.54.0 openai==2.8.0 \
        partial_json_parser==0.2.1.1.post7 setproctitle==1.3.8 einops==0.8.2 xgrammar==0.2.7
fi
quiet "$VENV" "$VENV/bin/python" -c "$ENGINE; import nvtx, expiring_dict, xxhash, sglang; print('sglang', sglang.__version__, 'CPU engine packages: ready')"
