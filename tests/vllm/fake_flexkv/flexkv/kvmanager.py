"""``KVManager`` stand-in: FlexKV 34ab141's task API (kvmanager.py:133-395, kvtask.py:1053-1135, 1437-1480).

Its CPU cache holds whole blocks keyed by FlexKV's own block hashes (namespace and token prefix). Launched
transfers finish at the ``polls``-th ``try_wait`` (or at ``wait``); only then are bytes copied, between that cache and
the last GPU registration, addressed the way FlexKV's workers address it (``tests/helpers``). Tests
steer it through :data:`CONTROL`: fail the next get/put transfers, fail or count resets. A failed
get scribbles 0xEE over its GPU blocks, as a transfer that died half-way could.
"""

import importlib.util
import sys
from itertools import count
from pathlib import Path

import numpy as np
import torch

from flexkv.common.request import KVResponse, KVResponseStatus
from flexkv.server import client
from tests.helpers import _layout_strides

CONTROL = {"fail_gets": 0, "fail_puts": 0, "polls": 1, "fail_reset": False, "resets": 0}
MANAGERS: list = []
_ids = count(1)


def _chunk(layer: int, block: int) -> torch.Tensor:
    """GPU bytes of (layer, block) as FlexKV's vLLM-type worker addresses them (gtensor_handler.cuh:47)."""
    if client.SUSPENDED:
        raise RuntimeError("FlexKV's GPU mappings are suspended (before_device_sleep)")
    reg = client.REGISTRATIONS[-1]
    layout = reg["kv_layout"]
    fields = {**vars(layout), "type": layout.type.value}
    tensor = reg["kv_caches"][layer]
    _, block_s, _, chunk = _layout_strides(fields, tensor.element_size())
    raw = torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())
    start = tensor.data_ptr() - tensor.untyped_storage().data_ptr() + block * block_s
    return raw[start : start + chunk - chunk % 8]


def _sequence_meta():
    """FlexKV's ``SequenceMeta``, with its ``hash_utils``, loaded once from the tree whose ``vllm_v1_adapter.py``
    was loaded over this stand-in (tests/vllm/conftest.py, scripts/bench_serving_vllm.py)."""
    if "flexkv.common.block" not in sys.modules:
        root = Path(sys.modules["flexkv.integration.vllm.vllm_v1_adapter"].__file__).parents[3]
        for name in ("hash_utils", "block"):
            file = root / "flexkv" / "common" / f"{name}.py"
            spec = importlib.util.spec_from_file_location(f"flexkv.common.{name}", file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
    return sys.modules["flexkv.common.block"].SequenceMeta


class _Task:
    def __init__(self, kind, keys):
        self.kind, self.keys, self.slots, self.polls, self.status = kind, keys, None, 0, None


class _TaskEngine:
    """FlexKV's KVTaskEngine as far as its reset reads it: the task table as 34ab141 builds it with its pinned
    expiring-dict 1.1.2 (kvtask.py:212, ``ExpiringDict(max_age_seconds=1800, max_len=100000)``: 1.1.2 takes the
    two keywords as two entries), and ``reset_cache``'s pass over every value (kvtask.py:1461)."""

    def __init__(self):
        self.tasks = {"max_age_seconds": 1800, "max_len": 100000}

    def reset_cache(self):
        return sum(1 for t in list(self.tasks.values()) if not t.is_completed())


class KVManager:
    def __init__(self, model_config, cache_config, dp_client_id=0, server_recv_port=None, event_collector=None):
        self.block = cache_config.tokens_per_block
        self.num_layers = model_config.num_layers
        self.cache: dict = {}  # FlexKV's block hash (namespace and token prefix) -> [bytes per layer]
        self.tasks: dict[int, _Task] = {}
        self.kv_task_engine = _TaskEngine()  # in-process mode (kvmanager.py:125)
        MANAGERS.append(self)

    def start(self):
        pass

    def is_ready(self):
        return True

    def shutdown(self):
        pass

    def _keys(self, token_ids, namespace):
        """Each block's key: FlexKV's own block hash (block.py's SequenceMeta, loaded from the FlexKV tree), so
        namespaces collide here exactly where they collide in FlexKV."""
        ids = np.asarray([int(t) for t in token_ids], dtype=np.int64)
        return [int(h) for h in _sequence_meta()(ids, self.block, namespace).block_hashes]

    def get_match(self, token_ids, token_mask=None, cpu_only=False, namespace=None, swa_aware=False):
        keys = self._keys(token_ids, namespace)
        hit = next((i for i, k in enumerate(keys) if k not in self.cache), len(keys))
        mask = torch.zeros(len(token_ids), dtype=torch.bool).numpy()
        mask[: hit * self.block] = True
        if token_mask is not None:
            mask &= token_mask
        task_id = next(_ids)
        wanted = [k for i, k in enumerate(keys) if mask[i * self.block]]
        self.tasks[task_id] = _Task("get", wanted)
        return task_id, mask

    def put_match(self, token_ids, token_mask=None, namespace=None):
        keys = self._keys(token_ids, namespace)
        mask = torch.ones(len(token_ids), dtype=torch.bool).numpy()
        for i, k in enumerate(keys):
            mask[i * self.block : (i + 1) * self.block] = k not in self.cache
        task_id = next(_ids)
        self.tasks[task_id] = _Task("put", [k for i, k in enumerate(keys) if mask[i * self.block]])
        return task_id, mask

    def launch(
        self, task_ids, slot_mappings, swa_slot_mappings=None, as_batch=False, layerwise_transfer=False, counter_id=0
    ):
        for task_id, slots in zip(task_ids, slot_mappings):
            self.tasks[task_id].slots = [int(s) // self.block for s in slots[:: self.block]]
        if not (as_batch and len(task_ids) > 1):
            return list(task_ids)
        batch = _Task("batch", [self.tasks.pop(t) for t in task_ids])
        batch_id = next(_ids)
        self.tasks[batch_id] = batch
        return [batch_id]

    def cancel(self, task_ids):
        for task_id in [task_ids] if isinstance(task_ids, int) else task_ids:
            self.tasks.pop(task_id, None)

    def _run(self, task):
        if task.kind == "batch":
            results = [self._run(t) for t in task.keys]
            return (
                KVResponseStatus.SUCCESS
                if all(r == KVResponseStatus.SUCCESS for r in results)
                else KVResponseStatus.FAILED
            )
        knob = "fail_gets" if task.kind == "get" else "fail_puts"
        try:
            if CONTROL[knob] > 0:
                CONTROL[knob] -= 1
                if task.kind == "get":
                    for block in task.slots:
                        for layer in range(self.num_layers):
                            _chunk(layer, block).fill_(0xEE)
                return KVResponseStatus.FAILED
            for key, block in zip(task.keys, task.slots):
                if task.kind == "get":
                    for layer, data in enumerate(self.cache[key]):
                        _chunk(layer, block).copy_(data)
                else:
                    self.cache[key] = [_chunk(layer, block).clone() for layer in range(self.num_layers)]
        except (RuntimeError, KeyError):
            return KVResponseStatus.FAILED
        return KVResponseStatus.SUCCESS

    def _respond(self, task_ids, finish):
        out = {}
        for task_id in [task_ids] if isinstance(task_ids, int) else task_ids:
            task = self.tasks.get(task_id)
            if task is None:
                out[task_id] = KVResponse(KVResponseStatus.NOTFOUND, task_id, None)
                continue
            task.polls += 1
            if finish or task.polls >= CONTROL["polls"]:
                out[task_id] = KVResponse(self._run(task), task_id, None)
                del self.tasks[task_id]
        return out

    def try_wait(self, task_ids):
        return self._respond(task_ids, finish=False)

    def wait(self, task_ids, timeout=20.0, completely=False):
        return self._respond(task_ids, finish=True)

    def reset(self):
        if CONTROL["fail_reset"]:
            raise RuntimeError("FlexKV reset failed")
        self.kv_task_engine.reset_cache()  # kvmanager.py:394
        CONTROL["resets"] += 1
        self.cache.clear()
