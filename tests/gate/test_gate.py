"""The gate (flexkv_adapter/gate.py): every tensor handed to FlexKV, planes and as-is tensors included, passes
the KV tensors' rules, in adapt() and plan() alike. Each test builds the input the rule refuses; the controls
beside them are the same pool with the rule satisfied, so every test can fail."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from flexkv_adapter import AdapterError, InconsistentLayersError, NotAddressableError, UnsupportedPoolError, adapt
from flexkv_adapter.flexkv import plan

ROWS, PAGE, LAYERS = 64, 16, 2


def fp4_like(layers: int = LAYERS) -> SimpleNamespace:
    """MHA K/V [64, 2, 8] uint8 per layer and per-token K/V scales [64, 2]: offloaded whole."""
    return SimpleNamespace(
        k_buffer=[torch.zeros(ROWS, 2, 8, dtype=torch.uint8) for _ in range(layers)],
        v_buffer=[torch.zeros(ROWS, 2, 8, dtype=torch.uint8) for _ in range(layers)],
        k_scale_buffer=[torch.zeros(ROWS, 2, dtype=torch.uint8) for _ in range(layers)],
        v_scale_buffer=[torch.zeros(ROWS, 2, dtype=torch.uint8) for _ in range(layers)],
        page_size=PAGE,
    )


def mla_like(layers: int = LAYERS) -> SimpleNamespace:
    return SimpleNamespace(
        kv_buffer=[torch.zeros(ROWS, 1, 32, dtype=torch.bfloat16) for _ in range(layers)], page_size=PAGE
    )


def minimax_like(main_ids: list[int], index_ids: list[int], index_layers: int | None = None) -> SimpleNamespace:
    main = SimpleNamespace(
        k_buffer=[torch.zeros(ROWS, 2, 8, dtype=torch.bfloat16) for _ in main_ids],
        v_buffer=[torch.zeros(ROWS, 2, 8, dtype=torch.bfloat16) for _ in main_ids],
        page_size=PAGE,
        model_layer_ids=list(main_ids),
    )
    n = len(index_ids) if index_layers is None else index_layers
    index = SimpleNamespace(
        k_buffer=[torch.zeros(ROWS, 1, 8, dtype=torch.bfloat16) for _ in range(n)],
        v_buffer=[torch.zeros(ROWS, 1, 8, dtype=torch.bfloat16) for _ in range(n)],
        page_size=PAGE,
    )
    return SimpleNamespace(
        main_pool=main, index_kv_pool=index, index_kv_layer_id_mapping={g: i for i, g in enumerate(index_ids)}
    )


def both_refuse(pool: Any, error: type[AdapterError], match: str, **options: Any) -> None:
    """adapt() and plan() refuse alike, with the rule named; never a raw exception."""
    for call in (adapt, plan):
        with pytest.raises(error, match=match):
            call(pool, **options)


# A. plane tensors are checked like KV tensors


def test_more_scale_tensors_than_kv_layers_are_refused_not_read_as_other_layers():
    pool = fp4_like()
    pool.k_scale_buffer.append(torch.zeros(ROWS, 2, dtype=torch.uint8))
    pool.v_scale_buffer.append(torch.zeros(ROWS, 2, dtype=torch.uint8))
    both_refuse(pool, InconsistentLayersError, r"k_scale_buffer/v_scale_buffer has 6 tensors for 2 layers")
    assert adapt(fp4_like()).whole is not None  # the control: as many scales as layers


def test_an_index_pool_with_more_layers_than_its_mapping_is_refused():
    pool = minimax_like([0, 1, 2], [1], index_layers=2)
    both_refuse(pool, InconsistentLayersError, r"index_kv_pool.k_buffer/v_buffer has 4 tensors for 1")
    assert len(plan(minimax_like([0, 1, 2], [1, 2])).groups) == 2


@pytest.mark.parametrize(
    "how, match",
    [
        ("meta", "meta device"),
        ("released", "storage was resized or freed"),
        ("0-d", "0-d"),
        ("0-row", "empty"),
    ],
)
def test_scale_planes_without_memory_are_refused_with_the_rule(how, match):
    pool = fp4_like()
    for name in ("k_scale_buffer", "v_scale_buffer"):
        if how == "meta":
            planes = [torch.zeros(ROWS, 2, dtype=torch.uint8, device="meta") for _ in range(LAYERS)]
        elif how == "released":
            planes = [torch.zeros(ROWS, 2, dtype=torch.uint8) for _ in range(LAYERS)]
            for t in planes:
                t.untyped_storage().resize_(0)
        elif how == "0-d":
            planes = [torch.tensor(1, dtype=torch.uint8) for _ in range(LAYERS)]
        else:
            planes = [torch.zeros(0, 2, dtype=torch.uint8) for _ in range(LAYERS)]
        setattr(pool, name, planes)
    both_refuse(pool, UnsupportedPoolError, f"k_scale_buffer.*{match}.*real device, a live storage")


def test_a_scale_plane_inside_the_kv_shifted_by_a_block_is_refused():
    pool = fp4_like()
    block = PAGE * 2 * 8  # one K block of layer 0
    scales = [pool.k_buffer[0].view(-1)[block : block + ROWS * 2].view(ROWS, 2) for _ in range(LAYERS)]
    pool.k_scale_buffer = [scales[0], pool.k_buffer[1].view(-1)[block : block + ROWS * 2].view(ROWS, 2)]
    both_refuse(pool, InconsistentLayersError, "share bytes")


# C. adapt() refuses the whole views plan() refuses (group rules, no tp)


def _mha_with_kv_scales() -> SimpleNamespace:
    pool = fp4_like()
    del pool.k_scale_buffer, pool.v_scale_buffer
    pool.kv_scale_buffer = [torch.zeros(ROWS, 2, dtype=torch.uint8) for _ in range(LAYERS)]
    return pool


def _mla_with_k_and_v_scales() -> SimpleNamespace:
    pool = mla_like()
    pool.k_scale_buffer = [torch.zeros(ROWS, 4, dtype=torch.uint8) for _ in range(LAYERS)]
    pool.v_scale_buffer = [torch.zeros(ROWS, 4, dtype=torch.uint8) for _ in range(LAYERS)]
    return pool


def _indexer_under_mha() -> SimpleNamespace:
    pool = fp4_like()
    del pool.k_scale_buffer, pool.v_scale_buffer
    pool.index_k_with_scale_buffer = [torch.zeros(ROWS // PAGE, PAGE * 8, dtype=torch.uint8) for _ in range(LAYERS)]
    return pool


GROUP_CASES = {
    "mha-kv-with-kv_scale_buffer": (_mha_with_kv_scales, "one plane per layer under a KV with kv_dim=2"),
    "mla-kv-with-k-and-v-scales": (_mla_with_k_and_v_scales, "K and V planes under a KV with kv_dim=1"),
    "indexer-under-mha-kv": (_indexer_under_mha, "one plane per layer under a KV with kv_dim=2"),
    "index-layer-outside-the-stage": (
        lambda: minimax_like([4, 5, 6], [1]),
        r"layers \[1\] are not layers of the KV's pipeline stage",
    ),
}


@pytest.mark.parametrize("case", GROUP_CASES)
def test_a_whole_view_plan_would_refuse_is_refused_by_adapt(case):
    factory, match = GROUP_CASES[case]
    both_refuse(factory(), NotAddressableError, match)


# E. the read-twice rule has no holes


class _CopyingIndexer(SimpleNamespace):
    @property
    def index_k_with_scale_buffer(self) -> list[torch.Tensor]:
        return [t.clone() for t in self._index]


def test_an_indexer_property_that_returns_copies_is_refused():
    pool = _CopyingIndexer(
        kv_buffer=mla_like().kv_buffer, page_size=PAGE, _index=[torch.zeros(4, PAGE * 8, dtype=torch.uint8)] * 2
    )
    both_refuse(pool, NotAddressableError, "index_k_with_scale_buffer gives new memory on a second read")


class _RefillingPool:
    """A getter that refills one list object with fresh copies on every read."""

    def __init__(self, copies: bool) -> None:
        self._k = [torch.zeros(ROWS, 2, 8) for _ in range(LAYERS)]
        self._v = [torch.zeros(ROWS, 2, 8) for _ in range(LAYERS)]
        self._out_k: list[torch.Tensor] = []
        self.copies, self.page_size = copies, PAGE

    @property
    def k_buffer(self) -> list[torch.Tensor]:
        self._out_k[:] = [t.clone() if self.copies else t for t in self._k]
        return self._out_k

    @property
    def v_buffer(self) -> list[torch.Tensor]:
        return self._v


def test_a_getter_refilling_the_same_list_with_copies_is_refused():
    both_refuse(_RefillingPool(copies=True), NotAddressableError, "k_buffer gives new memory on every read")
    view = adapt(_RefillingPool(copies=False))  # the control: the same list object, the pool's own tensors
    assert view.report.bytes_copied == 0


# F. the overlap rule is complete


def _raw_mla_pages(shift_blocks: int) -> list[torch.Tensor]:
    blocks, row = 4, PAGE * 16
    base = torch.zeros((blocks + shift_blocks) * row, dtype=torch.bfloat16)
    return [base[i * shift_blocks * row :][: blocks * row].view(blocks, PAGE, 16) for i in range(2)]


def _raw_vllm_021(shift_blocks: int) -> dict[str, torch.Tensor]:
    blocks, heads, dim = 4, 2, 8
    per = 2 * blocks * PAGE * heads * dim
    base = torch.zeros(2 * per, dtype=torch.bfloat16)
    step = shift_blocks * PAGE * heads * dim if shift_blocks else per
    layers = [base[i * step :][:per].view(2, blocks, PAGE, heads, dim) for i in range(2)]
    return {f"model.layers.{i}.attn": t for i, t in enumerate(layers)}


@pytest.mark.parametrize("form", ["mla-pages-list", "vllm-0.21-dict"])
def test_plan_as_is_refuses_layers_one_block_apart(form):
    pool: Any = SimpleNamespace(kv_buffer=_raw_mla_pages(1)) if form == "mla-pages-list" else _raw_vllm_021(1)
    options = {} if form == "mla-pages-list" else {"axes": "KV P T H D"}
    both_refuse(pool, InconsistentLayersError, "share bytes", **options)
    control: Any = SimpleNamespace(kv_buffer=_raw_mla_pages(4)) if form == "mla-pages-list" else _raw_vllm_021(0)
    assert plan(control, **options).num_layer == 2  # adjacent layers: registered as they are


def test_v_starting_half_a_row_into_k_is_refused_not_warned():
    rows, heads, dim = 32, 2, 8  # rows of 64 bytes (float32)
    base = torch.zeros((rows + 1) * heads * dim)
    half = heads * dim // 2
    k = base[: rows * heads * dim].view(rows, heads, dim)
    v = base[half : half + rows * heads * dim].view(rows, heads, dim)
    both_refuse(SimpleNamespace(k_buffer=[k], v_buffer=[v], page_size=PAGE), InconsistentLayersError, "share bytes")
    same = adapt(SimpleNamespace(k_buffer=[k], v_buffer=[k], page_size=PAGE))  # K and V one tensor: accepted
    assert same.report.warnings == ("k[0] overlaps v[0]",)
