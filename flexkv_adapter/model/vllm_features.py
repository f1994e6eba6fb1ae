"""vLLM 0.32-0.34's feature table: every ``KVCacheSpec`` type, KV cache groups, request features and options,
each served (with its proof), bypassed per request, or refused (plain data, read by the vLLM plugin; docs/vllm.md
shows it, generated). ``tests/vllm/test_vllm_features.py`` fails when vLLM defines a spec type no row names.
:data:`SINCE` names the rows whose setting a vLLM release added: older releases lack the setting (and the feature)."""

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
NAMESPACES = f"{T}test_vllm_namespaces.py::"
LORA_E2E = "tests/e2e/test_vllm_lora.py::"
NAMESPACE_HITS = f"{NAMESPACES}test_the_same_namespace_again_restores_its_own_kv_from_flexkv"
NAMESPACES_CONTROL = f"{NAMESPACES}test_negative_control_flexkvs_own_namespace_serves_another_namespaces_kv"
NAMESPACED = (
    "offloaded under a FlexKV namespace of its own: a digest of vLLM's tagged {extra} (flexkv/namespace.py); the "
    "same {what} hits its own KV, another {what}, a base request and a same-named {other} miss. Bypassed per "
    "request where FlexKV's tokens_per_block divides 61 (1 or 61: a plain prompt could spell the namespace)"
)
WINDOW = (
    "a sliding-window group: when a request finishes, vLLM replaces every block that has left the window with "
    "its null block 0 (scheduler.py, 0.33: 3367-3380), and FlexKV's request_finished stores that block table as "
    "full attention, so block 0's bytes would be restored inside a later request's window"
)
MULTIMODAL = f"{T}test_vllm_lifecycle_state.py::test_multimodal_requests_with_the_same_placeholders_share_no_kv"
HISPARSE = "a HiSparse group: its blocks hold a hot subset of tokens, not the prompt's positions"
MEMORY = f"{T}test_vllm_kv_memory.py::"
EXTENSIBLE = "extensible KV cache (vLLM 0.34)"
LENDING = "KV memory lent to a weight update (vLLM 0.34)"
NOT_EXTENSIBLE = (
    "Leave --enable-extensible-kv-cache unset (vLLM then keeps it off), or pass --no-enable-extensible-kv-cache"
)
DECIDED = "vLLM's config (its own refusal of --enable-extensible-kv-cache), and engine start"
INFLIGHT = f"{T}test_vllm_inflight_loads.py::"
PAUSE = f"{T}test_vllm_pause_kv_memory.py::"


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
    Feature("LoRA", REQUEST, "served", NAMESPACED.format(extra="(lora, name, path)", what="LoRA (name and path)",
            other="cache_salt"), proof=f"{LORA_E2E}test_a_lora_prompt_restored_from_flexkv_gives_that_adapters_cold_"
            "tokens", control=f"{LORA_E2E}test_negative_control_flexkvs_own_rule_serves_a_re_pointed_name_the_old_"
            "adapters_kv"),
    Feature("cache_salt", REQUEST, "served", NAMESPACED.format(extra="(cache_salt, salt)", what="salt",
            other="LoRA"), proof=f"{NAMESPACE_HITS}[same salt]",
            control=f"{NAMESPACES_CONTROL}[lora name vs same-named salt]"),
    Feature("multimodal inputs", REQUEST, "bypassed", "vLLM keys the blocks by the inputs' hashes, FlexKV by token "
            "ids alone: the request is neither loaded nor stored",
            proof=f"{MULTIMODAL}[True]", control=f"{MULTIMODAL}[False]"),
    Feature("prompt embeds", REQUEST, "bypassed", "the prompt is embeddings, not token ids FlexKV could key: the "
            "request is neither loaded nor stored",
            proof=f"{T}test_vllm_lifecycle_state.py::test_prompt_embeds_requests_neither_look_up_nor_store[True]",
            control=f"{T}test_vllm_lifecycle_state.py::test_prompt_embeds_requests_neither_look_up_nor_store[False]"),
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
            instead="Keep kv_load_failure_policy=fail (the default), or set VLLM_USE_V2_MODEL_RUNNER=0 (vLLM 0.32 "
            "and 0.33; 0.34 has no other GPU runner)"),
    Feature("sleep mode (vLLM 0.33, 0.34)", OPTION, "served", "FlexKV unmaps vLLM's KV memory before sleep and "
            "registers it again on wake", proof=f"{T}test_vllm_lifecycle_state.py::test_sleep_then_wake_then_store_"
            "and_hit_again", control=f"{T}test_vllm_lifecycle_state.py::test_negative_control_without_the_wrappers_"
            "sleep_leaves_flexkv_mapped"),
    Feature("sleep mode (vLLM 0.32)", OPTION, "refused", "vLLM 0.32's connector base has no sleep/wake hooks, so "
            "nothing would tell FlexKV that vLLM freed the KV memory it copies to", where=START,
            instead="Turn sleep mode off, or use vLLM 0.33 or 0.34"),
    Feature(EXTENSIBLE, OPTION, "refused", "vLLM 0.34's driver-mapped KV memory (committed after warm-up, one "
            "storage per layer, released on sleep, lent to weight updates), never proven with FlexKV: as shipped, "
            "FlexKV's export of it fails at start (no shareable handle). The plugin's kv_cache_access answers "
            "LEGACY_IPC (FlexKV shares vLLM's KV memory through legacy CUDA IPC, as on 0.32 and 0.33), so vLLM keeps "
            "the extensible KV cache off", where=DECIDED, instead=NOT_EXTENSIBLE,
            trigger=("cache_config.enable_extensible_kv_cache", True),
            proof=f"{MEMORY}test_on_cuda_vllms_decision_keeps_the_extensible_kv_cache_off_with_flexkv",
            control=f"{MEMORY}test_negative_control_without_the_plugins_answer_cuda_turns_the_extensible_kv_cache_on"),
    Feature(LENDING, OPTION, "refused", "a weight reload borrowing the KV memory of a paused, cleared engine "
            "(engine/core.py 0.34: 1075-1085); vLLM lends only an extensible KV cache, which FlexKV's connector "
            "keeps off (refused with it: the two are one setting)", where=DECIDED, instead=NOT_EXTENSIBLE),
    Feature("lookahead block hashes (vLLM 0.34)", OPTION, "refused", "EAGLE block-drop hashing ahead of a block's "
            "end (config/vllm.py 0.34: 633-654), which needs speculative decoding, refused here; the connector keeps "
            "vLLM's supports_lookahead_block_hashes (False), so vLLM hashes without lookahead", where=START,
            instead="Run without speculative decoding to use FlexKV"),
    Feature("reset_connector=False on sleep, release_kv_cache_memory, pause_generation (vLLM 0.34)", OPTION,
            "served", "FlexKV is emptied too, whatever reset_connector says, before vLLM frees or releases the KV "
            "memory FlexKV copied from (FlexKV cannot tell whether the weights change before the engine runs "
            "again); if FlexKV cannot be emptied, vLLM's call raises before it frees anything",
            proof=f"{PAUSE}test_flexkv_is_emptied_whatever_reset_connector_says_and_nothing_from_before_is_served"
            "[sleep]", control=f"{PAUSE}test_negative_control_without_the_rule_flexkv_serves_kv_from_before_the_"
            "memory_was_freed[sleep]"),
    Feature("--max-num-inflight-kv-loads (vLLM 0.34)", OPTION, "served", "FlexKV's loads count against the cap; "
            "the connector keeps vLLM's may_load_async (only P/D remote prefills), so a FlexKV load starts only "
            "when a running slot is free, as without the option",
            proof=f"{INFLIGHT}test_with_the_inflight_cap_flexkv_hits_load_in_turn_and_hold_the_right_kv",
            control=f"{INFLIGHT}test_negative_control_a_broken_registration_under_the_cap_loads_other_bytes"),
    Feature("attention backends", "attention backend", "served", "classified by the KV cache layout they ask for; "
            "every layout is read right or refused (docs/vllm.md#layouts)",
            proof=f"{T}test_vllm_layouts.py::test_every_layout_and_kind_is_adapted_right_or_refused", control=BROKEN),
)  # fmt: skip

RECOMPUTE_V2 = "kv_load_failure_policy=recompute (V2 GPU model runner)"
VLLM = FeatureTable("vLLM 0.32-0.34", "docs/vllm.md#features", SPEC_ROWS + OTHER_ROWS)
# row -> the vLLM (major, minor) whose config first has the row's trigger setting
SINCE: dict[str, tuple[int, int]] = {EXTENSIBLE: (0, 34)}

__all__ = ["OPTION", "RECOMPUTE_V2", "REQUEST", "SINCE", "SPEC", "VLLM"]
