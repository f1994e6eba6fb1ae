#!/usr/bin/env bash
# Install vLLM (CPU use only: its KV cache spec, layout and allocation code, and the
# FlexKVConnectorV1 class) into .venv-vllm, beside flexkv-adapter. vLLM 0.33.0 is installed without
# its dependency tree (which wants CUDA kernels); these are the packages it needs at import time
# for vllm.v1.worker.utils and the KV connector factory (found by trial). vllm._C is missing on CPU
# and only warns ("Failed to import from vllm._C", kept in the log with pip's output). torch is the CPU build that lies on local disk (2.13.0): vLLM's CPU code paths
# import and run on it, and it saves the 3.2 GB of CUDA libraries a PyPI torch brings. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_install_lib.sh
PYTHON=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
INSTALL_LOG=$VENV/install.log
INSTALL_NOTE="with vLLM's own warnings: 'Failed to import from vllm._C' is expected, vLLM's CUDA kernels \
do not exist on CPU and the tier does not run them"
make_venv "$PYTHON" "$VENV"
IMPORTS="import vllm.v1.worker.utils, vllm.distributed.kv_transfer.kv_connector.v1.flexkv_connector"
if ! "$VENV/bin/python" -c "$IMPORTS" 2>/dev/null; then
    need_disk 3072 "the vLLM tier ($VENV)"
    step "torch 2.13.0 (the CPU build where one is reachable) into $VENV" "~750 MB on disk" "1-3 minutes" \
        torch_cpu "$VENV" 2.13.0
    step "vLLM's import-time dependencies into $VENV" "~1.4 GB: triton, xgrammar, transformers, ..." "1-3 minutes" \
        pip_q "$VENV" cbor2 openai openai-harmony sniffio cachetools cloudpickle uvloop py-cpuinfo \
        prometheus_client xgrammar fastapi opentelemetry-api opentelemetry-sdk \
        opentelemetry-semantic-conventions-ai partial_json_parser llguidance einops \
        orjson psutil pybase64 requests pillow msgspec pyzmq tqdm aiohttp transformers \
        sentencepiece gguf
    step "vllm 0.33.0 (no dependency tree) into $VENV" "~900 MB" "about a minute" \
        pip_q "$VENV" --no-deps vllm==0.33.0
fi
install_project "$VENV"
# the modules the tier's tests import, not just the top-level package
quiet "$VENV" "$VENV/bin/python" -c "$IMPORTS; import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
