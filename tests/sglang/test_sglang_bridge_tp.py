"""TP = 2: two processes, a real gloo group, SGLang's FlexKVRadixCache on each rank behind the bridge."""

from __future__ import annotations

from . import flexkv_serving as serving
from . import tp_worker
from .real_flexkv import SOURCE as REAL
from .real_flexkv import needs_flexkv
from .two_ranks import run_two_ranks


def run_ranks(tmp_path, real="", broken=False):
    tree = serving.build_serving_tree(tmp_path / "tree")
    return run_two_ranks(
        tmp_path, tp_worker.run, lambda rdv, llama, queue, spare: (rdv, str(tree), llama, queue, spare, real, broken)
    )


def check(results, exact=(True, True)):
    for rank, (status, value) in results.items():
        assert status == "ok", value
        assert value["leader"] == (rank == 0)
        assert value["stored"] == [0, 1]  # both attempts of r1: store_kv succeeded on both ranks
        assert value["evicted_in_flight"] == 0 and value["ticks"] == 1 and value["evicted"] == 64
        assert value["loaded"] == 48 and value["elsewhere"]
        assert value["keys"] == ["r1@attempt0", "r1@attempt1"]  # the same keys on both ranks
        # each rank's own head shard (written with its own seed) comes back, every byte, and nothing else moves
        assert (value["exact"], value["untouched"]) == (exact[rank], True), rank
        # an abort right after the store (SGLang's PD transfer failure): every rank keeps the slots until done
        assert (value["abort evicted in flight"], value["abort ticks"], value["abort evicted"]) == (0, 1, 48)
        assert value["abort restored"] == (48, exact[rank]), rank
        # a rid used again while its first store runs: one key per store, each node unlocked on every rank
        first, second = value["reuse keys"]
        assert first == "r5@attempt0" and second.startswith("r5@attempt0#store"), value["reuse keys"]
        assert value["reuse ticks"] <= 2 and (value["reuse locked"], value["reuse evicted"]) == (0, 96)
    assert results[0][1]["reuse keys"] == results[1][1]["reuse keys"]  # FlexKV's leader compares them
    assert results[0][1]["mismatch"] == "none"
    assert "store-start rid mismatch: local='x@attempt1', leader='x@attempt0'" in results[1][1]["mismatch"]


def test_both_ranks_store_complete_and_restore_with_retries(tmp_path):
    check(run_ranks(tmp_path))


def test_negative_control_a_shifted_layer_on_rank_1_only_fails_rank_1(tmp_path):
    check(run_ranks(tmp_path, broken=True), exact=(True, False))


@needs_flexkv
def test_the_same_with_flexkv_real_connector(tmp_path):
    results = run_ranks(tmp_path, REAL)
    check(results)
    assert all(value["file"].startswith(REAL) for _, value in results.values())


@needs_flexkv
def test_negative_control_with_flexkv_real_connector(tmp_path):
    check(run_ranks(tmp_path, REAL, broken=True), exact=(True, False))


def test_negative_control_one_key_per_rid_leaks_the_first_lock_on_every_rank(tmp_path, monkeypatch):
    from flexkv_adapter.integrations.sglang.stores import StoreKeys

    monkeypatch.setattr(StoreKeys, "key", lambda self, base: base)  # the ranks fork with it
    for status, value in run_ranks(tmp_path).values():
        assert status == "ok", value
        assert value["reuse keys"] == ["r5@attempt0"] and value["reuse locked"] == 48
