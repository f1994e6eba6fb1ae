"""Engine objects are decided by their engine's feature table; any object whose rows are remapped is refused.

Every input to :func:`~flexkv_adapter.adapt`, :func:`~flexkv_adapter.plan` and the plugins passes here first
(:func:`~flexkv_adapter.readers.sources.locate_source`). An engine class (one with a class from
``sglang.srt.`` or ``vllm.`` in its MRO) is served only where its table serves it: a class the table does
not name, a user's subclass of an engine class included, is refused (default deny). Objects that are not
engine classes keep the reading rules (geometry declared or probed, never guessed), plus the two markers
of rows that are not the engine's token ids.
"""

from __future__ import annotations

import inspect

import torch

from ..errors import UnsupportedFeatureError, UnsupportedPoolError
from ..model.features import FeatureTable, engine_class, table_name
from ..model.sglang_features import SGLANG
from ..model.vllm_features import VLLM
from .containers import probe

# (table, the module prefixes that make a class the engine's, what such an object is called)
ENGINES: tuple[tuple[FeatureTable, tuple[str, ...], str], ...] = (
    (SGLANG, ("sglang.srt.",), "KV pool class"),
    (VLLM, ("vllm.",), "object"),
)
SUB_POOLS = ("main_pool", "full_kv_pool", "swa_kv_pool", "index_kv_pool", "index_k_pool")


def engine_refusal(obj: object, where: str = "", nested: bool = False) -> str | None:
    """The table's refusal of ``obj`` if it is an engine object its table does not serve; None otherwise.
    ``nested``: ``obj`` sits inside a wrapper, where a class refused only for its own shape may serve."""
    cls = type(obj)
    for table, prefixes, kind in ENGINES:
        if not engine_class(cls, prefixes):
            continue
        name = table_name(cls, prefixes)
        row = table.get(name)
        if nested and row is not None and row.nested:
            return None
        return table.refusal(name, kind, where)
    return None


def refuse_unproven(pool: object) -> None:
    """Refuse ``pool`` or a sub-pool of it that its engine's table does not serve, or whose rows are not
    indexed by the token ids the engine hands out (HiSparse's hot subset, unified memory's physical ids).
    Tensors, lists and dicts are no engine classes and carry no such attributes."""
    if isinstance(pool, (torch.Tensor, list, tuple, dict)):
        return
    top = type(pool).__name__
    for attr, sub in [("", pool), *((a, probe(pool, a, tolerate=True)) for a in SUB_POOLS)]:
        if sub is None or isinstance(sub, (torch.Tensor, list, tuple, dict)):
            continue
        where = f"{top}.{attr}" if attr else ""
        problem = engine_refusal(sub, where, nested=bool(attr))
        if problem is not None:
            raise UnsupportedFeatureError(problem)
        at = f"{top}{f'.{attr} ({type(sub).__name__})' if attr else ''}"
        if _is_hisparse(sub):
            raise UnsupportedPoolError(
                f"{at} is a HiSparse pool: its device buffers hold only the hot subset of tokens, addressed "
                f"through full_to_hisparse_device_index_mapping. FlexKV indexes by the full pool's token locations "
                f"and would read the wrong rows. Disable hisparse to offload with FlexKV"
            )
        if probe(sub, "_unified_buffer", tolerate=True) is not None:
            raise UnsupportedPoolError(
                f"{at} is a unified-memory pool (--enable-unified-memory: views into one UnifiedKVPool, "
                f"_unified_buffer): its buffers are indexed by physical, kernel-facing token ids, while SGLang's "
                f"allocator and radix cache hand out virtual ones. FlexKV would store and restore other pages, "
                f"another sub-pool's live ones among them. Serve without --enable-unified-memory to use FlexKV"
            )


def _is_hisparse(pool: object) -> bool:
    """HiSparse pools carry (or register later) a full -> device index mapping."""
    # tolerate: SGLang's property asserts that hisparse is enabled
    if probe(pool, "full_to_hisparse_device_index_mapping", tolerate=True) is not None:
        return True
    register_mapping = probe(pool, "register_mapping")
    try:
        return (
            callable(register_mapping)
            and "full_to_hisparse_device_index_mapping" in inspect.signature(register_mapping).parameters
        )
    except (TypeError, ValueError):
        return False
