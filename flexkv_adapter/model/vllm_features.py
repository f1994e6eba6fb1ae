"""vLLM 0.32/0.33's feature table: every ``KVCacheSpec`` type, KV cache groups, request features and options,
each served (with its proof), bypassed per request, or refused (plain data, read by the vLLM plugin; docs/vllm.md
shows it, generated). ``tests/vllm/test_vllm_features.py`` fails when vLLM defines a spec type no row names."""

from __future__ import annotations

from .features import Feature, FeatureTable

SPEC = "KV cache spec"
OPTION = "option"
REQUEST = "request feature"
T = "tests/vllm/"
E2E = "tests/e2e/test_vllm_generate.py::"
START = "engine start (FlexKVConnectorV1's construction and register_kv_caches, before FlexKV sees a tensor)"
PLAIN = "Serve this model without FlexKVConnectorV1"
BROKEN = f"{T}test_vllm_lifecycle_loads.py::test_negative_control_a_broken_registration_loads_other_bytes"
NAMESPACES = f"{T}test_vllm_namespaces.py::test_requests_vllm_keeps_apart_get_no_flexkv_hit_from_each_other"
NAMESPACES_CONTROL = (
    f"{T}test_vllm_namespaces.py::test_negative_control_without_the_rule_flexkv_serves_the_other_namespace"
)
WINDOW = (
    "a sliding-window group: when a request finishes, vLLM replaces every block that has left the window with "
    "its null block 0 (scheduler.py, 0.33: 3367-3380), and FlexKV's request_finished stores that block table as "
    "full attention, so block 0's bytes would be restored inside a later request's window"
)
MULTIMODAL = f"{T}test_vllm_lifecycle_state.py::test_multimodal_requests_with_the_same_placeholders_share_no_kv"
HISPARSE = "a HiSparse group: its blocks hold a hot subset of tokens, not the prompt's positions"


def _parallel(name: str, setting: str, reason: str) -> Feature:
    instead = f"Run with {name}=1 to use FlexKV"
    return Feature(
        name, OPTION, "refused", reason, where=START, instead=instead, trigger=(f"parallel_config.{setting}", 2)
    )


def _spec(name: str, reason: str, instead: str = PLAIN) -> Feature:
    return Feature(name, SPEC, "refused", reason, where=START, instead=instead)


SPEC_ROWS: tuple[Feature, ...] = (
    Feature("FullAttentionSpec", SPEC, "served", "full attention: every block of the prompt is kept",
            proof=f"{E2E}test_a_stored_then_evicted_prompt_restored_from_flexkv_gives_the_cold_tokens",
            control=f"{E2E}test_negative_control_a_perturbed_flexkv_copy_changes_the_tokens"),
    Feature("MLAAttentionSpec", SPEC, "served", "MLA latent rows, one head (kernel blocks regrouped where the "
            "manager block is larger)", proof=f"{T}test_vllm_layouts.py::test_every_layout_and_kind_is_adapted_"
            "right_or_refused", control=BROKEN),
    Feature("UniformTypeKVCacheSpecs", SPEC, "served", "one group of layers of one type but different sizes (an "
            "MLA model and its DeepSeek-V3.2 indexer): each layer's own spec is decided by its row",
            proof=f"{T}test_vllm_features.py::test_a_uniform_group_of_mla_and_its_indexer_is_registered_whole",
            control=f"{T}test_vllm_features.py::test_a_uniform_group_with_one_sliding_window_layer_is_refused"),
    _spec("SlidingWindowSpec", WINDOW, "Serve sliding-window models without FlexKVConnectorV1"),
    _spec("SlidingWindowMLASpec", WINDOW, "Serve sliding-window models without FlexKVConnectorV1"),
    _spec("RSWASpec", "a sliding window over the decoded tokens: vLLM keeps the prompt's blocks but nulls those "
          "between the prompt and the window during decode, and FlexKV's request_finished would store null block "
          "0 under those positions", "Serve sliding-window models without FlexKVConnectorV1"),
    _spec("ChunkedLocalAttentionSpec", "a chunked-local group: blocks before the current chunk are released and "
          "nulled as in a sliding window, so FlexKV would store the null block under the prefix"),
    _spec("CircularBufferSpec", "a circular-buffer group: blocks are reused in a ring, so a block id is no prompt "
          "position FlexKV could key"),
    _spec("CrossAttentionSpec", "an encoder-decoder cross-attention group: its KV comes from the encoder input, "
          "which FlexKV's token-id key does not see"),
    _spec("EncoderOnlyAttentionSpec", "an encoder-only group: its KV is not cached across requests"),
    _spec("SinkFullAttentionSpec", "a full-attention group with sink tokens held apart from the prompt's blocks; "
          "unproven"),
    _spec("HiddenStateCacheSpec", "a hidden-state cache (speculative decoding's), not attention KV"),
    _spec("AttentionSpec", "the bare attention spec: it says nothing of which blocks vLLM keeps; unproven"),
    _spec("MambaSpec", "a state-space (Mamba) state: one state per request, not per-token KV rows"),
    _spec("HiSparseHotSpec", HISPARSE),
    _spec("HiSparseResidentSpec", HISPARSE),
)  # fmt: skip

OTHER_ROWS: tuple[Feature, ...] = (
    Feature("several KV cache groups", "KV cache groups", "refused", "a hybrid model's groups (hybrid memory "
            "allocator): FlexKVConnectorV1 registers one group", where=START, instead=PLAIN),
    Feature("LoRA", REQUEST, "bypassed", "FlexKV's key cannot carry vLLM's tagged (lora, name, path) extra: the "
            "request is neither loaded nor stored", proof=NAMESPACES, control=NAMESPACES_CONTROL),
    Feature("cache_salt", REQUEST, "bypassed", "FlexKV's key cannot carry vLLM's tagged cache_salt extra: the "
            "request is neither loaded nor stored", proof=NAMESPACES, control=NAMESPACES_CONTROL),
    Feature("multimodal inputs", REQUEST, "bypassed", "vLLM keys the blocks by the inputs' hashes, FlexKV by token "
            "ids alone: the request is neither loaded nor stored",
            proof=f"{MULTIMODAL}[True]", control=f"{MULTIMODAL}[False]"),
    Feature("prompt embeds", REQUEST, "bypassed", "the prompt is embeddings, not token ids FlexKV could key: the "
            "request is neither loaded nor stored",
            proof=f"{T}test_vllm_lifecycle_state.py::test_prompt_embeds_requests_neither_look_up_nor_store",
            control=NAMESPACES_CONTROL),
    Feature("speculative decoding", OPTION, "refused", "speculative decoding (speculative_config): draft-model "
            "layers and their blocks beside the target's were never proven with FlexKV", where=START,
            instead="Run without speculative decoding to use FlexKV", trigger=("speculative_config", object)),
    Feature("--tensor-parallel-size", OPTION, "served", "tensor parallelism (proven at TP 2: every worker's "
            "registration, loads and failures aggregated by vLLM's KVOutputAggregator)",
            proof=f"{T}test_vllm_lifecycle_loads.py::test_at_tp2_every_worker_reports_the_failure_and_vllm_"
            "aggregates_it", control=BROKEN),
    _parallel("--pipeline-parallel-size", "pipeline_parallel_size", "pipeline parallelism: each stage registers "
              "its own layers with FlexKV; unproven"),
    _parallel("--decode-context-parallel-size", "decode_context_parallel_size", "decode context parallelism: a "
              "block spans block_size x dcp tokens spread across ranks, while FlexKV's slot mapping counts "
              "block_size tokens a block"),
    _parallel("--prefill-context-parallel-size", "prefill_context_parallel_size", "prefill context parallelism: "
              "each rank holds part of every block; unproven"),
    _parallel("--data-parallel-size", "data_parallel_size", "data parallelism: every DP rank runs its own "
              "scheduler and FlexKV client; unproven"),
    Feature("kv_load_failure_policy=fail", OPTION, "served", "vLLM's default: a failed FlexKV load ends the "
            "request with an error, never served as a hit", proof=f"{T}test_vllm_lifecycle_loads.py::test_failed_"
            "load_with_fail_policy_ends_the_request_with_an_error", control=f"{T}test_vllm_lifecycle_loads.py::"
            "test_negative_control_without_the_wrappers_a_failed_load_is_served_as_a_hit"),
    Feature("kv_load_failure_policy=recompute (V1 and CPU model runners)", OPTION, "served", "a failed load is "
            "recomputed from its first failed block", proof=f"{E2E}test_a_failed_flexkv_load_is_logged_and_"
            "recomputed_to_the_cold_tokens", control=f"{T}test_vllm_lifecycle_loads.py::test_negative_control_"
            "without_the_wrappers_a_failed_load_is_served_as_a_hit"),
    Feature("kv_load_failure_policy=recompute (V2 GPU model runner)", OPTION, "refused", "vLLM's V2 GPU model "
            "runner recomputes a rejected load from a stale offset (vllm#49250, open: wrong output)", where=START,
            instead="Keep kv_load_failure_policy=fail (the default), or set VLLM_USE_V2_MODEL_RUNNER=0"),
    Feature("sleep mode (vLLM 0.33)", OPTION, "served", "FlexKV unmaps vLLM's KV memory before sleep and registers "
            "it again on wake", proof=f"{T}test_vllm_lifecycle_state.py::test_sleep_then_wake_then_store_and_hit_"
            "again", control=f"{T}test_vllm_lifecycle_state.py::test_negative_control_without_the_wrappers_sleep_"
            "leaves_flexkv_mapped"),
    Feature("sleep mode (vLLM 0.32)", OPTION, "refused", "vLLM 0.32's connector base has no sleep/wake hooks, so "
            "nothing would tell FlexKV that vLLM freed the KV memory it copies to", where=START,
            instead="Turn sleep mode off, or use vLLM 0.33"),
    Feature("attention backends", "attention backend", "served", "classified by the KV cache layout they ask for; "
            "every layout is read right or refused (docs/vllm.md#layouts)",
            proof=f"{T}test_vllm_layouts.py::test_every_layout_and_kind_is_adapted_right_or_refused", control=BROKEN),
)  # fmt: skip

RECOMPUTE_V2 = "kv_load_failure_policy=recompute (V2 GPU model runner)"
VLLM = FeatureTable("vLLM 0.32/0.33", "docs/vllm.md#features", SPEC_ROWS + OTHER_ROWS)

__all__ = ["OPTION", "RECOMPUTE_V2", "REQUEST", "SPEC", "VLLM"]
