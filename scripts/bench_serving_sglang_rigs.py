"""The SGLang part's rigs for bench_serving_sglang.py: FlexKVRadixCaches over FlexKV's connector (run in .venv-sglang).

Two setups behind FlexKV's connector (bench_serving_sglang.py says which rows each one times): FlexKV's whole
Python with its compiled parts replaced (``real``), each rig on a FlexKV server of its own, or the SGLang tier's
in-process KVManager stand-in with its byte copies left out.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 8, "num_hidden_layers": 3, "intermediate_size": 128, "vocab_size": 128,
    "max_position_embeddings": 256, "torch_dtype": "bfloat16",
}  # fmt: skip


def rigs(tmp: Path, slots: int, real: bool) -> list[Any]:
    """Two FlexKVRadixCaches (one rank each) with the plugin loaded, each over its own FlexKV connector.

    ``real``: FlexKV's whole Python behind each connector (KVManager, task engine, radix index, server and
    transfer-worker processes; only its compiled parts replaced, tests/flexkv_cpu, as the tier's real-KVManager
    tests run it); else the tier's in-process KVManager stand-in, bookkeeping only (seconds, for ``--quick``).
    Two modes never share a connector: a poll by one takes the other's completed stores, so one mode would pay
    for the other's bookkeeping.
    """
    import pytest
    from sglang.srt import plugins
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.runtime_context import get_parallel

    sys.path.insert(0, str(ROOT))
    from tests.sglang.radix_harness import Rig, make_pool
    from tests.sglang.real_flexkv import SKIP_REASON, SOURCE, prepare, replace_gpu_parts

    if not SOURCE:
        sys.exit(f"bench_serving: {SKIP_REASON}")
    logging.getLogger("sglang").setLevel(logging.ERROR)
    logging.getLogger("flexkv_adapter").setLevel(logging.ERROR)
    get_parallel().override_permanently(attn_dcp_size=1, world_group=types.SimpleNamespace(cpu_group=None))
    mp = pytest.MonkeyPatch()
    mp.setenv("SGLANG_PLUGINS", "flexkv_adapter")
    if real:
        from tests.flexkv_cpu import boot

        boot.install_for_test(mp, SOURCE)  # FlexKV's spawned processes boot the same stand-ins
    prepare(mp, SOURCE)
    plugins.load_plugins()
    if not real:
        replace_gpu_parts(mp)
    if real:
        _poll_ready_often(mp)
    (tmp / "config.json").write_text(json.dumps(LLAMA))
    model = ModelConfig(model_path=str(tmp))
    made = []
    for i in range(2):
        if real:  # each rig its own FlexKV server and state (ipc:// paths must be short: under tmp's own /tmp)
            port = f"ipc://{tmp}/s{i}"
            env = {"FLEXKV_CPU_STATE_DIR": tmp / f"state{i}", "FLEXKV_CPU_SHM_DIR": tmp / f"shm{i}",
                   "FLEXKV_SERVER_RECV_PORT": port, "FLEXKV_CPU_CACHE_GB": 1}  # fmt: skip
            for name, value in env.items():
                mp.setenv(name, str(value))
            # FlexKV read FLEXKV_SERVER_RECV_PORT when the plugin imported it (config.py:767): its default,
            # ipc:///tmp/flexkv_server, is every FlexKV's on this machine, and a second rig there steals the first's
            from flexkv.common import config as flexkv_config

            mp.setattr(flexkv_config.GLOBAL_CONFIG_FROM_ENV, "server_recv_port", port)
            (tmp / f"state{i}").mkdir()
        with deadline(RIG_TIMEOUT_S, f"FlexKV's rig {i} did not start"):
            made.append(Rig(mp, model, "mha", pool=make_pool("mha", size=slots)))
        if real and (got := made[-1].cache.flexkv_connector.manager.server_recv_port) != port:
            sys.exit(f"bench_serving: FlexKV's rig {i} listens on {got}, not its own {port}")
    if not real:
        _bookkeeping_only(mp)
    return made


RIG_TIMEOUT_S = 300  # FlexKV waits for its server without end (connector.py:1909-1921): a lost registration hangs
set_handler = signal.signal  # bound before tests.sglang.real_flexkv.prepare() makes signal.signal a no-op


@contextlib.contextmanager
def deadline(seconds: int, what: str) -> Iterator[None]:
    """Exit with ``what`` after ``seconds`` (SIGALRM), FlexKV's processes with it: a benchmark that hangs tells
    nobody anything, and a plain exit would join FlexKV's transfer process (not a daemon) for good."""

    def expire(signum: int, frame: Any) -> None:
        print(f"bench_serving: {what} in {seconds} s", file=sys.stderr, flush=True)
        for pid in _descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os._exit(3)

    previous = set_handler(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        set_handler(signal.SIGALRM, previous)


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (Linux /proc), children before their own children."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rpartition(")")[2].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _poll_ready_often(mp: Any) -> None:
    """FlexKV's start-up wait asks its server every 0.2 s, not every 10 s (connector.py:1909-1921): the same
    wait, less the sleep past readiness (up to 10 s a rig). Nothing it measures runs through it."""
    import importlib

    cls = importlib.import_module("flexkv.integration.sglang.connector").FlexKVConnector
    wait = cls._wait_kv_manager_ready
    mp.setattr(cls, "_wait_kv_manager_ready", lambda self, poll_interval=0.2: wait(self, poll_interval))


def _bookkeeping_only(mp: Any) -> None:
    """The stand-in's tasks without their byte copies or call records: the same outcomes and FlexKV hits."""
    from tests.sglang import flexkv_serving

    def launch(self: Any, task_ids: list[int], slot_mappings: list[Any], swa_slot_mappings: Any = None,
               as_batch: bool = False, layerwise_transfer: bool = False, counter_id: int = 0) -> list[int]:  # fmt: skip
        for tid, slots in zip(task_ids, slot_mappings, strict=True):
            task = self.tasks[tid]
            task.slots, task.status = slots.clone(), "running"  # FlexKV serializes the slot mapping to its workers
        return task_ids

    def run(self: Any, task: Any) -> None:
        if task.kind == "put":
            self.pages.update(dict.fromkeys(task.pages, ()))
        task.status = "success"

    mp.setattr(flexkv_serving.DataKVManager, "launch", launch)
    mp.setattr(flexkv_serving.DataKVManager, "_run", run)


__all__ = ["LLAMA", "rigs"]
