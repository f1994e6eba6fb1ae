#!/usr/bin/env bash
# Install SGLang (CPU use only: its KV pool classes) into .venv-sglang, beside flexkv-adapter.
# SGLang 0.5.23 is installed without its dependency tree (which wants CUDA kernels); these are the
# packages it needs at import time for sglang.srt.mem_cache (found by trial), at the versions SGLang
# 0.5.23 pins (its METADATA's Requires-Dist) wherever they install on CPU. Idempotent.
#
# Where this environment is not SGLang 0.5.23's own, and why:
# | SGLang 0.5.23 requires                                  | here          | why                          |
# |---------------------------------------------------------|---------------|------------------------------|
# | torch==2.14.1, transformers==5.19.0, tokenizers==0.23.2, | as pinned     | -                            |
# | kernels>=0.14.1,<0.15, compressed-tensors==0.18.0,      |               |                              |
# | sentencepiece==0.2.1, apache-tvm-ffi==0.1.11,           |               |                              |
# | openai==2.8.0, xgrammar==0.2.7 (engine script)          |               |                              |
# | torchvision (unpinned)                                  | 0.29.1        | the build made for torch 2.14.1 |
# | cuda-python, flashinfer_python[cu13], flash-attn-4,     | not installed | CUDA kernels and bindings: |
# | sglang-kernel, sgl-deep-ep, sgl-deep-gemm, sgl-flash-mla,|               | nothing to run on CPU        |
# | humming-kernels, quack-kernels, tilelang, nvshmem4py,   |               |                              |
# | nvidia-cutlass-dsl, nvidia-mathdx, nvidia-ml-py,        |               |                              |
# | torch_memory_saver                                      |               |                              |
# | torchaudio, torchcodec, av, decord2, soundfile, timm,   | not installed | imported neither by the KV   |
# | anthropic, datasets, modelscope, mistral_common,        |               | pool classes nor by SGLang's |
# | outlines, llguidance, interegular, tiktoken, numba,     |               | CPU engine on a Llama        |
# | scipy, blobfile, build, ninja, easydict, py-spy,        |               | (tests/e2e)                  |
# | python-dateutil, python-multipart, prometheus-client,   |               |                              |
# | watchfiles, zstandard, openai-harmony, deepseek-recipe, |               |                              |
# | smg-grpc-servicer, tml-renderers                        |               |                              |
# `pip check` in this environment lists the not-installed ones; SGLANG_PINS is checked on every run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_install_lib.sh
PYTHON=${PYTHON:-python3}
VENV=${SGLANG_VENV:-.venv-sglang}
INSTALL_LOG=$VENV/install.log
INSTALL_NOTE="ERROR lines there from pip's dependency resolver are expected: SGLang goes in without its \
dependency tree, and pip names each package of that tree it does not find"
make_venv "$PYTHON" "$VENV"
SGLANG_PINS="torch==2.14.1 transformers==5.19.0 tokenizers==0.23.2 kernels>=0.14.1,<0.15 compressed-tensors==0.18.0
sentencepiece==0.2.1 apache-tvm-ffi==0.1.11"
# torch stays the PyPI build (CUDA libraries and all): SGLang imports torchvision at import time
# (sglang.srt.configs), and PyPI's torchvision does not load beside the CPU build of torch.
IMPORTS="import sglang.srt.mem_cache.memory_pool, sglang.srt.mem_cache.swa_memory_pool"
if ! "$VENV/bin/python" -c "$IMPORTS" 2>/dev/null; then
    need_disk 6656 "the SGLang tier ($VENV)"
    step "torch 2.14.1 + torchvision 0.29.1 into $VENV" "~4.5 GB on disk: torch 1.2 GB, its CUDA libraries 3.2 GB" "3-10 minutes" \
        pip_q "$VENV" torch==2.14.1 torchvision==0.29.1
    # shellcheck disable=SC2086 # SGLANG_PINS is a list of requirements
    step "SGLang's import-time dependencies into $VENV" "~1.3 GB: triton, transformers, ..." "1-3 minutes" \
        pip_q "$VENV" orjson psutil pybase64 requests triton pillow starlette msgspec pyzmq tqdm ipython aiohttp \
        dill gguf $SGLANG_PINS
    step "sglang 0.5.23 (no dependency tree) into $VENV" "~220 MB" "under a minute" pip_q "$VENV" --no-deps sglang==0.5.23
fi
# the pins hold in an environment made before them, and after any later install that moved one
# shellcheck disable=SC2086
if ! "$VENV/bin/python" -c "import sys
from importlib.metadata import version
from packaging.requirements import Requirement
sys.exit(not all(r.specifier.contains(version(r.name), prereleases=True) for r in map(Requirement, sys.argv[1:])))" \
    $SGLANG_PINS 2>/dev/null; then
    # shellcheck disable=SC2086
    step "SGLang 0.5.23's pinned versions (transformers 5.19.0, tokenizers, kernels, ...) into $VENV" "~100 MB" \
        "under a minute" pip_q "$VENV" $SGLANG_PINS
fi
# FlexKV's own pure-Python requirements, for the tier's tests on FlexKV's real Python (../shared or
# FLEXKV_SOURCE); xxhash serves the CPU stand-in of its hashing (tests/flexkv_cpu/hasher.py)
if ! "$VENV/bin/python" -c "import nvtx, expiring_dict, xxhash" 2>/dev/null; then
    step "FlexKV's Python requirements (nvtx, expiring-dict, xxhash) into $VENV" "~3 MB" "seconds" \
        pip_q "$VENV" nvtx==0.2.17 expiring-dict==1.1.2 xxhash==4.1.0
fi
install_project "$VENV"
# the modules the tier's tests import, not just the top-level package
quiet "$VENV" "$VENV/bin/python" -c "$IMPORTS; import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__)"
