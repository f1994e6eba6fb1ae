"""The vLLM plugin, loaded by vLLM's own load_general_plugins(), around vLLM's real FlexKVConnectorV1.

FlexKV's connector is its real vllm_v1_adapter.py over the stand-in in tests/vllm/fake_flexkv, whose
config asks the attention backend for get_kv_cache_shape at construction (the crash on vLLM 0.33)
and whose KVTPClient records registrations.
"""

from __future__ import annotations

import sys

import pytest
import torch

from flexkv_adapter import NotAddressableError

from ..helpers import flexkv_worker_read
from .build import allocate, connector_config
from .conftest import _drop_flexkv
from .test_vllm_layouts import EXPECTED, assert_flexkv_reads_vllm

INDEXERS = [f"model.layers.{i}.self_attn.indexer.k_cache" for i in range(3)]  # DeepSeek-V3.2: one per layer


@pytest.mark.parametrize(
    ("names", "refusal"),
    [
        (INDEXERS[:1], "1 indexer entries for 3 KV layers"),  # layers 1 and 2 would keep no indexer in FlexKV
        ([INDEXERS[1], INDEXERS[0], INDEXERS[2]], r"layers \[1, 0, 2\] are not the KV entries' \[0, 1, 2\]"),
    ],
)
def test_indexer_entries_that_are_not_one_per_layer_in_order_fail_start_up(plugged, tmp_path, names, refusal):
    from flexkv_adapter import InconsistentLayersError

    kv_caches, kv_cache_config, _ = allocate("LBNHC", "mla")
    for name in names:
        kv_caches[name] = torch.zeros(5, 64, 132, dtype=torch.uint8)
    worker = plugged(connector_config(tmp_path, "mla"), roles().WORKER, kv_cache_config)
    with pytest.raises(InconsistentLayersError, match=refusal):
        worker.register_kv_caches(kv_caches)
    assert registrations() == []


def test_an_indexer_entry_inside_the_kv_fails_start_up(plugged, tmp_path):
    from flexkv_adapter import InconsistentLayersError

    kv_caches, kv_cache_config, _ = allocate("LBNHC", "mla")
    backing = next(iter(kv_caches.values()))
    inside = torch.empty(0, dtype=torch.uint8).set_(backing.untyped_storage())[: 5 * 64 * 132].view(5, 64, 132)
    kv_caches.update(dict.fromkeys(INDEXERS[:2], torch.zeros(5, 64, 132, dtype=torch.uint8)))
    kv_caches[INDEXERS[2]] = inside  # FlexKV's indexer block b lands inside KV blocks: it would overwrite them
    worker = plugged(connector_config(tmp_path, "mla"), roles().WORKER, kv_cache_config)
    with pytest.raises(InconsistentLayersError, match=r"KV\[0\] and indexer\[2\] share bytes"):
        worker.register_kv_caches(kv_caches)
    assert registrations() == []


def roles():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    return KVConnectorRole


def sent_fields(layout) -> dict:
    """The registered KVCacheLayout as FlexKV's worker reads it."""
    return {**vars(layout), "type": layout.type.value}


def registrations():
    from flexkv.server.client import REGISTRATIONS

    return REGISTRATIONS


def test_without_the_plugin_construction_crashes_as_on_a_gpu(connector_cls, tmp_path):
    _, kv_cache_config, _ = allocate("LBNHC", "mha3")
    with pytest.raises(AttributeError, match="get_kv_cache_shape"):
        connector_cls(connector_config(tmp_path, "mha3"), roles().SCHEDULER, kv_cache_config)


@pytest.mark.parametrize(("case", "tp_size", "heads"), [("mha3", 1, 3), ("mha3", 2, 6), ("mha1", 2, 2), ("mla", 2, 1)])
def test_both_roles_construct_with_flexkvs_layout_from_the_spec(plugged, tmp_path, case, tp_size, heads):
    _, kv_cache_config, _ = allocate("LBNHC", case)
    spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
    config = connector_config(tmp_path, case, tp_size)
    for role in (roles().SCHEDULER, roles().WORKER):
        connector = plugged(config, role, kv_cache_config)
        side = connector._flexkv_connector.connector  # FlexKV's scheduler side keeps rank_info, its worker the config
        model = side.rank_info.model_config if role == roles().SCHEDULER else side.flexkv_config.model_config
        assert (model.kv_dim, model.head_size, model.num_kv_heads) == (1, spec.head_size + spec.head_size_v, heads)


@pytest.mark.parametrize("case", ["mha3", "mha1", "mla", "mla128"])
@pytest.mark.parametrize("layout", ["LBHNC", "LBNHC", "BLNHC", "BHLNC"])
def test_register_kv_caches_registers_the_adapters_plan_or_fails_start_up(plugged, tmp_path, layout, case):
    kv_caches, kv_cache_config, _ = allocate(layout, case)
    worker = plugged(connector_config(tmp_path, case), roles().WORKER, kv_cache_config)
    expected = EXPECTED[(layout, case)]
    if expected not in ("LAYERFIRST", "BLOCKFIRST"):
        with pytest.raises(NotAddressableError, match=expected):
            worker.register_kv_caches(kv_caches)
        assert registrations() == []
        return
    worker.register_kv_caches(kv_caches)
    (sent,) = registrations()
    layout_sent = sent["kv_layout"]
    assert (
        layout_sent.type.value == expected
        and layout_sent.tokens_per_block == kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
    )
    spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
    assert_flexkv_reads_vllm(sent_fields(layout_sent), sent["kv_caches"], kv_caches, spec.head_size)
    worker._flexkv_connector.after_device_wake()  # sleep mode: re-registered the same way
    assert registrations()[-1]["resume"] and registrations()[-1]["kv_layout"] == layout_sent


def test_one_head_per_rank_at_tp2_registers_the_model_total(plugged, tmp_path):
    kv_caches, kv_cache_config, _ = allocate("LBNHC", "mha1")
    worker = plugged(connector_config(tmp_path, "mha1", tp_size=2), roles().WORKER, kv_cache_config)
    worker.register_kv_caches(kv_caches)
    layout = registrations()[-1]["kv_layout"]
    model = worker._flexkv_connector.connector.flexkv_config.model_config
    assert (layout.num_head, layout.num_kv_heads, model.num_kv_heads) == (1, 2, 2)  # FlexKV alone: 1 = "shared"
    got = flexkv_worker_read(sent_fields(layout), registrations()[-1]["kv_caches"], 2, 0, 4)
    view = kv_caches["model.layers.2.self_attn.attn"][4].permute(1, 0, 2)
    assert got == bytes(view.contiguous().view(torch.uint8).flatten().tolist())


def test_the_connector_states_lbnhc_which_vllm_resolves_when_unset(plugged, tmp_path, monkeypatch):
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

    monkeypatch.delenv("VLLM_KV_CACHE_LAYOUT", raising=False)
    config = connector_config(tmp_path, "mha3")
    assert plugged.get_required_kvcache_layout(config) == "LBNHC"
    assert resolve_kv_cache_layout(config, [["LBHNC", "LBNHC", "BLHNC"]]).name == "LBNHC"
    config = connector_config(tmp_path, "mha3")  # FlashInfer on Blackwell: LBNHC unsupported, vLLM drops it
    assert resolve_kv_cache_layout(config, [["LBHNC", "BLHNC"]]).name == "LBHNC"


def test_padded_pages_fail_construction_with_the_reason(plugged, tmp_path):
    from .build import spec_of

    _, kv_cache_config, _ = allocate("LBNHC", "mla", spec=spec_of("mla", alignment=1000))
    with pytest.raises(NotAddressableError, match="padded"):
        plugged(connector_config(tmp_path, "mla"), roles().SCHEDULER, kv_cache_config)


def test_without_flexkv_the_plugin_changes_nothing(plugged, tmp_path, monkeypatch):
    _drop_flexkv()
    monkeypatch.setitem(sys.modules, "flexkv", None)
    _, kv_cache_config, _ = allocate("LBNHC", "mha3")
    with pytest.raises(ImportError, match="FlexKV is not installed"):
        plugged(connector_config(tmp_path, "mha3"), roles().SCHEDULER, kv_cache_config)


def test_the_entry_point_is_declared_for_vllm():
    from importlib.metadata import entry_points

    (point,) = [p for p in entry_points(group="vllm.general_plugins") if p.name == "flexkv_adapter"]
    assert point.value == "flexkv_adapter.integrations.vllm:install"


@pytest.mark.parametrize(("case", "accepted"), [("mla", True), ("mla128", False)])
def test_indexer_entries_go_through_flexkvs_own_split_only_when_it_reads_the_same(plugged, tmp_path, case, accepted):
    kv_caches, kv_cache_config, _ = allocate("LBNHC", case)
    for name in INDEXERS:  # one per layer: FlexKV pairs indexer entry i with layer i
        kv_caches[name] = torch.zeros(5, 64, 132, dtype=torch.uint8)
    worker = plugged(connector_config(tmp_path, case), roles().WORKER, kv_cache_config)
    if not accepted:  # kernel blocks regrouped: FlexKV's own split would take 64-token blocks
        with pytest.raises(NotAddressableError, match="indexer"):
            worker.register_kv_caches(kv_caches)
        assert registrations() == []
        return
    worker.register_kv_caches(kv_caches)
    (sent,) = registrations()
    assert (sent["kv_layout"].num_kv_heads, sent["kv_layout"].tokens_per_block, len(sent["kv_caches"])) == (1, 64, 3)
    assert len(sent["handles_per_group"][1]) == 3


def test_vllms_own_one_head_indexer_views_reach_flexkvs_split_as_the_3d_caches_it_reads(plugged, tmp_path):
    """vLLM 0.33's allocate_kv_cache gives an indexer layer a [B, 1, N, C] view; FlexKV 34ab141 asserts 3-D
    (vllm_v1_adapter.py:911): the plugin hands its split the squeezed view of the same memory."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    kv_caches, kv_cache_config, _ = allocate("LBNHC", "mla")
    spec = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=132, dtype=torch.uint8)  # the indexer's
    vllms = list(allocate("LBNHC", "mla", layers=3, spec=spec)[0].values())  # vLLM's own allocation: 4-D
    assert vllms[0].shape == (5, 1, 64, 132)
    kv_caches.update(zip(INDEXERS, vllms))
    worker = plugged(connector_config(tmp_path, "mla"), roles().WORKER, kv_cache_config)
    worker.register_kv_caches(kv_caches)
    (sent,) = registrations()
    main, indexer = sent["handles_per_group"]
    assert len(main) == 3 and len(indexer) == 3
    for got, view in zip(indexer, vllms):
        assert got.shape == (5, 64, 132) and got.data_ptr() == view.data_ptr() and got.is_contiguous()
        assert torch.equal(got, view[:, 0])
    assert sent["gpu_layouts"][1].num_block == 5 and sent["gpu_layouts"][1].tokens_per_block == 64


@pytest.mark.parametrize(
    ("indexer", "refusal"),
    [
        (lambda: torch.zeros(10, 64, 132, dtype=torch.uint8)[::2], "not contiguous"),  # FlexKV ignores strides
        (lambda: torch.zeros(4, 64, 132, dtype=torch.uint8), "read past its end"),  # fewer rows than blocks
    ],
)
def test_indexer_entries_flexkv_would_misread_fail_start_up_before_it_sees_them(plugged, tmp_path, indexer, refusal):
    kv_caches, kv_cache_config, _ = allocate("LBNHC", "mla")
    for name in INDEXERS:
        kv_caches[name] = indexer()
    worker = plugged(connector_config(tmp_path, "mla"), roles().WORKER, kv_cache_config)
    with pytest.raises(NotAddressableError, match=refusal):
        worker.register_kv_caches(kv_caches)
    assert registrations() == []


def test_a_spec_block_other_than_flexkvs_block_fails_start_up(plugged, tmp_path):
    from flexkv_adapter import AdapterError

    from .build import spec_of

    kv_caches, kv_cache_config, _ = allocate("LBNHC", "mha3", spec=spec_of("mha3", block_size=32))
    worker = plugged(connector_config(tmp_path, "mha3"), roles().WORKER, kv_cache_config)  # FlexKV: 16 tokens
    with pytest.raises(AdapterError, match="16-token blocks"):
        worker.register_kv_caches(kv_caches)
    assert registrations() == []


def test_a_flexkv_model_dtype_of_another_element_size_fails_start_up(plugged, tmp_path):
    """FlexKV computes GPU strides with ModelConfig.dtype's itemsize (FLEXKV_KV_CACHE_DTYPE, kv_cache_dtype):
    fp8 there over a bf16 cache would read half-blocks at half the stride."""
    from flexkv_adapter import AdapterError

    kv_caches, kv_cache_config, _ = allocate("LBNHC", "mha3")
    worker = plugged(connector_config(tmp_path, "mha3"), roles().WORKER, kv_cache_config)
    worker._flexkv_connector.connector.flexkv_config.model_config.dtype = torch.float8_e4m3fn
    with pytest.raises(AdapterError, match="FLEXKV_KV_CACHE_DTYPE"):
        worker.register_kv_caches(kv_caches)
    assert registrations() == []
