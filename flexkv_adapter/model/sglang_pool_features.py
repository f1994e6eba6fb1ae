"""SGLang 0.5.23's KV pool classes, each classified (plain data; :mod:`.sglang_features` holds the table).

Every concrete subclass of ``KVCache`` and ``HostKVCache`` SGLang defines, under ``sglang.srt`` (not only
``mem_cache``), is a row; ``tests/sglang/test_sglang_features.py`` fails when SGLang defines one that is not.
"""

from __future__ import annotations

from .features import Feature

POOL = "KV pool class"
T = "tests/sglang/"
E2E = "tests/e2e/test_sglang_generate.py::"
MHA_PROOF = f"{E2E}test_prompt_evicted_from_sglang_is_restored_by_flexkv_with_the_cold_tokens"
MHA_CONTROL = f"{E2E}test_negative_control_a_perturbed_flexkv_cpu_copy_changes_the_tokens"
MLA_PROOF = (
    f"{T}test_sglang_bridge_flexkv_kvmanager.py::test_store_evict_restore_through_flexkvs_real_kvmanager_is_byte_exact"
)
NO_ALIAS = f"{T}test_sglang_bridge.py::test_negative_control_a_registration_that_does_not_alias_the_pool_fails"
WHOLE = f"{T}test_sglang_whole.py::test_every_plane_round_trips_into_other_pages_and_nothing_else_changes"
WHOLE_CONTROL = f"{T}test_sglang_whole.py::test_dropping_a_plane_from_the_registration_is_caught"
HYBRID = f"{T}test_sglang_hybrid_agreement.py::test_an_attention_only_plan_of_the_pool_round_trips_by_global_layer_id"
HYBRID_CONTROL = f"{T}test_sglang_hybrid_agreement.py::test_negative_control_a_plan_with_two_layers_swapped_is_caught"
START = "adapt(), plan() and the plugin, before anything is registered with FlexKV"
PLAIN = "Serve with a pool class listed as served (plain MHA or MLA), or without FlexKV"

HOST = (
    "a HiCache host pool: a host-side copy SGLang keeps for its own hierarchical cache, not the pool the "
    "engine's token ids address on the device; FlexKV offloads the device pool"
)
NPU = "an Ascend NPU pool: FlexKV's transfer workers copy CUDA memory only, and nothing proves its layout"
UNIFIED = (
    "a unified-memory pool (--enable-unified-memory: views into one UnifiedKVPool, _unified_buffer): its "
    "buffers are indexed by physical, kernel-facing token ids, while SGLang's allocator and radix cache hand "
    "out virtual ones; FlexKV would store and restore other pages"
)
HISPARSE = (
    "a HiSparse pool: its device buffers hold only the hot subset of tokens, addressed through "
    "full_to_hisparse_device_index_mapping; FlexKV indexes by the full pool's token locations and would read "
    "the wrong rows"
)
INTERLEAVE = (
    "a page-interleave pool (--enable-kv-cache-sharding): its rows are not the engine's token ids (logical page "
    "p lives at another physical page, through the pool's own set_kv_buffer), so FlexKV's block b would hold "
    "another page"
)
DSV4 = "a DeepSeek-V4 pool (compressed, sliding-window and state planes): nothing proves FlexKV reads it right"
M3 = "a MiniMax-M3 NVFP4 pool: its packed planes and index pool are unproven with FlexKV"


def _refused(name: str, reason: str, instead: str = PLAIN, nested: bool = False) -> Feature:
    return Feature(name, POOL, "refused", reason, where=START, instead=instead, nested=nested)


def _served(name: str, reason: str, proof: str, control: str) -> Feature:
    return Feature(name, POOL, "served", reason, proof=proof, control=control)


DEVICE_ROWS: tuple[Feature, ...] = (
    _served("MHATokenToKVPool", "k_buffer/v_buffer per layer; the plugin serves it", MHA_PROOF, MHA_CONTROL),
    _served("MLATokenToKVPool", "kv_buffer per layer; the plugin serves it", MLA_PROOF, NO_ALIAS),
    _served(
        "DSATokenToKVPool",
        "adapt()/plan(): KV plus the indexer group (FlexKV's own SGLang connector is refused: it overruns the "
        "indexer)",
        WHOLE,
        WHOLE_CONTROL,
    ),
    _served("MHATokenToKVPoolFP4", "adapt()/plan(): KV plus scale group (the plugin refuses scale planes)", WHOLE,
            WHOLE_CONTROL),
    _served("MHATokenToKVPoolMXFP8", "adapt()/plan(): KV plus scale group (the plugin refuses scale planes)", WHOLE,
            WHOLE_CONTROL),
    _served("MLATokenToKVPoolFP4", "adapt()/plan(): KV plus scale group (the plugin refuses scale planes)", WHOLE,
            WHOLE_CONTROL),
    _served("MiniMaxSparseKVPool", "adapt()/plan(): main KV plus index planes (the plugin refuses hybrids)", WHOLE,
            WHOLE_CONTROL),
    _served("SWAKVPool", "adapt()/plan() with hybrid='attention_only': full layers, SWA layers as side groups; "
            "refused by default (HybridPoolError) and by the plugin", HYBRID, HYBRID_CONTROL),
    _served("HybridLinearKVPool", "adapt()/plan() with hybrid='attention_only': attention layers by global id, "
            "Mamba state left out and named; refused by default and by the plugin", HYBRID, HYBRID_CONTROL),
    _served(
        "QSATokenToKVPool",
        "adapt()/plan() with hybrid='attention_only', as HybridLinearKVPool (QSA index state listed as left out)",
        f"{T}test_sglang_hybrids.py::test_hybrid_pools_adapt_with_the_wrappers_global_ids",
        f"{T}test_sglang_hybrids.py::test_negative_control_a_child_that_claims_other_global_ids_is_refused",
    ),
    _refused(
        "MHATokenToKOnlyPool",
        "a K-only pool (no v_buffer): FlexKV's MHA registration needs K and V; inside MiniMaxSparseKVPool it is "
        "read as that pool's index planes",
        nested=True,
    ),
    _refused("NoOpMHATokenToKVPool", "a placeholder pool (embedding prefill with fa_skip_kv_cache): its buffers "
             "hold one page while the engine hands out every page of its size, so FlexKV would copy past them",
             "Serve embedding models without FlexKV"),
    _refused("PageMajorMHATokenToKVPool", "a page-major envelope layout SGLang 0.5.23 itself cannot build "
             "(ServerArgs rejects it at boot); unproven"),
    _refused("PageInterleaveMHATokenToKVPool", INTERLEAVE, "Serve without --enable-kv-cache-sharding"),
    _refused("PageInterleaveMLATokenToKVPool", INTERLEAVE, "Serve without --enable-kv-cache-sharding"),
    _refused("PageInterleaveDSATokenToKVPool", INTERLEAVE, "Serve without --enable-kv-cache-sharding"),
    _refused("LayerSplitDSATokenToKVPool", "a DSA pool whose layers are sharded across context-parallel ranks "
             "(owner-broadcast reads): each rank holds some layers only; unproven", "Serve without layer "
             "sharding (layer_shard_size 1)"),
    _refused("HiSparseDSATokenToKVPool", HISPARSE, "Disable hisparse to offload with FlexKV"),
    _refused("HiSparseMHAMainPool", HISPARSE, "Disable hisparse to offload with FlexKV"),
    _refused("HiSparseC4DevicePool", HISPARSE, "Disable hisparse to offload with FlexKV"),
    _refused("UnifiedMHATokenToKVPool", UNIFIED, "Serve without --enable-unified-memory"),
    _refused("UnifiedMLATokenToKVPool", UNIFIED, "Serve without --enable-unified-memory"),
    _refused("UnifiedSWAKVPool", UNIFIED, "Serve without --enable-unified-memory"),
    _refused("UnifiedHybridLinearKVPool", UNIFIED, "Serve without --enable-unified-memory"),
    _refused("UnifiedDraftKVPool", f"a speculative draft pool over {UNIFIED}", "Serve without "
             "--enable-unified-memory and without speculative decoding"),
    _refused("UnifiedDraftSWAKVPool", f"a speculative draft pool over {UNIFIED}", "Serve without "
             "--enable-unified-memory and without speculative decoding"),
    _refused("DeepSeekV4TokenToKVPool", DSV4),
    _refused("DeepSeekV4SingleKVPool", DSV4),
    _refused("DeepSeekV4UniformFP8KVPool", DSV4),
    _refused("DeepSeekV4IndexerPool", DSV4),
    _refused("MiniMaxM3Nvfp4KVPool", M3),
    _refused("MiniMaxM3Nvfp4MainKVPool", M3),
    _refused("MiniMaxM3Nvfp4IndexKPool", M3),
    _refused("NPUMHATokenToKVPool", NPU),
    _refused("NPUMLATokenToKVPool", NPU),
    _refused("NPUMHATokenToKOnlyPool", NPU),
    _refused("NPUMiniMaxSparseKVPool", NPU),
    _refused("NPUDeepSeekV4IndexerPool", NPU),
    _refused("NPUDeepSeekV4SingleKVPool", NPU),
    _refused("DSV4NPUTokenToKVPool", NPU),
    _refused("_DummyKVCache", "the MLX backend's stub (hardware_backend/mlx): it holds no KV FlexKV could copy",
             "Serve on CUDA without the MLX backend to use FlexKV"),
    _refused("UnknownMhaPool", "a test double of SGLang's own tensorcast tests, not a serving pool",
             "Adapt the engine's device pool"),
)  # fmt: skip
HOST_ROWS = tuple(
    _refused(name, HOST, "Adapt the engine's device pool (the KV pool the model runner allocates) instead")
    for name in (
        "MHATokenToKVPoolHost",
        "AsymmetricMHATokenToKVPoolHost",
        "MHATokenToKVPoolMXFP8Host",
        "MHATokenToKOnlyPoolHost",
        "HiSparseMHATokenToKVPoolHost",
        "MLATokenToKVPoolHost",
        "DSAIndexerPoolHost",
        "QSAIndexerPoolHost",
        "MambaPoolHost",
        "MiniMaxM3Nvfp4IndexKPoolHost",
        "MiniMaxM3Nvfp4MainKVPoolHost",
        "DeepSeekV4PagedHostPool",
        "DeepSeekV4StateHostPool",
        "UnifiedPageEnvelopeHostPool",
    )
)
POOL_ROWS: tuple[Feature, ...] = DEVICE_ROWS + HOST_ROWS
