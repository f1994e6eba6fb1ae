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
from collections.abc import Sequence

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
DEPTH = 3  # sub-pool levels walked (SGLang nests two: a hybrid's full pool, a DSA child's)
_NOT_POOLS = (torch.Tensor, list, tuple, dict, str, bytes, int, float)


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


def refuse_unproven(pool: object, attrs: Sequence[str] = ()) -> None:
    """Refuse ``pool``, or an object the KV is read from or through, that its engine's table does not serve or
    whose rows are not indexed by the token ids the engine hands out (HiSparse's hot subset, unified memory's
    physical ids): the pool, its sub-pools (:data:`SUB_POOLS`, down to :data:`DEPTH` levels), and every object
    along an ``attrs=`` path (``inner.k_buffer`` reads ``inner``'s rows: it is judged as a pool). Tensors,
    lists and dicts are no engine classes and carry no such attributes."""
    for where, obj, nested in _reached(pool, attrs):
        problem = engine_refusal(obj, where, nested=nested)
        if problem is not None:
            raise UnsupportedFeatureError(problem)
        at = f"{where} ({type(obj).__name__})" if where else type(obj).__name__
        if _is_hisparse(obj):
            raise UnsupportedPoolError(
                f"{at} is a HiSparse pool: its device buffers hold only the hot subset of tokens, addressed "
                f"through full_to_hisparse_device_index_mapping. FlexKV indexes by the full pool's token locations "
                f"and would read the wrong rows. Disable hisparse to offload with FlexKV"
            )
        if probe(obj, "_unified_buffer", tolerate=True) is not None:
            raise UnsupportedPoolError(
                f"{at} is a unified-memory pool (--enable-unified-memory: views into one UnifiedKVPool, "
                f"_unified_buffer): its buffers are indexed by physical, kernel-facing token ids, while SGLang's "
                f"allocator and radix cache hand out virtual ones. FlexKV would store and restore other pages, "
                f"another sub-pool's live ones among them. Serve without --enable-unified-memory to use FlexKV"
            )


def _reached(pool: object, attrs: Sequence[str]) -> list[tuple[str, object, bool]]:
    """(where, object, nested) for every object to judge: ``where`` is "" for the pool itself; ``nested`` for a
    sub-pool below a wrapper (where a class refused only for its own shape may serve)."""
    top = type(pool).__name__
    found: list[tuple[str, object, bool]] = []
    seen: set[int] = set()

    def visit(path: str, obj: object, nested: bool, depth: int) -> None:
        if obj is None or isinstance(obj, _NOT_POOLS) or id(obj) in seen or depth > DEPTH:
            return
        seen.add(id(obj))
        found.append((f"{top}.{path}" if path else "", obj, nested))
        for attr in SUB_POOLS:
            visit(f"{path}.{attr}" if path else attr, probe(obj, attr, tolerate=True), True, depth + 1)

    visit("", pool, False, 0)
    for attr in attrs:
        parts = str(attr).split(".")[:-1]  # the objects the path reads through; the last part is the tensors
        obj: object = pool
        for i, part in enumerate(parts):
            obj = probe(obj, part, tolerate=True)
            holder = i == len(parts) - 1  # the tensors' owner: its rows are the KV's
            if obj is None or isinstance(obj, _NOT_POOLS):
                break
            if id(obj) not in seen:
                seen.add(id(obj))
                found.append((f"{top}.{'.'.join(parts[: i + 1])}", obj, not holder))
    return found


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
