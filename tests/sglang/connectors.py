"""Building SGLang's connectors with real pools, and checking what reached the FlexKV stand-in."""

from __future__ import annotations

import importlib

import torch

from flexkv_adapter.integrations.sglang.plugin import IN_TREE_MODULE

from ..helpers import flexkv_worker_read, region_bytes
from . import flexkv_standin as fk

OWN_MODULE = "flexkv.integration.sglang.connector"


def build(pool, model, module=IN_TREE_MODULE, page_size=16, pp_rank=0, **server):
    """Construct the connector as FlexKVRadixCache.__init__ does (keyword arguments only)."""
    cls = importlib.import_module(module).FlexKVConnector
    return cls(
        sgl_model_config=model,
        server_args=fk.ServerArgs(**server),
        page_size=page_size,
        kvcache=pool,
        tp_rank=0,
        dp_rank=0,
        pp_rank=pp_rank,
        attn_cp_rank=0,
    )


class Renamed:
    """A wrapper FlexKV's connector alone refuses: SGLang's tensors under other names."""

    def __init__(self, pool):
        self.key_cache, self.value_cache, self.page_size = pool.k_buffer, pool.v_buffer, pool.page_size


def assert_registered_as_pool(planes, page_size=16):
    """One registration whose tensors alias ``planes`` and whose blocks FlexKV reads from the right bytes."""
    (reg,) = fk.calls("register_to_server")
    layers = len(planes[0])
    flat = [t for plane in planes for t in plane]
    assert len(reg["kv_caches"]) == len(flat)
    fields = fk.layout_fields(reg["kv_layout"])
    assert fields["num_layer"] == layers and fields["tokens_per_block"] == page_size
    for got, pool_t in zip(reg["kv_caches"], flat):
        assert got.untyped_storage().data_ptr() == pool_t.untyped_storage().data_ptr()  # zero-copy
        got.view(torch.uint8).view(got.shape[0], -1)[3].fill_(77)  # written through the registered tensor ...
        assert (pool_t.view(torch.uint8).view(pool_t.shape[0], -1)[3] == 77).all()  # ... read through the pool
    for layer in range(layers):
        for kv, plane in enumerate(planes):
            for block in range(fields["num_block"]):
                expected = region_bytes(plane[layer][block * page_size : (block + 1) * page_size])
                assert flexkv_worker_read(fields, reg["kv_caches"], layer, kv, block) == expected
    return reg
