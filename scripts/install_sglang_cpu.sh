#!/usr/bin/env bash
# Install SGLang (CPU use only: its KV pool classes) into .venv-sglang, beside flexkv-adapter.
# SGLang 0.5.23 is installed without its dependency tree (which wants CUDA kernels); these are the
# packages it needs at import time for sglang.srt.mem_cache (found by trial). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${SGLANG_VENV:-.venv-sglang}
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
pip_install() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored" || true; }
if ! "$VENV/bin/python" -c "import sglang.srt.mem_cache.memory_pool" 2>/dev/null; then
    pip_install torch==2.14.1 torchvision==0.29.1
    pip_install orjson psutil pybase64 requests triton pillow starlette msgspec pyzmq tqdm ipython aiohttp \
        transformers dill apache-tvm-ffi sentencepiece compressed-tensors gguf
    pip_install --no-deps sglang==0.5.23
fi
pip_install -e ".[test]"
"$VENV/bin/python" -c "import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__)"
