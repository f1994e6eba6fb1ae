#!/usr/bin/env bash
# Install SGLang (CPU use only: its KV pool classes) into .venv-sglang, beside flexkv-adapter.
# SGLang 0.5.23 is installed without its dependency tree (which wants CUDA kernels); these are the
# packages it needs at import time for sglang.srt.mem_cache (found by trial). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_install_lib.sh
PYTHON=${PYTHON:-python3}
VENV=${SGLANG_VENV:-.venv-sglang}
make_venv "$PYTHON" "$VENV"
# torch stays the PyPI build (CUDA libraries and all): SGLang imports torchvision at import time
# (sglang.srt.configs), and PyPI's torchvision does not load beside the CPU build of torch.
IMPORTS="import sglang.srt.mem_cache.memory_pool, sglang.srt.mem_cache.swa_memory_pool"
if ! "$VENV/bin/python" -c "$IMPORTS" 2>/dev/null; then
    need_disk 6656 "the SGLang tier ($VENV)"
    step "torch 2.14.1 + torchvision 0.29.1 into $VENV" "~4.5 GB on disk: torch 1.2 GB, its CUDA libraries 3.2 GB" "3-10 minutes" \
        pip_q "$VENV" torch==2.14.1 torchvision==0.29.1
    step "SGLang's import-time dependencies into $VENV" "~1.3 GB: triton, transformers, ..." "1-3 minutes" \
        pip_q "$VENV" orjson psutil pybase64 requests triton pillow starlette msgspec pyzmq tqdm ipython aiohttp \
        transformers dill apache-tvm-ffi sentencepiece compressed-tensors gguf
    step "sglang 0.5.23 (no dependency tree) into $VENV" "~220 MB" "under a minute" pip_q "$VENV" --no-deps sglang==0.5.23
fi
# FlexKV's own pure-Python requirements, for the tier's tests on FlexKV's real Python (../shared or
# FLEXKV_SOURCE); xxhash serves the CPU stand-in of its hashing (tests/flexkv_cpu/hasher.py)
if ! "$VENV/bin/python" -c "import nvtx, expiring_dict, xxhash" 2>/dev/null; then
    step "FlexKV's Python requirements (nvtx, expiring-dict, xxhash) into $VENV" "~3 MB" "seconds" \
        pip_q "$VENV" nvtx==0.2.17 expiring-dict==1.1.2 xxhash==4.1.0
fi
install_project "$VENV"
# the modules the tier's tests import, not just the top-level package
"$VENV/bin/python" -c "$IMPORTS; import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__)"
