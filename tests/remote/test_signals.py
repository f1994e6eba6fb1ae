"""start_remote and signals sent to its whole process group (a closed terminal, ``kill -- -pgid``)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from flexkv_adapter.remote.exit_codes import ExitCode

from .harness import Remote, alive
from .standin import MasterStandIn, register_gpus


@pytest.fixture
def ready_remote(tmp_path):
    """A start_remote in its own process group, ready with two workers; its master closed after."""
    remote = Remote(tmp_path, new_session=True)
    master = MasterStandIn("127.0.0.1", remote.ports, remote.register_port, 2)
    remote.wait_state("waiting_for_gpus")
    register_gpus(remote.register_port, 2)
    remote.wait_state("ready")
    yield remote
    master.close()


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_a_signal_to_the_whole_process_group_still_lets_the_workers_unpin(ready_remote, sig):
    """A closed terminal or ``kill -HUP -- -pgid`` reaches FlexKV's workers too: they handle only
    SIGTERM (and ignore SIGINT), so SIGHUP killed them (and the resource tracker) mid-flight."""
    remote = ready_remote
    os.killpg(remote.proc.pid, sig)
    code, _, err = remote.finish()
    assert code == ExitCode.OK and "Traceback" not in err, err
    assert sorted(r["how"] for r in remote.recorded() if "how" in r) == 2 * [
        "sentinel" if sig == signal.SIGHUP else "sigterm"
    ]
    assert remote.orphans() == []


def test_a_status_signal_to_the_whole_process_group_leaves_the_workers_running(ready_remote):
    remote = ready_remote
    workers = next(r["workers"] for r in remote.recorded() if "workers" in r)
    os.killpg(remote.proc.pid, signal.SIGUSR1)  # start_remote logs its state; FlexKV's workers would die of it
    time.sleep(0.3)
    assert remote.proc.poll() is None and all(alive(pid) for pid in workers)
    code, err, _ = remote.stop()
    assert code == ExitCode.OK and "received SIGUSR1" in err and "Traceback" not in err, err
    assert [r["how"] for r in remote.recorded() if "how" in r] == ["sentinel", "sentinel"]
