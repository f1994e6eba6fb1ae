#!/usr/bin/env bash
# Install vLLM (CPU use only: its KV cache spec, layout and allocation code, and the
# FlexKVConnectorV1 class) into .venv-vllm, beside flexkv-adapter. vLLM 0.33.0 is installed without
# its dependency tree (which wants CUDA kernels); these are the packages it needs at import time
# for vllm.v1.worker.utils and the KV connector factory (found by trial). vllm._C is missing on CPU
# and only warns. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
pip_install() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored" || true; }
if ! "$VENV/bin/python" -c "import vllm.v1.worker.utils, vllm.distributed.kv_transfer.kv_connector.v1.flexkv_connector" 2>/dev/null; then
    pip_install torch==2.14.1
    pip_install cbor2 openai openai-harmony sniffio cachetools cloudpickle uvloop py-cpuinfo \
        prometheus_client xgrammar fastapi opentelemetry-api opentelemetry-sdk \
        opentelemetry-semantic-conventions-ai partial_json_parser llguidance einops \
        orjson psutil pybase64 requests pillow msgspec pyzmq tqdm aiohttp transformers \
        sentencepiece gguf
    pip_install --no-deps vllm==0.33.0
fi
pip_install -e ".[test]"
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
