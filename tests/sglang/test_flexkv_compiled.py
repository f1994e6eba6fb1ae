"""FlexKV's compiled extension where it is built (scripts/install_flexkv.sh), against the stand-ins it replaces.

The stand-ins serve the sides that cannot load the build (CPU torch); here they are held to the real module:
the hasher must give FlexKV's own block hashes, and the module a process gets must be FlexKV's compiled one
with only the GPU-only names replaced.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.flexkv_cpu import c_ext, hasher
from tests.flexkv_cpu.compiled import GPU_ONLY, compiled_ext, load

from .real_flexkv import SOURCE

SO = compiled_ext([SOURCE]) if SOURCE else None
pytestmark = pytest.mark.skipif(
    SO is None,
    reason=f"no compiled flexkv.c_ext in {SOURCE or 'any FlexKV tree'} (scripts/install_flexkv.sh builds it)",
)


def _hashes(module, ids: list[int], page: int) -> list[int]:
    out = torch.zeros(len(ids) // page, dtype=torch.uint64)
    module.gen_hashes(module.Hasher(), torch.tensor(ids, dtype=torch.int64), page, out)
    return out.tolist()


@settings(max_examples=50, deadline=None)
@given(ids=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=200), page=st.sampled_from([1, 4, 16]))
def test_the_compiled_hasher_and_the_stand_in_give_the_same_block_hashes(ids, page):
    ids = ids[: len(ids) // page * page] or [0] * page
    assert _hashes(hasher, ids, page) == _hashes(load(SO), ids, page)
    assert hasher.get_hash_size() == load(SO).get_hash_size()


def test_negative_control_a_hasher_reset_per_block_disagrees_with_the_compiled_one():
    class PerBlock(hasher.Hasher):
        def update(self, data):  # broken on purpose: hashes each block alone
            self.reset()
            return super().update(data)

    class Broken:
        Hasher, gen_hashes = PerBlock, staticmethod(hasher.gen_hashes)

    ids = list(range(1000, 1048))
    assert _hashes(Broken, ids, 16)[1:] != _hashes(load(SO), ids, 16)[1:]


def test_a_process_gets_flexkvs_compiled_module_with_only_the_gpu_only_names_replaced():
    module = c_ext.module(source=SOURCE)
    assert module.__file__ == str(SO) and module.__git_commit__ != "cpu-stand-in"
    for name in ("Hasher", "CRadixTreeIndex", "SSDIOCTX", "transfer_kv_blocks_ssd"):
        assert getattr(module, name).__module__ == "flexkv.c_ext", name  # FlexKV's pybind11 names
    for name in GPU_ONLY[1:]:
        assert getattr(module, name).__module__ == "tests.flexkv_cpu.stubs", name
    assert module.transfer_kv_blocks.__module__ == "tests.flexkv_cpu.c_ext"  # the counted CPU kernel (kernel.py)
