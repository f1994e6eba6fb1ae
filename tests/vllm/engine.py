"""A CPU stand-in for vLLM's engine loop (0.32, 0.33 or 0.34): the REAL Scheduler (with its real KVCacheManager)
and the real worker-side connector driver, stepped by hand: schedule -> worker -> update_from_output.
The driver is the V2 model runner's ``ActiveKVConnector`` (``driver="v2"``) or the V1 runner's
``KVConnectorModelRunnerMixin._get_kv_connector_output`` (``driver="v1"``), which vLLM 0.34 deleted with the
V1 runner: ``driver="v1"`` skips there (:func:`v1_driver_reason`), and only that driver imports it.

Only the model is replaced: its "forward" writes, into every block a scheduled token touches, bytes
that are a function of the token prefix up to that block's end (:func:`kv_bytes`), through vLLM's
own per-layer views. So a block holds the right KV exactly when it holds ``kv_bytes`` of its prefix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
from typing import Any

import torch

from .build import LAYER_NAMES, allocate, backing, connector_config

BLOCK = 16
V1_MIXIN = "vllm.v1.worker.kv_connector_model_runner_mixin"


def v1_driver_reason() -> str:
    """Why the V1 runner's connector driver cannot run on this vLLM ("" where its module imports)."""
    import importlib.util

    if importlib.util.find_spec(V1_MIXIN) is not None:
        return ""
    import vllm

    return f"vLLM {vllm.__version__} has no V1 model runner ({V1_MIXIN}): only its V2 runner's driver exists"


def kv_bytes(prefix: list[int], layer: int, nbytes: int, adapter: Any = None) -> torch.Tensor:
    """The bytes the stand-in model computes for the block ending ``prefix`` in ``layer``; a LoRA ``adapter``
    ((name, path), as vLLM keys it) changes them, as a real adapter changes K and V (a cache_salt does not)."""
    key = (layer, prefix) if adapter is None else (layer, prefix, adapter)
    seed = int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:7], "little")
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def adapter_of(request: Any) -> Any:
    """The LoRA a request runs with, as vLLM keys its prefix cache by it: (name, path), or None."""
    lora = getattr(request, "lora_request", None)
    return None if lora is None else (lora.lora_name, lora.lora_path)


def block_bytes(view: torch.Tensor, block: int) -> torch.Tensor:
    """One manager block of a vLLM per-layer view, as bytes (copy)."""
    return view[block].contiguous().view(torch.uint8).flatten()


class Engine:
    """Scheduler + worker(s) around vLLM's FlexKVConnectorV1, as patched by the plugin.

    With ``workers`` > 1 every worker runs the connector driver on the same scheduler output and
    vLLM's ``KVOutputAggregator`` merges their outputs, as the multiprocess executor does at TP > 1.
    """

    def __init__(
        self,
        connector_cls: Any,
        tmp_path: Any,
        policy: str = "fail",
        blocks: int = 40,
        workers: int = 1,
        driver: str = "v2",
        scheduler_cls: Any = None,
        scheduler_settings: dict[str, Any] | None = None,
    ) -> None:
        from vllm.distributed.kv_transfer import kv_transfer_state
        from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        if driver == "v1" and (reason := v1_driver_reason()):
            import pytest

            pytest.skip(reason)
        self.kv_caches, kv_cache_config, _ = allocate("LBNHC", "mha3", blocks=blocks)
        self.config = connector_config(tmp_path, "mha3")
        self.config.kv_transfer_config.kv_load_failure_policy = policy
        self.config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        for name, value in (scheduler_settings or {}).items():  # read by the Scheduler's constructor too
            setattr(self.config.scheduler_config, name, value)
        self.scheduler = (scheduler_cls or Scheduler)(
            vllm_config=self.config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(self.config),
            block_size=BLOCK,
        )
        self.workers = [connector_cls(self.config, KVConnectorRole.WORKER, kv_cache_config) for _ in range(workers)]
        self.drivers: list[Any] = []
        for worker in self.workers:
            kv_transfer_state._KV_CONNECTOR_AGENT = worker
            if driver == "v2":
                from vllm.v1.worker.gpu.kv_connector import ActiveKVConnector

                self.drivers.append(ActiveKVConnector(self.config, self.kv_caches))  # registers the caches
            else:
                worker.register_kv_caches(self.kv_caches)
                self.drivers.append(None)
        self.worker = self.workers[0]
        self.aggregator = KVOutputAggregator(workers)
        self.outputs: list[Any] = []  # every SchedulerOutput, in order
        self.finished: dict[str, Any] = {}

    @property
    def flexkv(self) -> Any:
        """FlexKV's scheduler-side connector (FlexKVSchedulerConnector) inside the scheduler's connector."""
        return self.scheduler.connector._flexkv_connector.connector

    def add(self, req_id: str, tokens: list[int], max_tokens: int = 2, **kwargs: Any) -> Any:
        from vllm import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.request import Request

        init_none_hash(sha256)
        request = Request(
            req_id,
            list(tokens),
            SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            None,
            block_hasher=get_request_block_hasher(BLOCK, sha256),
            **kwargs,
        )
        self.scheduler.add_request(request)
        return request

    def _forward(self, so: Any) -> dict[str, list[int]]:
        """Write KV for the scheduled tokens; sample token 7 for requests whose prompt is done."""
        sampled = {}
        for req_id, n in so.num_scheduled_tokens.items():
            request = self.scheduler.requests[req_id]
            end = request.num_computed_tokens
            tokens = request.all_token_ids
            (block_ids,) = self.scheduler.kv_cache_manager.get_block_ids(req_id)
            adapter = adapter_of(request)
            for index in range((end - n) // BLOCK, (end - 1) // BLOCK + 1):
                prefix = tokens[: min(end, (index + 1) * BLOCK)]
                for layer, name in enumerate(LAYER_NAMES):
                    view = self.kv_caches[name][block_ids[index]]
                    data = kv_bytes(prefix, layer, view.numel() * view.element_size(), adapter)
                    view.copy_(data.view(view.dtype).view(view.shape))
            sampled[req_id] = [7] if end >= request.num_tokens else []
        return sampled

    def _run_worker(self, worker: Any, driver: Any, so: Any, forward: bool) -> Any:
        from vllm.distributed.kv_transfer import kv_transfer_state
        from vllm.forward_context import set_forward_context
        from vllm.v1.outputs import ModelRunnerOutput

        kv_transfer_state._KV_CONNECTOR_AGENT = worker
        if driver is not None:  # the V2 runner: pre_forward, forward, finish_forward, post_forward
            driver.pre_forward(so)
            sampled = self._forward(so) if forward else {r: [] for r in so.num_scheduled_tokens}
            driver.finish_forward()
            kv_output = driver.post_forward(so.finished_req_ids)
        else:  # the V1 runner (vLLM 0.32, 0.33): its mixin drives the connector around the forward
            KVConnectorModelRunnerMixin = importlib.import_module(V1_MIXIN).KVConnectorModelRunnerMixin
            with (
                set_forward_context(None, self.config),
                KVConnectorModelRunnerMixin._get_kv_connector_output(so) as kv_output,
            ):
                sampled = self._forward(so) if forward else {r: [] for r in so.num_scheduled_tokens}
        req_ids = list(sampled)
        fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
        index = {"req_id_to_index": {r: i for i, r in enumerate(req_ids)}} if "req_id_to_index" in fields else {}
        return ModelRunnerOutput(  # 0.34 dropped req_id_to_index: passed only where the dataclass declares it
            req_ids=req_ids, sampled_token_ids=[sampled[r] for r in req_ids], kv_connector_output=kv_output, **index
        )

    def step(self) -> Any:
        so = self.scheduler.schedule()
        self.outputs.append(so)
        outs = [self._run_worker(w, d, so, forward=i == 0) for i, (w, d) in enumerate(zip(self.workers, self.drivers))]
        out = self.aggregator.aggregate(outs) if len(outs) > 1 else outs[0]
        for engine_outputs in self.scheduler.update_from_output(so, out).values():
            for output in engine_outputs.outputs:
                if output.finish_reason is not None:
                    self.finished[output.request_id] = output.finish_reason
        return so

    def run(self, until: Any, steps: int = 30) -> int:
        """Step until ``until()`` holds; the number of steps taken (fails after ``steps``)."""
        for n in range(steps):
            if until():
                return n
            self.step()
        raise AssertionError(f"not reached after {steps} steps")

    def idle(self) -> bool:
        """No request left and FlexKV holds no task: every block is back in vLLM's pool."""
        return not self.scheduler.requests and not self.flexkv.req_id_to_task_dict

    def serve(self, req_id: str, tokens: list[int], max_tokens: int = 2, **kwargs: Any) -> Any:
        """Add a request and step until it finished and every transfer it started is done."""
        request = self.add(req_id, tokens, max_tokens, **kwargs)
        self.run(self.idle)
        return request

    def forget_local(self) -> None:
        """Drop vLLM's own prefix cache and scramble the whole KV buffer: only FlexKV can hit now."""
        assert self.scheduler.reset_prefix_cache()
        raw = backing(self.kv_caches)
        raw.copy_(torch.randint(0, 256, (raw.numel(),), dtype=torch.uint8, generator=torch.Generator().manual_seed(5)))

    def holds(self, req_id_or_blocks: Any, tokens: list[int], upto: int, adapter: Any = None) -> bool:
        """Whether the first ``upto`` blocks of a request hold ``kv_bytes`` of ``tokens``' prefixes (under
        ``adapter``)."""
        block_ids = req_id_or_blocks
        if isinstance(req_id_or_blocks, str):
            (block_ids,) = self.scheduler.kv_cache_manager.get_block_ids(req_id_or_blocks)
        for index in range(upto):
            for layer, name in enumerate(LAYER_NAMES):
                got = block_bytes(self.kv_caches[name], block_ids[index])
                if not torch.equal(got, kv_bytes(tokens[: (index + 1) * BLOCK], layer, got.numel(), adapter)):
                    return False
        return True


def flexkv_empty(engine: Engine) -> bool:
    """Nothing left in FlexKV's task maps (adp:253-266), in its task engine, nor in the plugin's ledger."""
    from flexkv.kvmanager import MANAGERS

    side = engine.flexkv
    maps = (side.req_id_to_task_dict, side.get_tasks, side.put_tasks, side.tasks_to_launch, side.tasks_to_cancel)
    ledger = engine.scheduler.connector._flexkv_adapter_ledger
    return not any(maps) and not side.failed_block_ids and not MANAGERS[-1].tasks and not ledger.pending
