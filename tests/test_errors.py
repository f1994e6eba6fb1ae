"""Errors: the right class, and messages that carry geometry and the fix."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import (
    AdapterError,
    AmbiguousLayoutError,
    InconsistentLayersError,
    NotAddressableError,
    UnsupportedPoolError,
    adapt,
)

from .helpers import SGLangLikeMHAPool


def test_error_hierarchy_is_rooted_in_value_error():
    for cls in (UnsupportedPoolError, AmbiguousLayoutError, NotAddressableError, InconsistentLayersError):
        assert issubclass(cls, AdapterError)
    assert issubclass(AdapterError, ValueError)


def test_unsupported_pool_lists_every_reason_and_the_fix():
    class WeirdPool:
        kv_buffer = None
        k_cache = "not a tensor"
        v_cache = "nor this"

    with pytest.raises(UnsupportedPoolError) as err:
        adapt(WeirdPool(), page_size=16)
    msg = str(err.value)
    assert "Unsupported KV cache type WeirdPool" in msg
    assert "none of these attributes is present (or they are None): k_buffer/v_buffer, kv_buffer" in msg
    assert "k_cache is str" in msg
    assert "attrs=" in msg and "register_attribute_names" in msg


def test_unsupported_hybrid_wrapper_is_named():
    pool = SimpleNamespace(full_kv_pool=SGLangLikeMHAPool(32, 16, torch.float32, 2, 4, 2), mamba_pool=object())
    with pytest.raises(UnsupportedPoolError, match="hybrid pool \\(hybrid-linear\\).*cannot enumerate"):
        adapt(pool)


def test_ambiguity_lists_candidates_and_the_settling_option():
    f = torch.zeros(2, 2, 40, 2, 8)
    with pytest.raises(AmbiguousLayoutError) as err:
        adapt(f, page_size=16)
    msg = str(err.value)
    assert "axes='L KV N H D'" in msg and "axes='KV L N H D'" in msg
    assert "shape=(2, 2, 40, 2, 8)" in msg and "stride=" in msg and "dtype=torch.float32" in msg
    assert "Fix: pass axes=" in msg
    view = adapt(f, page_size=16, axes="KV L N H D")
    assert view.k_buffer[1].data_ptr() == f[0, 1].data_ptr()


def test_two_heads_versus_the_kv_axis_is_ambiguous_without_geometry():
    per_layer = [torch.zeros(2, 2, 16, 2, 8) for _ in range(2)]  # [KV, P, T, H, D] or [P, KV, T, H, D]
    with pytest.raises(AmbiguousLayoutError, match="axes='KV P T H D'.*\n.*axes='P KV T H D'"):
        adapt(per_layer)
    assert adapt(per_layer, axes="KV P T H D").num_blocks == 2


def test_not_addressable_message_has_geometry_and_fix():
    pool = SimpleNamespace(kv_cache=[torch.zeros(5, 2, 16, 4, 8) for _ in range(2)], page_size=16)
    with pytest.raises(NotAddressableError) as err:
        adapt(pool)
    msg = str(err.value)
    assert "SimpleNamespace.kv_cache" in msg and "stride=(1024, 32, 8, 1)" in msg and "dtype=torch.float32" in msg
    assert "data_ptr + b * block_bytes" in msg and "Fix:" in msg


def test_inconsistent_layer_shapes():
    pool = SimpleNamespace(
        k_cache=[torch.zeros(32, 2, 4), torch.zeros(48, 2, 4)],
        v_cache=[torch.zeros(32, 2, 4), torch.zeros(48, 2, 4)],
        page_size=16,
    )
    with pytest.raises(InconsistentLayersError, match="layer 1 K has shape=\\(48, 2, 4\\)"):
        adapt(pool)


def test_inconsistent_dtypes_across_layers():
    pool = SimpleNamespace(
        k_cache=[torch.zeros(32, 2, 4), torch.zeros(32, 2, 4, dtype=torch.float16)],
        v_cache=[torch.zeros(32, 2, 4)] * 2,
        page_size=16,
    )
    with pytest.raises(InconsistentLayersError, match="dtype=torch.float16"):
        adapt(pool)


def test_k_and_v_with_different_rows():
    pool = SimpleNamespace(k_cache=[torch.zeros(32, 2, 4)] * 2, v_cache=[torch.zeros(48, 2, 4)] * 2, page_size=16)
    with pytest.raises(InconsistentLayersError, match="K and V must agree"):
        adapt(pool)


def test_option_contradicting_pool_metadata():
    pool = SGLangLikeMHAPool(32, 16, torch.float32, head_num=2, head_dim=4, layer_num=2)
    with pytest.raises(InconsistentLayersError, match="option head_num=3 contradicts pool.head_num=2"):
        adapt(pool, head_num=3)
    with pytest.raises(InconsistentLayersError, match="page_size=8 contradicts pool.page_size=16"):
        adapt(pool, page_size=8)


def test_pool_metadata_that_disagrees_with_the_tensors():
    pool = SGLangLikeMHAPool(32, 16, torch.float32, head_num=2, head_dim=4, layer_num=2)
    pool.head_num = 4
    with pytest.raises(UnsupportedPoolError, match="heads would be 2, expected 4"):
        adapt(pool)


def test_unknown_and_invalid_options():
    with pytest.raises(AdapterError, match="unknown adapt\\(\\) keyword"):
        adapt(torch.zeros(2, 2, 32, 3, 8), page_size=16, heads=3)
    with pytest.raises(AdapterError, match="positive integer"):
        adapt(torch.zeros(2, 2, 32, 3, 8), page_size=0)
    with pytest.raises(AdapterError, match="invalid axes"):
        adapt(torch.zeros(2, 2, 32, 3, 8), page_size=16, axes="L KV Q H D")
    with pytest.raises(AdapterError, match="kind must be"):
        adapt(torch.zeros(2, 2, 32, 3, 8), page_size=16, kind="gqa")


def test_rows_fewer_than_a_page():
    with pytest.raises(AdapterError, match="fewer than page_size=16"):
        adapt(SimpleNamespace(kv_cache=[torch.zeros(12, 1, 8)], page_size=16))


def test_page_size_unknown():
    with pytest.raises(AdapterError, match="page size unknown"):
        adapt(SimpleNamespace(kv_cache=[torch.zeros(32, 1, 8)]))


def test_block_bytes_not_a_multiple_of_eight_is_refused():
    pool = SimpleNamespace(kv_cache=[torch.zeros(32, 1, 3, dtype=torch.bfloat16)], page_size=1)
    with pytest.raises(NotAddressableError, match="block bytes 6 are not a multiple of 8"):
        adapt(pool)


def test_misaligned_base_pointer_is_refused():
    buf = torch.zeros(4 * 32 * 8 * 2 + 2, dtype=torch.uint8)
    with pytest.raises(NotAddressableError, match="not 16-byte aligned \\(address % 16 = 2\\)"):
        adapt(buf, page_size=16, shape=(2, 2, 32, 1, 8), dtype=torch.bfloat16, axes="L KV N H D", offset=2)


def test_hisparse_pools_are_refused():
    pool = SimpleNamespace(
        kv_buffer=[torch.zeros(32, 1, 8)],
        page_size=16,
        full_to_hisparse_device_index_mapping=torch.zeros(64, dtype=torch.int64),
    )
    with pytest.raises(UnsupportedPoolError, match="HiSparse pool.*wrong rows"):
        adapt(pool)
