"""``FlexKVSchedulerConnector`` and its task records, following vllm_v1_adapter.py:138-787 at 34ab141.

Same attributes, method names, signatures and bookkeeping (task maps, failed block ids, the
blocking wait that pops tasks without reporting them); timing fields and logging left out.
"""

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from vllm.v1.engine import FinishReason

from flexkv.common.request import KVResponseStatus
from flexkv.integration.stats import FlexKVStats
from flexkv.kvmanager import KVManager


@dataclass
class FlexKVResponse:
    task_id: int
    task_type: str
    request: Any
    success: bool


@dataclass
class FlexKVTask:
    task_id: int = 0
    request: Any = 0
    slot_mapping: Any = None
    block_ids: list = field(default_factory=list)


@dataclass(kw_only=True)
class FlexKVGetTask(FlexKVTask):
    num_computed_tokens: int
    num_new_matched_tokens: int


@dataclass(kw_only=True)
class FlexKVPutTask(FlexKVTask):
    num_matched_tokens: int
    num_unmatched_tokens: int


class FlexKVSchedulerConnector:
    def __init__(self, flexkv_config, rank_info):
        self.block_size = flexkv_config.cache_config.tokens_per_block
        self.cache_config = flexkv_config.cache_config
        self.rank_info = rank_info
        self.collector = None
        self.flexkv_manager = KVManager(model_config=rank_info.model_config, cache_config=flexkv_config.cache_config)
        self.flexkv_manager.start()
        self.req_id_to_task_dict: dict[str, int] = {}
        self.get_tasks: dict[int, list] = {}
        self.put_tasks: dict[int, list] = {}
        self.tasks_to_launch: dict[int, FlexKVTask] = {}
        self.tasks_to_cancel: dict[int, FlexKVTask] = {}
        self.flexkv_stats = FlexKVStats(200)
        self.failed_block_ids: set[int] = set()
        self.enable_batch = True  # kv sharing, remote and GDS off

    def is_ready(self):
        return self.flexkv_manager.is_ready()

    def shutdown(self):
        self.flexkv_manager.shutdown()

    def reset_cache(self) -> bool:  # adp:288-310: reset, then drop every map
        self.flexkv_manager.reset()
        for maps in (
            self.req_id_to_task_dict,
            self.get_tasks,
            self.put_tasks,
            self.tasks_to_launch,
            self.tasks_to_cancel,
        ):
            maps.clear()
        self.failed_block_ids.clear()
        return True

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        _, matched = self._get_match(request=request, num_computed_tokens=num_computed_tokens)
        self.flexkv_stats.record_get(request.num_tokens, num_computed_tokens, matched)
        return (matched, True) if matched > 0 else (0, False)

    def _extract_namespace(self, request):  # adp:329-378: LoRA name, cache_salt, namespace_info
        parts = []
        if getattr(request, "lora_request", None) is not None and request.lora_request.lora_name is not None:
            parts.append(str(request.lora_request.lora_name))
        if getattr(request, "cache_salt", None) is not None:
            parts.append(str(request.cache_salt))
        return parts or None

    def _get_match(self, request, num_computed_tokens=0):
        num_tokens_to_get = (request.num_tokens // self.block_size) * self.block_size
        assert num_computed_tokens <= num_tokens_to_get and num_computed_tokens % self.block_size == 0
        if num_tokens_to_get == num_computed_tokens:
            return -1, 0
        token_ids = np.array(request.all_token_ids[:num_tokens_to_get])
        mask = np.ones_like(token_ids, dtype=bool)
        mask[:num_computed_tokens] = False
        task_id, matched_mask = self.flexkv_manager.get_match(
            token_ids=token_ids, token_mask=mask, namespace=self._extract_namespace(request)
        )
        matched = matched_mask.sum().item()
        if matched > 0:
            self.req_id_to_task_dict[request.request_id] = task_id
            self.tasks_to_cancel[task_id] = FlexKVGetTask(
                task_id=task_id,
                request=request,
                num_computed_tokens=num_computed_tokens,
                num_new_matched_tokens=matched,
            )
        else:
            self.flexkv_manager.cancel(task_ids=[task_id])
        return task_id, matched

    def update_state_after_alloc(self, request, blocks, num_new_matched_tokens):
        if num_new_matched_tokens == 0:
            return
        task_id = self.req_id_to_task_dict[request.request_id]
        task = self.tasks_to_cancel.pop(task_id)
        self.tasks_to_launch[task_id] = task
        first = task.num_computed_tokens // self.block_size
        task.block_ids = blocks.get_block_ids()[0][first : first + num_new_matched_tokens // self.block_size]
        task.slot_mapping = np.array(task.block_ids).repeat(self.block_size) * self.block_size

    def wait_for_all_get_tasks(self):
        return self._blocking_waiting_for_tasks(self.get_tasks)

    def request_finished(self, request, block_ids):  # adp:515-560
        if request.request_id in self.req_id_to_task_dict:
            return True
        reason = request.get_finished_reason()
        abort_offload = reason == FinishReason.ABORT and bool(getattr(request, "offload_kv_on_finish", False))
        if not (request.is_finished() and (reason in (FinishReason.STOP, FinishReason.LENGTH) or abort_offload)):
            return False
        task_id, matched, unmatched = self._put_match(request=request)
        self.flexkv_stats.record_put(request.num_tokens, unmatched)
        if unmatched <= 0:
            return False
        task = self.tasks_to_cancel.pop(task_id)
        self.tasks_to_launch[task_id] = task
        first = matched // self.block_size
        to_put = block_ids[first : first + unmatched // self.block_size]
        task.slot_mapping = np.array(to_put).repeat(self.block_size) * self.block_size
        return True

    def _put_match(self, request):
        num_tokens_to_put = ((request.num_tokens - 1) // self.block_size) * self.block_size
        if num_tokens_to_put == 0:
            return -1, 0, 0
        token_ids = np.array(request.all_token_ids[:num_tokens_to_put])
        task_id, unmatched_mask = self.flexkv_manager.put_match(
            token_ids=token_ids, namespace=self._extract_namespace(request)
        )
        unmatched = unmatched_mask.sum().item()
        if unmatched > 0:
            self.req_id_to_task_dict[request.request_id] = task_id
            self.tasks_to_cancel[task_id] = FlexKVPutTask(
                task_id=task_id,
                request=request,
                num_matched_tokens=num_tokens_to_put - unmatched,
                num_unmatched_tokens=unmatched,
            )
        else:
            self.flexkv_manager.cancel(task_ids=[task_id])
        return task_id, num_tokens_to_put - unmatched, unmatched

    def cancel_tasks(self):
        if not self.tasks_to_cancel:
            return
        for task in self.tasks_to_cancel.values():
            del self.req_id_to_task_dict[task.request.request_id]
        self.flexkv_manager.cancel(task_ids=list(self.tasks_to_cancel.keys()))
        self.tasks_to_cancel.clear()

    def launch_tasks(self):  # adp:641-687: gets, then puts, each batched when more than one
        for kind, target in ((FlexKVGetTask, self.get_tasks), (FlexKVPutTask, self.put_tasks)):
            tasks = [t for t in self.tasks_to_launch.values() if isinstance(t, kind)]
            if not tasks:
                continue
            launched = self.flexkv_manager.launch(
                task_ids=[t.task_id for t in tasks],
                slot_mappings=[t.slot_mapping for t in tasks],
                as_batch=self.enable_batch and len(tasks) > 1,
            )
            if len(launched) == 1 and len(tasks) > 1:
                target[launched[0]] = tasks
            elif len(launched) == len(tasks):
                for launched_id, task in zip(launched, tasks):
                    target[launched_id] = [task]
            else:
                raise ValueError("KVTaskManager returned unexpected number of launched task ids.")
        self.tasks_to_launch.clear()

    def query_finished_task(self):  # adp:689-727
        if len(self.req_id_to_task_dict) == 0:
            return set(), set()
        responses = self.flexkv_manager.try_wait(list(self.get_tasks.keys()) + list(self.put_tasks.keys()))
        finished_sending, finished_recving = set(), set()
        num_failed = 0
        for task_id, response in responses.items():
            success = response.status == KVResponseStatus.SUCCESS
            if task_id in self.get_tasks:
                tasks = self.get_tasks.pop(task_id)
                finished_recving.update(t.request.request_id for t in tasks)
            else:
                tasks = self.put_tasks.pop(task_id)
                finished_sending.update(t.request.request_id for t in tasks)
            for task in tasks:
                del self.req_id_to_task_dict[task.request.request_id]
                if not success:
                    num_failed += 1
                    if isinstance(task, FlexKVGetTask):
                        self.failed_block_ids.update(task.block_ids)
        self.flexkv_stats.record_faild(num_failed_requests=num_failed)
        return finished_sending, finished_recving

    def get_and_clear_failed_block_ids(self):
        failed = self.failed_block_ids
        self.failed_block_ids = set()
        return failed

    def handle_preemptions(self, preempted_req_ids):
        for req_id in preempted_req_ids:
            task_id = self.req_id_to_task_dict.get(req_id)
            if task_id in self.tasks_to_launch:
                self.tasks_to_cancel[task_id] = self.tasks_to_launch.pop(task_id)

    def _blocking_waiting_for_tasks(self, task_dict):  # adp:753-779: pops the tasks; nobody reports them
        if not task_dict:
            return []
        responses = self.flexkv_manager.wait(task_ids=list(task_dict.keys()))
        out = []
        for task_id, response in responses.items():
            success = response.status == KVResponseStatus.SUCCESS
            for task in task_dict.pop(task_id):
                del self.req_id_to_task_dict[task.request.request_id]
                out.append(FlexKVResponse(task.task_id, "get", task.request, success))
        return out
