"""Third-party recognisers found through a real ``flexkv_adapter.recognizers`` entry point."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import AmbiguousLayoutError, UnsupportedPoolError, adapt
from flexkv_adapter.readers.plugins import reload_recognizers


def _install_plugin(root, dist: str, body: str, entry: str) -> None:
    """An installed distribution, as pip leaves it: a module plus a dist-info with entry_points.txt."""
    (root / f"{dist}.py").write_text(body)
    info = root / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[flexkv_adapter.recognizers]\n{entry} = {dist}:recognise\n")


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    reload_recognizers()
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("engine_plugin")]:
        del sys.modules[name]
    reload_recognizers()


PLUGIN = """
def recognise(pool):
    if type(pool).__name__ == "SimpleNamespace" and hasattr(pool, "slabs"):
        return {"name": "slab-engine", "kind": "mha", "attrs": ["slabs"], "axes": "KV L N H D", "page_size": 16}
    return None
"""


def test_a_plugin_teaches_adapt_a_new_engine(plugin_dir):
    _install_plugin(plugin_dir, "engine_plugin_a", PLUGIN, "slabs")
    slabs = torch.zeros(2, 3, 40, 2, 8)
    view = adapt(SimpleNamespace(slabs=slabs))
    assert view.report.recognizer == "plugin:slabs" and view.num_blocks == 2
    assert view.v_buffer[2].data_ptr() == slabs[1, 2].data_ptr()
    # explicit options bypass plugins
    assert adapt(SimpleNamespace(slabs=slabs), attrs=["slabs"], axes="KV L N H D", page_size=20).num_blocks == 2


def test_plugins_that_disagree_are_an_ambiguity(plugin_dir):
    _install_plugin(plugin_dir, "engine_plugin_a", PLUGIN, "slabs")
    _install_plugin(plugin_dir, "engine_plugin_b", PLUGIN.replace("KV L N H D", "L KV N H D"), "slabs-other")
    with pytest.raises(AmbiguousLayoutError, match="plugins disagree.*slabs:.*slabs-other:"):
        adapt(SimpleNamespace(slabs=torch.zeros(2, 2, 32, 2, 8)))


def test_a_broken_plugin_is_logged_not_fatal(plugin_dir, caplog):
    _install_plugin(plugin_dir, "engine_plugin_c", "raise ImportError('missing dependency')\n", "broken")
    view = adapt(SimpleNamespace(kv_cache=[torch.zeros(32, 1, 8)], page_size=16))
    assert view.report.recognizer == "renamed"
    assert any("broken" in m and "failed to load" in m for m in caplog.messages)


DOTTED_PLUGIN = """
def recognise(pool):
    if type(pool).__name__ == "Holder":
        return {"name": "holder-engine", "kind": "mha", "attrs": ["inner.k_buffer", "inner.v_buffer"],
                "axes": "N H D", "page_size": 16}
    return None
"""


def test_the_objects_a_plugins_attrs_read_through_are_judged_like_the_callers(plugin_dir):
    """A recogniser's dotted attrs= pass the same engine-object gate as the caller's: a HiSparse-like pool (its
    rows a hot subset) read through a plugin is refused, and the same pool without the marker is adapted."""
    from ..helpers import SGLangLikeMHAPool

    _install_plugin(plugin_dir, "engine_plugin_dotted", DOTTED_PLUGIN, "holder")
    reload_recognizers()
    holder = type("Holder", (), {})
    inner = SGLangLikeMHAPool(size=48, page_size=16, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=2)
    pool = holder()
    pool.inner = inner
    assert adapt(pool).layer_ids == [0, 1]  # negative control: no marker, the plugin's reading serves
    inner.full_to_hisparse_device_index_mapping = torch.zeros(4, dtype=torch.int64)
    with pytest.raises(UnsupportedPoolError, match=r"Holder\.inner \(SGLangLikeMHAPool\) is a HiSparse pool"):
        adapt(pool)
