"""The real-SGLang tier: builds SGLang's own pool classes on CPU. Skips (visibly) without sglang.

Install with ``bash scripts/install_sglang_cpu.sh`` (a separate .venv-sglang); ``scripts/test.sh``
runs this tier there.
"""

from __future__ import annotations

import logging
import warnings

import pytest

try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.mem_cache import memory_pool as sglang_memory_pool
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: F401
except Exception as exc:  # ImportError, or a broken partial install
    sglang_memory_pool = None
    SKIP_REASON = f"sglang is not importable ({type(exc).__name__}: {exc}); run scripts/install_sglang_cpu.sh"
else:
    SKIP_REASON = ""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/sglang/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.sglang)
            if SKIP_REASON:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(autouse=True, scope="session")
def _quiet_sglang():
    logging.getLogger("sglang").setLevel(logging.ERROR)
    if sglang_memory_pool is not None:
        from sglang.srt.runtime_context import get_parallel

        get_parallel().override_permanently(attn_dcp_size=1)  # DSA pools read it; no process groups here
