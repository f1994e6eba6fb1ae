"""What adapt() and inspect say when they refuse: the specific reason first, a did-you-mean for a
misspelt option, and one verdict for a layout that no reading makes addressable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter import AdapterError, AmbiguousLayoutError, NotAddressableError, UnsupportedPoolError, adapt, plan
from flexkv_adapter.readers.options import KNOWN_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = sorted(KNOWN_OPTIONS | {"page_size"})


def _sglang_mha(rows: int, page_size: int = 16) -> SimpleNamespace:
    k = [torch.zeros(rows, 2, 8) for _ in range(2)]
    return SimpleNamespace(k_buffer=k, v_buffer=[torch.zeros(rows, 2, 8) for _ in range(2)], page_size=page_size)


@given(name=st.sampled_from(OPTIONS), data=st.data())
def test_a_misspelt_option_is_answered_with_the_option_it_came_from(name: str, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(name) - 1))
    typo = name[:cut] + name[cut + 1 :]  # one letter dropped
    with pytest.raises(AdapterError, match="unknown adapt") as err:
        adapt(_sglang_mha(64), **{typo: 16})
    hint = str(err.value).split("did you mean ", 1)[1].split("?", 1)[0]
    assert name in hint.split(" or "), str(err.value)


def test_page_size_is_listed_among_the_known_options_and_a_far_name_gets_no_guess() -> None:
    with pytest.raises(AdapterError) as err:
        adapt(_sglang_mha(64), zzzzzzzz=1)
    assert "did you mean" not in str(err.value) and "'page_size'" in str(err.value)


def test_the_correctly_spelt_option_is_taken() -> None:  # negative control
    assert adapt(_sglang_mha(64), page_size=16).k_buffer[0].shape[0] == 64


@given(rows=st.integers(1, 15))
def test_rows_under_one_page_come_first_among_the_reasons(rows: int) -> None:
    with pytest.raises(UnsupportedPoolError) as err:
        adapt(_sglang_mha(rows))
    bullets = [line for line in str(err.value).splitlines() if line.startswith("  - ")]
    assert "fewer than page_size=16" in bullets[0], str(err.value)
    assert "none of these attributes is present" in bullets[-1]


@given(blocks=st.integers(3, 6), block_size=st.sampled_from([4, 16]), heads=st.sampled_from([1, 2, 8]), dim=st.just(8))
def test_a_vllm_blocks_first_dict_is_not_addressable_however_it_is_read(  # 1 block is tight; 2 = the K/V extent
    blocks: int, block_size: int, heads: int, dim: int
) -> None:
    kv = {f"model.layers.{i}.self_attn.attn": torch.zeros(blocks, 2, block_size, heads, dim) for i in range(2)}
    with pytest.raises(NotAddressableError) as err:
        adapt(kv)
    text = str(err.value)
    assert "P KV T H D" in text and "not C-contiguous" in text
    with pytest.raises(NotAddressableError):  # the same verdict when the reading is named
        adapt(kv, axes="P KV T H D")


def test_plan_still_asks_which_reading_it_registers_whole() -> None:
    # plan() registers [NB, 2, BS, H, D] as LAYERBLOCK once the reading is named: the question helps there
    kv = {f"model.layers.{i}.self_attn.attn": torch.zeros(4, 2, 16, 2, 8) for i in range(2)}
    with pytest.raises(AmbiguousLayoutError):
        plan(kv)
    assert plan(kv, page_size=16).type.name == "LAYERBLOCK"


def test_two_addressable_readings_are_still_ambiguous() -> None:  # negative control: never a guess
    layers = [(torch.zeros(64, 2, 8), torch.zeros(64, 2, 8)) for _ in range(2)]
    with pytest.raises(AmbiguousLayoutError):
        adapt(layers, page_size=16)


@pytest.mark.parametrize(
    "spec, outcome",
    [("vllm-v0.23-blocks-first", "adapt() refuses it (NotAddressableError)"), ("sglang-mha", "adapt() gives views")],
)
def test_inspect_says_what_adapt_will_do(spec: str, outcome: str) -> None:
    path = ROOT / "configs" / "layouts" / f"{spec}.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "flexkv_adapter", "inspect", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].endswith(outcome), done.stdout
