"""What FlexKV's SGLang connectors will do with a pool, and the checks that refuse a mismatch first.

The connectors take the layer count, page size and head semantics from the model config and
server arguments, not from the pool; a view that disagrees is registered anyway and read wrongly.
These facts are derived here the way FlexKV derives them (``FlexKVConfig.post_init_from_sglang_config``).
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import AdapterError, InconsistentLayersError
from ...flexkv.checks import shared_kv_mode
from ...model.copy_rules import shard_problem
from ...model.layout import ViewKind
from ...model.views import PoolView
from ...readers.wrappers import detect, plane_groups, pool_kind, scale_groups

FIX_SKEW = (
    "Fix: pin FlexKV to b70205e (the last commit this connector works with: "
    "pip install 'git+https://github.com/taco-project/FlexKV@b70205e'), or use a SGLang release that "
    "imports FlexKV's own connector (flexkv.integration.sglang.connector). With FlexKV 94915c4 or later the plugin "
    "serves this SGLang's radix cache through FlexKV's own connector instead, when that connector answers its calls"
)


@dataclass(frozen=True)
class FlexKVApi:
    """The installed FlexKV's call shapes that SGLang 0.5.23's in-tree connector depends on."""

    register_indexer_kwargs: bool  # KVTPClient.register_to_server(indexer_buffers=, indexer_layout=)
    layout_is_mla: bool  # KVCacheLayout(is_mla=)
    model_use_mla: bool  # ModelConfig.use_mla

    def in_tree_mismatches(self) -> list[str]:
        found = []
        if not self.register_indexer_kwargs:
            found.append(
                "flexkv.server.client.KVTPClient.register_to_server() no longer accepts indexer_buffers=/"
                "indexer_layout= (removed by FlexKV 56c71a7)"
            )
        if not self.layout_is_mla:
            found.append("flexkv.common.storage.KVCacheLayout() no longer accepts is_mla= (removed by FlexKV c213e5d)")
        if not self.model_use_mla:
            found.append("flexkv.common.config.ModelConfig has no use_mla (removed by FlexKV c213e5d)")
        return found


def _accepts(fn: Callable[..., Any], *names: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return all(n in params for n in names)


def installed_flexkv_api() -> FlexKVApi:
    """Read the call shapes from the installed FlexKV's signatures (version strings are not trusted)."""
    client = importlib.import_module("flexkv.server.client").KVTPClient
    layout = importlib.import_module("flexkv.common.storage").KVCacheLayout
    model = importlib.import_module("flexkv.common.config").ModelConfig
    return FlexKVApi(
        register_indexer_kwargs=_accepts(client.register_to_server, "indexer_buffers", "indexer_layout"),
        layout_is_mla=_accepts(layout, "is_mla"),
        model_use_mla=_accepts(model, "use_mla"),
    )


def skew_error(api: FlexKVApi) -> AdapterError | None:
    """The in-tree connector would retry its registration for ~6 minutes and then fail: refuse now."""
    found = api.in_tree_mismatches()
    if not found:
        return None
    return AdapterError(
        "SGLang's in-tree FlexKV connector (sglang.srt.mem_cache.storage.flexkv) was written for an older FlexKV "
        "API; with the installed FlexKV its GPU registration cannot succeed: " + "; ".join(found) + ". " + FIX_SKEW
    )


@dataclass(frozen=True)
class ConnectorFacts:
    """What the connector will tell FlexKV, derived from the model config and server arguments."""

    kind: ViewKind
    kind_reason: str
    stage_layers: int
    stage: str
    total_kv_heads: int | None
    head_size: int | None  # what FlexKV's ModelConfig sizes its CPU blocks with (None: not derived here)
    attn_tp_size: int
    kv_heads_is_shared_switch: bool  # current FlexKV: a registered head count of 1 means "same KV on every rank"
    flexkv_itemsize: int | None = None  # ModelConfig.dtype's element size, FlexKV's GPU stride unit (None: unknown)
    dtype_origin: str = ""


def model_kind(model_config: Any, api: FlexKVApi) -> tuple[ViewKind, str]:
    """FlexKV's own rule: ``attention_arch == MLA`` while ModelConfig.use_mla existed, else ``qk_nope_head_dim``."""
    if api.model_use_mla:
        arch = getattr(model_config, "attention_arch", None)
        name = getattr(arch, "name", arch)
        return ("mla" if name == "MLA" else "mha"), f"the model's attention_arch is {name}"
    has = hasattr(model_config, "qk_nope_head_dim")
    return ("mla" if has else "mha"), f"the model config {'has' if has else 'has no'} qk_nope_head_dim"


def _total_kv_heads(model_config: Any, tp_size: int) -> int | None:
    """The model's total KV heads, read as FlexKV reads them (its fallbacks included)."""
    for name, args, scale in (("get_total_num_kv_heads", (), 1), ("get_num_kv_heads", (tp_size,), tp_size)):
        method = getattr(model_config, name, None)
        if callable(method):
            try:
                value = int(method(*args)) * scale
            except Exception:  # FlexKV falls back on any error too
                continue
            if value > 0:
                return value
    heads = getattr(model_config, "num_key_value_heads", None)
    return heads if isinstance(heads, int) and heads > 0 else None


def _int(model_config: Any, name: str) -> int:
    value = getattr(model_config, name, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _head_size(model_config: Any, mla: bool, fp8: bool | None = False) -> int | None:
    """FlexKV's head_size for the model (FlexKVConfig's SGLang branch, NSA/DSA included); None when
    it cannot be told (an NSA model whose FlexKV dtype a config file decides)."""
    if not mla:
        return _int(model_config, "head_dim") or None
    rope = _int(model_config, "qk_rope_head_dim")
    latent = _int(model_config, "kv_lora_rank") or _int(model_config, "qk_nope_head_dim")
    if getattr(model_config, "index_head_dim", None) is not None:  # NSA/DSA: an fp8 row packs scales too
        if fp8 is None:
            return None
        if fp8:
            lora = _int(model_config, "kv_lora_rank")
            return lora + lora // 128 * 4 + rope * torch.bfloat16.itemsize
    return latent + rope or None


def _named_dtype(server_args: Any, environ: Any) -> tuple[str, str] | None:
    """The dtype name FlexKV takes before the model's, with its source, in FlexKV's order; None if none."""
    for name, value in (
        ("FLEXKV_KV_CACHE_DTYPE", environ.get("FLEXKV_KV_CACHE_DTYPE")),
        ("--kv-cache-dtype", getattr(server_args, "kv_cache_dtype", None)),
    ):
        if isinstance(value, str) and (name != "--kv-cache-dtype" or value != "auto"):
            return name, value
    return None


def _flexkv_fp8(model_config: Any, server_args: Any, environ: Any = os.environ) -> bool | None:
    """Whether FlexKV's ModelConfig.dtype is float8_e4m3fn, by flexkv_itemsize's sources; None if unknown."""
    if environ.get("FLEXKV_CONFIG_PATH"):
        return None
    if (named := _named_dtype(server_args, environ)) is not None:
        return named[1].lower() in ("fp8", "float8", "e4m3", "fp8_e4m3")
    return getattr(model_config, "dtype", torch.bfloat16) == torch.float8_e4m3fn


# FlexKVConfig._resolve_dtype's table: a name it does not know becomes bfloat16.
_FLEXKV_ITEMSIZE = dict.fromkeys(("float16", "bfloat16", "fp16", "bf16"), 2) | {"float32": 4, "fp32": 4}
_FLEXKV_ITEMSIZE |= dict.fromkeys(("fp8", "float8", "e4m3", "fp8_e4m3", "nvfp4", "fp4", "e2m1", "fp4_e2m1"), 1)


def flexkv_itemsize(model_config: Any, server_args: Any, environ: Any = os.environ) -> tuple[int | None, str]:
    """The element size of FlexKV's ModelConfig.dtype and where it comes from; None when a config file decides."""
    if environ.get("FLEXKV_CONFIG_PATH"):
        return None, "FLEXKV_CONFIG_PATH"
    if (named := _named_dtype(server_args, environ)) is not None:
        name, value = named
        return _FLEXKV_ITEMSIZE.get(value.lower(), 2), f"{name} {value!r} (FlexKV reads unknown names as bfloat16)"
    dtype = getattr(model_config, "dtype", torch.bfloat16)
    return (dtype.itemsize, f"the model dtype {dtype}") if isinstance(dtype, torch.dtype) else (None, "")


def resolved(server_args: Any) -> Any:
    """What SGLang decided, not what the user typed: SGLang 0.5.23's resolution hooks keep their results beside
    the raw fields (``_resolved_overrides``; ``--dp-size 2 --enable-dp-attention`` becomes ``attn_dp_size=2,
    dp_size=1``, MLA prefill CP sets ``attn_cp_size``), read through its own ``resolved_view``."""
    if not getattr(server_args, "_resolved_overrides", None):
        return server_args
    try:
        return importlib.import_module("sglang.srt.arg_groups.model_override_base").resolved_view(server_args)
    except (ImportError, AttributeError):  # an SGLang without the view keeps no overrides either
        return server_args


def connector_facts(model_config: Any, server_args: Any, pp_rank: int, api: FlexKVApi) -> ConnectorFacts:
    server_args = resolved(server_args)
    layers = int(getattr(model_config, "num_hidden_layers", 0) or 0)
    if layers <= 0:
        raise AdapterError("the model config has no num_hidden_layers; FlexKV's connector needs it for its layout")
    pp_size = int(getattr(server_args, "pp_size", 1) or 1)
    start, end = 0, layers
    if pp_size > 1:
        get_pp_indices = importlib.import_module("sglang.srt.distributed.utils").get_pp_indices  # FlexKV uses it too
        start, end = get_pp_indices(layers, pp_rank, pp_size)
    tp = int(getattr(server_args, "tp_size", 1) or 1)
    dp = int(getattr(server_args, "dp_size", 1) or 1) if getattr(server_args, "enable_dp_attention", False) else 1
    cp = int(getattr(server_args, "attn_cp_size", 1) or 1)
    kind, why = model_kind(model_config, api)
    mla = kind == "mla"
    itemsize, origin = flexkv_itemsize(model_config, server_args)
    return ConnectorFacts(
        kind=kind,
        kind_reason=why,
        stage_layers=end - start,
        stage=f"layers {start}..{end - 1} of num_hidden_layers={layers}, pp rank {pp_rank} of {pp_size}",
        total_kv_heads=1 if mla else _total_kv_heads(model_config, tp),
        head_size=_head_size(model_config, mla, _flexkv_fp8(model_config, server_args)),
        attn_tp_size=max(1, tp // (dp * cp)),
        kv_heads_is_shared_switch=not api.layout_is_mla,
        flexkv_itemsize=itemsize,
        dtype_origin=origin,
    )


def check_pool_kind(pool: object, facts: ConnectorFacts) -> None:
    """A plain pool whose buffers FlexKV would pick as the other kind than the model's."""
    found = pool_kind(pool)
    if found is not None and found != facts.kind and detect(pool) is None:
        attrs = "kv_buffer" if found == "mla" else "k_buffer/v_buffer"
        raise InconsistentLayersError(
            f"{type(pool).__name__} is an {found.upper()} pool ({attrs}) but FlexKV treats the model as "
            f"{facts.kind.upper()} ({facts.kind_reason}); the pool does not belong to this model"
        )


def check_view(view: PoolView, facts: ConnectorFacts, page_size: int) -> None:
    """Refuse a view the connector would register with a different layer count, page size or head meaning."""
    pool = type(view.source).__name__
    if len(view.layer_ids) != facts.stage_layers:
        raise InconsistentLayersError(
            f"{pool} holds {len(view.layer_ids)} layers but FlexKV's connector registers "
            f"num_layer={facts.stage_layers} ({facts.stage}); FlexKV would misread the tensors"
        )
    if view.page_size != page_size:
        raise InconsistentLayersError(
            f"{pool}: the view's page size {view.page_size} differs from the connector's page_size={page_size}"
        )
    dims = {t.shape[2] for t in view.tensors()}
    if len(dims) != 1:
        raise InconsistentLayersError(
            f"{pool}: K and V head dims differ ({sorted(dims)}); FlexKV's connector registers K's head size for "
            f"both and would misread V"
        )
    if facts.head_size is not None and dims != {facts.head_size}:
        raise InconsistentLayersError(
            f"{pool} holds rows of {dims.pop()} elements per head but FlexKV sizes its blocks for head_size="
            f"{facts.head_size} from the model config; the pool does not match this model"
        )
    first = view.tensors()[0]
    if facts.flexkv_itemsize is not None and facts.flexkv_itemsize != first.element_size():
        raise InconsistentLayersError(
            f"{pool} holds {first.element_size()}-byte elements but FlexKV's model dtype has {facts.flexkv_itemsize} "
            f"bytes ({facts.dtype_origin}); FlexKV computes GPU strides with it and would read the wrong bytes. Set "
            f"FLEXKV_KV_CACHE_DTYPE to a {first.element_size()}-byte dtype FlexKV knows (fp8, bf16, fp16, fp32)"
        )
    heads, tp, total = int(first.shape[1]), facts.attn_tp_size, facts.total_kv_heads
    if facts.kind == "mla" or (heads == 1 and total == 1):  # shared KV (MQA: the model's one head on every rank)
        chunk = page_size * heads * int(first.shape[2]) * first.element_size()
        if shared_kv_mode() == "sharded" and (problem := shard_problem(chunk, tp)):
            raise InconsistentLayersError(f"{pool} at attention TP size {tp}: {problem}")
        return
    if total is not None and heads * tp != total:
        raise InconsistentLayersError(
            f"{pool} holds {heads} KV heads per rank at attention TP size {tp}, but the model has {total} KV heads "
            f"in total; FlexKV sizes its CPU cache from the total and splits it by rank, so it would copy the wrong "
            f"heads (replicated KV heads are not supported by FlexKV's SGLang connector)"
        )
    if facts.kv_heads_is_shared_switch and heads == 1 and tp > 1:
        raise InconsistentLayersError(
            f"{pool} holds 1 KV head per rank at attention TP size {tp} ({total} heads in total): FlexKV's "
            f"connector registers num_kv_heads=1, which FlexKV reads as 'every rank holds the same KV' and would "
            f"copy one rank's heads for all; run with fewer TP ranks than KV heads"
        )


def left_out(pool: object) -> list[str]:
    """What FlexKV's connector would not receive: hybrid side state and quantisation scale planes."""
    structure = detect(pool)
    if structure is None:
        return [g.describe() for g in scale_groups(pool, ())]
    return [g.describe() for g in (*structure.side_groups, *plane_groups(structure.primary, (), ""))]


def hybrid_message(pool: object, facts: ConnectorFacts, hybrid_setting: str) -> str:
    structure = detect(pool)
    what = f"a hybrid pool ({structure.family})" if structure is not None else "a pool with state beside its KV"
    lines = [
        f"{type(pool).__name__} is {what}. FlexKV's SGLang connector registers only kv_buffer or k_buffer/v_buffer "
        f"and cannot offload this model correctly: a prefix restored from FlexKV would lack the state below."
    ]
    if structure is not None:
        lines.append(
            f"It also takes its layer count from the model config ({facts.stage_layers} layers: {facts.stage}), "
            f"not from the pool, so even the attention layers alone would be misread."
        )
    lines.append("Not offloaded: " + "; ".join(left_out(pool)) + ".")
    if hybrid_setting == "attention_only":
        lines.append("The hybrid=attention_only setting does not apply under the SGLang plugin for these reasons.")
    lines.append("Serve this model without --enable-flexkv.")
    return " ".join(lines)
