"""SGLang 0.5.23's feature table: pool classes (:mod:`.sglang_pool_features`), server options and request
features, each served (with its proof), bypassed per request, or refused (plain data, read by ``readers/``
and the SGLang plugin; docs/sglang.md shows it, generated)."""

from __future__ import annotations

from .features import Feature, FeatureTable
from .sglang_pool_features import NO_ALIAS, POOL_ROWS

OPTION = "server option"
REQUEST = "request feature"
T = "tests/sglang/"
START = "engine start (the plugin's connector, before FlexKV registers anything)"
NAMESPACES = f"{T}test_sglang_bridge_namespaces.py::"
NAMESPACE_HITS = f"{NAMESPACES}test_each_namespace_restores_only_its_own_kv"
NAMESPACES_CONTROL = f"{NAMESPACES}test_negative_control_a_namespace_not_handed_to_flexkv_serves_the_base_kv_to_a_lora"
NAMESPACED = (
    "offloaded under a FlexKV namespace of its own (sglang_namespaced_requests: namespaced, the default): a digest "
    "of the request's tagged {what} (flexkv/namespace.py), taken from the request, not from SGLang's joined "
    "extra_key; the same {what} hits its own KV, any other namespace misses (a LoRA's also over FlexKV's real "
    "KVManager). Bypassed per request under SGLang's in-tree connector or where page_size divides 61 (1, SGLang's "
    "default, or 61); `skip` bypasses them all, `shared` shares KV by token ids"
)
E2E = "tests/e2e/test_sglang_generate.py::"
RETRACT = f"{T}test_sglang_bridge_retract.py::"


def _refused(name: str, setting: str, value: object, reason: str, instead: str) -> Feature:
    return Feature(name, OPTION, "refused", reason, where=START, instead=instead, trigger=(setting, value))


OPTION_ROWS: tuple[Feature, ...] = (
    Feature("--page-size", OPTION, "served", "any page size the connector registers alike (a mismatch with "
            "FlexKV's tokens_per_block is refused at start)",
            proof=f"{T}test_sglang_plugin.py::test_any_geometry_is_registered_correctly_or_refused", control=NO_ALIAS),
    Feature("--kv-cache-dtype", OPTION, "served", "any dtype whose element size is FlexKV's model dtype's (another "
            "size is refused at start: FlexKV strides blocks in its dtype)",
            proof=f"{T}test_sglang_nsa_namespace.py::test_flexkvs_nsa_formula_for_fp8_and_bf16", control=NO_ALIAS),
    Feature("--tp-size", OPTION, "served", "tensor parallelism (proven at TP 1 and 2, every rank's registration "
            "and restores checked)", proof=f"{T}test_sglang_bridge_tp.py::test_both_ranks_store_complete_and_restore_"
            "with_retries", control=f"{T}test_sglang_bridge_tp.py::test_negative_control_a_shifted_layer_on_rank_1_"
            "only_fails_rank_1"),
    _refused("--pp-size", "pp_size", 2, "a pipeline-parallel topology: the bridge is proven at tensor "
             "parallelism only", "Run with pp_size=1"),
    _refused("--attn-cp-size", "attn_cp_size", 2, "attention context parallelism: the bridge is proven at tensor "
             "parallelism only", "Run with attn_cp_size=1"),
    _refused("--dcp-size", "dcp_size", 2, "decode context parallelism: each rank holds part of every page, which "
             "FlexKV's connector keys and copies whole", "Run with dcp_size=1"),
    _refused("--dp-size", "dp_size", 2, "data parallelism: SGLang 0.5.23's FlexKV factory passes dp_rank=None, so "
             "every DP rank would register as FlexKV's DP client 0", "Run with dp_size=1"),
    _refused("--enable-dp-attention", "attn_dp_size", 2, "DP attention (attn_dp_size > 1): SGLang 0.5.23's FlexKV "
             "factory passes dp_rank=None, so every DP rank would register as FlexKV's DP client 0",
             "Run without --enable-dp-attention"),
    _refused("--enable-kv-cache-sharding", "enable_kv_cache_sharding", True, "KV cache sharding: pages split across "
             "ranks in page-interleave pools whose rows are not token ids (SGLang 0.5.23 also refuses it next to "
             "--enable-flexkv)", "Run without --enable-kv-cache-sharding"),
    _refused("--enable-hierarchical-cache", "enable_hierarchical_cache", True, "SGLang's HiCache beside FlexKV: "
             "FlexKVRadixCache has no host tier, and SGLang 0.5.23's scheduler then calls its "
             "ready_to_load_host_cache, which raises at the first prefill", "Configure FlexKV's own CPU/SSD tiers "
             "and run without --enable-hierarchical-cache"),
    _refused("--hicache-storage-backend", "hicache_storage_backend", "file", "a HiCache storage backend beside "
             "FlexKV: SGLang 0.5.23's scheduler then calls FlexKVRadixCache.is_backuped, which it lacks, at every "
             "admitted request", "Configure FlexKV's own SSD or remote tier instead"),
    _refused("--speculative-algorithm", "speculative_algorithm", "EAGLE", "speculative decoding: FlexKVRadixCache "
             "stores by speculative_eagle_topk and FlexKV registers the target model's pool only (the draft "
             "model's KV is not offloaded); unproven", "Run without speculative decoding to use FlexKV"),
    _refused("--disaggregation-mode", "disaggregation_mode", "decode", "prefill/decode disaggregation: the KV "
             "moves between servers outside FlexKV, and a decode server's retraction backup calls "
             "FlexKVRadixCache.backup_kv_cache, which it lacks (mem_cache/common.py:358); unproven",
             "Run without PD disaggregation to use FlexKV"),
    _refused("--enable-priority-scheduling", "enable_priority_scheduling", True, "priority scheduling: it can "
             "preempt running requests, a release path FlexKV's in-flight copies were not proven against",
             "Run without --enable-priority-scheduling"),
    Feature("--chunked-prefill-size", OPTION, "served", "chunked prefill (SGLang's default): a chunk's checkpoint "
            "stays in the device tree; FlexKV stores the whole prompt when the request finishes (the end-to-end run "
            "prefills its 192-token prompts in 64-token chunks)",
            proof=f"{E2E}test_prompt_evicted_from_sglang_is_restored_by_flexkv_with_the_cold_tokens",
            control=f"{E2E}test_negative_control_a_perturbed_flexkv_cpu_copy_changes_the_tokens"),
)  # fmt: skip

REQUEST_ROWS: tuple[Feature, ...] = (
    Feature("LoRA (extra_key)", REQUEST, "served", NAMESPACED.format(what="LoRA id"),
            proof=f"{NAMESPACE_HITS}[lora tenant1]", control=NAMESPACES_CONTROL),
    Feature("extra_key (the caller's)", REQUEST, "served", NAMESPACED.format(what="extra_key"),
            proof=f"{NAMESPACE_HITS}[caller extra_key tenant1]", control=NAMESPACES_CONTROL),
    Feature("cache_salt", REQUEST, "served", NAMESPACED.format(what="salt"),
            proof=f"{NAMESPACE_HITS}[cache_salt tenant1]", control=NAMESPACES_CONTROL),
    Feature("multimodal inputs", REQUEST, "bypassed", "image and audio tokens reach FlexKV as pad ids derived from "
            "the input's hash, unproven as keys: such a request neither looks up nor stores in FlexKV",
            proof=f"{NAMESPACES}test_a_multimodal_request_neither_hits_nor_stores_flexkv_kv",
            control=f"{NAMESPACES}test_negative_control_shared_namespaces_serve_the_base_request_kv[multimodal]"),
    Feature("retraction", REQUEST, "served", "a decoding request retracted under memory pressure (release_req): "
            "its slots are freed with no FlexKV task left for it, an in-flight store keeps its slots through the "
            "retraction's eviction, and the re-admitted request is restored byte-exact",
            proof=f"{RETRACT}test_a_retracted_request_frees_its_slots_and_is_restored_byte_exact_when_admitted_again",
            control=f"{RETRACT}test_negative_control_without_the_store_lock_the_retractions_eviction_hands_out_slots_"
            "flexkv_still_copies"),
)  # fmt: skip

SGLANG = FeatureTable("SGLang 0.5.23", "docs/sglang.md#features", POOL_ROWS + OPTION_ROWS + REQUEST_ROWS)

__all__ = ["OPTION", "REQUEST", "SGLANG"]
