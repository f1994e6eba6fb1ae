"""View objects: FlexKV's hasattr-based kind detection, forwarding, pass-through, idempotency."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import AdapterError, MHAView, MLAView, PoolView, adapt

from ..helpers import SGLangLikeMHAPool, SGLangLikeMLAPool, flexkv_resolve_kv_buffers


def _mha(**extra):
    pool = SGLangLikeMHAPool(size=48, page_size=16, dtype=torch.float32, head_num=2, head_dim=4, layer_num=2)
    for k, v in extra.items():
        setattr(pool, k, v)
    return pool


def test_mha_view_hides_kv_buffer_even_when_the_pool_has_one():
    view = adapt(_mha(kv_buffer=None))
    assert hasattr(view, "k_buffer") and hasattr(view, "v_buffer")
    assert not hasattr(view, "kv_buffer")
    with pytest.raises(AttributeError, match="kv_buffer"):
        view.kv_buffer  # noqa: B018


def test_mla_view_hides_k_and_v_buffers_even_when_the_pool_has_them():
    pool = SGLangLikeMLAPool(
        size=48, page_size=16, dtype=torch.float32, kv_lora_rank=8, qk_rope_head_dim=4, layer_num=2
    )
    pool.k_buffer = None
    pool.v_buffer = "stale"
    view = adapt(pool)
    assert isinstance(view, MLAView)
    assert hasattr(view, "kv_buffer")
    assert not hasattr(view, "k_buffer") and not hasattr(view, "v_buffer")


def test_flexkv_connector_resolution_fails_on_the_raw_pool_and_works_on_the_view():
    pool = SimpleNamespace(
        key_cache=[torch.zeros(32, 2, 4) for _ in range(2)],
        value_cache=[torch.zeros(32, 2, 4) for _ in range(2)],
        page_size=16,
    )
    with pytest.raises(AttributeError, match="Unsupported KV cache type"):
        flexkv_resolve_kv_buffers(pool)
    view = adapt(pool)
    tensors = flexkv_resolve_kv_buffers(view)
    assert len(tensors) == 4
    assert [t.data_ptr() for t in tensors] == [t.data_ptr() for t in pool.key_cache + pool.value_cache]


def test_other_attributes_and_methods_are_forwarded_to_the_pool():
    pool = _mha(custom_flag=123)
    view = adapt(pool)
    assert view.custom_flag == 123
    assert view.size == 48 and view.head_num == 2
    assert view.get_key_buffer(1) is pool.k_buffer[1]
    with pytest.raises(AttributeError):
        view.no_such_attribute  # noqa: B018


def test_view_attributes_describe_the_exposed_tensors_not_the_pool():
    pool = SGLangLikeMHAPool(size=40, page_size=16, dtype=torch.float8_e4m3fn, head_num=2, head_dim=8, layer_num=2)
    view = adapt(pool)
    assert view.dtype == torch.uint8 and pool.dtype == torch.float8_e4m3fn
    assert view.device == torch.device("cpu")
    assert view.source is pool
    assert view.num_blocks == 3 and view.k_buffer[0].shape[0] == 48


def test_index_k_with_scale_buffer_is_passed_through_untouched():
    indexer = [torch.zeros(4, 16 * 132, dtype=torch.uint8) for _ in range(2)]
    pool = SGLangLikeMLAPool(
        size=48, page_size=16, dtype=torch.float32, kv_lora_rank=8, qk_rope_head_dim=4, layer_num=2
    )
    pool.index_k_with_scale_buffer = indexer
    view = adapt(pool)
    assert view.index_k_with_scale_buffer is indexer
    assert not hasattr(adapt(_mha()), "index_k_with_scale_buffer")


def test_adapt_is_idempotent():
    view = adapt(_mha())
    assert adapt(view) is view
    assert adapt(view, page_size=16) is view
    with pytest.raises(AdapterError, match="already adapted"):
        adapt(view, page_size=8)
    with pytest.raises(AdapterError, match="already adapted"):
        adapt(view, head_num=2)


def test_tensors_lists_all_k_then_all_v():
    pool = _mha()
    view = adapt(pool)
    assert isinstance(view, MHAView) and isinstance(view, PoolView)
    assert [t.data_ptr() for t in view.tensors()] == [t.data_ptr() for t in pool.k_buffer + pool.v_buffer]
    assert "MHAView" in repr(view) and "2 layers" in repr(view)


def test_view_survives_copy_without_recursion():
    import copy

    view = adapt(_mha())
    clone = copy.copy(view)
    assert clone.k_buffer is view.k_buffer


def test_logical_dtype_with_another_itemsize_is_warned_about():
    pool = SGLangLikeMHAPool(size=48, page_size=16, dtype=torch.float32, head_num=2, head_dim=4, layer_num=2)
    pool.dtype = torch.bfloat16
    assert "itemsize 2" in adapt(pool).report.warnings[0]
    pool.dtype = torch.float32
    assert adapt(pool).report.warnings == ()
    buf = torch.zeros(2 * 2 * 32 * 2 * 4 * 2, dtype=torch.uint8)
    view = adapt(buf, page_size=16, shape=(2, 2, 32, 2, 4), dtype=torch.bfloat16, axes="L KV N H D")
    assert view.report.warnings == ()


# What FlexKV's SGLang connector reads from the kvcache object and acts on (flexkv_consumers.md §4).
FLEXKV_CONNECTOR_SWITCHES = ("swa_kv_pool", "translate_loc_from_full_to_swa", "c4_kv_pool", "full_kv_pool")


def _hybrid_names_in_source() -> set[str]:
    """Every wrapper attribute readers/wrappers.py / pipeline/adapting.py name as a pool or a layer mapping."""
    import ast
    import importlib
    import inspect

    adapt_module, hybrid = (
        importlib.import_module(f"flexkv_adapter.{m}") for m in ("pipeline.adapting", "readers.wrappers")
    )

    names = set(adapt_module._HYBRID_MARKERS)
    for module in (hybrid, adapt_module):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            value = node.value if isinstance(node, ast.Constant) else None
            suffixes = ("_pool", "_layer_id_mapping", "layers_mapping")
            if isinstance(value, str) and value.isidentifier() and value.endswith(suffixes) and value[0] != "_":
                names.add(value)
    return names


def test_hybrid_names_found_in_the_source_cover_the_known_markers():
    found = _hybrid_names_in_source()
    assert {"full_kv_pool", "swa_kv_pool", "mamba_pool", "main_pool", "index_kv_pool", "layers_mapping"} <= found


@pytest.mark.parametrize("build", ["mha", "mla", "swa", "hybrid_linear", "minimax"])
def test_views_hide_every_hybrid_attribute_of_their_source(build):
    from flexkv_adapter.cli.samples import _hybrid_linear_pool, _minimax_pool, _swa_pool

    pools = {
        "mha": _mha,
        "mla": lambda: SGLangLikeMLAPool(48, 16, torch.float32, kv_lora_rank=8, qk_rope_head_dim=4, layer_num=2),
        "swa": _swa_pool,
        "hybrid_linear": _hybrid_linear_pool,
        "minimax": _minimax_pool,
    }
    pool = pools[build]()
    view = adapt(pool, hybrid="attention_only")
    names = {*FLEXKV_CONNECTOR_SWITCHES, *_hybrid_names_in_source()}
    for name in names:  # present on the source (set now if the sample lacks it): still hidden
        if not hasattr(view.source, name):
            setattr(view.source, name, SimpleNamespace(k_buffer=[torch.zeros(1)]))
        assert hasattr(view.source, name)
        assert not hasattr(view, name), name
        with pytest.raises(AttributeError, match=name):
            getattr(view, name)
    # FlexKV's connector, given the view, takes neither its SWA nor its DeepSeek-V4 path.
    assert getattr(view, "swa_kv_pool", None) is None and not hasattr(view, "c4_kv_pool")
    assert flexkv_resolve_kv_buffers(view)[0].data_ptr() == view.tensors()[0].data_ptr()
    view.source.ordinary = "forwarded"
    assert view.ordinary == "forwarded"  # other attributes are still forwarded
