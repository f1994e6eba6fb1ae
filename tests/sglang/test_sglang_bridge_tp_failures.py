"""TP = 2: a load counts only if every rank's copy succeeded, and every rank takes the same count.

FlexKV's connector returns the slot count on non-leader ranks whatever the leader's copy did
(connector.py:634, :694): the leader loaded 0 tokens, rank 1 counted 48 that were never written, and
the ranks' radix trees diverged. A launch error on the leader was re-raised before the barrier its peers
wait in. Two processes, a real gloo group, SGLang's real FlexKVRadixCache on each rank over FlexKV
34ab141's real connector and comm (``flexkv_faults``: the leader's copy fails, times out, or its launch raises).
"""

from __future__ import annotations

import queue

import pytest

from tests.flexkv_source import find

from . import tp_faults_worker, two_ranks
from .two_ranks import run_two_ranks

ROOT = find().root
pytestmark = pytest.mark.skipif(ROOT is None, reason=find().skip_reason)
IDS = 48


def run_ranks(tmp_path, mode, control=False):
    results = run_two_ranks(tmp_path, tp_faults_worker.run, lambda *common: (*common, str(ROOT), mode, control))
    for status, value in results.values():
        assert status == "ok", value
    return {rank: value for rank, (_, value) in results.items()}


@pytest.mark.parametrize("mode", ["failed", "raise", "timeout", "lookup"])
def test_every_rank_takes_a_miss_when_the_leaders_copy_does_not_succeed(tmp_path, mode):
    results = run_ranks(tmp_path, mode)
    for rank, out in results.items():
        assert (out["loaded"], out["tree"]) == (0, 0), (rank, out)  # the same answer, the same tree
        assert out["held"] == (IDS if mode == "timeout" else 0), (rank, out)  # quarantined on every rank
        assert out["held after"] == 0, (rank, out)  # given back when the leader's copy ended
        assert out["again"] == (IDS, True), (rank, out)  # and served exactly afterwards


def test_a_rank_whose_load_raises_before_flexkvs_barrier_takes_a_miss_with_every_rank(tmp_path):
    """Rank 1's FlexKV raises before the barrier its leader waits in (a CUDA error at the slot mapping's copy to
    the host, connector.py:624): it enters the barrier itself, and every rank takes the miss, the same tree, its
    slots back, and is served again."""
    for rank, out in run_ranks(tmp_path, "peer raise").items():
        assert (out["loaded"], out["tree"], out["held"], out["held after"]) == (0, 0, 0, 0), (rank, out)
        assert out["again"] == (IDS, True), (rank, out)


def test_negative_control_a_rank_that_skips_flexkvs_barrier_leaves_every_rank_waiting(tmp_path, monkeypatch):
    """The leader's rule alone (it enters the barrier only where its KVManager raised): rank 0 waits in FlexKV's
    barrier, rank 1 in the bridge's agreement, and neither answers (here within 15 s; the fixed run takes ~5 s)."""
    from flexkv_adapter.integrations.sglang.bridge import BridgeConnector
    from flexkv_adapter.integrations.sglang.outcomes import Seen

    def leader_rule(self, log):
        return self.leader and self.agreement.active and Seen(log).manager_error is not None

    monkeypatch.setattr(BridgeConnector, "_skipped_barrier", leader_rule)  # the forked ranks inherit it
    monkeypatch.setattr(two_ranks, "RESULT_S", 15)
    with pytest.raises(queue.Empty):
        run_ranks(tmp_path, "peer raise")


def test_negative_control_without_agreement_rank_1_counts_tokens_never_written(tmp_path):
    results = run_ranks(tmp_path, "failed", control=True)
    assert results[0]["loaded"] == 0 and results[1]["loaded"] == IDS


@pytest.mark.parametrize("mode", ["flush", "flush failed"])
def test_a_flush_takes_the_leaders_outcome_on_every_rank(tmp_path, mode):
    failed = mode == "flush failed"
    for rank, out in run_ranks(tmp_path, mode).items():
        assert (out["stale"], out["loaded"]) == (failed, 0), (rank, out)  # emptied, or bypassed: no old KV
        assert out["after"] == (False, IDS), (rank, out)  # a flush that succeeds serves FlexKV again


def test_negative_control_without_agreement_rank_1_keeps_serving_flexkv_after_a_failed_flush(tmp_path):
    results = run_ranks(tmp_path, "flush failed", control=True)
    assert (results[0]["stale"], results[1]["stale"]) == (True, False)


def test_a_store_whose_launch_raises_on_the_leader_unlocks_every_rank_and_stores_again(tmp_path):
    for rank, out in run_ranks(tmp_path, "store raise").items():
        assert (out["locked"], out["in flight"]) == (0, 0), (rank, out)  # no node locked, nothing tracked
        assert out["again"] == (IDS, True), (rank, out)  # the put task was cancelled: the prefix stored again


def test_negative_control_an_uncancelled_put_task_shadows_the_prefix_on_every_rank(tmp_path, monkeypatch):
    from flexkv_adapter.integrations.sglang.bridge import BridgeConnector

    monkeypatch.setattr(BridgeConnector, "_cancel", lambda self, task_ids: None)  # the ranks fork with it
    for rank, out in run_ranks(tmp_path, "store raise").items():
        assert out["again"][0] == 0, (rank, out)
